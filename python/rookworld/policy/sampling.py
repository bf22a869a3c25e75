"""Batched sampling from the policy, and the chunked log-prob pass that the GRPO loss is built on.

`generate` prefills the (left-padded) prompts once, then decodes one token per step for the whole batch against
a preallocated `KVCache`. Every decode step has the same shapes (the cache is written at a position *tensor*),
so on CUDA the step is compiled with `torch.compile(mode="reduce-overhead")` and replayed as a CUDA graph.
The loop body is batch-wide tensor code: finished rows keep decoding padding instead of being removed, and on
CUDA the "all done?" check (a device sync) runs only every `check_every` steps.

Log-probs come in two flavours, because GRPO needs both:
- `GenerationOutput.logprobs`: log-prob of each sampled token under the distribution it was actually drawn
  from, i.e. after temperature, top-k and top-p (0 for greedy decoding, a point mass). Use these for importance
  ratios against the sampler, or to check the sampler.
- `GenerationOutput.policy_logprobs` (return_policy_logprobs=True): log-softmax of the raw logits at
  temperature 1 over the full vocabulary, the untempered policy's own log-prob.
The trainer uses neither for its ratio and KL: it recomputes log-probs with `token_logprobs` at the sampling
temperature over the full vocabulary (the distribution the policy gradient is taken for), with gradients and
without the cache's bf16 rounding.
"""

from __future__ import annotations

import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


from rookworld.policy.model import GPT, KVCache

EOS_ID = 50256
PAD_ID = EOS_ID

# Round the cache length up to a multiple of this when compiling, so that prompts of slightly different widths
# reuse one compiled graph (each distinct shape is a recompilation and another CUDA graph).
CACHE_LEN_BUCKET = 64
# Compiled decoding keeps its KV caches between calls (the CUDA graph has their addresses baked in); at most
# this many shapes per model, least recently used evicted. `release_caches(model)` frees them.
MAX_CACHED_SHAPES = 2


@dataclass
class GenerationOutput:
    tokens: torch.Tensor  # [B, N] long; after a sequence ends, pad_token_id
    mask: torch.Tensor  # [B, N] bool; True on generated tokens, including the EOS that ended a sequence
    logprobs: torch.Tensor  # [B, N] float32; sampling log-probs (see module docstring), 0 where mask is False
    policy_logprobs: torch.Tensor | None  # [B, N] float32; temperature-1 full-vocab log-probs, if requested
    lengths: torch.Tensor  # [B] long; number of generated tokens (mask.sum(1))
    stopped: torch.Tensor  # [B] bool; True where the sequence ended with EOS, False where it hit its limit


@dataclass
class TokenScores:
    logprobs: torch.Tensor  # [B, N] float32
    entropy: torch.Tensor | None = None  # [B, N] float32, if requested
    kl: torch.Tensor | None = None  # [B, N] float32: exact KL to the reference over the vocabulary, if one is given
    values: torch.Tensor | None = None  # [B, N] float32: the value head's estimate before each token, if given


# ----------------------------------------------------------------------------------------------------------
# Sampling from one step's logits


def _top_p_filter(sorted_logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest prefix of descending-sorted logits whose probability mass reaches top_p."""
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs
    return sorted_logits.masked_fill(mass_before >= top_p, float("-inf"))  # the top token always survives


def _race(scaled: torch.Tensor, uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The draw and its log-prob from (tempered, filtered) logits [B, K] and uniforms of the same shape.

    Exponential race (Gumbel-max): argmax_i p_i / E_i with E_i = -log(U_i) ~ Exp(1) is a draw from p, and so is
    argmax_i (logit_i - log E_i), since log p_i differs from logit_i by one constant per row: no log-softmax is
    written. U = 0 gives E = inf: that token just cannot win. Compiled, this is one pass over the logits and the
    uniforms instead of a dozen."""
    choice = (scaled - uniform.log().neg().log()).argmax(-1, keepdim=True)
    token_logp = scaled.gather(-1, choice).squeeze(-1) - scaled.logsumexp(-1)
    return choice, token_logp


_compiled_races: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}


