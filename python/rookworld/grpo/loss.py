"""One micro-batch's GRPO loss: what it reads of the rollout (`Experience`) and each token's loss (`GRPOLoss`), over
`grpo.formulas`. The log-prob pass takes a `GRPOLoss` as its `TokenLoss` and calls it on each chunk of positions
with their log-probs (and entropy and exact KL where it makes them), so that the gradient is made in the same pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from rookworld.grpo import formulas
from rookworld.net.head import TokenTerms

Tensor = torch.Tensor


@dataclass(frozen=True)
class Experience:
    """What one micro-batch's loss reads of its rollout, flat over its [b * W] positions as the pass indexes them
    (None where the run does not make it)."""

    advantages: Tensor
    weights: Tensor  # each token's weight in its minibatch's loss (`Objective.weights`), 0 off the loss mask
    old_logprobs: Tensor | None = None  # the sampling policy's: the ratio's denominator when the policy moves
    ref_logprobs: Tensor | None = None  # the reference's, for a sampled KL (k2, k3)
    kl_scale: Tensor | None = None  # each token's multiple of beta (None: 1)

    def at(self, positions: Tensor) -> Experience:
        return Experience(**{f.name: None if (x := getattr(self, f.name)) is None else x[positions]
                             for f in fields(self)})


@dataclass(frozen=True)
class GRPOLoss:
    """Each token's clipped surrogate, plus beta times its KL to the reference, minus the entropy bonus, times its
    weight; with what the metrics count of it (clipped, and the KL where measured)."""

    experience: Experience
    clip: tuple[float, float]  # (low, high): the ratio's range, 1 - low to 1 + high
    ratio_to_old: bool  # the policy moved within the step: the ratio is to the sampling policy, else to itself
    beta: float  # the KL term's weight this step (0: the KL is measured, not penalised)
    sampled_kl: Callable[[Tensor, Tensor], Tensor] | None  # k2 / k3 of the log-probs and the reference's
    entropy_coef: float

    @classmethod
    def of(cls, objective, experience: Experience) -> GRPOLoss:
        """The loss of `objective`'s current step (its switches and beta: `grpo.objective.Objective`) over a
        micro-batch's `experience`."""
        s = objective.settings
        return cls(experience, (s.clip_low, s.clip_high), objective.passes.several_updates,
                   objective.step_beta if objective.kl_in_loss else 0.0, objective.sampled_kl, s.entropy_coef)

    def __call__(self, logprobs: Tensor, entropy: Tensor | None, kl: Tensor | None, positions: Tensor) -> TokenTerms:
        x = self.experience.at(positions)
        old = x.old_logprobs if self.ratio_to_old else logprobs.detach()
        loss, clipped = formulas.clipped_surrogate(logprobs, old, x.advantages, *self.clip)
        if x.ref_logprobs is not None:
            kl = self.sampled_kl(logprobs, x.ref_logprobs)
        if kl is not None:
            kl = kl.float()
            if self.beta > 0:
                loss = loss + self.beta * (kl if x.kl_scale is None else kl * x.kl_scale)
        if self.entropy_coef > 0:
            loss = loss - self.entropy_coef * entropy
        metrics = {"clipped": clipped} if kl is None else {"clipped": clipped, "kl": kl}
        return TokenTerms(loss * x.weights, metrics)
