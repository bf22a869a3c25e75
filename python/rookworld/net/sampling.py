"""Batched sampling from the policy: one draw per row from next-token logits, and `generate` around it.

`generate` prefills the (left-padded) prompts once, then decodes one token per step for the whole batch
(`rookworld.net.decoding`). The loop body is batch-wide tensor code: finished rows keep decoding padding
instead of being removed, and on CUDA the "all done?" check (a device sync) runs only every 16 steps.

`GenerationOutput.logprobs` is the log-prob of each sampled token under the distribution it was actually drawn
from, i.e. after temperature, top-k and top-p (0 for greedy decoding, a point mass): what importance ratios
against the sampler need, or a check of the sampler. The trainer does not use it for its ratio and KL: it
recomputes log-probs with `rookworld.net.logprobs.token_logprobs` at the sampling temperature over the full
vocabulary (the distribution the policy gradient is taken for), with gradients and without the cache's bf16
rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

import torch

from rookworld.net.compile_log import describe
from rookworld.net.compiling import Compiled, run_or_fall_back
from rookworld.net.decoding import Decoder
from rookworld.net.limits import ContextTooLong
from rookworld.net.memo import ProductMemo
from rookworld.net.model import GPT
from rookworld.net.tokenizer import EOS_ID


@dataclass
class GenerationOutput:
    tokens: torch.Tensor  # [B, N] long; after a sequence ends, the EOS id (EOS is the pad token)
    mask: torch.Tensor  # [B, N] bool; True on generated tokens, including the EOS that ended a sequence
    logprobs: torch.Tensor  # [B, N] float32; sampling log-probs (see module docstring), 0 where mask is False
    lengths: torch.Tensor  # [B] long; number of generated tokens (mask.sum(1))
    stopped: torch.Tensor  # [B] bool; True where the sequence ended with EOS, False where it hit its limit


# ----------------------------------------------------------------------------------------------------------
# Sampling from one step's logits


def _top_p_filter(sorted_logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest prefix of descending-sorted logits whose probability mass reaches top_p."""
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs
    return sorted_logits.masked_fill(mass_before >= top_p, float("-inf"))  # the top token always survives


