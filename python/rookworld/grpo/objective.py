"""The GRPO objective, decided once from the config: which log-prob passes a rollout runs, how advantages are
formed, which terms each token's loss has (read by `grpo.loss.GRPOLoss.of`), how tokens are weighed, and beta.
`collect_rollout` and `update` ask it rather than the config; the formulas themselves are `grpo.formulas`' pure
functions.

The option names a user gives and the checks of how they combine are `rookworld.settings.objective`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rookworld.grpo import formulas
from rookworld.harness.distributed import Comm
from rookworld.settings.base import Slice
from rookworld.settings.objective import KL_DIRECTIONS

@dataclass(frozen=True)
class Totals:
    """What a minibatch's loss is divided by, counted over the whole minibatch (under DDP, over every rank and
    divided by the number of ranks, since DDP averages the ranks' gradients)."""

    tokens: float  # usable tokens (`token` aggregation)
    sequences: float  # rows with a usable token (`sequence`: a row the loss does not count is no sequence)
    rows: float  # rows sampled (`constant`: Dr. GRPO's fixed normaliser)


def std_scaling(cfg) -> str:
    """--std-scaling with auto resolved: group for GRPO's group baseline, batch otherwise."""
    if cfg.std_scaling != "auto":
        return cfg.std_scaling
    return "group" if cfg.advantage == "grpo" and cfg.baseline == "group" else "batch"


@dataclass(frozen=True)
class Scored:
    """What the advantages are formed from, handed over by the rollout: n completions' rewards [n] (float64),
    validity [n] and tasks [n], their completion and loss masks [n, N], and the log-prob passes the objective asked
    for [n, N] (None where not made); `kl_scale` [n, N] multiplies beta token by token (`kl_scale`), None for 1
    everywhere."""

    rewards: torch.Tensor
    valid: torch.Tensor
    tasks: np.ndarray
    completion_mask: torch.Tensor
    loss_mask: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    kl_scale: torch.Tensor | None = None


@dataclass(frozen=True)
class Passes:
    """The log-prob passes a rollout runs, decided once with the objective.

    reference: the reference's log-probs of the completions, once per rollout (the exact KL needs them for every
        token of the vocabulary, so it runs the reference in the update instead).
    several_updates: the policy takes more than one optimizer step per rollout, so the importance ratio's
        denominator is the sampling policy's log-probs. Otherwise it is the update's own pass, detached: a second
        pass's rounding (a GPU's) would read as a ratio away from 1.
    sampler: the sampling policy's log-probs (and the critic's values), once per rollout: the importance ratio's
        denominator when the policy moves within a step, k1's penalty, and GAE's values.
    """

    reference: bool
    several_updates: bool
    sampler: bool


@dataclass(frozen=True)
class ObjectiveSettings(Slice):
    """The settings the objective reads, and no other (`ObjectiveSettings.of(cfg)` from a `TrainConfig`)."""

    beta: float
    beta_warmup_steps: int
    kl_estimator: str
    kl_direction: str
    kl_target: float | None
    kl_horizon: int
    a_beta_scale: float
    a_advantage_scale: float
    advantage: str
    baseline: str
    std_scaling: str
    ema_decay: float
    gamma: float
    gae_lambda: float
    group_size: int
    mask_truncated: bool
    drop_zero_spread: bool
    clip_low: float
    clip_high: float
    entropy_coef: float
    a_likelihood_weight: float
    value_clip: float
    vf_coef: float
    loss_aggregation: str
    max_new_tokens: int
    mu: int
    minibatches: int


