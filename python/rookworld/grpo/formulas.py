"""The GRPO objective's formulas, as pure tensor functions (no model, no I/O, no option names), so each piece
is testable by hand. Which of them a run uses, and with which settings, is decided in `objective`.

Shapes: rewards are per completion [N]; log-probs, masks, advantages, values and losses per token [N, T].
Completions of one prompt are consecutive (a group). Which gradient each KL estimator gives is worked out in
docs/training.md ("The KL leash"); the tests check it exactly on a small vocabulary.
"""

from __future__ import annotations

import math

import torch

#: Rewards closer than this are equal: a group whose rewards all lie within it has no spread. The scorer's
#: rewards are sums of a few weighted terms in [-0.3, 1]; differences below this are rounding, not signal.
SPREAD_TOL = 1e-6


def group_has_spread(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Per completion: whether its group's rewards differ by more than `SPREAD_TOL` (a group without spread teaches
    nothing)."""
    groups = rewards.double().view(-1, group_size)
    spread = (groups.max(dim=1).values - groups.min(dim=1).values) > SPREAD_TOL
    return spread.repeat_interleave(group_size)


def group_std(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Each group's (population) std [groups, 1], in float64."""
    return rewards.double().view(-1, group_size).std(dim=1, keepdim=True, unbiased=False)


def group_advantages(rewards: torch.Tensor, group_size: int, *, baseline: torch.Tensor | None = None,
                     std: torch.Tensor | float | None = None, eps: float = 1e-6) -> torch.Tensor:
    """Per-completion advantages [N]: reward minus a baseline, divided by ``std + eps`` when a std is given.

    The baseline is the group's mean (GRPO) or, when given, ``baseline`` [N] (e.g. a running mean of each
    task's reward). ``std`` is one number (the batch's) or one per group [groups, 1] (`group_std`). With the
    group mean, a group without spread gets exactly zero: in float32 its mean can differ from its equal rewards
    by ~1e-8, and divided by a std that is as tiny that becomes random-sign noise of order 0.1.
    """
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.double()
    groups = r.view(-1, group_size)
    if baseline is None:
        spread = group_has_spread(r, group_size).view(-1, group_size)
        centred = torch.where(spread, groups - groups.mean(dim=1, keepdim=True), 0.0)
    else:
        centred = (r - baseline.double().view(-1)).view(-1, group_size)
    if std is not None:
        centred = centred / (std + eps)
    return centred.view(-1).float()


def ema(previous: float | None, value: float, decay: float) -> float:
    """Exponential moving average; the first value starts it."""
    return value if previous is None else decay * previous + (1.0 - decay) * value


def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k1 per token, log pi - log ref: an unbiased estimate of KL(policy || reference) from samples of
    the policy, which can be negative. As a loss term its gradient is zero in expectation, which is why the
    objective folds it into the advantages instead (`penalty_to_go`)."""
    return logprobs - ref_logprobs


def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k2 per token, r^2 / 2 with r = log ref - log pi: as a loss term, the gradient of
    KL(policy || reference)."""
    r = ref_logprobs - logprobs
    return 0.5 * r * r


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 per token, e^r - 1 - r with r = log ref - log pi: unbiased for KL(policy || reference) and
    never negative; as a loss term, the gradient of KL(reference || policy)."""
    r = ref_logprobs - logprobs
    return _exp_linear_above(r, K3_EXP_LIMIT) - 1.0 - r


#: Past r = this, k3's e^r continues as its tangent: a padded position or a token the policy made ~e^20 times
#: less likely than the reference then costs a large finite value, never inf (inf x a mask of 0 is NaN).
K3_EXP_LIMIT = 20.0


#: The KL estimators of sampled tokens by --kl-estimator's name ("full", the exact KL, is `net.head`'s).
SAMPLED_KL = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def _exp_linear_above(r: torch.Tensor, limit: float) -> torch.Tensor:
    """e^r up to `limit`, e^limit (1 + r - limit) beyond: finite, and its gradient keeps e^r's sign (a clamp's
    would be 0, turning k3's gradient from about -e^20 into +1 and pushing such a token further down)."""
    # e^limit as a constant past the limit: clamp's gradient at r == limit is 1 on some torch versions (2.11) and 0
    # on others, and through `e` it would double the slope there.
    return torch.where(r >= limit, math.exp(limit) * (1.0 + (r - limit)), torch.exp(r.clamp(max=limit)))


