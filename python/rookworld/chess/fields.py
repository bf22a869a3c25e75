"""The fields of a target: what each part of a P: or A: completion says, and where in its text it begins.

A P: target (either layout) writes its candidates (`M`), their evaluations (`E`) and the best move (`B`); an A:
target the next position (`state`) and then `+reward+terminated+truncated` (`reward`: the reward and its two
flags). A field begins at the whitespace before its label ("  E:"), so a token that holds the label's leading
spaces belongs to the field it opens. `rookworld sft --field-weights` weighs the loss by field; the held-out
evaluation reports each field's loss apart.
"""

from __future__ import annotations

import re

#: Every field, in the order a weights table lists them; index 0 of a token's field is `OTHER` (the prompt, and the
#: EOS that closes a document).
FIELDS = ("M", "E", "B", "state", "reward")
OTHER = 0
_LABELS = re.compile(r"\b([MEB]):")


def field_starts(task: str, target: str) -> list[tuple[int, int]]:
    """(character offset, field number 1..len(FIELDS)) where each field of `target` begins, in order. A target that
    does not read as its task's (a malformed line is refused before this) gives the fields it can find."""
    if task == "A":
        plus = target.find("+")
        return [(0, FIELDS.index("state") + 1)] + ([] if plus < 0 else [(plus, FIELDS.index("reward") + 1)])
    starts, end = [], 0
    for m in _LABELS.finditer(target):
        start = m.start()
        while start > end and target[start - 1].isspace():  # the blanks before the label, each looked at once
            start -= 1
        starts.append((start, FIELDS.index(m.group(1)) + 1))
        end = m.end()
    return starts if starts and starts[0][0] == 0 else [(0, FIELDS.index("M") + 1)] + starts


def policy_fields(target: str) -> tuple[str, str, str] | None:
    """(moves, evals, best) of a P: target `M: ... E: ... B: best`, in that order, each stripped; None when it does
    not read so. Read as the regex `\\s*M:\\s*(.*?)\\s*E:\\s*(.*?)\\s*B:\\s*(\\S+)\\s*$` read it (the first E:, then the
    first B: after it that one word ends), but in one pass: that regex backtracked polynomially on fields padded
    with blanks and no best move (a few hundred blanks never ended)."""
    text = target.lstrip()
    if not text.startswith("M:"):
        return None
    e = text.find("E:", 2)
    if e < 0:
        return None
    end = len(text.rstrip())
    last = end  # the last word is text[last:end]; the one before it ends at `before`
    while last > 0 and not text[last - 1].isspace():
        last -= 1
    before = last
    while before > 0 and text[before - 1].isspace():
        before -= 1
    b = text.find("B:", max(e + 2, before - 2))  # what follows the first B: from here on is one word, or nothing
    if b < 0 or b + 2 >= end:
        return None
    return text[2:e].strip(), text[e + 2 : b].strip(), text[b + 2 : end].strip()


def parse_weights(text: str) -> dict[str, float]:
    """`M=1,E=0.2,B=4`-style text as {field: weight}; a field it does not name keeps weight 1. Raises ValueError
    with what is wrong."""
    weights = dict.fromkeys(FIELDS, 1.0)
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in FIELDS:
            raise ValueError(f"{item!r} is not FIELD=WEIGHT with FIELD one of {', '.join(FIELDS)}")
        try:
            weight = float(value)
        except ValueError:
            raise ValueError(f"{item!r}: the weight must be a number") from None
        if not weight >= 0 or weight == float("inf"):
            raise ValueError(f"{item!r}: the weight must be finite and 0 or more")
        weights[name] = weight
    if not any(weights.values()):
        raise ValueError("every field's weight is 0: the loss would count nothing")
    return weights
