"""rookworld's chess for TRL's GRPOTrainer (`pip install 'rookworld[trl]'`): its rewards as reward functions and
its positions as a dataset.

    from trl import GRPOConfig, GRPOTrainer
    from rookworld.integrations.trl import chess_dataset, reward_funcs

    trainer = GRPOTrainer(model="models/chess-cpu-sft", reward_funcs=reward_funcs(),
                          train_dataset=chess_dataset(count=10_000), args=GRPOConfig(...))

The reward functions are coroutines, so TRL awaits them beside its other reward functions; they score each batch
at once in Rust, P: prompts against the dataset's own analyses or a Stockfish pool (close them after training).
"""

from __future__ import annotations

from collections.abc import Sequence

from datasets import Dataset

from rookworld.ground.data import Record, read_records
from rookworld.integrations.rewards import AsyncChessReward, chess_rows


def reward_funcs(task: str = "mixed", **stockfish) -> list[AsyncChessReward]:
    """TRL's `reward_funcs`: one reward for `task` ("mixed", "policy" or "env"); `stockfish` as `ChessReward`
    takes it (`stockfish_depth=10`, `stockfish_workers`, `stockfish_cache`, `stockfish_path`)."""
    return [AsyncChessReward(task, **stockfish)]


def chess_dataset(source: str | Sequence[Record] | None = None, *, count: int | None = None, seed: int = 0,
                  task_mix: float = 0.8, document_start: bool = True) -> Dataset:
    """A plain-text GRPO dataset: a `prompt` column and the columns the reward reads (`task`, `fen`,
    `truth_moves`, `truth_evals`). `source` is a positions file (`rookworld positions --out`, annotated or not),
    records, or None for `count` generated positions of `seed`."""
    records = read_records(source)[0] if isinstance(source, str) else source
    rows = chess_rows(records, count=count, seed=seed, task_mix=task_mix, document_start=document_start)
    return Dataset.from_list(rows)