def _token_logp(scaled: torch.Tensor, choice: torch.Tensor, top: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """The drawn tokens' log-probs [B]: logit - (max + log of the weights' float64 total)."""
    return scaled.gather(-1, choice).squeeze(-1) - (top.squeeze(-1) + total.squeeze(-1).log().to(scaled.dtype))


def _draw(scaled: torch.Tensor, uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The draw and its log-prob from (tempered, filtered) logits [B, K] and one uniform [B, 1] a row.

    Inversion: the first token whose cumulative weight exceeds U times the total. Exact to float64's rounding of
    the sum: the weights exp(logit - max) are float32 (down to 1e-38 of the top token), summed in float64, so a
    token of 1e-12 of the total still moves the sum it is added to, and keeps its mass. A weight of 0 (a token
    top-p removed) never holds a step of the sum, so it is never drawn. One uniform a row instead of one a token
    (the Gumbel race drew K float64 uniforms and took two logarithms of each); compiled, the weights and their
    sum are one pass over the logits."""
    top = scaled.amax(-1, keepdim=True)
    weights = (scaled - top).exp()
    cumulative = weights.double().cumsum(-1)
    total = cumulative[:, -1:]
    # right=True: the first index whose sum is above the target; a U of 0 takes the first token with weight.
    choice = torch.searchsorted(cumulative, uniform * total, right=True).clamp_(max=scaled.shape[-1] - 1)
    return choice, _token_logp(scaled, choice, top, total)


#: Columns of one scan in `_draw_in_blocks`. Inductor splits a scan longer than 8,192 over several thread blocks
#: on CUDA, and that split scan's code generation fails in float64 (torch 2.11, H100): scans this long never split.
SCAN_BLOCK = 256


def _running_sums(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 running sum of non-negative weights [B, K] along the rows, in two levels: `inside` [B, blocks,
    SCAN_BLOCK], the running sum within each block (K padded with weights of 0 to whole blocks), and `ends` [B,
    blocks], the whole sum at each block's end. Element (b, i) of the whole running sum is ends[b - 1] (0 for the
    first block) + inside[b, i]: never decreasing, and flat across a weight of 0, like the sequential sum."""
    B, K = weights.shape
    blocks = -(-K // SCAN_BLOCK)
    inside = torch.nn.functional.pad(weights.double(), (0, blocks * SCAN_BLOCK - K)).view(B, blocks, SCAN_BLOCK)
    inside = inside.cumsum(-1)
    return inside, inside[..., -1].cumsum(-1)


def _draw_in_blocks(scaled: torch.Tensor, uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`_draw` as inductor compiles it on CUDA (torch 2.11), which it cannot do for a scan over the whole row
    (above) nor for searchsorted over a computed tensor: the running sum in blocks (`_running_sums`), the block
    holding the target found among the blocks' ends, then the token within it, each by counting the sums at or
    below the target. The same draw to float64's rounding; should a parallel scan's rounding give a weight of 0 a
    step, the likeliest token is drawn instead of it."""
    top, best = scaled.max(-1, keepdim=True)
    weights = (scaled - top).exp()
    inside, ends = _running_sums(weights)
    total = ends[:, -1:]
    target = uniform * total
    block = (ends <= target).sum(-1, keepdim=True).clamp_(max=ends.shape[-1] - 1)
    before = torch.where(block > 0, ends.gather(-1, (block - 1).clamp(min=0)), 0.0)
    sums = inside.gather(1, block[:, :, None].expand(-1, 1, SCAN_BLOCK)).squeeze(1) + before
    choice = (block * SCAN_BLOCK + (sums <= target).sum(-1, keepdim=True)).clamp_(max=scaled.shape[-1] - 1)
    choice = torch.where(weights.gather(-1, choice) > 0, choice, best)
    return choice, _token_logp(scaled, choice, top, total)


#: The draw each device type runs: on the CPU the whole row's sum is one scan, the cheapest there (BENCHMARKS.md,
#: "The draw in blocks").
DRAWS = MappingProxyType({"cuda": _draw_in_blocks})


def device_draw(device_type: str) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """The (eager) draw `device_type` runs."""
    return DRAWS.get(device_type, _draw)


#: Each draw with its compiled versions.
COMPILED_DRAWS = {fn: Compiled(fn) for fn in (_draw, _draw_in_blocks)}
for _fn in COMPILED_DRAWS:
    describe(_fn, lambda scaled, uniform: f"the sampling draw for {scaled.shape[0]:,} rows x {scaled.shape[1]:,} "
                                          "tokens")


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    compile: bool = False,
    uniform: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from logits [B, V] (float32). Returns (tokens [B], sampling log-probs [B]).

    temperature <= 0 means greedy (log-prob 0: the distribution sampled from is a point mass).
    compile: fuse the draw into one pass (torch.compile; a warning and eager if compiling fails).
    uniform: the draw's float64 uniforms [B, 1], one a row; drawn from `generator` when not given.
    """
    if temperature <= 0:
        return logits.argmax(-1), torch.zeros(logits.shape[0], device=logits.device)
    scaled = logits / temperature if temperature != 1.0 else logits
    candidates: torch.Tensor | None = None
    if top_k is not None and top_k < scaled.shape[-1]:
        # Top-p then only needs to sort k values, not the whole vocabulary.
        scaled, candidates = scaled.topk(top_k, dim=-1)
    elif top_p is not None and top_p < 1.0:
        scaled, candidates = scaled.sort(dim=-1, descending=True)
    if top_p is not None and top_p < 1.0:
        scaled = _top_p_filter(scaled, top_p)
    device_type = scaled.device.type
    eager = device_draw(device_type)
    draw = COMPILED_DRAWS[eager].pick(device_type, True, dynamic=True) if compile else eager  # one graph for all
    # On the CPU, rows a block at a time: a block's float64 sums stay under glibc's 32 MiB mmap threshold, so
    # their memory is reused instead of mapped and faulted in anew at every draw.
    B, K = scaled.shape
    block = B if device_type == "cuda" else max(1, (24 << 20) // (8 * K))
    if uniform is None:
        # Uniforms from rand, outside any compiled code, so that `generator` makes runs reproducible; the draw
        # never syncs with the host, unlike torch.multinomial.
        uniform = torch.rand((B, 1), generator=generator, device=scaled.device, dtype=torch.float64)
    parts = []
    for i in range(0, max(B, 1), block):
        rows = (scaled[i : i + block], uniform[i : i + block])
        out, draw = (eager(*rows), eager) if draw is eager else run_or_fall_back(draw, eager, device_type, *rows)
        parts.append(out)
    choice, token_logp = (torch.cat(x) for x in zip(*parts))
    token = choice.squeeze(-1) if candidates is None else candidates.gather(-1, choice).squeeze(-1)
    return token, token_logp


# ----------------------------------------------------------------------------------------------------------
# Generation


@dataclass(frozen=True)
class SamplingOptions:
    """How `generate` samples.

    max_new_tokens: one limit, or one per output row (a tensor). A row stops at its limit or, with stop_at_eos, after
        emitting `eos_id` (the tokenizer's; GPT-2's 50256 by default), which is part of the completion and of its
        mask, and pads the row after it. stop_at_eos=False generates exactly max_new_tokens per row (fixed-length
        sampling, benchmarks).
    temperature <= 0 is greedy; top_k / top_p restrict the support (applied after temperature, top-k first).
    compile: compile the decode step (CUDA graphs on CUDA); default True on CUDA, False elsewhere. It compiles
        once with dynamic shapes; on CUDA each new (batch size, bucketed length) records another CUDA graph. If
        compiling fails, a RuntimeWarning says why and the process decodes eagerly from then on.
    dtype: compute dtype; default bfloat16 on CUDA for an fp32 model, else the model's own. If it differs from
        the parameters' dtype the forward runs under torch.autocast; the KV cache is kept in `dtype`.
    """

    max_new_tokens: int | torch.Tensor = 144
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    stop_at_eos: bool = True
    eos_id: int = EOS_ID
    compile: bool | None = None
    dtype: torch.dtype | None = None

    def check(self) -> None:
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")


@torch.no_grad()
def generate(model: GPT, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
             options: SamplingOptions = SamplingOptions(), *, seed: int | None = None,
             generator: torch.Generator | None = None, rows_per_prompt: int = 1,
             memo: ProductMemo | None = None) -> GenerationOutput:
    """Sample completions for a left-padded batch of prompts, as `options` say.

    input_ids / attention_mask: [B, P], left-padded (see `rookworld.net.tokenizer`); mask None = no padding.
    rows_per_prompt: completions per prompt, consecutive rows of the output (B x rows_per_prompt rows), the
        prompt computed once for all of them.
    seed or generator: seeded runs are reproducible (same device, same batch). The generator must live on the
        model's device.
    memo: keeps the trunk's products of this (eager, CPU) decoding for the update's first pass (`ProductMemo`).
    """
    device = model.device
    input_ids = input_ids.to(device)
    P, B = input_ids.shape[1], input_ids.shape[0] * rows_per_prompt
    mask = (
        attention_mask.to(device=device, dtype=torch.bool)
        if attention_mask is not None
        else torch.ones(input_ids.shape, dtype=torch.bool, device=device)
    )
    limits, N = _row_limits(options.max_new_tokens, B, device)
    if P + N > model.config.block_size:
        room = model.config.block_size - P  # the prompt alone may fill it: a 1 MB move had "-1999021 or less" advised
        raise ContextTooLong(f"a prompt of {P} tokens and --max-new-tokens {N} exceed the model's context of "
                             f"{model.config.block_size} tokens: " + (
                                 f"give --max-new-tokens {room} or less" if room > 0 else
                                 "the prompt alone fills it, whatever --max-new-tokens is: shorten it (no move or "
                                 "history of a chess position is that long)"))
    options.check()
    if generator is None and seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)

    was_training = model.training
    model.eval()  # dropout must be off while sampling, whatever the trainer left it at
    try:
        decoder = Decoder(model, B, P + N, options.dtype, options.compile)
        if memo is None:
            logits = decoder.prefill(input_ids, mask, rows_per_prompt)
            return _decode(decoder, logits, limits, N, options, generator)
        if decoder.compile:
            raise ValueError("a ProductMemo keeps the products of eager decoding; this decoding is compiled")
        logits = decoder.prefill(input_ids, mask, rows_per_prompt, memo.recording(model, ("prompt",)))
        return _decode(decoder, logits, limits, N, options, generator, memo)
    finally:
        model.train(was_training)


def _row_limits(max_new_tokens: int | torch.Tensor, B: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """Each row's new-token limit [B] and the largest."""
    if isinstance(max_new_tokens, torch.Tensor):
        limits = max_new_tokens.to(device=device, dtype=torch.long).expand(B)
        N = int(limits.max()) if B else 0
    else:
        limits = torch.full((B,), max_new_tokens, dtype=torch.long, device=device)
        N = max_new_tokens
    if N < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {N}")
    return limits, N


def _decode(decoder: Decoder, logits: torch.Tensor, limits: torch.Tensor, N: int, options: SamplingOptions,
            generator: torch.Generator | None, memo: ProductMemo | None = None) -> GenerationOutput:
    """Up to N tokens per row (at most `limits`), each drawn from the decoder's logits, from the prompts' on;
    `memo` keeps each step's products in the column of the token it fed."""
    B, device = limits.shape[0], limits.device
    temperature, top_k, top_p, eos_id = options.temperature, options.top_k, options.top_p, options.eos_id
    tokens = torch.full((B, N), eos_id, dtype=torch.long, device=device)
    out_mask = torch.zeros((B, N), dtype=torch.bool, device=device)
    logprobs = torch.zeros((B, N), dtype=torch.float32, device=device)
    done = limits <= 0
    stopped = torch.zeros(B, dtype=torch.bool, device=device)
    check_every = 16 if device.type == "cuda" else 1  # "all rows done?" is a host sync
    rows = torch.arange(B, device=device)  # the output rows that the decoder's rows are
    for step in range(N):
        # A uniform for every row, done or dropped ones too, so that each row's draws do not depend on the others'.
        uniform = None if temperature <= 0 else torch.rand((B, 1), generator=generator, device=device,
                                                          dtype=torch.float64)[rows]
        token, token_logp = sample_next(logits, temperature, top_k, top_p, generator, decoder.compile, uniform)
        row_done = done[rows]
        alive = ~row_done
        token = torch.where(alive, token, eos_id)
        tokens[rows, step] = token
        out_mask[rows, step] = alive
        logprobs[rows, step] = token_logp.masked_fill(row_done, 0.0).to(logprobs.dtype)
        if options.stop_at_eos:
            hit_eos = alive & (token == eos_id)
            stopped[rows] |= hit_eos
            row_done = row_done | hit_eos
        row_done = row_done | (limits[rows] <= step + 1)
        done[rows] = row_done
        if step + 1 == N or ((step + 1) % check_every == 0 and bool(done.all())):
            break
        kept = decoder.drop_done(row_done)
        if kept is not None:
            rows, token = rows[kept], token[kept]
            if not rows.numel():  # every group done between two of CUDA's checks: no row left to decode
                break
        logits = decoder.step(token, None if memo is None else memo.recording(decoder.model, ("column", rows, step)))
    lengths = out_mask.sum(1)
    width = int(lengths.max()) if B else 0  # one sync at the end: drop columns that no row reached
    return GenerationOutput(tokens=tokens[:, :width], mask=out_mask[:, :width], logprobs=logprobs[:, :width],
                            lengths=lengths, stopped=stopped)
