"""Next-token logits of a batch, one token per row at a time, against a cache of keys and values.

The prompts are prefilled once, each group's prompt once. Compiled, every decode step after that has the same
shapes (a preallocated `KVCache`, written at a position *tensor*), so on CUDA the step is compiled with
`torch.compile(mode="reduce-overhead")` and replayed as a CUDA graph; a graph has its cache's addresses baked in, so
compiled decoding keeps its caches between calls. Eager (the CPU's default), a `GroupCache` keeps each group's
prompt once, attention reads only the slots written so far, and groups whose rows are all done leave the batch
(`Decoder.drop_done`): a finished row costs nothing more.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

import torch

from rookworld.net.caches import GroupCache, KVCache
from rookworld.net.compile_log import describe
from rookworld.net.compiling import Compiled, has_failed, run_or_fall_back
from rookworld.net.head import head_logits
from rookworld.net.model import GPT, Products

# Round the cache length up to a multiple of this when compiling, so that prompts of slightly different widths
# reuse one cache and one CUDA graph (each distinct shape is another recording).
CACHE_LEN_BUCKET = 64
# Compiled decoding keeps its KV caches between calls (the CUDA graph has their addresses baked in); at most
# this many shapes per model, least recently used evicted. A run's steady state is each task at one or two batch
# sizes (the mix rounds its prompt counts) in one cache-length bucket: with fewer, the shapes evict each other and
# every eviction re-records a CUDA graph. `release_caches(model)` frees them.
MAX_CACHED_SHAPES = 4


def decode_step(
    model: GPT,
    cache: KVCache | GroupCache,
    tokens: torch.Tensor,
    position_ids: torch.Tensor,
    write_pos: torch.Tensor,
    device_type: str,
    amp_dtype: torch.dtype | None,
    products: Products | None = None,
) -> torch.Tensor:
    """One token per row [B, 1] through the model against the cache; next-token logits [B, V] in float32.
    `products`: who makes the trunk's products (a memo's recording, eager only)."""
    with torch.autocast(device_type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
        hidden = model.trunk(tokens, None, position_ids, cache, write_pos, products)
        return head_logits(hidden[:, -1], model.lm_head.weight)


describe(decode_step, lambda model, cache, tokens, *_: f"the decode step for {tokens.shape[0]:,} rows x "
                                                      f"{cache.valid.shape[1]} positions")
_DECODE_STEP = Compiled(decode_step)


class CachePool:
    """The KV caches compiled decoding keeps between calls, by model: CUDA graphs replay against fixed addresses,
    so a cache must outlive the call that made it. At most MAX_CACHED_SHAPES a model, least recently used evicted;
    a model's go with it."""

    def __init__(self):
        self._by_model: weakref.WeakKeyDictionary[GPT, OrderedDict[tuple, KVCache]] = weakref.WeakKeyDictionary()

    def cache(self, model: GPT, batch_size: int, max_len: int, dtype: torch.dtype) -> KVCache:
        """The cache of this shape, reset, made the first time."""
        pool = self._by_model.setdefault(model, OrderedDict())
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

    def release(self, model: GPT | None = None) -> None:
        """Frees the caches of one model, or of all."""
        if model is None:
            self._by_model.clear()
        else:
            self._by_model.pop(model, None)


#: Process-wide, as the CUDA graphs recorded against these caches' addresses are: a cache must outlive the call that
#: made it (`CachePool`), and every caller of the compiled decode step replays the same graphs.
_CACHES = CachePool()


def release_caches(model: GPT | None = None) -> None:
    """Free the KV caches that compiled decoding keeps (for one model, or all)."""
    _CACHES.release(model)


def decodes_eagerly(device: torch.device, compile: bool | None) -> bool:
    """Whether a `Decoder` on `device` with this `compile` setting runs eagerly, against a `GroupCache` whose done
    groups leave the batch (else compiled, against a static `KVCache`)."""
    compile = (device.type == "cuda") if compile is None else compile
    return not compile or has_failed(decode_step, device.type)


