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
  the hidden states and the head's weight (`rookworld.net.head`): no logits are kept for the backward, none
  recomputed.
  Without one, a differentiable call checkpoints each chunk instead (backward recomputes its logits).
- Products made once. Given a `Replay` of the policy's `ProductMemo`, the trunk takes the products that sampling
  made for these tokens with these weights instead of making them again (its backward is the same).
The logits are float32 under autocast too (`head_logits`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from rookworld.net.compile_log import describe
from rookworld.net.compiling import Compiled
from rookworld.net.head import Columns, FusedHead, TokenLoss, TokenTerms, Vocab
from rookworld.net.memo import Replay
from rookworld.net.attention import LayerAttention, causal
from rookworld.net.model import GPT, Block, BlockRunner
from rookworld.net.head import tempered_logits, vocab_forward

__all__ = ["LogProbs", "PassOptions", "TokenLogProbs", "TokenLoss", "TokenTerms", "chunk_rows", "token_logprobs"]


@dataclass(frozen=True)
class PassOptions:
    """How a log-prob pass runs, beside the tokens it is given.

    start: the first position scored (for GRPO, the prompt's width: the completion's log-probs).
    temperature: of the distribution scored (the entropy and the KL are that distribution's too).
    entropy: also each position's entropy.
    compile: the trunk's blocks (one graph for every layer) and the passes over the vocabulary through
        torch.compile (a warning and eager if it fails).
    kl_weights: (forward, reverse) weights of the exact KL to a reference, when one is given (`vocab_forward`).
    rows_per_prompt: rows come in groups of this many that share their prompt columns, computed once a group.
    chunk_size: positions a chunk of the vocabulary pass (default `chunk_rows`).
    keep_hidden: also return the hidden states (`.hidden`), for a loss or a head of the caller's own.
    """

    start: int = 1
    temperature: float = 1.0
    entropy: bool = False
    compile: bool = False
    kl_weights: tuple[float, float] = (1.0, 0.0)
    rows_per_prompt: int = 1
    chunk_size: int | None = None
    keep_hidden: bool = False


@dataclass
class TokenLogProbs:
    logprobs: torch.Tensor  # [B, N] float32 (detached when a loss was given)
    entropy: torch.Tensor | None = None  # [B, N] float32, if requested
    kl: torch.Tensor | None = None  # [B, N] float32: exact KL to the reference over the vocabulary, if one is given
    values: torch.Tensor | None = None  # [B, N] float32: the value head's estimate before each token (`LogProbs`)
    loss: torch.Tensor | None = None  # scalar: the sum of the given loss over the wanted positions, differentiable
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)  # [B, N] each: the loss's `TokenTerms.metrics`
    #: [B, N, n_embd]: the hidden state that predicts each token, differentiable (keep_hidden: for a loss of the
    #: caller's own)
    hidden: torch.Tensor | None = None


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
    """(log-prob, [entropy], [KL to the reference]) of each position of one chunk (`vocab_forward`'s)."""
    if not with_entropy and ref_hidden is None:  # the log-prob alone: a logsumexp and a gather, no [chunk, V] more
        z = tempered_logits(hidden, weight, temperature)
        return ((z.gather(-1, targets.unsqueeze(-1)) - z.logsumexp(-1, keepdim=True)).squeeze(-1),)
    lp, entropy, kl, _ = vocab_forward(hidden, targets, weight, temperature, with_entropy, ref_hidden, ref_weight,
                                       kl_weights)
    return tuple(x for x in (lp, entropy, kl) if x is not None)


# Eager, each step of _chunk_logprobs after the matmul (fp32 copy, logsumexp, gather, exp, entropy) is a pass over
# [chunk, vocab] in memory: together several times the matmul's own traffic. Compiled, they fuse into a couple of
# reductions over the logits, forward and backward.
_CHUNK = Compiled(_chunk_logprobs)