class Objective:
    """What a GRPO step optimises, from a `TrainConfig` (of which it keeps its `ObjectiveSettings`).
    ``reference_given``: the caller brought a frozen reference (otherwise one is loaded when beta > 0). Its state,
    beta and the EMA baselines, goes into every checkpoint (`state()`)."""

    def __init__(self, cfg, *, reference_given: bool = False):
        self.settings = cfg = ObjectiveSettings.of(cfg)
        #: A frozen reference is there, so the KL to it is measured (and, with beta > 0, penalised).
        self.measures_kl = reference_given or cfg.beta > 0
        #: The exact KL runs the reference inside the update's pass, over the whole vocabulary.
        self.exact_kl = self.measures_kl and cfg.kl_estimator == "full"
        #: The per-token KL estimate of sampled tokens (`formulas.SAMPLED_KL`; None: the exact KL, over the vocabulary)
        self.sampled_kl = formulas.SAMPLED_KL.get(cfg.kl_estimator)
        self.kl_weights = KL_DIRECTIONS[cfg.kl_direction]
        # As a loss term k1's gradient is zero in expectation: it enters as a per-token reward instead.
        self.kl_in_advantages = self.measures_kl and cfg.kl_estimator == "k1" and cfg.beta > 0
        self.kl_in_loss = self.measures_kl and cfg.kl_estimator != "k1"
        #: GAE: a value head on the policy's trunk, trained beside it.
        self.critic = cfg.advantage == "gae"
        self.std_scaling = std_scaling(cfg)
        #: The weight of A:'s exact targets' NLL beside the GRPO loss (0: no likelihood pass; `grpo.likelihood`).
        self.a_likelihood_weight = cfg.a_likelihood_weight
        #: beta before warm-up, moved by the --kl-target controller.
        self.beta = cfg.beta
        #: beta in the current step (`begin_step`): what the advantages' and the loss's KL terms weigh by.
        self.step_beta = self.beta_at(0)
        #: --baseline ema: each task's moving average reward, by task name.
        self.baselines: dict[str, float] = {}
        several = cfg.mu > 1 or cfg.minibatches > 1
        self.passes = Passes(reference=self.measures_kl and not self.exact_kl, several_updates=several,
                             sampler=several or self.kl_in_advantages or self.critic)

    def state(self) -> dict[str, Any]:
        return {"beta": self.beta, "baselines": dict(self.baselines)}

    def load_state(self, state: dict[str, Any]) -> None:
        self.beta = state.get("beta", self.settings.beta)
        self.baselines = dict(state.get("baselines", {}))

    # -- beta ----------------------------------------------------------------------------------------------------

    def begin_step(self, step: int) -> None:
        """Fixes beta for step `step`: its rollout and every epoch of its update use the same one."""
        self.step_beta = self.beta_at(step)

    def beta_at(self, step: int) -> float:
        """beta in step `step` (from 0): ramped up linearly over --beta-warmup-steps."""
        if self.settings.beta_warmup_steps:
            return self.beta * min(1.0, (step + 1) / self.settings.beta_warmup_steps)
        return self.beta

    def observe_kl(self, kl: float | None) -> None:
        """Proportional control toward --kl-target (Ziegler et al.): beta grows when the KL overshoots, shrinks
        below it. A step that measured no KL is no evidence to move beta on."""
        if self.settings.kl_target is None or kl is None:
            return
        error = max(-0.2, min(0.2, kl / self.settings.kl_target - 1.0))
        self.beta = max(1e-6, self.beta * (1.0 + error / self.settings.kl_horizon))

    # -- advantages ----------------------------------------------------------------------------------------------

    def loss_mask(self, completion_mask: torch.Tensor, valid: torch.Tensor, stopped: torch.Tensor,
                  rewards: torch.Tensor) -> torch.Tensor:
        """The completion tokens [n, N] the loss counts: none of a group without ground truth (`valid` [n]), and
        per the options none of a completion cut off at its limit (`stopped` [n]: it ended with EOS) or of a group
        whose `rewards` [n] do not vary."""
        mask = completion_mask & valid.unsqueeze(1)
        if self.settings.mask_truncated:
            mask &= stopped.unsqueeze(1)
        if self.settings.drop_zero_spread:
            mask &= formulas.group_has_spread(rewards, self.settings.group_size).unsqueeze(1)
        return mask

    def kl_scale(self, tasks: np.ndarray, width: int, device: torch.device) -> torch.Tensor | None:
        """Each completion token's KL weight as a multiple of beta [n, width]: --a-beta-scale on A: rows, 1 on the
        others; None when every row's is 1 (nothing to multiply)."""
        if self.settings.a_beta_scale == 1.0 or not self.measures_kl:
            return None
        rows = torch.from_numpy(np.where(np.asarray(tasks) == "A", self.settings.a_beta_scale, 1.0)).float()
        return rows.to(device)[:, None].expand(-1, width)

    def advantages(self, r: Scored, comm: Comm) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
        """Per-token advantages [n, N], the value targets (GAE; else None) and the baselines' metrics, from what the
        rollout hands over (`Scored`).

        k1's KL is a per-token reward -beta k1 (the sampling policy's log-probs against the reference's): its
        return-to-go is subtracted from GRPO's advantages, or enters GAE with the task reward (PPO-RLHF)."""
        cm = r.completion_mask.float()
        penalty = None
        if self.kl_in_advantages:
            penalty = self.step_beta * formulas.kl_k1(r.old_logprobs, r.ref_logprobs) * cm
        if penalty is not None and r.kl_scale is not None:
            penalty = penalty * r.kl_scale
        if self.critic:
            return *self._gae(r.rewards, cm, r.loss_mask, penalty, r.old_values, comm), {}
        advantages, info = self._completion_advantages(r.rewards, r.valid, r.tasks, comm)
        if self.settings.a_advantage_scale != 1.0:
            env = torch.from_numpy(np.asarray(r.tasks) == "A").to(advantages.device)
            advantages = torch.where(env, advantages * self.settings.a_advantage_scale, advantages)
        per_token = advantages[:, None] * cm
        return (per_token if penalty is None else per_token - formulas.penalty_to_go(penalty, cm)), None, info

    def _completion_advantages(self, rewards: torch.Tensor, valid: torch.Tensor, tasks: np.ndarray, comm: Comm
                               ) -> tuple[torch.Tensor, dict[str, float]]:
        """GRPO's per-completion advantages [n]; the batch std and the EMA baselines span every rank. The EMA
        baseline is the average of earlier steps (a first step has only its own mean), so it does not depend on
        this step's samples; this step's mean updates it afterwards."""
        G = self.settings.group_size
        std = None
        if self.std_scaling == "group":
            std = formulas.group_std(rewards, G)
        elif self.std_scaling == "batch":
            std = math.sqrt(comm.moments(rewards, valid)[2])
        if self.settings.baseline == "group":
            return formulas.group_advantages(rewards, G, std=std), {}
        keys = np.array([t if t in ("P", "A") else "other" for t in tasks])
        baseline = torch.zeros_like(rewards, dtype=torch.float64)
        info = {}
        for key in ("P", "A", "other"):
            rows = torch.from_numpy(keys == key).to(rewards.device) & valid
            n, total = comm.sum([float(rows.sum()), float(rewards[rows].double().sum())])
            if n == 0:
                continue
            value = self.baselines.get(key, total / n)
            baseline[rows] = value
            info[f"baseline/{key}"] = value
            self.baselines[key] = formulas.ema(self.baselines.get(key), total / n, self.settings.ema_decay)
        return formulas.group_advantages(rewards, G, baseline=baseline, std=std), info

    def _gae(self, rewards: torch.Tensor, cm: torch.Tensor, loss_mask: torch.Tensor, penalty: torch.Tensor | None,
             old_values: torch.Tensor, comm: Comm) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE over each completion's tokens, the task reward coming with its last token; with batch scaling,
        whitened over every rank's counted tokens (PPO)."""
        token_rewards = torch.zeros_like(cm)
        last = cm.sum(1).long().clamp(min=1) - 1
        token_rewards[torch.arange(len(last), device=cm.device), last] = rewards.float()
        if penalty is not None:
            token_rewards = token_rewards - penalty
        s = self.settings
        per_token, returns = formulas.gae(token_rewards * cm, old_values, cm, s.gamma, s.gae_lambda)
        if self.std_scaling == "batch":
            _, mean, var = comm.moments(per_token, loss_mask)
            per_token = (per_token - mean) / (math.sqrt(var) + 1e-6) * cm
        return per_token, returns

    # -- the loss (its tokens' terms: `grpo.loss.GRPOLoss`) ---------------------------------------------------

    def value_loss(self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """The critic's term of each token's loss (weighted by --vf-coef), and its clipped value loss."""
        v_loss = formulas.value_loss(values, old_values, returns, self.settings.value_clip)
        return self.settings.vf_coef * v_loss, v_loss

    def weights(self, mask: torch.Tensor, totals: Totals) -> torch.Tensor:
        """Each token's weight in its minibatch's loss [b, W], 0 off the mask: with the minibatch's counts, the
        micro-batches' weighted sums add up to the minibatch's aggregated loss."""
        how = self.settings.loss_aggregation
        if how == "token":
            return formulas.token_weights(mask, totals.tokens)
        if how == "sequence":
            return formulas.sequence_weights(mask, totals.sequences)
        return formulas.constant_weights(mask, self.settings.max_new_tokens, totals.rows)

