"""The prompts of each GRPO step: a pure function of (seed, step, rank), so a resumed run sees what an unbroken
one would have seen."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from rookworld.ground import chess
from rookworld.ground.data import Record
from rookworld.ground.rewards import GroundTruth


@dataclass(frozen=True)
class Prompt:
    task: str
    text: str
    #: Stockfish's analysis when the data file already has it: (moves best first, evals in pawns).
    truth: GroundTruth | None = None


def is_env_task(index: int, task_mix: float) -> bool:
    """Whether prompt `index` of the stream is an A: prompt (given positions that can be A:).

    A: prompts come at an exact rate rather than by coin flips: of any n consecutive prompts, the floor or the
    ceiling of n x (1 - task_mix) are A:. Each step (and each rank's share of it) then has an almost fixed
    number of prompts per task, so the sampler's batch shapes per task, which CUDA graphs are captured for,
    take at most two values. Which positions get which task stays random: positions are drawn independently
    of their index, and a data file is reshuffled every pass."""
    share = Fraction(1.0 - task_mix).limit_denominator(1 << 16)
    return (index + 1) * share.numerator // share.denominator > index * share.numerator // share.denominator


class PromptSource:
    """The prompts of each step: generated positions by default, or the records of a positions file, reshuffled
    every pass."""

    def __init__(self, cfg, records: Sequence[Record] | None = None, rank: int = 0, world: int = 1):
        self.cfg, self.rank, self.world = cfg, rank, world
        self.per_rank = cfg.prompts_per_step // world
        self.records = list(records) if records else None
        self._order: list[int] = []
        self._order_epoch = -1

    def _record(self, index: int) -> Record:
        """Record `index` of the stream: pass k over the file is its own seeded permutation."""
        n = len(self.records)
        epoch = index // n
        if self._order_epoch != epoch:
            self._order = list(range(n))
            random.Random(self.cfg.seed * 7919 + epoch).shuffle(self._order)
            self._order_epoch = epoch
        return self.records[self._order[index % n]]

    def batch(self, step: int) -> list[Prompt]:
        cfg = self.cfg
        if cfg.overfit_single_batch:
            step = 0
        start = step * cfg.prompts_per_step + self.rank * self.per_rank
        if self.records is not None:
            records = [self._record(start + i) for i in range(self.per_rank)]
        else:
            records = [Record.from_position(p) for p in chess.generate_positions(
                self.per_rank, cfg.seed, start=start, illegal_share=cfg.illegal_share)]
        prompts = []
        for i, r in enumerate(records):
            if r.move is None or not is_env_task(start + i, cfg.task_mix):
                prompts.append(Prompt("P", r.policy_prompt, r.truth))
            else:
                prompts.append(Prompt("A", r.env_prompt))
        return prompts