def _block(block: Block, x: torch.Tensor, attend: LayerAttention
           ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One block of a log-prob pass (`GPT`'s `BlockRunner`, when compiled)."""
    return block(x, attend)


# Eager under bf16 autocast, a block's LayerNorms, GELUs, residual adds and casts each read and write the
# activations once more, forward and backward: at GPT-2 small's width about as many bytes as its matmuls take
# time. Compiled, they fuse into the matmuls' neighbours. One block is compiled, not the trunk: every layer runs
# the same graph (a layer's attention holds its tensors, not its index), so compiling costs one layer's time
# whatever the depth. Shapes vary between calls (micro-batches are cut to their own columns, prompts have their
# own widths), so it compiles with dynamic shapes from the first call: a graph for each attention (the prompts',
# the continuations') and grad mode (the no-grad passes, the update's forward and backward).
_BLOCK = Compiled(_block)
describe(_block, lambda block, x, attend: "a block of the log-prob pass"
                                          f"{'' if torch.is_grad_enabled() else ' (no grad)'} for {x.shape[0]:,} "
                                          f"rows x {x.shape[1]} positions "
                                          f"({'prompts' if attend.func is causal else 'continuations'})")


def _block_runner(device_type: str, compile: bool) -> BlockRunner | None:
    """The compiled block for every layer of a pass (eager after a compiler failure), or None: each runs as it is."""
    if not compile:
        return None
    return lambda block, x, attend: _BLOCK(device_type, True, block, x, attend, dynamic=True)


def _states(model: GPT, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, start: int,
            rows_per_prompt: int, replay: Replay | None = None, blocks: BlockRunner | None = None) -> torch.Tensor:
    """The hidden state that predicts each token from `start` on [B, T - start, n_embd]: position t - 1's.
    replay: the trunk's products taken from sampling's memo (shared prompts only); blocks: who runs each block."""
    if rows_per_prompt == 1:
        return model.trunk(input_ids, attention_mask, blocks=blocks)[:, start - 1 : -1]
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids, dtype=torch.bool)

    def products(phase: str):
        return replay.phase(model, phase) if replay is not None else None

    prompt_ids, prompt_mask = input_ids[::rows_per_prompt, :start], attention_mask[::rows_per_prompt, :start]
    prompt, prefix = model.prompt_trunk(prompt_ids, prompt_mask, products("prompt"), blocks)
    completions = model.continue_trunk(input_ids[:, start:], attention_mask[:, start:], prefix, prompt_mask,
                                       products("completion"), blocks)
    # The prompt's last state predicts the first completion token (prompts are left-padded: it is a real token).
    return torch.cat([prompt[:, -1:].repeat_interleave(rows_per_prompt, 0), completions[:, :-1]], dim=1)


describe(_chunk_logprobs, lambda hidden, *_: f"the vocabulary's log-softmax for {hidden.shape[0]:,} positions")


def token_logprobs(model: GPT, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                   options: PassOptions = PassOptions(), *, wanted: torch.Tensor | None = None,
                   reference: GPT | None = None, loss: TokenLoss | None = None, replay: Replay | None = None
                   ) -> TokenLogProbs:
    """log p(input_ids[:, t] | input_ids[:, :t]) for t in [options.start, T): logprobs [B, T - start].

    For GRPO, input_ids = prompt (left-padded, width P) + completion, and start = P gives the completion's
    per-token log-probs. Autocast, if any, is the caller's.
    wanted: bool [B, T - start], the positions wanted; the lm_head runs on those alone and every other position
    reads 0.
    reference: also the exact KL to this (frozen) model's tempered distribution at each position, summed over the
    vocabulary: `vocab_forward`'s with `options.kl_weights`.
    loss: a `TokenLoss`; `.loss` is then its sum over the wanted positions, with gradients made in the same pass
    (see the module docstring), `.metrics` its metrics, and the log-probs, entropy and KL are detached.
    replay: `model`'s trunk products, kept when it sampled these tokens (`ProductMemo`), instead of made again.
    """
    B, T = input_ids.shape
    start, device_type = options.start, input_ids.device.type
    if not 1 <= start < T:
        raise ValueError(f"start must lie in [1, {T}), got {start}")
    N, trunk_args = T - start, (input_ids, attention_mask, start, options.rows_per_prompt)
    blocks = _block_runner(device_type, options.compile)
    if replay is None:
        hidden = _states(model, *trunk_args, blocks=blocks)
    else:  # the memo is an eager seam: no compiled region ever sees it
        hidden = _states(model, *trunk_args, replay)
    hidden = hidden.reshape(B * N, -1)
    ref_hidden = None
    if reference is not None:
        with torch.no_grad():
            ref_hidden = _states(reference, *trunk_args, blocks=blocks).reshape(B * N, -1)
    positions = None if wanted is None else _wanted_positions(wanted, B, N)
    pick = (lambda x: x) if positions is None else (lambda x: x[positions])  # noqa: E731
    chunk = options.chunk_size or chunk_rows(input_ids.device, model.config.vocab_size)
    vocab = Vocab(model.lm_head.weight, None if reference is None else reference.lm_head.weight.detach(),
                  options.temperature, options.entropy, options.kl_weights, chunk, options.compile)
    targets = input_ids[:, start:].reshape(B * N)
    total, columns, metrics = _VocabPass(vocab)(pick(hidden), pick(targets),
                                                None if ref_hidden is None else pick(ref_hidden), loss, positions)
    def spread(c: torch.Tensor) -> torch.Tensor:  # a column of the wanted positions to [B, N], 0 elsewhere
        return (c if positions is None else c.new_zeros(B * N).index_copy(0, positions, c)).view(B, N)

    columns = [None if c is None else spread(c) for c in columns]
    return TokenLogProbs(logprobs=columns[0], entropy=columns[1], kl=columns[2], loss=total,
                         metrics={name: spread(c) for name, c in metrics.items()},
                         hidden=hidden.view(B, N, -1) if options.keep_hidden else None)


def _wanted_positions(wanted: torch.Tensor, B: int, N: int) -> torch.Tensor:
    if wanted.shape != (B, N):
        raise ValueError(f"wanted must have shape {(B, N)}, got {tuple(wanted.shape)}")
    return wanted.reshape(B * N).nonzero().squeeze(1)


@dataclass(frozen=True)
class _VocabPass:
    """The lm_head and the log-softmax over chunks of positions, with a loss (`FusedHead`) or without."""

    vocab: Vocab

    def __call__(self, hidden: torch.Tensor, targets: torch.Tensor, ref_hidden: torch.Tensor | None,
                 loss: TokenLoss | None, positions: torch.Tensor | None):
        """(the loss's sum or None, [log-probs, entropy or None, KL or None], {metric: column}) of the positions
        given."""
        if loss is None:
            return None, self._stats(hidden, targets, ref_hidden), {}
        if positions is None:
            positions = torch.arange(len(targets), device=targets.device)
        out = Columns()
        total = FusedHead.apply(hidden, self.vocab.weight, ref_hidden, targets, positions, loss, self.vocab, out)
        cat = lambda parts: torch.cat(parts) if parts else None  # noqa: E731
        return total, [cat(out.logprobs), cat(out.entropy), cat(out.kl)], {k: cat(v) for k, v in out.metrics.items()}

    def _fuses(self, ref_hidden: torch.Tensor | None) -> bool:
        """Whether compiling `_chunk_logprobs` saves passes over [chunk, vocab]: a log-prob alone (the reference's,
        at temperature 1) is the head's product, a logsumexp and a gather, which eager code already does in about
        the passes a compiled kernel takes; a temperature, the entropy or the KL each add passes that fuse. Not
        worth the graph (and its minutes of compiling) otherwise."""
        return self.vocab.temperature != 1.0 or self.vocab.entropy or ref_hidden is not None

    def _stats(self, hidden: torch.Tensor, targets: torch.Tensor, ref_hidden: torch.Tensor | None
               ) -> list[torch.Tensor | None]:
        """`_chunk_logprobs` of each chunk (checkpointed under autograd), concatenated."""
        v = self.vocab
        differentiable = torch.is_grad_enabled() and (hidden.requires_grad or v.weight.requires_grad)
        compile = v.compile and self._fuses(ref_hidden)
        parts: list[tuple[torch.Tensor, ...]] = []
        for i in range(0, max(len(targets), 1), v.chunk):  # no position wanted: one empty chunk keeps the shapes
            c = slice(i, i + v.chunk)
            args = (hidden[c], targets[c], v.weight, v.temperature, v.entropy,
                    None if ref_hidden is None else ref_hidden[c], v.ref_weight, v.kl_weights)
            parts.append(_CHUNK(hidden.device.type, compile, *args, checkpointed=differentiable, dynamic=True))
        columns = [torch.cat(c) for c in zip(*parts)]
        entropy = columns[1] if v.entropy else None
        return [columns[0], entropy, columns[-1] if ref_hidden is not None else None]


class LogProbs(nn.Module):
    """`token_logprobs` of a model (and its value head's values, if any) behind a forward(), so DDP's hooks see
    every parameter the update uses. `options`: the run's (temperature, entropy, compilation, KL directions, rows a
    prompt), each call giving its start. The frozen reference comes as an argument: it is not trained, so DDP must
    not own it."""

    def __init__(self, model: nn.Module, options: PassOptions, value_head: nn.Module | None = None):
        super().__init__()
        self.model, self.options, self.value_head = model, options, value_head

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None, start: int, *, loss: TokenLoss,
                wanted: torch.Tensor | None = None, reference: nn.Module | None = None,
                replay: Replay | None = None) -> TokenLogProbs:
        keep = self.options.keep_hidden or self.value_head is not None
        options = replace(self.options, start=start, keep_hidden=keep)
        out = token_logprobs(self.model, ids, mask, options, wanted=wanted, reference=reference, loss=loss,
                             replay=replay)
        return with_values(out, self.value_head, self.options.keep_hidden)


def with_values(out: TokenLogProbs, value_head: nn.Module | None, keep_hidden: bool = False) -> TokenLogProbs:
    """`out` with the value head's value of the hidden state that predicts each token [B, N] (differentiable),
    its hidden states dropped unless `keep_hidden`."""
    if value_head is None:
        return out
    values = value_head(out.hidden).float().reshape(out.logprobs.shape)
    return replace(out, values=values, hidden=out.hidden if keep_hidden else None)
