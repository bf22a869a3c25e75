"""rookworld's P: and A: rewards as one plain reward function, `f(prompts, completions, **columns) -> list`, the
signature TRL's GRPOTrainer calls (`reward_funcs=[...]`) and most trainers accept, and the rows it scores.

A batch is scored at once by the Rust core, as in `rookworld train`: the rules of chess for A:, Stockfish's
analysis for P: (from the row's `truth_moves` / `truth_evals` when the data carries it, else from a Stockfish pool
started at the first P: prompt that needs one, with its cache). Any completion gets a score, never an exception.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from rookworld.ground import chess
from rookworld.ground.data import Record, assign_moves
from rookworld.ground.rewards import RewardScorer, task_of
from rookworld.ground.stockfish import StockfishPool

#: Which prompts a reward function scores; the others get None, TRL's word for "this reward does not apply".
TASKS = {"policy": ("P",), "env": ("A",), "mixed": ("P", "A")}


#: What begins each of RookWorld's training documents, and so each prompt a trainer gives its models.
DOCUMENT_START = "<|endoftext|>"


def _text(message: Any) -> str:
    """A plain-text prompt or completion as it is; a conversational one (a list of messages) as its last content."""
    if isinstance(message, str):
        return message
    if isinstance(message, Sequence) and message and isinstance(message[-1], dict):
        return str(message[-1].get("content", ""))
    return "" if message is None else str(message)


def _prompt(message: Any) -> str:
    return _text(message).removeprefix(DOCUMENT_START)


class ChessReward:
    """rookworld's reward for P: and A: completions with TRL's reward-function signature.

    `task` is "policy" (P: prompts only), "env" (A: only) or "mixed" (both). The Stockfish settings are those of
    `rookworld train` (`--stockfish-depth` and so on); the pool starts at the first P: prompt whose row carries no
    analysis, and `close()` ends it (so does leaving a `with` block)."""

    def __init__(self, task: str = "mixed", *, stockfish_path: str | None = None, stockfish_depth: int = 10,
                 stockfish_workers: int | None = None, stockfish_cache: str | None = None,
                 shaping: str = "continuous"):
        if task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
        self.task, self.shaping = task, shaping
        self.__name__ = f"rookworld_{task}"  # TRL logs each reward under its function's name
        self._engine = dict(path=stockfish_path, depth=stockfish_depth, workers=stockfish_workers,
                            cache_path=stockfish_cache)
        self._pool: StockfishPool | None = None
        self._scorer = RewardScorer(None, shaping)

    def _stockfish(self) -> RewardScorer:
        if self._pool is None:
            self._pool = StockfishPool(**self._engine)
            self._scorer = RewardScorer(self._pool, self.shaping)
        return self._scorer

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], truth_moves: Sequence | None = None,
                 truth_evals: Sequence | None = None, **columns) -> list[float | None]:
        prompts, completions = [_prompt(p) for p in prompts], [_text(c) for c in completions]
        tasks = [task_of(p) for p in prompts]
        mine = [i for i, t in enumerate(tasks) if t in TASKS[self.task]]
        rewards: list[float | None] = [None] * len(prompts)
        if not mine:
            return rewards
        truth = [_truth(tasks[i], truth_moves[i] if truth_moves is not None else None,
                        truth_evals[i] if truth_evals is not None else None) for i in mine]
        needed = [k for k, i in enumerate(mine) if tasks[i] == "P" and truth[k] is None]
        if needed:
            found = self._stockfish().ground_truth([prompts[mine[k]] for k in needed])
            for k, t in zip(needed, found):
                truth[k] = t
        scores = self._scorer.score_batch([prompts[i] for i in mine], [completions[i] for i in mine], truth)
        for i, r in zip(mine, scores.rewards.tolist()):
            rewards[i] = r
        return rewards

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> ChessReward:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncChessReward(ChessReward):
    """`ChessReward` as a coroutine function: a trainer that awaits its reward functions together (TRL's
    GRPOTrainer does) runs its others while the Rust core and Stockfish score, off the event loop's thread."""

    async def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns) -> list[float | None]:
        return await asyncio.to_thread(ChessReward.__call__, self, prompts, completions, **columns)


def _truth(task: str | None, moves, evals):
    """A row's analysis as the scorer takes it; None for an A: row or a P: row that carries none."""
    if task != "P" or not moves:
        return None
    return [str(m) for m in moves], [float(e) for e in evals]


def chess_rows(records: Sequence[Record] | None = None, *, count: int | None = None, seed: int = 0,
               task_mix: float = 0.8, document_start: bool = True) -> list[dict[str, Any]]:
    """The rows of a chess RL dataset: a `prompt` (P: or A:), its `task`, the position's `fen`, and Stockfish's
    analysis as `truth_moves` / `truth_evals` where the record has one (empty lists otherwise: the reward asks
    Stockfish). `records` are a positions file's (`rookworld.ground.data.read_records`); without them, `count`
    generated positions of `seed`. About `task_mix` of the rows are P: (`rookworld train --task-mix`), the rest A:
    (for positions with a move to make). Each prompt begins with `DOCUMENT_START`, as RookWorld's training documents
    did, unless `document_start` is False."""
    if records is None:
        if count is None:
            raise ValueError("give records, or a count of positions to generate")
        records = [Record.from_position(p) for p in chess.generate_positions(count, seed)]
    elif count is not None:
        records = list(records)[:count]
    records = assign_moves(records, seed)
    rng = random.Random(seed)
    rows = []
    for r in records:
        env = r.move is not None and rng.random() >= task_mix
        truth = r.truth if not env else None
        prompt = (DOCUMENT_START if document_start else "") + (r.env_prompt if env else r.policy_prompt)
        rows.append({"prompt": prompt, "task": "A" if env else "P", "fen": r.fen,
                     "truth_moves": list(truth[0]) if truth else [], "truth_evals": list(truth[1]) if truth else []})
    return rows