def _maybe_compiled(fn: Callable, compiled: dict[str, Callable], device_type: str, compile: bool) -> Callable:
    """fn compiled for `device_type` (kept in `compiled`), or fn itself when not compiling or when compiling has
    failed on that device type before."""
    if not compile or device_type in _compile_failed:
        return fn
    if device_type not in compiled:
        compiled[device_type] = torch.compile(fn, fullgraph=True)
    return compiled[device_type]


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    compile: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from logits [B, V] (float32). Returns (tokens [B], sampling log-probs [B]).

    temperature <= 0 means greedy (log-prob 0: the distribution sampled from is a point mass).
    compile: fuse the draw into one pass (torch.compile; a warning and eager if compiling fails).
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
    # Uniforms from rand, outside any compiled code, so that `generator` makes runs reproducible (and not from
    # exponential_(), 5x slower on CPU); the race never syncs with the host, unlike torch.multinomial.
    uniform = torch.rand(scaled.shape, generator=generator, device=scaled.device)
    race = _maybe_compiled(_race, _compiled_races, scaled.device.type, compile)
    (choice, token_logp), _ = _run_or_fall_back(race, _race, scaled.device.type, scaled, uniform)
    token = choice.squeeze(-1) if candidates is None else candidates.gather(-1, choice).squeeze(-1)
    return token, token_logp


# ----------------------------------------------------------------------------------------------------------
# Decoding


