"""The vocabulary pass's numbers for one chunk of positions, forward and backward by hand: each position's
log-prob, entropy and KL to the reference, and the gradient w.r.t. the chunk's logits of a loss whose derivatives
w.r.t. those three are given. `rookworld.net.fused_head` runs them on each side of the loss; tests/test_vocab_grad.py
holds the backward to autograd's in float64.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rookworld.net.head import head_logits


class VocabState(NamedTuple):
    """What the backward needs of a chunk's forward, each over [chunk, V] unless said."""

    logp: torch.Tensor  # the tempered log-softmax
    p: torch.Tensor  # its exp
    logq: torch.Tensor | None  # the reference's tempered log-softmax (with a reference)
    q: torch.Tensor | None  # its exp (the reverse KL only)
    entropy: torch.Tensor | None  # [chunk] (when asked)
    kl_f: torch.Tensor | None  # [chunk]: the forward KL (with its weight above 0)


class Derivatives(NamedTuple):
    """A loss's derivatives w.r.t. each position's log-prob, entropy and KL [chunk]; None where it reads none."""

    lp: torch.Tensor
    entropy: torch.Tensor | None
    kl: torch.Tensor | None


def tempered_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """The lm_head's logits over the temperature, float32 (`head_logits`)."""
    z = head_logits(hidden, weight)
    return z / temperature if temperature != 1.0 else z


def vocab_forward(hidden, targets, weight, temperature, with_entropy, ref_hidden, ref_weight, kl_weights):
    """A chunk's log-prob, entropy and KL [chunk] (None where not asked), and its `VocabState`. The one definition
    of the entropy and the KL: the pass without a loss takes them from here too (`logprobs._chunk_logprobs`).
    KL = w_f KL(policy || reference) + w_r KL(reference || policy) for `kl_weights` (w_f, w_r); a term of weight 0
    is not computed."""
    w_f, w_r = kl_weights
    z = tempered_logits(hidden, weight, temperature)
    logp = z - z.logsumexp(-1, keepdim=True)
    p = logp.exp()
    lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(p * logp).sum(-1) if with_entropy else None
    kl = logq = q = kl_f = None
    if ref_hidden is not None:
        logq = tempered_logits(ref_hidden, ref_weight, temperature).log_softmax(-1)
        kl = torch.zeros_like(lp)
        if w_f:
            kl_f = (p * (logp - logq)).sum(-1)
            kl = kl + w_f * kl_f
        if w_r:
            q = logq.exp()
            kl = kl + w_r * (q * (logq - logp)).sum(-1)
    return lp, entropy, kl, VocabState(logp, p, logq, q, entropy, kl_f)


def vocab_backward(targets: torch.Tensor, temperature: float, kl_weights: tuple[float, float], state: VocabState,
                   grads: Derivatives) -> torch.Tensor:
    """The gradient w.r.t. the chunk's logits [chunk, V] of a loss whose derivatives w.r.t. each position's
    log-prob, entropy and KL are `grads` (the head's own gradients are this through its weight and hidden states).
    With z the tempered logits: d log p_y / dz = e_y - p; dH/dz = -p (log p + H);
    dKL_f/dz = p (log p - log q - KL_f); dKL_r/dz = p - q."""
    w_f, w_r = kl_weights
    coef = grads.lp.unsqueeze(-1)
    if grads.entropy is not None:
        coef = coef + grads.entropy.unsqueeze(-1) * (state.logp + state.entropy.unsqueeze(-1))
    if grads.kl is not None and w_f:
        coef = coef - (grads.kl * w_f).unsqueeze(-1) * (state.logp - state.logq - state.kl_f.unsqueeze(-1))
    dz = -state.p * coef
    if grads.kl is not None and w_r:
        dz = dz + (grads.kl * w_r).unsqueeze(-1) * (state.p - state.q)
    dz = dz.scatter_add(-1, targets.unsqueeze(-1), grads.lp.unsqueeze(-1))
    return dz / temperature if temperature != 1.0 else dz