class Decoder:
    """Next-token logits [B, V] (float32) of a left-padded batch: `prefill` the prompts, then `step` one token per
    row at a time, for up to `max_len` positions in all.

    dtype: compute dtype; default bfloat16 on CUDA for an fp32 model, else the model's own. If it differs from the
    parameters' dtype the model runs under torch.autocast; the KV cache is kept in `dtype`.
    compile: compile the step (a CUDA graph on CUDA); default True on CUDA. `self.compile` says whether it is.
    """

    def __init__(self, model: GPT, batch_size: int, max_len: int, dtype: torch.dtype | None,
                 compile: bool | None):
        self.model, self.device = model, model.device
        device_type = self.device.type
        # bf16 on CUDA unless the model already runs in a 16-bit type; fp32 weights then stay fp32 (autocast).
        default_dtype = torch.bfloat16 if device_type == "cuda" and model.dtype == torch.float32 else model.dtype
        compute_dtype = dtype or default_dtype
        self.amp_dtype = compute_dtype if compute_dtype != model.dtype else None
        compile = not decodes_eagerly(self.device, compile)
        # reduce-overhead = inductor + CUDA graphs: the ~100 small kernels of a decode step become one replay.
        mode = "reduce-overhead" if device_type == "cuda" else None
        # dynamic: one graph for every batch and cache length (a step's P:/A: split moves its batches from step to
        # step); CUDA graphs still record one replay for each shape, which costs a recording, not a compile.
        self.step_fn = _DECODE_STEP.pick(device_type, compile, mode=mode, dynamic=True)
        self.compile = self.step_fn is not decode_step
        self.max_len = max_len
        self.cache: KVCache | GroupCache | None = None
        if self.compile:
            max_len = -(-max_len // CACHE_LEN_BUCKET) * CACHE_LEN_BUCKET
            self.cache = _CACHES.cache(model, batch_size, max_len, compute_dtype)

    def prefill(self, input_ids: torch.Tensor, mask: torch.Tensor, rows_per_prompt: int = 1,
                products: Products | None = None) -> torch.Tensor:
        """Logits [B, V] after the prompts [B / rows_per_prompt, P] (mask: bool, False on left padding), each prompt
        computed once: kept once for its `rows_per_prompt` consecutive rows (eager), or its keys and values copied
        to each of them in the static cache, in place (a CUDA graph's addresses stay valid)."""
        P = input_ids.shape[1]
        with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.bfloat16,
                            enabled=self.amp_dtype is not None):
            hidden, kvs = self.model.prompt_trunk(input_ids, mask, products)
            logits = head_logits(hidden[:, -1], self.model.lm_head.weight)
        self.rows_per_prompt = rows_per_prompt
        self.write_pos = torch.tensor([P], dtype=torch.long, device=self.device)
        self.position_ids = mask.sum(1, keepdim=True).repeat_interleave(rows_per_prompt, 0)  # each row's next
        if not self.compile:
            self.cache = GroupCache(kvs, mask, rows_per_prompt, self.max_len - P)
            return logits.repeat_interleave(rows_per_prompt, 0)
        for layer, (k, v) in enumerate(kvs):
            self.cache.kv[layer, 0, :, :, :P] = k.repeat_interleave(rows_per_prompt, 0)
            self.cache.kv[layer, 1, :, :, :P] = v.repeat_interleave(rows_per_prompt, 0)
        self.cache.valid[:, :P] = mask.repeat_interleave(rows_per_prompt, 0)
        return logits.repeat_interleave(rows_per_prompt, 0)

    def drop_done(self, done: torch.Tensor) -> torch.Tensor | None:
        """Eager decoding: drops every group whose rows are all done (done: [B] bool over the decoder's rows) and
        returns the rows kept ([B] bool), or None when none is dropped (always, compiled: its shapes are static)."""
        if not isinstance(self.cache, GroupCache):
            return None
        group_done = done.view(-1, self.rows_per_prompt).all(1)
        if not bool(group_done.any()):
            return None
        rows = self.cache.keep(torch.nonzero(~group_done).squeeze(1))
        self.position_ids = self.position_ids[rows]
        return (~group_done).repeat_interleave(self.rows_per_prompt)

    def step(self, token: torch.Tensor, products: Products | None = None) -> torch.Tensor:
        """Logits after appending `token` [B] to every row (`products`: as `decode_step`'s)."""
        args = (self.model, self.cache, token[:, None], self.position_ids, self.write_pos, self.device.type,
                self.amp_dtype, products)
        if self.compile:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs are consumed
        logits, self.step_fn = run_or_fall_back(self.step_fn, decode_step, self.device.type, *args)
        self.compile = self.step_fn is not decode_step
        self.write_pos = self.write_pos + 1
        self.position_ids = self.position_ids + 1
        return logits
