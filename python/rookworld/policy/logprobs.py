"""The log-prob pass that the GRPO and SFT losses are built on: per-token log-probs of given sequences, with
gradients, and beside them the entropy, the exact KL to a reference and a value head's estimates.

The trunk runs once; the lm_head and log-softmax run over a chunk of (row, time) positions at a time, so the fp32
[B, T, vocab] logits never exist at once. With gradients each chunk is checkpointed: backward recomputes its
logits instead of keeping them (peak: one chunk of logits).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rookworld.policy.compiling import maybe_compiled, run_or_fall_back
from rookworld.policy.model import GPT


@dataclass
class TokenLogProbs:
    logprobs: torch.Tensor  # [B, N] float32
    entropy: torch.Tensor | None = None  # [B, N] float32, if requested
    kl: torch.Tensor | None = None  # [B, N] float32: exact KL to the reference over the vocabulary, if one is given
    values: torch.Tensor | None = None  # [B, N] float32: the value head's estimate before each token, if given


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


def _chunk_logprobs(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    weight: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    ref_hidden: torch.Tensor | None = None,
    ref_weight: torch.Tensor | None = None,
    kl_weights: tuple[float, float] = (1.0, 0.0),
) -> tuple[torch.Tensor, ...]:
    """(log-prob, [entropy], [KL to the reference]) of each position of one chunk."""
    logits = F.linear(hidden, weight).float()
    if temperature != 1.0:
        logits = logits / temperature
    log_z = logits.logsumexp(-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    out = [logp]
    if with_entropy:
        probs = (logits - log_z.unsqueeze(-1)).exp()
        out.append(log_z - (probs * logits).sum(-1))
    if ref_hidden is not None:
        ref_logits = F.linear(ref_hidden, ref_weight).float()
        if temperature != 1.0:
            ref_logits = ref_logits / temperature
        out.append(full_kl(logits - log_z.unsqueeze(-1), ref_logits.log_softmax(-1), kl_weights))
    return tuple(out)


# Eager, each step of _chunk_logprobs after the matmul (fp32 copy, logsumexp, gather, exp, entropy) is a pass over
# [chunk, vocab] in memory: together several times the matmul's own traffic. Compiled, they fuse into a couple of
# reductions over the logits, forward and backward.
_compiled_chunks: dict[str, Callable[..., tuple[torch.Tensor, ...]]] = {}


def _trunk(model: GPT, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    return model.trunk(input_ids, attention_mask)


# Eager under bf16 autocast, the trunk's LayerNorms, GELUs, residual adds and casts each read and write the
# activations once more, forward and backward: at GPT-2 small's width about as many bytes as its matmuls take
# time. Compiled, they fuse into the matmuls' neighbours. Shapes vary between calls (micro-batches are cut to
# their own columns), so after the first new shape dynamo compiles a dynamic-shape graph.
_compiled_trunks: dict[str, Callable[..., torch.Tensor]] = {}


def token_logprobs(model: GPT, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *, start: int = 1,
                   chunk_size: int = 1024, temperature: float = 1.0, return_entropy: bool = False,
                   compile: bool = False, reference: GPT | None = None, kl_weights: tuple[float, float] = (1.0, 0.0),
                   value_head: torch.nn.Module | None = None, wanted: torch.Tensor | None = None) -> TokenLogProbs:
    """log p(input_ids[:, t] | input_ids[:, :t]) for t in [start, T): logprobs [B, T - start], differentiable.

    For GRPO, input_ids = prompt (left-padded, width P) + completion, and start = P gives the completion's
    per-token log-probs. The lm_head runs on `chunk_size` positions at a time (see the module docstring).
    Entropy (optional) is that of the same, temperature-scaled, distribution. Autocast, if any, is the caller's.
    compile: run the trunk and the per-chunk log-softmax through torch.compile (a warning and eager if compiling
    fails).
    reference: also the exact KL to this (frozen) model's tempered distribution at each position, summed over
    the vocabulary: `full_kl` with `kl_weights` = (forward, reverse). Its logits are made chunk by chunk beside
    the policy's, so they too never exist whole.
    value_head: also its value of the hidden state that predicts each token (the state before the token).
    wanted: bool [B, T - start], the positions wanted; the lm_head runs on those alone and every other position
    reads 0 (log-prob, entropy and KL; values are made everywhere). The lm_head is most of a small model's work,
    so skipping positions no loss counts (a prompt under a completion-only loss, padding) saves most of theirs.
    """
    B, T = input_ids.shape
    if not 1 <= start < T:
        raise ValueError(f"start must lie in [1, {T}), got {start}")
    N, device_type = T - start, input_ids.device.type
    trunk = maybe_compiled(_trunk, _compiled_trunks, device_type, compile)
    hidden, trunk = run_or_fall_back(trunk, _trunk, device_type, model, input_ids, attention_mask)
    hidden = hidden[:, start - 1 : T - 1].reshape(B * N, -1)  # position t-1 predicts token t
    targets = input_ids[:, start:].reshape(B * N)
    ref_hidden = ref_weight = None
    if reference is not None:
        with torch.no_grad():
            ref_hidden, _ = run_or_fall_back(trunk, _trunk, device_type, reference, input_ids, attention_mask)
            ref_hidden = ref_hidden[:, start - 1 : T - 1].reshape(B * N, -1)
        ref_weight = reference.lm_head.weight.detach()
    h, t, rh, picked = hidden, targets, ref_hidden, None
    if wanted is not None:
        if wanted.shape != (B, N):
            raise ValueError(f"wanted must have shape {(B, N)}, got {tuple(wanted.shape)}")
        picked = wanted.reshape(B * N).nonzero().squeeze(1)
        h, t = hidden[picked], targets[picked]
        rh = None if ref_hidden is None else ref_hidden[picked]
    columns = _in_chunks(h, t, model.lm_head.weight, temperature, return_entropy, rh, ref_weight, kl_weights,
                         chunk_size=chunk_size, device_type=device_type, compile=compile)
    if picked is None:
        columns = [c.view(B, N) for c in columns]
    else:
        columns = [c.new_zeros(B * N).index_copy(0, picked, c).view(B, N) for c in columns]
    logprobs = columns.pop(0)
    entropy = columns.pop(0) if return_entropy else None
    kl = columns.pop(0) if reference is not None else None
    values = value_head(hidden).float().view(B, N) if value_head is not None else None
    return TokenLogProbs(logprobs=logprobs, entropy=entropy, kl=kl, values=values)


def _in_chunks(hidden: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor, temperature: float,
               with_entropy: bool, ref_hidden: torch.Tensor | None, ref_weight: torch.Tensor | None,
               kl_weights: tuple[float, float], *, chunk_size: int, device_type: str,
               compile: bool) -> list[torch.Tensor]:
    """`_chunk_logprobs` of `chunk_size` positions at a time (each checkpointed under autograd), every output
    concatenated over the chunks."""
    differentiable = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    fn = maybe_compiled(_chunk_logprobs, _compiled_chunks, device_type, compile)
    parts: list[tuple[torch.Tensor, ...]] = []
    for i in range(0, max(len(targets), 1), chunk_size):  # with no position wanted, one empty chunk keeps the shapes
        chunk = slice(i, i + chunk_size)
        args = (hidden[chunk], targets[chunk], weight, temperature, with_entropy,
                None if ref_hidden is None else ref_hidden[chunk], ref_weight, kl_weights)
        out, fn = run_or_fall_back(fn, _chunk_logprobs, device_type, *args, checkpointed=differentiable)
        parts.append(out)
    return [torch.cat(c) for c in zip(*parts)]
