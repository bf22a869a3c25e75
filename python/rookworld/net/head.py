"""The lm_head over the vocabulary, in three parts, each building on the one before:

- its numerics: logits in float32 whatever the compute dtype, and the gradients of its weight and input;
- one chunk of positions by hand: each position's log-prob, entropy and KL, and their gradient with respect to the
  logits (tests/test_vocab_grad.py holds it against autograd in float64);
- the vocabulary pass of a loss (`FusedHead`): the lm_head and the log-softmax over chunks of positions, the loss of
  each token and its gradients made in one forward, so that no chunk's logits are kept for the backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F

from rookworld.net.compile_log import describe
from rookworld.net.compiling import Compiled
from rookworld.net.model import inner_product, linear, uses_onednn


# -- the lm_head's numerics --------------------------------------------------------------------------------------

def head_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The lm_head's logits [..., V] in float32. Under autocast (or with 16-bit weights) the inputs are rounded to
    the 16-bit type, as autocast's matmul rounds them, but the products are summed and returned in float32: rounded
    to bf16, GPT-2's logits of -50 to -100 would lose 0.1-0.3 each, which the log-softmax keeps."""
    device_type = hidden.device.type
    dtype = _head_dtype(hidden, weight)
    if dtype not in (torch.bfloat16, torch.float16):
        if uses_onednn(hidden, weight):
            return linear(hidden, weight)
        if device_type == "cpu" and hidden.dim() == 2:
            # MKL makes [V, C] x [C, rows] faster than [rows, C] x [C, V] at GPT-2's shapes (BENCHMARKS.md); the
            # copy that transposes it back costs less than a log-softmax and a draw over the strided view.
            logits = torch.mm(weight, hidden.t()).t().contiguous()
        else:
            logits = F.linear(hidden, weight)
        return logits if logits.dtype == torch.float64 else logits.float()
    h, w = hidden.to(dtype), weight.to(dtype)
    with torch.autocast(device_type, enabled=False):
        if device_type == "cuda" and not (torch.is_grad_enabled() and (h.requires_grad or w.requires_grad)):
            # bf16 tensor cores, fp32 out (no autograd formula is needed where nothing wants a gradient).
            return torch.mm(h.reshape(-1, h.shape[-1]), w.t(), torch.float32).view(*h.shape[:-1], w.shape[0])
        return F.linear(h.float(), w.float())  # the rounded inputs' products are exact in float32


def head_grad_weight(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """The lm_head's weight laid out for `head_input_grad` over many chunks of `hidden`: transposed in memory
    where oneDNN makes the products (faster than torch.mm by the weight as it is; the copy is made once for all
    chunks), else None."""
    return weight.detach().t().contiguous() if uses_onednn(hidden, weight) else None


def head_input_grad(dz: torch.Tensor, weight: torch.Tensor, transposed: torch.Tensor | None = None) -> torch.Tensor:
    """dz @ W: the gradient w.r.t. a chunk's hidden states [rows, C] of the loss's gradient w.r.t. its logits dz
    [rows, V], rounded as `head_logits` rounds. `transposed`: `head_grad_weight`'s layout of W, if made."""
    if _head_dtype(dz, weight) in (torch.bfloat16, torch.float16):
        return head_logits(dz, weight.t())
    if transposed is not None:
        return inner_product(dz.contiguous(), transposed, None)
    return torch.mm(dz, weight)


def add_head_grad(grad: torch.Tensor, dz: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor) -> None:
    """grad += dz^T @ hidden: a chunk's share of the lm_head weight's gradient [V, C] (float32), rounded as
    `head_logits` rounds. In float32, accumulated in place: a fresh [V, C] product a chunk would be new pages
    for GPT-2 (the allocator maps blocks that large afresh), which took longer than the product itself on the CPU."""
    if _head_dtype(hidden, weight) in (torch.bfloat16, torch.float16):
        grad += head_logits(dz.t(), hidden.t())
    else:
        grad.addmm_(dz.t().to(grad.dtype), hidden.to(grad.dtype))


def _head_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    device_type = hidden.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else weight.dtype


# -- one chunk of positions, forward and backward by hand --------------------------------------------------------

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


# -- the vocabulary pass of a loss -------------------------------------------------------------------------------

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
