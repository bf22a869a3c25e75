"""The GRPO objective, as pure tensor functions (no model, no I/O), so each piece is testable by hand.

Shapes: rewards are per completion [N]; log-probs, masks, advantages, values and losses per token [N, T].
Completions of one prompt are consecutive (a group). Which gradient each KL option gives is worked out in
the README ("The KL leash"); the tests check it exactly on a small vocabulary.
"""

from __future__ import annotations

import torch

STD_SCALINGS = ("group", "batch", "none")
BASELINES = ("group", "ema")
ADVANTAGE_ESTIMATORS = ("grpo", "gae")
KL_ESTIMATORS = ("k1", "k2", "k3", "full")
AGGREGATIONS = ("token", "sequence", "constant")

#: Rewards closer than this are equal: a group whose rewards all lie within it has no spread. The scorer's
#: rewards are sums of a few weighted terms in [-0.3, 1]; differences below this are rounding, not signal.
SPREAD_TOL = 1e-6


def group_has_spread(rewards: torch.Tensor, group_size: int, tol: float = SPREAD_TOL) -> torch.Tensor:
    """Per completion: whether its group's rewards differ at all (a group without spread teaches nothing)."""
    groups = rewards.double().view(-1, group_size)
    spread = (groups.max(dim=1).values - groups.min(dim=1).values) > tol
    return spread.repeat_interleave(group_size)


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-6, *,
                     baseline: torch.Tensor | None = None, batch_std: float | None = None) -> torch.Tensor:
    """Per-completion advantages [N]: reward minus a baseline, divided by a std.

    The baseline is the group's mean (GRPO) or, when given, ``baseline`` [N] (e.g. a running mean of each
    task's reward). The std is the group's (``group``), the whole batch's (``batch``; ``batch_std`` when the
    batch spans several ranks) or none (``none``, Dr. GRPO). With the group mean, a group without spread gets
    exactly zero: in float32 its mean can differ from its equal rewards by ~1e-8, and divided by a std that is
    as tiny that becomes random-sign noise of order 0.1.
    """
    if scale not in STD_SCALINGS:
        raise ValueError(f"std scaling must be one of {STD_SCALINGS}, got {scale!r}")
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.double()
    groups = r.view(-1, group_size)
    if baseline is None:
        spread = group_has_spread(r, group_size).view(-1, group_size)
        centred = torch.where(spread, groups - groups.mean(dim=1, keepdim=True), 0.0)
    else:
        if scale == "group":
            raise ValueError("group std scaling needs the group-mean baseline (a group without spread has std 0)")
        centred = (r - baseline.double().view(-1)).view(-1, group_size)
    if scale == "group":
        centred = centred / (groups.std(dim=1, keepdim=True, unbiased=False) + eps)
    elif scale == "batch":
        std = float(r.std(unbiased=False)) if batch_std is None else batch_std
        centred = centred / (std + eps)
    return centred.view(-1).float()


def ema(previous: float | None, value: float, decay: float) -> float:
    """Exponential moving average; the first value starts it."""
    return value if previous is None else decay * previous + (1.0 - decay) * value


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from samples of the policy (Schulman's k1, k2, k3).

    With r = ref - policy log-probs: k1 = -r (unbiased, can be negative), k2 = r^2 / 2, k3 = e^r - 1 - r
    (unbiased and never negative). As loss terms their gradients differ (README): k2's is that of
    KL(policy || reference), k3's that of KL(reference || policy), and k1's is zero in expectation, which is
    why the trainer folds k1 into the advantages instead (`penalty_to_go`).
    """
    r = ref_logprobs - logprobs
    if estimator == "k1":
        return -r
    if estimator == "k2":
        return 0.5 * r * r
    if estimator == "k3":
        # Clamped so a token the reference finds impossible cannot overflow the exponential.
        return torch.exp(r.clamp(max=20.0)) - 1.0 - r
    raise ValueError(f"sampled KL estimator must be one of k1, k2, k3, got {estimator!r}")


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


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, how: str = "token", *, max_tokens: int | None = None,
              total_tokens: float | None = None, total_sequences: float | None = None) -> torch.Tensor:
    """Reduces a per-token loss to a scalar.

    ``token`` (DAPO): sum over all tokens / their count, so long completions weigh more in total.
    ``sequence`` (GRPO): mean over sequences of each sequence's token mean.
    ``constant`` (Dr. GRPO): sum / (sequences x max_tokens), free of length bias.

    When a minibatch is split into micro-batches, pass the whole minibatch's ``total_tokens`` /
    ``total_sequences`` so that the micro-batch losses add up to the minibatch loss (under DDP, which averages
    the ranks' gradients, the global token count divided by the number of ranks).
    """
    mask = mask.to(per_token.dtype)
    masked = per_token * mask
    n_seq = total_sequences if total_sequences is not None else per_token.shape[0]
    if how == "token":
        denom = total_tokens if total_tokens is not None else mask.sum().clamp(min=1.0)
        return masked.sum() / denom
    if how == "sequence":
        per_seq = masked.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)
        return per_seq.sum() / n_seq
    if how == "constant":
        if max_tokens is None:
            raise ValueError("constant aggregation needs max_tokens")
        return masked.sum() / (n_seq * max_tokens)
    raise ValueError(f"loss aggregation must be one of {AGGREGATIONS}, got {how!r}")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)
