"""The model's move in a position, legal whenever a move is: the one implementation that `rookworld play`, the
game suites, `rookworld uci` and `serve`'s games choose moves with.

One rule, the model's own distribution at its `B:` slot: the B: move of its P: answer when it is legal (what its
decoding chose there), else the legal move it finds most probable at that slot, every legal move's tokens scored
after the answer's own text up to its `B:` (as the engines that play with a network mask illegal moves). The first
legal candidate of its M: list is no guide: the list is the data's order (shuffled in RookWorld's) and the model
repeats moves in it. Which case gave the move is kept (`source`), so that a game or a suite can say how often the
model's own move was illegal while the game goes on legally.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rookworld.chess import rules
from rookworld.chess.rewards import policy_prompt
from rookworld.lm.answers import GREEDY, Decoding, PolicyAnswer
from rookworld.net.limits import ContextTooLong

#: Where a move came from: the answer's own B: move, or (that one illegal or missing) the model's likeliest legal move.
BEST, LIKELIEST = "best", "likeliest"
SOURCES = (BEST, LIKELIEST)
#: How a source reads in a sentence ("played the legal move it finds most probable").
SOURCE_WORDS = {BEST: "its B: move", LIKELIEST: "the legal move it finds most probable"}


@dataclass(frozen=True)
class ModelMove:
    """The move chosen for one position: `move` is None only where no move is allowed (the game is over);
    `logprob` is the move's log-probability when it was the likeliest legal move."""

    move: str | None
    source: str | None
    answer: PolicyAnswer
    logprob: float | None = None

    @property
    def note(self) -> str | None:
        """What the user should hear of when the model's own move was not played; None when it was."""
        if self.source in (BEST, None):
            return None
        said = f"its best move {self.answer.best!r} is illegal" if self.answer.best else "its answer has no best move"
        return f"{said}; played the legal move it finds most probable at its B:, {self.move}"


def scoring_context(fen: str, completion: str) -> str:
    """What a move is scored after: the prompt and the answer up to its `B:`, as the model would go on writing
    its move; without a `B:` in the answer, the prompt and `B:` alone (the rest of such an answer is no guide)."""
    cut = completion.find("B:")
    return policy_prompt(fen) + (completion[:cut] + "B:" if cut >= 0 else " B:")


def likeliest_move(lm, fen: str, completion: str, moves: Sequence[str]) -> tuple[str, float]:
    """The move of `moves` the model gives the highest probability after `scoring_context`, with its log-prob."""
    continuations = [" " + m for m in moves]
    try:
        scores = lm.continuation_logprobs(scoring_context(fen, completion), continuations)
    except ContextTooLong:  # an answer cut at the token limit right at its B: leaves no room for the move
        scores = lm.continuation_logprobs(scoring_context(fen, ""), continuations)
    best = max(range(len(moves)), key=scores.__getitem__)
    return moves[best], scores[best]


def choose_moves(lm, fens: Sequence[str], *, decoding: Decoding = GREEDY, seed: int = 0,
                 allowed: Sequence[Sequence[str]] | None = None) -> list[ModelMove]:
    """The model's move in each position, from one batched P: generation. `allowed[i]` restricts position i's
    moves (UCI's `go searchmoves`); by default they are its legal moves."""
    fens = list(fens)
    legal = rules.legal_moves_batch(fens)
    if allowed is not None:
        legal = [[m for m in moves if m in only] for moves, only in zip(legal, map(set, allowed))]
    answers = lm.policy(fens, decoding=decoding, seed=seed)
    out = []
    for fen, answer, moves in zip(fens, answers, legal):
        if not moves:
            out.append(ModelMove(None, None, answer))
            continue
        if answer.best in set(moves):
            out.append(ModelMove(answer.best, BEST, answer))
            continue
        move, logprob = likeliest_move(lm, fen, answer.text, moves)
        out.append(ModelMove(move, LIKELIEST, answer, logprob))
    return out