def penalty_to_go(penalty: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum over t' >= t of penalty[:, t'] on each row's tokens: the return, from token t on, of a per-token
    reward -penalty (undiscounted). Subtracted from the advantages of a policy gradient, beta x this makes the
    expected gradient that of beta x the sequence's KL, with k1 as the penalty (PPO-RLHF's KL-in-reward)."""
    p = penalty * mask.to(penalty.dtype)
    return p.flip(-1).cumsum(-1).flip(-1) * mask.to(penalty.dtype)


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over each row's tokens (a prefix of the row, as `mask` says).

    delta_t = r_t + gamma V_{t+1} - V_t with V = 0 after a row's last token; A_t = sum_k (gamma lam)^k delta_{t+k};
    returns (the value targets) = A + V. Returns (advantages, returns), 0 off the mask."""
    m = mask.to(values.dtype)
    r, v = token_rewards * m, values * m
    T = v.shape[-1]
    adv = torch.zeros_like(v)
    running = torch.zeros_like(v[..., 0])
    for t in reversed(range(T)):
        next_v = v[..., t + 1] if t + 1 < T else torch.zeros_like(running)
        delta = r[..., t] + gamma * next_v - v[..., t]
        running = (delta + gamma * lam * running) * m[..., t]
        adv[..., t] = running
    return adv, (adv + v) * m


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float) -> torch.Tensor:
    """Per-token clipped value loss (PPO): 0.5 max((V - R)^2, (V_old + clip(V - V_old, +-clip) - R)^2)."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)


def clipped_surrogate(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                      clip_low: float = 0.2, clip_high: float = 0.28) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token policy-gradient loss -min(rho A, clip(rho, 1 - low, 1 + high) A) and whether each token
    was clipped. A higher upper bound (clip-higher, DAPO) lets unlikely tokens with positive advantage grow.
    Advantages are per sequence [N] or per token [N, T]."""
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages.unsqueeze(-1) if advantages.dim() == logprobs.dim() - 1 else advantages
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    was_clipped = (clipped < unclipped).detach()
    return loss, was_clipped


def token_weights(mask: torch.Tensor, total_tokens: float | None = None) -> torch.Tensor:
    """DAPO's aggregation, as each token's weight: 1 / the tokens counted (``total_tokens``, the whole minibatch's
    when a minibatch is split into micro-batches), so long completions weigh more in total."""
    mask = mask if mask.is_floating_point() else mask.float()
    return mask / (total_tokens if total_tokens is not None else mask.sum().clamp(min=1.0))


def sequence_weights(mask: torch.Tensor, total_sequences: float | None = None) -> torch.Tensor:
    """GRPO's aggregation, as each token's weight: the mean, over the sequences with a counted token
    (``total_sequences`` of the minibatch), of each one's token mean. A row without one is no sequence: counting
    it would shrink the step."""
    mask = mask if mask.is_floating_point() else mask.float()
    counts = mask.sum(dim=-1, keepdim=True)
    total = total_sequences if total_sequences is not None else (counts > 0).sum().clamp(min=1)
    return mask / (counts.clamp(min=1.0) * total)


def constant_weights(mask: torch.Tensor, max_tokens: int, total_sequences: float | None = None) -> torch.Tensor:
    """Dr. GRPO's aggregation, as each token's weight: 1 / (sequences x max_tokens), free of length bias."""
    mask = mask if mask.is_floating_point() else mask.float()
    n_seq = total_sequences if total_sequences is not None else mask.shape[0]
    return mask / (n_seq * max_tokens)


def token_mean(per_token: torch.Tensor, mask: torch.Tensor, total_tokens: float | None = None) -> torch.Tensor:
    return (per_token * token_weights(mask.to(per_token.dtype), total_tokens)).sum()


def sequence_mean(per_token: torch.Tensor, mask: torch.Tensor, total_sequences: float | None = None
                  ) -> torch.Tensor:
    return (per_token * sequence_weights(mask.to(per_token.dtype), total_sequences)).sum()


def constant_mean(per_token: torch.Tensor, mask: torch.Tensor, max_tokens: int,
                  total_sequences: float | None = None) -> torch.Tensor:
    return (per_token * constant_weights(mask.to(per_token.dtype), max_tokens, total_sequences)).sum()
