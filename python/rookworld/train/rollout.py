"""A GRPO rollout: G completions per prompt, their rewards and advantages, and the log-probs the update needs.

`collect_rollout` is steps 1-3 of a GRPO step: sample, score and compare, then run the frozen reference (and,
when the policy moves within a step, the sampling policy) over the completions once.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from rookworld.policy.sampling import GenerationOutput
from rookworld.train import grpo
from rookworld.train.distributed import Comm
from rookworld.train.models import Models, micro_batches
from rookworld.train.prompts import Prompt


@dataclass(frozen=True)
class RewardResult:
    rewards: np.ndarray  # [N] float
    tasks: np.ndarray  # [N] str
    well_formed: np.ndarray  # [N] bool
    #: [N] bool: False where no ground truth could be had (the sample is left out of the update).
    valid: np.ndarray | None = None


class RewardFn(Protocol):
    def prefetch(self, prompts: Sequence[Prompt]) -> None: ...

    def __call__(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> RewardResult: ...


class ChessReward:
    """The verifiable chess rewards: Stockfish for P:, the rules for A: (`rookworld.rewards`)."""

    def __init__(self, scorer):
        self.scorer = scorer

    def prefetch(self, prompts: Sequence[Prompt]) -> None:
        texts = [p.text for p in prompts if p.task == "P" and p.truth is None]
        if texts:
            self.scorer.prefetch(texts)

    def __call__(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> RewardResult:
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
        tasks = np.array([p.task for p in prompts])
        well_formed = np.zeros(len(prompts), dtype=bool)
        keep = np.flatnonzero(valid)
        batch = self.scorer.score_batch([texts[i] for i in keep], [completions[i] for i in keep],
                                        ground_truth=[truth[i] for i in keep])
        rewards[keep], well_formed[keep] = batch.rewards, batch.well_formed
        return RewardResult(rewards, tasks, well_formed, valid)


@dataclass
class Rollout:
    """One step's samples and everything the update and the metrics read of them. Rows are completions,
    G consecutive rows per prompt; token tensors are [rows, prompt width + completion width]."""

    prompts: list[Prompt]
    tasks: np.ndarray  # [n] task of each row
    completions: list[str]
    scored: RewardResult
    valid: np.ndarray  # [n] bool: the row's prompt had ground truth
    out: GenerationOutput
    ids: torch.Tensor  # [n, P + N] left-padded prompt, then completion
    mask: torch.Tensor
    prompt_width: int  # P
    prompt_lens: np.ndarray  # [n] real prompt tokens
    completion_lens: np.ndarray  # [n]
    rewards: torch.Tensor  # [n] float64
    spread: torch.Tensor  # [n] bool: the row's group has reward spread
    loss_mask: torch.Tensor  # [n, N] bool: tokens the loss counts
    advantages: torch.Tensor  # [n, N] per token
    returns: torch.Tensor | None  # [n, N] value targets (GAE)
    ref_logprobs: torch.Tensor | None  # [n, N] (None with the exact KL, which runs the reference in the update)
    old_logprobs: torch.Tensor | None  # [n, N] sampling policy, when the policy moves within a step
    old_values: torch.Tensor | None  # [n, N] (GAE)
    beta: float
    info: dict[str, Any] = field(default_factory=dict)  # metrics of the rollout itself (baselines)
    times: dict[str, float] = field(default_factory=dict)

    def micro_batches(self, rows: np.ndarray, size: int):
        return micro_batches(rows, self.prompt_lens, self.completion_lens, self.prompt_width, size)


def seed_of(*parts: int) -> int:
    return random.Random(":".join(map(str, parts))).getrandbits(63)


def collect_rollout(cfg, models: Models, comm: Comm, tokenizer, reward_fn: RewardFn, prompts: list[Prompt], *,
                    step: int, beta: float, baselines: dict[str, float], log,
                    completion_lengths: dict[str, int] | None = None) -> Rollout:
    G, device = cfg.group_size, models.device
    t0 = time.perf_counter()
    # 1. Sample G completions per prompt.
    ids, pmask = tokenizer.encode_batch([p.text for p in prompts], bos=True, device=device)
    ids, pmask = ids.repeat_interleave(G, 0), pmask.repeat_interleave(G, 0)
    gen = torch.Generator(device=device).manual_seed(seed_of(cfg.seed, step, comm.info.rank))
    prompt_lens = pmask.sum(1).cpu().numpy()
    tasks = np.repeat([p.task for p in prompts], G)
    out = models.sample(ids, pmask, prompt_lens, tasks, gen, cfg, completion_lengths)
    _sync(device)
    t_gen = time.perf_counter()

    # 2. Rewards and advantages.
    completions = tokenizer.decode_batch(out.tokens, out.mask)
    scored = reward_fn([p for p in prompts for _ in range(G)], completions)
    rewards = torch.tensor(np.asarray(scored.rewards, dtype=np.float64), device=device)
    valid = np.ones(len(completions), dtype=bool) if scored.valid is None else np.asarray(scored.valid, bool)
    valid_t = torch.from_numpy(valid).to(device)
    spread = grpo.group_has_spread(rewards, G)
    loss_mask = out.mask & valid_t.unsqueeze(1)  # a group without ground truth: no loss
    if not valid.all():
        log.warn("unscored", step + 1, f"{int((~valid).sum()) // G} prompt(s) could not be scored (Stockfish "
                                       "failed after retries) and were left out of this step")
    if cfg.mask_truncated:
        loss_mask &= out.stopped.unsqueeze(1)
    if cfg.drop_zero_spread:
        loss_mask &= spread.unsqueeze(1)
    advantages, info = None, {}
    if cfg.advantage == "grpo":
        advantages, info = completion_advantages(cfg, comm, rewards, valid_t, tasks, baselines)
    t_reward = time.perf_counter()

    # 3. Reference and sampling-policy log-probs (and values), once per rollout.
    full_ids, full_mask = torch.cat([ids, out.tokens], dim=1), torch.cat([pmask, out.mask], dim=1)
    P, completion_lens = ids.shape[1], out.lengths.cpu().numpy()
    batches = micro_batches(np.arange(len(completions)), prompt_lens, completion_lens, P, cfg.micro_batch_size)
    exact_kl = cfg.kl_estimator == "full"
    ref_lp = old_lp = old_values = None
    if models.reference is not None and not exact_kl:
        ref_lp, _ = models.rollout_scores(models.reference, full_ids, full_mask, P, batches, cfg.temperature)
    k1_penalty = cfg.kl_estimator == "k1" and beta > 0 and ref_lp is not None
    if cfg.mu > 1 or cfg.minibatches > 1 or k1_penalty or models.value_head is not None:
        old_lp, old_values = models.rollout_scores(models.policy, full_ids, full_mask, P, batches, cfg.temperature,
                                                   values=models.value_head is not None)
    with torch.no_grad():
        token_adv, returns = token_advantages(cfg, comm, advantages, rewards, out, loss_mask, beta, ref_lp, old_lp,
                                              old_values)
    _sync(device)
    times = {"generate": t_gen - t0, "reward": t_reward - t_gen, "reference": time.perf_counter() - t_reward}
    return Rollout(prompts, tasks, completions, scored, valid, out, full_ids, full_mask, P, prompt_lens,
                   completion_lens, rewards, spread, loss_mask, token_adv, returns, ref_lp, old_lp, old_values, beta,
                   info, times)


def completion_advantages(cfg, comm: Comm, rewards: torch.Tensor, valid: torch.Tensor, tasks: np.ndarray,
                          baselines: dict[str, float]) -> tuple[torch.Tensor, dict[str, Any]]:
    """GRPO's per-completion advantages [n] (the batch std and the EMA baselines span every rank). With
    `--baseline ema`, `baselines` ({task: average}) is read, then updated with this step's means."""
    scale = cfg.advantage_scaling
    batch_std = math.sqrt(comm.moments(rewards, valid)[2]) if scale == "batch" else None
    if cfg.baseline == "group":
        return grpo.group_advantages(rewards, cfg.group_size, scale, batch_std=batch_std), {}
    keys = np.array([t if t in ("P", "A") else "other" for t in tasks])
    baseline = torch.zeros_like(rewards, dtype=torch.float64)
    info = {}
    for key in ("P", "A", "other"):
        rows = torch.from_numpy(keys == key).to(rewards.device) & valid
        n, total = comm.sum([float(rows.sum()), float(rewards[rows].double().sum())])
        if n == 0:
            continue
        # The baseline is the average of earlier steps (a first step has only its own mean), so it does not
        # depend on this step's samples; this step's mean updates it afterwards.
        value = baselines.get(key, total / n)
        baseline[rows] = value
        info[f"baseline/{key}"] = value
        baselines[key] = grpo.ema(baselines.get(key), total / n, cfg.ema_decay)
    return grpo.group_advantages(rewards, cfg.group_size, scale, baseline=baseline, batch_std=batch_std), info


