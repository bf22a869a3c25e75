"""The vocabulary pass of a loss: the lm_head and the log-softmax over chunks of positions, the loss of each
position (a `TokenLoss`), and the loss's gradients w.r.t. the hidden states and the head's weight, all in one
forward. No logits are kept for the backward, none recomputed: once a chunk's statistics are known, so are the
loss's derivatives w.r.t. them (autograd over [chunk] numbers), and `vocab_grad.vocab_backward` carries them
through the vocabulary by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from rookworld.net.compile_log import describe
from rookworld.net.compiling import Compiled
from rookworld.net.head import add_head_grad, head_grad_weight, head_input_grad
from rookworld.net.vocab_grad import Derivatives, vocab_backward, vocab_forward


@dataclass
class TokenTerms:
    """What a `TokenLoss` makes of a chunk's positions."""

    loss: torch.Tensor  # [c]: each position's share of the loss (differentiable in the statistics it reads)
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)  # [c] each: what the caller counts of them


class TokenLoss(Protocol):
    """A loss that sums a function of each position's log-prob, entropy and KL (GRPO's, SFT's NLL). A chunk's
    positions come as their flat indices into [B * N] (`positions`), for the caller's own per-position inputs;
    entropy and kl are None where the pass does not make them."""

    def __call__(self, logprobs: torch.Tensor, entropy: torch.Tensor | None, kl: torch.Tensor | None,
                 positions: torch.Tensor) -> TokenTerms: ...


@dataclass(frozen=True)
class NLL:
    """A `TokenLoss` of likelihood (SFT's, and GRPO's on A:'s exact targets): each counted token's negative
    log-likelihood times its weight (`weights`, flat over the micro-batch's [B * N] positions) over `normalizer`
    (what the step's loss is divided by)."""

    normalizer: float
    weights: torch.Tensor

    def __call__(self, logprobs, entropy, kl, positions) -> TokenTerms:
        return TokenTerms(-logprobs * self.weights[positions] / self.normalizer)


@dataclass(frozen=True)
class Vocab:
    """How the vocabulary pass runs: the head's weight (and the frozen reference's), the temperature, which
    statistics it makes, positions a chunk, and whether its passes over [chunk, V] are compiled."""

    weight: torch.Tensor
    ref_weight: torch.Tensor | None
    temperature: float
    entropy: bool
    kl_weights: tuple[float, float]
    chunk: int
    compile: bool


@dataclass
class Columns:
    """The fused pass's statistics of every position given, detached (entropy and KL None where not made)."""

    logprobs: list[torch.Tensor] = field(default_factory=list)
    entropy: list[torch.Tensor] = field(default_factory=list)
    kl: list[torch.Tensor] = field(default_factory=list)
    metrics: dict[str, list[torch.Tensor]] = field(default_factory=dict)

    def add(self, lp, entropy, kl, metrics: dict[str, torch.Tensor]) -> None:
        self.logprobs.append(lp)
        for part, x in ((self.entropy, entropy), (self.kl, kl)):
            if x is not None:
                part.append(x)
        for name, x in metrics.items():
            self.metrics.setdefault(name, []).append(x)


class FusedHead(torch.autograd.Function):
    """The forward computes, chunk by chunk, the statistics (into `columns`), the loss, and its gradients w.r.t.
    the hidden states and the head's weight; the backward only scales those by the upstream gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, ref_hidden, targets, positions, loss: TokenLoss, vocab: Vocab,
                columns: Columns):
        dh = torch.zeros_like(hidden)
        dw = torch.zeros(weight.shape, dtype=torch.promote_types(weight.dtype, torch.float32), device=weight.device)
        total = torch.zeros((), dtype=torch.promote_types(hidden.dtype, torch.float32), device=hidden.device)
        transposed = head_grad_weight(hidden, weight)
        for i in range(0, max(len(targets), 1), vocab.chunk):
            c = slice(i, i + vocab.chunk)
            rh = None if ref_hidden is None else ref_hidden[c]
            per_position, dz = _fused_chunk(hidden[c], targets[c], rh, positions[c], loss, vocab, columns)
            total += per_position.sum()
            dh[c] = head_input_grad(dz, weight, transposed).to(dh.dtype)
            add_head_grad(dw, dz, hidden[c], weight)
        # Kept on ctx, not saved: the one backward scales them in place and hands them on (a fresh [V, C] product
        # would be that many new pages on the CPU).
        ctx.grads = dh, dw.to(weight.dtype)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total):
        if ctx.grads is None:
            raise RuntimeError("the fused vocabulary pass gives its gradients once (retain_graph is not supported)")
        (dh, dw), ctx.grads = ctx.grads, None
        return dh.mul_(grad_total), dw.mul_(grad_total), None, None, None, None, None, None


# Eager, the passes of vocab_forward and vocab_backward over [chunk, vocab] (logsumexp, exp, gather, the
# entropy's product, the gradient's terms) cost several times the head's matmul in memory traffic on a GPU;
# compiled, they fuse into a few kernels on each side of the loss.
_FORWARD = Compiled(vocab_forward)
_BACKWARD = Compiled(vocab_backward)
describe(vocab_forward, lambda hidden, *_: f"the fused vocabulary pass's forward for {hidden.shape[0]:,} positions")
describe(vocab_backward, lambda targets, *_: f"the fused vocabulary pass's backward for {targets.shape[0]:,} "
                                             "positions")


def _fused_chunk(hidden: torch.Tensor, targets: torch.Tensor, ref_hidden: torch.Tensor | None,
                 positions: torch.Tensor, loss: TokenLoss, vocab: Vocab, columns: Columns
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk: its statistics (into `columns`), the loss of each position, and the loss's gradient w.r.t. the
    chunk's (tempered) logits [chunk, V]."""
    device_type = hidden.device.type
    lp, entropy, kl, state = _FORWARD(device_type, vocab.compile, hidden, targets, vocab.weight, vocab.temperature,
                                      vocab.entropy, ref_hidden, vocab.ref_weight, vocab.kl_weights, dynamic=True)
    terms, grads = loss_and_derivatives(loss, lp, entropy, kl, positions)
    columns.add(lp, entropy, kl, terms.metrics)
    dz = _BACKWARD(device_type, vocab.compile, targets, vocab.temperature, vocab.kl_weights, state, grads,
                   dynamic=True)
    return terms.loss, dz


def loss_and_derivatives(loss: TokenLoss, lp: torch.Tensor, entropy: torch.Tensor | None, kl: torch.Tensor | None,
                         positions: torch.Tensor) -> tuple[TokenTerms, Derivatives]:
    """The loss's terms of each position (detached), and its derivatives w.r.t. the position's log-prob, entropy
    and KL (None where the loss does not read them): autograd over [chunk] numbers, not over the vocabulary."""
    leaves = [x.detach().requires_grad_() if x is not None else None for x in (lp, entropy, kl)]
    with torch.enable_grad():
        terms = loss(*leaves, positions)
        per_position = terms.loss
        used = [x for x in leaves if x is not None]
        grads = iter(torch.autograd.grad(per_position.sum(), used, allow_unused=True) if per_position.requires_grad
                     else [None] * len(used))
    g_lp, g_ent, g_kl = (next(grads) if x is not None else None for x in leaves)
    if g_lp is None:
        g_lp = torch.zeros_like(lp)
    metrics = {name: x.detach() for name, x in terms.metrics.items()}
    return TokenTerms(per_position.detach(), metrics), Derivatives(g_lp, g_ent, g_kl)
