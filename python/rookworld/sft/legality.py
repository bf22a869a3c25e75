"""Legality from every legal move: an auxiliary SFT loss on the probability the model gives to legal moves.

Cross-entropy on a P: target teaches one move a slot (the one Stockfish listed); the position has about 30 legal
ones, which the Rust core lists at once. At each token of each move a P: target writes (its M: moves and its B:
move), given the move's tokens before it, some next tokens continue a legal move of the position and the others
cannot (a UCI move is `' ' + file`, rank, file, rank and perhaps a piece, a token each). The loss is

    legal = mean over those tokens of  -log sum_{t continues a legal move} p(t | context)

so it pushes probability off the tokens no legal move can take, and leaves the choice among legal moves to the
cross-entropy. `--legal-weight w` adds `w x legal` to SFT's token mean.

The soft best move goes further at the tokens of the move where the target chooses (B:, or the first M: move when
the candidates are ranked best first): Stockfish's eval of every legal move (in pawns, the side
to move's view) makes a distribution q(m) = softmax(eval(m) / T) over the legal moves (Ruoss et al. 2024: a value
for every move beats copying the best one). At each token of that move, given its tokens before, the target of
the next token t is the q-mass of the legal moves spelled with the prefix and then t, over the q-mass of those
with the prefix; the loss is the cross-entropy -sum_t target(t) log p(t | context), and `--soft-best-weight w` adds
w x its mean over those tokens.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rookworld.chess import rules

#: The move fields of a P: target: every word after "M:" up to "E:", and the word after "B:".
_BEST = re.compile(r"B:\s*(\S+)")
#: A word spelled as a UCI move: only these have slots (the vocabulary may not spell any other word).
_UCI = re.compile(r"[a-h][1-8][a-h][1-8][qrbn]?")


def soft_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy -sum_t target(t) log p(t) per row: logits [n, V], target [n, V] (each row sums to 1), in float32
    or above."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return -(target * logits.log_softmax(-1)).sum(-1)


def move_shares(evals: Sequence[tuple[str, float]], temperature: float) -> dict[str, float]:
    """q(m) = softmax(eval / temperature) over every legal move's (move, eval in pawns)."""
    top = max(e for _, e in evals)
    weights = {m: float(np.exp((e - top) / temperature)) for m, e in evals}
    total = sum(weights.values())
    return {m: w / total for m, w in weights.items()}