def token_advantages(cfg, comm: Comm, advantages: torch.Tensor | None, rewards: torch.Tensor, out: GenerationOutput,
                     loss_mask: torch.Tensor, beta: float, ref_lp: torch.Tensor | None, old_lp: torch.Tensor | None,
                     old_values: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token advantages [n, N] and, for GAE, the value targets.

    k1's KL is a per-token reward -beta k1 (the sampling policy's log-probs against the reference's): its
    return-to-go is subtracted from GRPO's advantages, or enters GAE with the task reward (PPO-RLHF)."""
    cm = out.mask.float()
    penalty = None
    if cfg.kl_estimator == "k1" and beta > 0 and ref_lp is not None:
        penalty = beta * grpo.kl_estimate(old_lp, ref_lp, "k1") * cm
    if cfg.advantage == "grpo":
        per_token = advantages[:, None] * cm
        return (per_token if penalty is None else per_token - grpo.penalty_to_go(penalty, cm)), None
    token_rewards = torch.zeros_like(cm)
    lengths = out.lengths.clamp(min=1)
    token_rewards[torch.arange(len(lengths), device=cm.device), lengths - 1] = rewards.float()
    if penalty is not None:
        token_rewards = token_rewards - penalty
    per_token, returns = grpo.gae(token_rewards * cm, old_values, cm, cfg.gamma, cfg.gae_lambda)
    if cfg.advantage_scaling == "batch":  # PPO's whitening, over every rank's tokens
        _, mean, var = comm.moments(per_token, loss_mask)
        per_token = (per_token - mean) / (math.sqrt(var) + 1e-6) * cm
    return per_token, returns


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
