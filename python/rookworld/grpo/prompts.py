"""The prompts of each GRPO step: a pure function of (seed, step, rank), so a resumed run sees what an unbroken
one would have seen."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from rookworld.chess import rules
from rookworld.chess.data import Record, position_key
from rookworld.chess.rewards import GroundTruth
from rookworld.settings.base import Slice


@dataclass(frozen=True)
class Prompt:
    task: str
    text: str
    #: Stockfish's analysis when the data file already has it: (moves best first, evals in pawns).
    truth: GroundTruth | None = None


def a_prompt_at(index: int, task_mix: float) -> bool:
    """Whether prompt `index` of the stream is an A: prompt (given positions that can be A:).

    A: prompts come at an exact rate rather than by coin flips: of any n consecutive prompts, the floor or the
    ceiling of n x (1 - task_mix) are A:. Each step (and each rank's share of it) then has an almost fixed
    number of prompts per task, so the sampler's batch shapes per task, which CUDA graphs are captured for,
    take at most two values. Which positions get which task stays random: positions are drawn independently
    of their index, and a data file is reshuffled every pass."""
    share = Fraction(1.0 - task_mix).limit_denominator(1 << 16)
    return (index + 1) * share.numerator // share.denominator > index * share.numerator // share.denominator


#: Stream k of a seed's stand-ins for held-out positions draws from seed + k x this (far from every other stream's
#: offset: evaluation's, mate-in-one's).
REDRAW_SEED_STRIDE = 7_000_003
#: Redraws of one generated position before it is kept held out or not: a bound on the loop, never reached by a
#: held-out set that leaves the generator any other position.
MAX_REDRAWS = 1000


@dataclass(frozen=True)
class PromptSettings(Slice):
    """The settings the prompts read (`PromptSettings.of(cfg)` from a `TrainConfig`)."""

    prompts_per_step: int
    seed: int
    illegal_share: float
    overfit_single_batch: bool
    task_mix: float


class PromptSource:
    """The prompts of each step: generated positions by default, or the records of a positions file, reshuffled
    every pass. No prompt is a `held_out` position (keys as `position_key`): a file's are left out, and a generated
    one is replaced by the position of the same index in the seed's next stand-in stream, which keeps the stream a
    pure function of (seed, step, rank). Openings recur (every generator seed starts from the same book), so
    without this a generated held-out set shares about a fifth of its positions with training."""

    def __init__(self, cfg, records: Sequence[Record] | None = None, rank: int = 0, world: int = 1,
                 held_out: frozenset[str] = frozenset()):
        self.cfg, self.rank, self.world = PromptSettings.of(cfg), rank, world
        self.per_rank = cfg.prompts_per_step // world
        self.held_out = held_out
        self.records = [r for r in records if position_key(r.fen) not in held_out] if records else None
        self.left_out = len(records) - len(self.records) if records else 0
        self._order: list[int] = []
        self._order_epoch = -1

    def resized(self, prompts_per_step: int) -> PromptSource:
        """The same stream of prompts at another batch size (auto-batch's trials and its choice): a new source; this
        one is unchanged."""
        cfg = dataclasses.replace(self.cfg, prompts_per_step=prompts_per_step)
        return PromptSource(cfg, self.records, self.rank, self.world, self.held_out)

    def _record(self, index: int) -> Record:
        """Record `index` of the stream: pass k over the file is its own seeded permutation."""
        n = len(self.records)
        epoch = index // n
        if self._order_epoch != epoch:
            self._order = list(range(n))
            random.Random(self.cfg.seed * 7919 + epoch).shuffle(self._order)
            self._order_epoch = epoch
        return self.records[self._order[index % n]]

    def _generated(self, start: int) -> list[rules.Position]:
        cfg = self.cfg
        positions = rules.generate_positions(self.per_rank, cfg.seed, start=start, illegal_share=cfg.illegal_share)
        for i, p in enumerate(positions):
            k = 0
            while position_key(p.fen) in self.held_out and k < MAX_REDRAWS:
                k += 1
                p = rules.generate_positions(1, cfg.seed + k * REDRAW_SEED_STRIDE, start=start + i,
                                             illegal_share=cfg.illegal_share)[0]
            positions[i] = p
        return positions

    def batch(self, step: int) -> list[Prompt]:
        cfg = self.cfg
        if cfg.overfit_single_batch:
            step = 0
        start = step * cfg.prompts_per_step + self.rank * self.per_rank
        if self.records is not None:
            records = [self._record(start + i) for i in range(self.per_rank)]
        else:
            records = [Record.from_position(p) for p in self._generated(start)]
        prompts = []
        for i, r in enumerate(records):
            if r.move is None or not a_prompt_at(start + i, cfg.task_mix):
                prompts.append(Prompt("P", r.policy_prompt, r.truth))
            else:
                prompts.append(Prompt("A", r.env_prompt))
        return prompts