def legal_loss(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """-log of the probability on `allowed` tokens, per row: logits [n, V], allowed bool [n, V] (each row has
    one allowed token at least), in float32 or above."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    inside = logits.masked_fill(~allowed, float("-inf")).logsumexp(-1)
    return logits.logsumexp(-1) - inside


@dataclass(frozen=True)
class SoftSlots:
    """A batch's chosen move tokens (`LegalTokens.best_slots`): `rows`, `columns` (as `MoveSlots`) and `target`
    [n, V] (each row's distribution over the next token)."""

    rows: torch.Tensor
    columns: torch.Tensor
    target: torch.Tensor

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class MoveSlots:
    """A batch's move tokens: `rows`, `columns` (the index in the row of the token each slot predicts) and
    `allowed` [n, V] (the tokens that continue a legal move there)."""

    rows: torch.Tensor
    columns: torch.Tensor
    allowed: torch.Tensor

    def __len__(self) -> int:
        return len(self.rows)


class LegalTokens:
    """Which tokens continue a legal move at each move token of a P: target. `tokenizer`'s encoding spells each
    legal move as the target does (a space before it)."""

    def __init__(self, tokenizer):
        self.encode = tokenizer.encoding.encode_ordinary
        self.decode = tokenizer.encoding.decode_single_token_bytes
        self.vocab_size, self.eos_id = tokenizer.vocab_size, tokenizer.eos_id
        self._spelled: dict[str, tuple[int, ...]] = {}

    def spell(self, move: str) -> tuple[int, ...]:
        found = self._spelled.get(move)
        if found is None:
            found = self._spelled[move] = tuple(self.encode(" " + move))
        return found

    def _written(self, target: Sequence[int]) -> tuple[str, dict[int, tuple[int, tuple[int, ...]]]]:
        """The target's text, and for each UCI move it writes (its M: words and its B: word) spelled with its own
        space, by the move's character offset: (the index of its first token, its tokens in the target)."""
        pieces = [self.decode(t) for t in target]
        text = b"".join(pieces).decode("utf-8", "replace")
        starts = np.cumsum([0] + [len(p) for p in pieces])  # byte offsets: the chess text is ASCII
        found = {}
        for begin, word in _move_words(text):
            if not _UCI.fullmatch(word):
                continue
            first = int(np.searchsorted(starts, begin - 1, side="right")) - 1  # the token holding the space before
            if first < 0 or starts[first] != begin - 1:
                continue  # not spelled with its own space (a layout this does not read): no slot
            found[begin] = (first, tuple(target[first : first + len(self.spell(word))]))
        return text, found

    def slots(self, fen: str, target: Sequence[int]) -> list[tuple[int, list[int]]]:
        """(index in `target` of a move token, the token ids that continue a legal move there), for every token of
        every move the target writes, while its tokens so far begin some legal move."""
        legal = [self.spell(m) for m in rules.legal_moves(fen)]
        out = []
        for first, spelled in self._written(target)[1].values():
            for k in range(len(spelled)):
                allowed = sorted({s[k] for s in legal if len(s) > k and s[:k] == spelled[:k]})
                if not allowed:
                    break
                out.append((first + k, allowed))
        return out

    def best_slots(self, target: Sequence[int], shares: dict[str, float], at: str = "B"
                   ) -> list[tuple[int, dict[int, float]]]:
        """(index in `target` of a token of its chosen move, {next token: its share of the target}) for every token
        of that move while its tokens so far begin a legal move; `shares`: q over the legal moves (`move_shares`).
        The chosen move is the B: move (`at="B"`), or the first M: move (`at="first"`: where a target whose
        candidates are ranked best first makes its choice)."""
        text, written = self._written(target)
        words = _move_words(text)
        best = _BEST.search(text)
        if at == "B":  # the last word, when it is B:'s
            words = words[-1:] if best is not None and words and words[-1][0] == best.start(1) else []
        elif _moves(text) is None:
            words = []
        if not words or words[0][0] not in written:
            return []
        first, spelled = written[words[0][0]]
        legal = [(self.spell(m), q) for m, q in shares.items()]
        out = []
        for k in range(len(spelled)):
            mass: dict[int, float] = {}
            for s, q in legal:
                if len(s) > k and s[:k] == spelled[:k]:
                    mass[s[k]] = mass.get(s[k], 0.0) + q
            total = sum(mass.values())
            if total <= 0:
                break
            out.append((first + k, {t: m / total for t, m in mass.items()}))
        return out

    def _gather(self, docs: Sequence[tuple[object, int, np.ndarray] | None], slots_of, device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor, list]:
        """(rows, columns, what each slot holds) of a batch's rows: each (what `slots_of` reads besides the target,
        the index of its target's first token in the row, the row's ids), or None for a row without one."""
        rows, columns, held = [], [], []
        for r, doc in enumerate(docs):
            if doc is None:
                continue
            key, offset, ids = doc
            target = ids[offset:].tolist()
            if self.eos_id in target:  # a row ends with the EOS that closes its document
                target = target[: target.index(self.eos_id)]
            for index, value in slots_of(key, target):
                rows.append(r)
                columns.append(offset + index)
                held.append(value)
        as_long = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
        return as_long(rows), as_long(columns), held

    def soft_batch(self, docs: Sequence[tuple[dict[str, float], int, np.ndarray] | None], device: torch.device,
                   at: str = "B") -> SoftSlots:
        """The chosen move's slots of a batch's rows (`best_slots`): each (q over its position's legal moves, the
        index of its target's first token in the row, the row's ids), or None for a row without them."""
        rows, columns, targets = self._gather(docs, lambda shares, target: self.best_slots(target, shares, at), device)
        dense = torch.zeros(len(targets), self.vocab_size, dtype=torch.float32)
        for i, dist in enumerate(targets):
            dense[i, list(dist)] = torch.tensor(list(dist.values()), dtype=torch.float32)
        return SoftSlots(rows, columns, dense.to(device))

    def batch(self, docs: Sequence[tuple[str, int, np.ndarray] | None], device: torch.device) -> MoveSlots:
        """The move slots of a batch's rows: each (FEN, the index of its target's first token in the row, the row's
        ids), or None for a row without a P: target."""
        rows, columns, allowed = self._gather(docs, lambda fen, target: self.slots(fen, target), device)
        mask = torch.zeros(len(allowed), self.vocab_size, dtype=torch.bool)
        for i, tokens in enumerate(allowed):
            mask[i, tokens] = True
        return MoveSlots(rows, columns, mask.to(device))


def _moves(text: str) -> tuple[int, int] | None:
    """Where the M: field's words are in `text`: from after its first "M:" to the first "E:" after it; None
    without both. A lazy regex (M:(.*?)E:) searched from every "M:" of a line that has no "E:" read to the end from
    each: quadratic in the line."""
    start = text.find("M:")
    end = text.find("E:", start + 2) if start >= 0 else -1
    return None if end < 0 else (start + 2, end)


def _move_words(text: str) -> list[tuple[int, str]]:
    """(offset, word) of each move the P: target `text` writes: its M: words and its B: word."""
    words = []
    moves = _moves(text)
    if moves is not None:
        start, end = moves
        words += [(start + m.start(), m.group()) for m in re.finditer(r"\S+", text[start:end])]
    best = _BEST.search(text, moves[1] + 2 if moves is not None else 0)
    if best is not None:
        words.append((best.start(1), best.group(1)))
    return words
