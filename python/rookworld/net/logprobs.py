"""The log-prob pass that the GRPO and SFT losses are built on: per-token log-probs of given sequences, and beside
them the entropy, the exact KL to a reference and a value head's estimates.

Three things keep it cheap:
- A group's prompt once. With `rows_per_prompt` G (a GRPO group when its prompt is shared), rows come in groups
  of G that share their prompt columns: the prompt goes through the trunk once per group and its G completions
  attend to its keys and values
  (`GPT.prompt_trunk`, `GPT.continue_trunk`); the backward flows into the prompt's computation once.
- One pass over the vocabulary. The lm_head and the log-softmax run on chunks of positions sized by their bytes
  (`chunk_rows`), so no [tokens, vocab] tensor exists whole. Given a `loss` that sums a function of each position's
  log-prob, entropy and KL (the GRPO and SFT losses do), the same pass also computes the loss's gradients w.r.t.
  the hidden states and the head's weight (`_FusedHead`): no logits are kept for the backward, none recomputed.
  Without one, a differentiable call checkpoints each chunk instead (backward recomputes its logits).
- Products made once. Given a `Replay` of the policy's `ProductMemo`, the trunk takes the products that sampling
  made for these tokens with these weights instead of making them again (its backward is the same).
The logits are float32 under autocast too (`head_logits`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from rookworld.net.compile_log import describe
from rookworld.net.compiling import maybe_compiled, run_or_fall_back
from rookworld.net.head import add_head_grad, head_grad_weight, head_input_grad, head_logits
from rookworld.net.memo import Replay
from rookworld.net.model import GPT

#: loss(logprobs, entropy, kl, positions) -> the loss of each position [c]: a chunk's positions are given as their
#: flat indices into [B * (T - start)]; entropy and kl are None where not computed.
TokenLoss = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor], torch.Tensor]


@dataclass
class TokenLogProbs:
    logprobs: torch.Tensor  # [B, N] float32 (detached when a loss was given)
    entropy: torch.Tensor | None = None  # [B, N] float32, if requested
    kl: torch.Tensor | None = None  # [B, N] float32: exact KL to the reference over the vocabulary, if one is given
    values: torch.Tensor | None = None  # [B, N] float32: the value head's estimate before each token, if given
    loss: torch.Tensor | None = None  # scalar: the sum of the given loss over the wanted positions, differentiable
    #: [B, N, n_embd]: the hidden state that predicts each token, differentiable (keep_hidden: for a loss of the
    #: caller's own)
    hidden: torch.Tensor | None = None


def full_kl(logp: torch.Tensor, ref_logp: torch.Tensor, weights: tuple[float, float] = (1.0, 0.0)) -> torch.Tensor:
    """Exact KL per row between two log-softmaxed distributions over the vocabulary [n, V] -> [n]:
    w_forward KL(policy || reference) + w_reverse KL(reference || policy) for weights = (w_forward, w_reverse).
    A term of weight 0 is not computed: each is a pass over [n, V]."""
    w_forward, w_reverse = weights
    if w_forward < 0 or w_reverse < 0 or w_forward + w_reverse <= 0:
        raise ValueError(f"KL weights must be >= 0 and not both 0, got {weights}")
    kl = None
    if w_forward:
        kl = w_forward * (logp.exp() * (logp - ref_logp)).sum(-1)
    if w_reverse:
        reverse = w_reverse * (ref_logp.exp() * (ref_logp - logp)).sum(-1)
        kl = reverse if kl is None else kl + reverse
    return kl


def chunk_rows(device: torch.device, vocab_size: int) -> int:
    """Positions per chunk of the vocabulary pass: each [chunk, vocab] float32 tensor about 24 MiB on the CPU,
    under glibc's 32 MiB threshold, so the allocator reuses its memory instead of mapping and page-faulting fresh
    pages for every chunk; 256 MiB on a GPU, whose caching allocator reuses any size. A multiple of 8 where it can
    be: MKL's head products are markedly slower at other row counts (BENCHMARKS.md)."""
    budget = (256 if device.type == "cuda" else 24) * 2**20
    rows = max(1, budget // (4 * vocab_size))
    return rows - rows % 8 if rows > 8 else rows


def _chunk_logprobs(hidden: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor, temperature: float,
                    with_entropy: bool, ref_hidden: torch.Tensor | None = None, ref_weight: torch.Tensor | None = None,
                    kl_weights: tuple[float, float] = (1.0, 0.0)) -> tuple[torch.Tensor, ...]:
    """(log-prob, [entropy], [KL to the reference]) of each position of one chunk."""
    logits = head_logits(hidden, weight)
    if temperature != 1.0:
        logits = logits / temperature
    log_z = logits.logsumexp(-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    out = [logp]
    if with_entropy:
        probs = (logits - log_z.unsqueeze(-1)).exp()
        out.append(log_z - (probs * logits).sum(-1))
    if ref_hidden is not None:
        ref_logits = head_logits(ref_hidden, ref_weight)
        if temperature != 1.0:
            ref_logits = ref_logits / temperature
        out.append(full_kl(logits - log_z.unsqueeze(-1), ref_logits.log_softmax(-1), kl_weights))
    return tuple(out)


# Eager, each step of _chunk_logprobs after the matmul (fp32 copy, logsumexp, gather, exp, entropy) is a pass over
# [chunk, vocab] in memory: together several times the matmul's own traffic. Compiled, they fuse into a couple of
# reductions over the logits, forward and backward.
_compiled_chunks: dict[str, Callable[..., tuple[torch.Tensor, ...]]] = {}


def _states(model: GPT, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, start: int,
            rows_per_prompt: int, replay: Replay | None = None) -> torch.Tensor:
    """The hidden state that predicts each token from `start` on [B, T - start, n_embd]: position t - 1's.
    replay: the trunk's products taken from sampling's memo (shared prompts only)."""
    if rows_per_prompt == 1:
        return model.trunk(input_ids, attention_mask)[:, start - 1 : -1]
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids, dtype=torch.bool)

    def phase(name: str):
        return replay.phase(model, name) if replay is not None else contextlib.nullcontext()

    prompt_ids, prompt_mask = input_ids[::rows_per_prompt, :start], attention_mask[::rows_per_prompt, :start]
    with phase("prompt"):
        prompt, prefix = model.prompt_trunk(prompt_ids, prompt_mask)
    with phase("completion"):
        completions = model.continue_trunk(input_ids[:, start:], attention_mask[:, start:], prefix, prompt_mask)
    # The prompt's last state predicts the first completion token (prompts are left-padded: it is a real token).
    return torch.cat([prompt[:, -1:].repeat_interleave(rows_per_prompt, 0), completions[:, :-1]], dim=1)


# Eager under bf16 autocast, the trunk's LayerNorms, GELUs, residual adds and casts each read and write the
# activations once more, forward and backward: at GPT-2 small's width about as many bytes as its matmuls take
# time. Compiled, they fuse into the matmuls' neighbours. Shapes vary between calls (micro-batches are cut to
# their own columns, prompts have their own widths), so it compiles with dynamic shapes from the first call: one
# graph for the no-grad passes, one (forward and backward) for the update's.
_compiled_states: dict[str, Callable[..., torch.Tensor]] = {}
describe(_states, lambda model, ids, *_: f"the trunk's log-prob pass{'' if torch.is_grad_enabled() else ' (no grad)'} "
                                         f"for {ids.shape[0]:,} rows x {ids.shape[1]} positions")
describe(_chunk_logprobs, lambda hidden, *_: f"the vocabulary's log-softmax for {hidden.shape[0]:,} positions")


def token_logprobs(model: GPT, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *, start: int = 1,
                   chunk_size: int | None = None, temperature: float = 1.0, return_entropy: bool = False,
                   compile: bool = False, reference: GPT | None = None, kl_weights: tuple[float, float] = (1.0, 0.0),
                   value_head: torch.nn.Module | None = None, wanted: torch.Tensor | None = None,
                   rows_per_prompt: int = 1, loss: TokenLoss | None = None,
                   replay: Replay | None = None, keep_hidden: bool = False) -> TokenLogProbs:
    """log p(input_ids[:, t] | input_ids[:, :t]) for t in [start, T): logprobs [B, T - start].

    For GRPO, input_ids = prompt (left-padded, width P) + completion, and start = P gives the completion's
    per-token log-probs; `rows_per_prompt` G says that rows come in groups of G with the same prompt columns (computed
    once a group). Entropy (optional) is that of the same, temperature-scaled, distribution. Autocast, if any, is
    the caller's. `chunk_size`: positions per vocabulary chunk (default `chunk_rows`).
    compile: the trunk and the per-chunk log-softmax through torch.compile (a warning and eager if it fails).
    reference: also the exact KL to this (frozen) model's tempered distribution at each position, summed over the
    vocabulary: `full_kl` with `kl_weights` = (forward, reverse).
    value_head: also its value of the hidden state that predicts each token (differentiable).
    wanted: bool [B, T - start], the positions wanted; the lm_head runs on those alone and every other position
    reads 0 (log-prob, entropy and KL; values are made everywhere).
    loss: a `TokenLoss`; `.loss` is then its sum over the wanted positions, with gradients made in the same pass
    (see the module docstring), and the log-probs, entropy and KL are detached.
    replay: `model`'s trunk products, kept when it sampled these tokens (`ProductMemo`), instead of made again.
    keep_hidden: also return the hidden states (`.hidden`), for a loss of the caller's own; otherwise they are not
    kept past the call.
    """
    B, T = input_ids.shape
    if not 1 <= start < T:
        raise ValueError(f"start must lie in [1, {T}), got {start}")
    N, device_type = T - start, input_ids.device.type
    states = maybe_compiled(_states, _compiled_states, device_type, compile, dynamic=True)
    if replay is None:
        hidden, states = run_or_fall_back(states, _states, device_type, model, input_ids, attention_mask, start,
                                          rows_per_prompt)
    else:  # the memo is an eager seam: no compiled region ever sees it
        hidden = _states(model, input_ids, attention_mask, start, rows_per_prompt, replay)
    hidden = hidden.reshape(B * N, -1)
    ref_hidden = None
    if reference is not None:
        with torch.no_grad():
            ref_hidden = run_or_fall_back(states, _states, device_type, reference, input_ids, attention_mask, start,
                                          rows_per_prompt)[0].reshape(B * N, -1)
    positions = None if wanted is None else _wanted_positions(wanted, B, N)
    pick = (lambda x: x) if positions is None else (lambda x: x[positions])  # noqa: E731
    head = _VocabPass(model.lm_head.weight, None if reference is None else reference.lm_head.weight.detach(),
                      temperature, return_entropy, kl_weights, chunk_size or chunk_rows(input_ids.device,
                                                                                         model.config.vocab_size),
                      compile)
    targets = input_ids[:, start:].reshape(B * N)
    total, columns = head(pick(hidden), pick(targets), None if ref_hidden is None else pick(ref_hidden), loss,
                          positions)
    columns = [(c if positions is None else c.new_zeros(B * N).index_copy(0, positions, c)).view(B, N)
               for c in columns]
    values = value_head(hidden).float().view(B, N) if value_head is not None else None
    entropy = columns[1] if return_entropy else None
    kl = columns[-1] if reference is not None else None
    return TokenLogProbs(logprobs=columns[0], entropy=entropy, kl=kl, values=values, loss=total,
                         hidden=hidden.view(B, N, -1) if keep_hidden else None)


def _wanted_positions(wanted: torch.Tensor, B: int, N: int) -> torch.Tensor:
    if wanted.shape != (B, N):
        raise ValueError(f"wanted must have shape {(B, N)}, got {tuple(wanted.shape)}")
    return wanted.reshape(B * N).nonzero().squeeze(1)


@dataclass
class _VocabPass:
    """The lm_head and the log-softmax over chunks of positions, with or without a loss (module docstring)."""

    weight: torch.Tensor
    ref_weight: torch.Tensor | None
    temperature: float
    entropy: bool
    kl_weights: tuple[float, float]
    chunk: int
    compile: bool

    def __call__(self, hidden: torch.Tensor, targets: torch.Tensor, ref_hidden: torch.Tensor | None,
                 loss: TokenLoss | None, positions: torch.Tensor | None
                 ) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
        """(the loss's sum or None, [log-probs, (entropy), (KL)] of the given positions)."""
        if loss is None:
            return None, self._stats(hidden, targets, ref_hidden)
        if positions is None:
            positions = torch.arange(len(targets), device=targets.device)
        total, lp, entropy, kl = _FusedHead.apply(hidden, self.weight, ref_hidden, targets, positions, loss, self)
        return total, [lp, *([entropy] if self.entropy else []), *([kl] if ref_hidden is not None else [])]

    def _fuses(self, ref_hidden: torch.Tensor | None) -> bool:
        """Whether compiling `_chunk_logprobs` saves passes over [chunk, vocab]: a log-prob alone (the reference's,
        at temperature 1) is the head's product, a logsumexp and a gather, which eager code already does in about
        the passes a compiled kernel takes; a temperature, the entropy or the KL each add passes that fuse. Not
        worth the graph (and its minutes of compiling) otherwise."""
        return self.temperature != 1.0 or self.entropy or ref_hidden is not None

    def _stats(self, hidden: torch.Tensor, targets: torch.Tensor, ref_hidden: torch.Tensor | None
               ) -> list[torch.Tensor]:
        """`_chunk_logprobs` of each chunk (checkpointed under autograd), concatenated."""
        differentiable = torch.is_grad_enabled() and (hidden.requires_grad or self.weight.requires_grad)
        device_type = hidden.device.type
        fn = maybe_compiled(_chunk_logprobs, _compiled_chunks, device_type, self.compile and self._fuses(ref_hidden),
                            dynamic=True)
        parts: list[tuple[torch.Tensor, ...]] = []
        for i in range(0, max(len(targets), 1), self.chunk):  # no position wanted: one empty chunk keeps the shapes
            c = slice(i, i + self.chunk)
            args = (hidden[c], targets[c], self.weight, self.temperature, self.entropy,
                    None if ref_hidden is None else ref_hidden[c], self.ref_weight, self.kl_weights)
            out, fn = run_or_fall_back(fn, _chunk_logprobs, device_type, *args, checkpointed=differentiable)
            parts.append(out)
        return [torch.cat(c) for c in zip(*parts)]


class _FusedHead(torch.autograd.Function):
    """The vocabulary pass of a loss that sums a function of each position's log-prob, entropy and KL. The forward
    computes, chunk by chunk, the statistics, the loss, and the loss's gradients w.r.t. the hidden states and the
    head's weight (the loss's derivatives w.r.t. each position's statistics are known once they are); the backward
    only scales those by the upstream gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, ref_hidden, targets, positions, loss, vocab):
        dh = torch.zeros_like(hidden)
        dw = torch.zeros(weight.shape, dtype=torch.promote_types(weight.dtype, torch.float32), device=weight.device)
        total = torch.zeros((), dtype=torch.promote_types(hidden.dtype, torch.float32), device=hidden.device)
        parts = []
        transposed = head_grad_weight(hidden, weight)
        for i in range(0, max(len(targets), 1), vocab.chunk):
            c = slice(i, i + vocab.chunk)
            rh = None if ref_hidden is None else ref_hidden[c]
            stats, dz = _fused_chunk(hidden[c], targets[c], rh, positions[c], loss, vocab)
            total += stats.loss
            dh[c] = head_input_grad(dz, weight, transposed).to(dh.dtype)
            add_head_grad(dw, dz, hidden[c], weight)
            parts.append((stats.logprobs, stats.entropy, stats.kl))
        # Kept on ctx, not saved: the one backward scales them in place and hands them on (a fresh [V, C] product
        # would be that many new pages on the CPU).
        ctx.grads = dh, dw.to(weight.dtype)
        # Statistics not made come back empty (an autograd.Function returns tensors).
        columns = [torch.cat(c) if c[0] is not None else hidden.new_zeros(0) for c in zip(*parts)]
        ctx.mark_non_differentiable(*columns)
        return (total, *columns)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total, *unused):
        if ctx.grads is None:
            raise RuntimeError("the fused vocabulary pass gives its gradients once (retain_graph is not supported)")
        (dh, dw), ctx.grads = ctx.grads, None
        return dh.mul_(grad_total), dw.mul_(grad_total), None, None, None, None, None


@dataclass
class _ChunkStats:
    logprobs: torch.Tensor
    entropy: torch.Tensor | None
    kl: torch.Tensor | None
    loss: torch.Tensor


def _fused_chunk(hidden: torch.Tensor, targets: torch.Tensor, ref_hidden: torch.Tensor | None,
                 positions: torch.Tensor, loss: TokenLoss, vocab: _VocabPass
                 ) -> tuple[_ChunkStats, torch.Tensor]:
    """One chunk of `_FusedHead`: its statistics and loss, and the loss's gradient w.r.t. the chunk's (tempered)
    logits [chunk, V]. The passes over [chunk, vocab] before and after the loss (compiled where asked, each
    into a few fused kernels) surround the loss's own derivatives, taken over [chunk] numbers."""
    device_type = hidden.device.type
    forward = maybe_compiled(_vocab_forward, _compiled_forwards, device_type, vocab.compile, dynamic=True)
    args = (hidden, targets, vocab.weight, vocab.temperature, vocab.entropy, ref_hidden, vocab.ref_weight,
            vocab.kl_weights)
    (lp, entropy, kl, logp, p, logq, q, kl_f), _ = run_or_fall_back(forward, _vocab_forward, device_type, *args)
    per_position, g_lp, g_ent, g_kl = _loss_and_derivatives(loss, lp, entropy, kl, positions)
    backward = maybe_compiled(_vocab_backward, _compiled_backwards, device_type, vocab.compile, dynamic=True)
    args = (targets, vocab.temperature, vocab.kl_weights, logp, p, logq, q, entropy, kl_f, g_lp, g_ent, g_kl)
    dz, _ = run_or_fall_back(backward, _vocab_backward, device_type, *args)
    return _ChunkStats(lp, entropy, kl, per_position.sum()), dz


def _vocab_forward(hidden, targets, weight, temperature, with_entropy, ref_hidden, ref_weight, kl_weights):
    """A chunk's log-prob, entropy and KL, and what their derivatives need: log p and p over the vocabulary (the
    tempered log-softmax), log q and q (the reference's, q only for the reverse KL), KL_f (the forward KL)."""
    w_f, w_r = kl_weights
    z = head_logits(hidden, weight)
    if temperature != 1.0:
        z = z / temperature
    logp = z - z.logsumexp(-1, keepdim=True)
    p = logp.exp()
    lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(p * logp).sum(-1) if with_entropy else None
    kl = logq = q = kl_f = None
    if ref_hidden is not None:
        ref_z = head_logits(ref_hidden, ref_weight)
        logq = (ref_z / temperature if temperature != 1.0 else ref_z).log_softmax(-1)
        kl = torch.zeros_like(lp)
        if w_f:
            kl_f = (p * (logp - logq)).sum(-1)
            kl = kl + w_f * kl_f
        if w_r:
            q = logq.exp()
            kl = kl + w_r * (q * (logq - logp)).sum(-1)
    return lp, entropy, kl, logp, p, logq, q, kl_f


def _vocab_backward(targets, temperature, kl_weights, logp, p, logq, q, entropy, kl_f, g_lp, g_ent, g_kl):
    """The gradient w.r.t. the chunk's logits of a loss whose derivatives w.r.t. each position's log-prob, entropy
    and KL are g_lp, g_ent, g_kl (the head's own gradients are this through its weight and hidden states). With z
    the tempered logits: d log p_y / dz = e_y - p;
    dH/dz = -p (log p + H); dKL_f/dz = p (log p - log q - KL_f); dKL_r/dz = p - q."""
    w_f, w_r = kl_weights
    coef = g_lp.unsqueeze(-1)
    if g_ent is not None:
        coef = coef + g_ent.unsqueeze(-1) * (logp + entropy.unsqueeze(-1))
    if g_kl is not None and w_f:
        coef = coef - (g_kl * w_f).unsqueeze(-1) * (logp - logq - kl_f.unsqueeze(-1))
    dz = -p * coef
    if g_kl is not None and w_r:
        dz = dz + (g_kl * w_r).unsqueeze(-1) * (p - q)
    dz = dz.scatter_add(-1, targets.unsqueeze(-1), g_lp.unsqueeze(-1))
    return dz / temperature if temperature != 1.0 else dz


# Eager, the passes of _vocab_forward and _vocab_backward over [chunk, vocab] (logsumexp, exp, gather, the
# entropy's product, the gradient's terms) cost several times the head's matmul in memory traffic on a GPU;
# compiled, they fuse into a few kernels on each side of the loss.
_compiled_forwards: dict[str, Callable[..., tuple]] = {}
_compiled_backwards: dict[str, Callable[..., tuple]] = {}
describe(_vocab_forward, lambda hidden, *_: f"the fused vocabulary pass's forward for {hidden.shape[0]:,} positions")
describe(_vocab_backward, lambda targets, *_: f"the fused vocabulary pass's backward for {targets.shape[0]:,} "
                                              "positions")


def _loss_and_derivatives(loss: TokenLoss, lp: torch.Tensor, entropy: torch.Tensor | None, kl: torch.Tensor | None,
                          positions: torch.Tensor):
    """The loss of each position, and its derivatives w.r.t. the position's log-prob, entropy and KL (None where
    the loss does not use them): autograd over [chunk] numbers, not over the vocabulary."""
    leaves = [x.detach().requires_grad_() if x is not None else None for x in (lp, entropy, kl)]
    with torch.enable_grad():
        per_position = loss(*leaves, positions)
        used = [x for x in leaves if x is not None]
        grads = iter(torch.autograd.grad(per_position.sum(), used, allow_unused=True) if per_position.requires_grad
                     else [None] * len(used))
    g_lp, g_ent, g_kl = (next(grads) if x is not None else None for x in leaves)
    if g_lp is None:
        g_lp = torch.zeros_like(lp)
    return per_position.detach(), g_lp, g_ent, g_kl


class LogProbs(nn.Module):
    """`token_logprobs` (and the value head, if any) behind a forward(), so DDP's hooks see every parameter
    the update uses. The frozen reference comes as an argument: it is not trained, so DDP must not own it."""

    def __init__(self, model: nn.Module, value_head: nn.Module | None = None, compile: bool = False,
                 entropy: bool = True):
        super().__init__()
        self.model, self.value_head, self.compile, self.entropy = model, value_head, compile, entropy

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None, start: int, temperature: float, *,
                loss: TokenLoss, reference: nn.Module | None = None, kl_weights: tuple[float, float] = (1.0, 0.0),
                wanted: torch.Tensor | None = None, rows_per_prompt: int = 1,
                replay: Replay | None = None, keep_hidden: bool = False) -> TokenLogProbs:
        return token_logprobs(self.model, ids, mask, start=start, temperature=temperature, return_entropy=self.entropy,
                              compile=self.compile, reference=reference, kl_weights=kl_weights,
                              value_head=self.value_head, wanted=wanted, rows_per_prompt=rows_per_prompt, loss=loss,
                              replay=replay, keep_hidden=keep_hidden)
