"""A GRPO rollout's rewards, as the trainer asks for them (`RewardFn`): Stockfish for P:, the rules for A:
(`rookworld.chess.rewards`, the one scorer), over a step's `Prompt`s, and the wait on Stockfish that a stop can cut
short. (Other trainers' reward function over the same scorer is `rookworld.integrations.chess_reward.ChessReward`.)"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from typing import Protocol

import numpy as np

from rookworld.chess.rewards import RewardScorer, Scores
from rookworld.grpo.prompts import Prompt
from rookworld.harness.stop import StepAbandoned


class RewardFn(Protocol):
    def prefetch(self, prompts: Sequence[Prompt]) -> None: ...

    def __call__(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> Scores: ...


class RolloutReward:
    """A rollout's rewards: Stockfish for P:, the rules for A: (`rookworld.chess.rewards`), over the step's
    `Prompt`s. (Other trainers' reward function is `rookworld.integrations.chess_reward.ChessReward`.)"""

    def __init__(self, scorer):
        self.scorer = scorer

    def prefetch(self, prompts: Sequence[Prompt]) -> None:
        texts = [p.text for p in prompts if p.task == "P" and p.truth is None]
        if texts:
            self.scorer.prefetch(texts)

    def __call__(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> Scores:
        texts = [p.text for p in prompts]
        truth = [p.truth for p in prompts]
        valid = np.ones(len(prompts), dtype=bool)
        missing = [i for i, p in enumerate(prompts) if p.task == "P" and p.truth is None]
        if missing:
            found, failed = self.scorer.ground_truth_or_failures([texts[i] for i in missing])
            for i, t in zip(missing, found):
                truth[i] = t
            valid[[missing[j] for j in failed]] = False
        rewards = np.zeros(len(prompts))
        well_formed = np.zeros(len(prompts), dtype=bool)
        keep = np.flatnonzero(valid)
        scores = self.scorer.score_batch([texts[i] for i in keep], [completions[i] for i in keep],
                                         ground_truth=[truth[i] for i in keep])
        rewards[keep], well_formed[keep] = scores.rewards, scores.well_formed
        parts = {}  # what the rewards are made of, for the step's metrics (0 in a row left unscored)
        for name, values in scores.parts.items():
            parts[name] = np.zeros(len(prompts), dtype=values.dtype)
            parts[name][keep] = values
        return Scores(rewards=rewards, tasks=np.array([p.task for p in prompts]), well_formed=well_formed,
                      valid=valid, parts=parts)


#: How often a wait on Stockfish looks up from the analyses: for a stop asked for meanwhile.
WAIT_SLICE_S = 0.25
#: How long a stop (Ctrl-C, SIGTERM) lets the engines finish the step's analyses before the step is dropped.
STOP_GRACE_S = 1.0


class StoppableRolloutReward(RolloutReward):
    """The chess rewards, waiting on Stockfish's analyses of a step in short slices: a stop asked for meanwhile
    (`stopping`) drops the step (`StepAbandoned`) once the engines have had `STOP_GRACE_S` more, since no weight has
    changed yet; a pool that gave up on its engine ends the wait with its `StockfishError`."""

    def __init__(self, scorer: RewardScorer, stopping: Callable[[], bool]):
        super().__init__(scorer)
        self.stopping = stopping

    def __call__(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> Scores:
        texts = [p.text for p in prompts if p.task == "P" and p.truth is None]
        if texts:
            self._wait(self.scorer.prefetch(texts))  # the step's analyses, queued or cached already
        return super().__call__(prompts, completions)

    def _wait(self, futures: list[Future]) -> None:
        pending, drop_at = set(futures), None
        while pending:
            _, pending = wait(pending, timeout=WAIT_SLICE_S)
            if drop_at is None and self.stopping():
                drop_at = time.monotonic() + STOP_GRACE_S
            if pending and drop_at is not None and time.monotonic() > drop_at:
                raise StepAbandoned
        failure = self.scorer.stockfish.failure
        if failure is not None:
            raise failure
