"""The GRPO objective, as pure tensor functions (no model, no I/O), so each piece is testable by hand.

Shapes: rewards and advantages are per completion [N]; log-probs, masks and losses per token [N, T].
"""

from __future__ import annotations

import torch

STD_SCALINGS = ("group", "batch", "none")
KL_ESTIMATORS = ("k1", "k2", "k3")
AGGREGATIONS = ("token", "sequence", "constant")


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-6) -> torch.Tensor:
    """Reward minus its group's mean, divided by the group's std (``group``), the whole batch's std
    (``batch``) or nothing (``none``, Dr. GRPO). Completions of one prompt are consecutive."""
    if scale not in STD_SCALINGS:
        raise ValueError(f"std scaling must be one of {STD_SCALINGS}, got {scale!r}")
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    groups = rewards.float().view(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    if scale == "group":
        # A group whose rewards do not vary has std 0 and advantages exactly 0.
        centred = centred / (groups.std(dim=1, keepdim=True, unbiased=False) + eps)
    elif scale == "batch":
        centred = centred / (rewards.float().std(unbiased=False) + eps)
    return centred.view(-1)


def group_has_spread(rewards: torch.Tensor, group_size: int, tol: float = 1e-9) -> torch.Tensor:
    """Per completion: whether its group's rewards differ at all (a group without spread teaches nothing)."""
    groups = rewards.float().view(-1, group_size)
    spread = (groups.max(dim=1).values - groups.min(dim=1).values) > tol
    return spread.repeat_interleave(group_size)


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from samples of the policy (Schulman's k1, k2, k3).

    With r = ref - policy log-probs: k1 = -r (unbiased, can be negative), k2 = r^2 / 2, k3 = e^r - 1 - r
    (unbiased and never negative).
    """
    r = ref_logprobs - logprobs
    if estimator == "k1":
        return -r
    if estimator == "k2":
        return 0.5 * r * r
    if estimator == "k3":
        # Clamped so a token the reference finds impossible cannot overflow the exponential.
        return torch.exp(r.clamp(max=20.0)) - 1.0 - r
    raise ValueError(f"KL estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


def clipped_surrogate(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                      clip_low: float = 0.2, clip_high: float = 0.28) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token policy-gradient loss -min(rho A, clip(rho, 1 - low, 1 + high) A) and whether each token
    was clipped. A higher upper bound (clip-higher, DAPO) lets unlikely tokens with positive advantage grow."""
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
    ``total_sequences`` so that the micro-batch losses add up to the minibatch loss.
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
