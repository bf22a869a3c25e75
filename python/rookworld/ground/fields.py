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
_LABELS = re.compile(r"\s*\b([MEB]):")


def field_starts(task: str, target: str) -> list[tuple[int, int]]:
    """(character offset, field number 1..len(FIELDS)) where each field of `target` begins, in order. A target that
    does not read as its task's (a malformed line is refused before this) gives the fields it can find."""
    if task == "A":
        plus = target.find("+")
        return [(0, FIELDS.index("state") + 1)] + ([] if plus < 0 else [(plus, FIELDS.index("reward") + 1)])
    starts = [(m.start(), FIELDS.index(m.group(1)) + 1) for m in _LABELS.finditer(target)]
    return starts if starts and starts[0][0] == 0 else [(0, FIELDS.index("M") + 1)] + starts


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