def _decode_step(
    model: GPT,
    cache: KVCache,
    tokens: torch.Tensor,
    position_ids: torch.Tensor,
    write_pos: torch.Tensor,
    device_type: str,
    amp_dtype: torch.dtype | None,
) -> torch.Tensor:
    """One token per row [B, 1] through the model against the cache; next-token logits [B, V] in float32."""
    with torch.autocast(device_type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
        hidden = model.trunk(tokens, None, position_ids, cache, write_pos)
        return model.lm_head(hidden[:, -1]).float()


_compiled_steps: dict[str, Callable[..., torch.Tensor]] = {}
#: Device types on which compiling the decode step failed once: they decode eagerly for the rest of the process.
_compile_failed: dict[str, str] = {}
_cache_pool: weakref.WeakKeyDictionary[GPT, OrderedDict[tuple, KVCache]] = weakref.WeakKeyDictionary()


def _compiled_step(device_type: str) -> Callable[..., torch.Tensor]:
    if device_type not in _compiled_steps:
        # reduce-overhead = inductor + CUDA graphs: the ~100 small kernels of a decode step become one replay.
        mode = "reduce-overhead" if device_type == "cuda" else None
        _compiled_steps[device_type] = torch.compile(_decode_step, mode=mode, fullgraph=True, dynamic=False)
    return _compiled_steps[device_type]


def _give_up_compiling(device_type: str, error: Exception) -> None:
    """A compiler failure (missing toolchain, an inductor or Triton bug) costs speed, never the run."""
    cause = getattr(error, "inner_exception", None) or error.__cause__ or error  # the backend's own error
    first_line = (str(cause).strip().splitlines() or [""])[0][:300]
    _compile_failed[device_type] = f"{type(cause).__name__}: {first_line}"
    warnings.warn(f"torch.compile failed on {device_type} ({_compile_failed[device_type]}); sampling and "
                  "scoring without it from now on, which is slower. --no-compile skips the attempt.",
                  RuntimeWarning, stacklevel=4)


def _run_or_fall_back(fn: Callable, eager: Callable, device_type: str, *args: Any, checkpointed: bool = False):
    """fn(*args) (through activation checkpointing if `checkpointed`); if fn is a compiled function whose
    compilation fails, eager(*args) after a warning. Returns the result and the function to use from then on.
    Compilation fails before anything runs, so nothing is done twice."""
    run = lambda f: checkpoint(f, *args, use_reentrant=False) if checkpointed else f(*args)  # noqa: E731
    if fn is eager:
        return run(fn), fn
    try:
        return run(fn), fn
    except torch._dynamo.exc.TorchDynamoException as error:
        _give_up_compiling(device_type, error)
        return run(eager), eager


def _pooled_cache(model: GPT, batch_size: int, max_len: int, dtype: torch.dtype) -> KVCache:
    """A KV cache reused across calls: CUDA graphs replay against fixed addresses, so the cache must persist."""
    pool = _cache_pool.setdefault(model, OrderedDict())
    key = (batch_size, max_len, dtype, model.device)
    if key in pool:
        pool.move_to_end(key)
        cache = pool[key]
        cache.reset()
        return cache
    while len(pool) >= MAX_CACHED_SHAPES:
        pool.popitem(last=False)
    cache = KVCache(model.config, batch_size, max_len, model.device, dtype)
    # Tells dynamo/cudagraphs these inputs keep their address, so mutating them in the graph is allowed.
    torch._dynamo.mark_static_address(cache.kv)
    torch._dynamo.mark_static_address(cache.valid)
    pool[key] = cache
    return cache


def release_caches(model: GPT | None = None) -> None:
    """Free the KV caches that compiled decoding keeps (for one model, or all)."""
    if model is None:
        _cache_pool.clear()
    else:
        _cache_pool.pop(model, None)


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


class _Decoder:
    """Next-token logits [B, V] (float32) of a batch, one token at a time: against a KV cache written at a
    position tensor (the step compiled, and replayed as a CUDA graph, on CUDA), or, with use_cache=False, by
    recomputing the whole sequence (slow; the tests' reference)."""

    def __init__(self, model: GPT, input_ids: torch.Tensor, mask: torch.Tensor, new_tokens: int,
                 dtype: torch.dtype | None, compile: bool | None, use_cache: bool):
        device = model.device
        # bf16 on CUDA unless the model already runs in a 16-bit type; fp32 weights then stay fp32 (autocast).
        default_dtype = torch.bfloat16 if device.type == "cuda" and model.dtype == torch.float32 else model.dtype
        compute_dtype = dtype or default_dtype
        self.amp_dtype = compute_dtype if compute_dtype != model.dtype else None
        compile = (device.type == "cuda") if compile is None else compile
        self.compile = compile and use_cache and device.type not in _compile_failed
        self.model, self.device, self.use_cache = model, device, use_cache
        self.input_ids, self.mask = input_ids, mask
        self.autocast = torch.autocast(device.type, dtype=self.amp_dtype or torch.bfloat16,
                                       enabled=self.amp_dtype is not None)
        if use_cache:
            max_len = input_ids.shape[1] + new_tokens
            if self.compile:
                max_len = -(-max_len // CACHE_LEN_BUCKET) * CACHE_LEN_BUCKET
                self.cache = _pooled_cache(model, input_ids.shape[0], max_len, compute_dtype)
                self.step_fn = _compiled_step(device.type)
            else:
                self.cache = KVCache(model.config, input_ids.shape[0], max_len, device, compute_dtype)
                self.step_fn = _decode_step

    def first(self) -> torch.Tensor:
        """Logits after the prompts (the prefill)."""
        P = self.input_ids.shape[1]
        with self.autocast:
            if not self.use_cache:
                return self.model.lm_head(self.model.trunk(self.input_ids, self.mask)[:, -1]).float()
            hidden = self.model.trunk(self.input_ids, self.mask, None, self.cache, torch.arange(P, device=self.device))
            logits = self.model.lm_head(hidden[:, -1]).float()
        self.write_pos = torch.tensor([P], dtype=torch.long, device=self.device)
        self.position_ids = self.mask.sum(1, keepdim=True)  # next position of every row: its real prompt length
        return logits

    def next(self, token: torch.Tensor) -> torch.Tensor:
        """Logits after appending `token` [B] to every row."""
        if not self.use_cache:
            ones = torch.ones(token.shape[0], 1, dtype=torch.bool, device=self.device)
            self.input_ids = torch.cat([self.input_ids, token[:, None]], dim=1)
            self.mask = torch.cat([self.mask, ones], dim=1)
            with self.autocast:
                return self.model.lm_head(self.model.trunk(self.input_ids, self.mask)[:, -1]).float()
        args = (self.model, self.cache, token[:, None], self.position_ids, self.write_pos, self.device.type,
                self.amp_dtype)
        if self.compile:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs are consumed
        logits, self.step_fn = _run_or_fall_back(self.step_fn, _decode_step, self.device.type, *args)
        self.compile = self.step_fn is not _decode_step
        self.write_pos = self.write_pos + 1
        self.position_ids = self.position_ids + 1
        return logits


@torch.no_grad()
def generate(
    model: GPT,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    max_new_tokens: int | torch.Tensor = 144,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int = EOS_ID,
    pad_token_id: int = PAD_ID,
    stop_at_eos: bool = True,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    return_policy_logprobs: bool = False,
    use_cache: bool = True,
    compile: bool | None = None,
    dtype: torch.dtype | None = None,
    check_every: int | None = None,
) -> GenerationOutput:
    """Sample completions for a left-padded batch of prompts.

    input_ids / attention_mask: [B, P], left-padded (see `rookworld.policy.tokenizer`); mask None = no padding.
    max_new_tokens: one limit, or one per row ([B] tensor). A row stops at its limit or, with stop_at_eos, after
        emitting eos_token_id (the EOS is part of the completion and of its mask). stop_at_eos=False generates
        exactly max_new_tokens per row (benchmarks).
    temperature <= 0 is greedy; top_k / top_p restrict the support (applied after temperature, top-k first).
    seed or generator: seeded runs are reproducible (same device, same batch). The generator must live on the
        model's device.
    return_policy_logprobs: also return temperature-1 full-vocab log-probs of the sampled tokens.
    use_cache=False recomputes the whole sequence every step (slow; a reference for tests).
    compile: compile the decode step (CUDA graphs on CUDA); default True on CUDA, False elsewhere. Each new
        (batch size, bucketed length) compiles again; dynamo's recompile limit (torch._dynamo.config
        .recompile_limit, 8) caps how many shapes one process can compile before falling back to eager. If
        compiling fails, a RuntimeWarning says why and the process decodes eagerly from then on.
    dtype: compute dtype; default bfloat16 on CUDA for an fp32 model, else the model's own. If it differs from
        the parameters' dtype the forward runs under torch.autocast; the KV cache is kept in `dtype`.
    check_every: steps between "all rows done?" checks (a host sync); default 16 on CUDA, 1 on CPU.
    """
    device = model.device
    input_ids = input_ids.to(device)
    B, P = input_ids.shape
    mask = (
        attention_mask.to(device=device, dtype=torch.bool)
        if attention_mask is not None
        else torch.ones(B, P, dtype=torch.bool, device=device)
    )
    limits, N = _row_limits(max_new_tokens, B, device)
    if P + N > model.config.block_size:
        raise ValueError(f"prompt width {P} + {N} new tokens exceeds the context of {model.config.block_size}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p}")
    if generator is None and seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    check_every = check_every or (16 if device.type == "cuda" else 1)

    tokens = torch.full((B, N), pad_token_id, dtype=torch.long, device=device)
    out_mask = torch.zeros((B, N), dtype=torch.bool, device=device)
    logprobs = torch.zeros((B, N), dtype=torch.float32, device=device)
    policy_logprobs = torch.zeros((B, N), dtype=torch.float32, device=device) if return_policy_logprobs else None
    done = limits <= 0
    stopped = torch.zeros(B, dtype=torch.bool, device=device)

    was_training = model.training
    model.eval()  # dropout must be off while sampling, whatever the trainer left it at
    try:
        decoder = _Decoder(model, input_ids, mask, N, dtype, compile, use_cache)
        logits = decoder.first()
        for step in range(N):
            token, token_logp = sample_next(logits, temperature, top_k, top_p, generator, decoder.compile)
            if policy_logprobs is not None:
                policy_logprobs[:, step] = logits.gather(-1, token[:, None]).squeeze(1) - logits.logsumexp(-1)
            alive = ~done
            token = torch.where(alive, token, pad_token_id)
            tokens[:, step] = token
            out_mask[:, step] = alive
            logprobs[:, step] = token_logp.masked_fill(done, 0.0)
            if stop_at_eos:
                hit_eos = alive & (token == eos_token_id)
                stopped |= hit_eos
                done = done | hit_eos
            done = done | (limits <= step + 1)
            if step + 1 == N or ((step + 1) % check_every == 0 and bool(done.all())):
                break
            logits = decoder.next(token)
    finally:
        model.train(was_training)

    if policy_logprobs is not None:
        policy_logprobs.masked_fill_(~out_mask, 0.0)
    lengths = out_mask.sum(1)
    width = int(lengths.max()) if B else 0  # one sync at the end: drop columns that no row reached
    return GenerationOutput(
        tokens=tokens[:, :width],
        mask=out_mask[:, :width],
        logprobs=logprobs[:, :width],
        policy_logprobs=policy_logprobs[:, :width] if policy_logprobs is not None else None,
        lengths=lengths,
        stopped=stopped,
    )


# ----------------------------------------------------------------------------------------------------------
# Scoring pass for training


KL_DIRECTIONS = ("forward", "reverse", "symmetric")


def full_kl(logp: torch.Tensor, ref_logp: torch.Tensor, direction: str = "forward") -> torch.Tensor:
    """Exact KL per row between two log-softmaxed distributions over the vocabulary [n, V] -> [n]:
    ``forward`` KL(policy || reference), ``reverse`` KL(reference || policy), ``symmetric`` their mean."""
    if direction not in KL_DIRECTIONS:
        raise ValueError(f"KL direction must be one of {KL_DIRECTIONS}, got {direction!r}")
    forward = reverse = None
    if direction != "reverse":
        forward = (logp.exp() * (logp - ref_logp)).sum(-1)
    if direction != "forward":
        reverse = (ref_logp.exp() * (ref_logp - logp)).sum(-1)
    if forward is None:
        return reverse
    if reverse is None:
        return forward
    return 0.5 * (forward + reverse)


def _chunk_scores(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    weight: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    ref_hidden: torch.Tensor | None = None,
    ref_weight: torch.Tensor | None = None,
    kl_direction: str = "forward",
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
        out.append(full_kl(logits - log_z.unsqueeze(-1), ref_logits.log_softmax(-1), kl_direction))
    return tuple(out)


# Eager, each step of _chunk_scores after the matmul (fp32 copy, logsumexp, gather, exp, entropy) is a pass over
# [chunk, vocab] in memory: together several times the matmul's own traffic. Compiled, they fuse into a couple of
# reductions over the logits, forward and backward.
_compiled_scores: dict[str, Callable[..., tuple[torch.Tensor, ...]]] = {}


def _trunk(model: GPT, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    return model.trunk(input_ids, attention_mask)


# Eager under bf16 autocast, the trunk's LayerNorms, GELUs, residual adds and casts each read and write the
# activations once more, forward and backward: at GPT-2 small's width about as many bytes as its matmuls take
# time. Compiled, they fuse into the matmuls' neighbours. Shapes vary between calls (micro-batches are cut to
# their own columns), so after the first new shape dynamo compiles a dynamic-shape graph.
_compiled_trunks: dict[str, Callable[..., torch.Tensor]] = {}


def token_logprobs(
    model: GPT,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    start: int = 1,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    return_entropy: bool = False,
    compile: bool = False,
    reference: GPT | None = None,
    kl_direction: str = "forward",
    value_head: torch.nn.Module | None = None,
    scored: torch.Tensor | None = None,
) -> TokenScores:
    """log p(input_ids[:, t] | input_ids[:, :t]) for t in [start, T): logprobs [B, T - start], differentiable.

    For GRPO, input_ids = prompt (left-padded, width P) + completion, and start = P gives the completion's
    per-token log-probs. The trunk runs once; the lm_head and log-softmax run over `chunk_size` (row, time)
    positions at a time, so the fp32 [B, T, vocab] logits never exist at once. With gradients enabled each chunk
    is checkpointed: backward recomputes its logits instead of keeping them (peak: one chunk of logits).
    Entropy (optional) is that of the same, temperature-scaled, distribution. Autocast, if any, is the caller's.
    compile: run the trunk and the per-chunk log-softmax through torch.compile (a warning and eager if compiling
    fails).
    reference: also the exact KL to this (frozen) model's tempered distribution at each position, summed over
    the vocabulary (`full_kl`, in `kl_direction`); its logits are made chunk by chunk beside the
    policy's, so they too never exist whole.
    value_head: also its value of the hidden state that predicts each token (the state before the token).
    scored: bool [B, T - start], the positions wanted; the lm_head runs on those alone and every other position
    reads 0 (log-prob, entropy and KL; values are made everywhere). The lm_head is most of a small model's work,
    so skipping positions no loss counts (a prompt under a completion-only loss, padding) saves most of theirs.
    """
    B, T = input_ids.shape
    if not 1 <= start < T:
        raise ValueError(f"start must lie in [1, {T}), got {start}")
    device_type = input_ids.device.type
    trunk = _maybe_compiled(_trunk, _compiled_trunks, device_type, compile)
    hidden, trunk = _run_or_fall_back(trunk, _trunk, device_type, model, input_ids, attention_mask)
    hidden = hidden[:, start - 1 : T - 1]  # position t-1 predicts token t
    N = T - start
    hidden = hidden.reshape(B * N, -1)
    targets = input_ids[:, start:].reshape(B * N)
    weight = model.lm_head.weight
    ref_hidden = ref_weight = None
    if reference is not None:
        with torch.no_grad():
            ref_hidden, _ = _run_or_fall_back(trunk, _trunk, device_type, reference, input_ids, attention_mask)
            ref_hidden = ref_hidden[:, start - 1 : T - 1].reshape(B * N, -1)
        ref_weight = reference.lm_head.weight.detach()
    picked = None
    h, t, rh = hidden, targets, ref_hidden
    if scored is not None:
        if scored.shape != (B, N):
            raise ValueError(f"scored must have shape {(B, N)}, got {tuple(scored.shape)}")
        picked = scored.reshape(B * N).nonzero().squeeze(1)
        h, t = hidden[picked], targets[picked]
        rh = None if ref_hidden is None else ref_hidden[picked]
    differentiable = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    scores = _maybe_compiled(_chunk_scores, _compiled_scores, device_type, compile)
    parts: list[list[torch.Tensor]] = []
    for i in range(0, max(len(t), 1), chunk_size):  # with nothing scored, one empty chunk keeps the outputs' shape
        chunk = slice(i, i + chunk_size)
        args = (h[chunk], t[chunk], weight, temperature, return_entropy,
                None if rh is None else rh[chunk], ref_weight, kl_direction)
        out, scores = _run_or_fall_back(scores, _chunk_scores, device_type, *args, checkpointed=differentiable)
        parts.append(list(out))
    columns = [torch.cat(c) for c in zip(*parts)]
    if picked is None:
        columns = [c.view(B, N) for c in columns]
    else:
        columns = [c.new_zeros(B * N).index_copy(0, picked, c).view(B, N) for c in columns]
    logprobs = columns.pop(0)
    entropy = columns.pop(0) if return_entropy else None
    kl = columns.pop(0) if reference is not None else None
    values = value_head(hidden).float().view(B, N) if value_head is not None else None
    return TokenScores(logprobs=logprobs, entropy=entropy, kl=kl, values=values)


def score_completions(
    model: GPT,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor | None,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> TokenScores:
    """`token_logprobs` of completions [B, N] after left-padded prompts [B, P]: scores [B, N]."""
    B, P = prompt_ids.shape
    completion_ids = completion_ids.to(prompt_ids.device)
    if prompt_mask is None:
        prompt_mask = torch.ones_like(prompt_ids, dtype=torch.bool)
    if completion_mask is None:
        completion_mask = torch.ones_like(completion_ids, dtype=torch.bool)
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask.bool(), completion_mask.to(prompt_ids.device).bool()], dim=1)
    return token_logprobs(model, ids, mask, start=P, **kwargs)
