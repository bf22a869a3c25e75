"""Next-token logits of a batch, one token per row at a time, against a cache of keys and values.

The prompts are prefilled once, each group's prompt once. Compiled, every decode step after that has the same
shapes (a preallocated `KVCache`, written at a position *tensor*), so on CUDA the step is compiled with
`torch.compile(mode="reduce-overhead")` and replayed as a CUDA graph; a graph has its cache's addresses baked in, so
compiled decoding keeps its caches between calls. Eager (the CPU's default), a `GroupCache` keeps each group's
prompt once, attention reads only the slots written so far, and groups whose rows are all done leave the batch
(`Decoder.drop_done`): a finished row costs nothing more. Each cache's `attend` is a layer's attention
(`rookworld.net.attention`), over its own slots.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

import torch
import torch.nn.functional as F

from rookworld.net.attention import grouped_attention, prompt_bias
from rookworld.net.compile_log import describe
from rookworld.net.compiling import Compiled, has_failed, run_or_fall_back
from rookworld.net.head import head_logits
from rookworld.net.model import GPT, GPTConfig, Products

# Round the cache length up to a multiple of this when compiling, so that prompts of slightly different widths
# reuse one cache and one CUDA graph (each distinct shape is another recording).
CACHE_LEN_BUCKET = 64
# Compiled decoding keeps its KV caches between calls (the CUDA graph has their addresses baked in); at most
# this many shapes per model, least recently used evicted. A run's steady state is each task at one or two batch
# sizes (the mix rounds its prompt counts) in one cache-length bucket: with fewer, the shapes evict each other and
# every eviction re-records a CUDA graph. `release_caches(model)` frees them.
MAX_CACHED_SHAPES = 4


# -- the caches: `KVCache` (static shapes, what CUDA graphs need) and `GroupCache` (eager) -----------------

class KVCache:
    """Preallocated keys and values for incremental decoding, with static shapes.

    kv:    [n_layer, 2, B, n_head, max_len, head_dim]; slot t holds the key/value of sequence position t.
    valid: [B, max_len] bool; False for left padding and for slots not written yet. Attention reads all
           max_len slots and masks with `valid`, so no shape ever depends on how far decoding has got.
    """

    def __init__(
        self, config: GPTConfig, batch_size: int, max_len: int, device: torch.device | str, dtype: torch.dtype
    ) -> None:
        shape = (config.n_layer, 2, batch_size, config.n_head, max_len, config.head_dim)
        # zeros, not empty: masked slots still enter SDPA's weighted sum (with weight 0), and 0 * NaN is NaN.
        self.kv = torch.zeros(shape, device=device, dtype=dtype)
        self.valid = torch.zeros(batch_size, max_len, device=device, dtype=torch.bool)

    @property
    def max_len(self) -> int:
        return self.kv.shape[4]

    def reset(self) -> None:
        # Stale keys/values are harmless (finite, and masked); only the mask must be cleared.
        self.valid.zero_()

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, write_pos: torch.Tensor) -> None:
        """Store one layer's keys and values [B, n_head, T, head_dim] at slots write_pos [T] (long tensor)."""
        k, v = k.to(self.kv.dtype), v.to(self.kv.dtype)
        if not torch.compiler.is_compiling():
            self.kv[layer, 0].index_copy_(2, write_pos, k)
            self.kv[layer, 1].index_copy_(2, write_pos, v)
            return
        # Under torch.compile, a write through a view (as above) is functionalized into a copy of the whole cache
        # on every decode step. One index_put_ on the cache tensor itself, with an index for every dimension, is
        # done in place. (In eager mode that form is far slower than index_copy_, hence two paths.)
        _, _, B, H, _, D = self.kv.shape
        dev = self.kv.device
        index = (
            torch.full((), layer, dtype=torch.long, device=dev),
            torch.arange(2, device=dev).view(2, 1, 1, 1, 1),
            torch.arange(B, device=dev).view(1, B, 1, 1, 1),
            torch.arange(H, device=dev).view(1, 1, H, 1, 1),
            write_pos.view(1, 1, 1, -1, 1),
            torch.arange(D, device=dev).view(1, 1, 1, 1, D),
        )
        self.kv.index_put_(index, torch.stack([k, v]))

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of one layer's keys and values, [B, n_head, max_len, head_dim] each."""
        return self.kv[layer, 0], self.kv[layer, 1]

    def begin(self, write_pos: torch.Tensor, new_valid: torch.Tensor) -> torch.Tensor:
        """Marks slots write_pos [T] valid where new_valid [B, T] says so, and returns the mask [B, 1, T, max_len]
        of the keys each of the T new tokens sees: the valid slots at or before its own."""
        self.valid.index_copy_(1, write_pos, new_valid)
        key_pos = torch.arange(self.max_len, device=write_pos.device)
        query_pos = write_pos.unsqueeze(1)  # [T, 1]
        allowed = self.valid.unsqueeze(1) & (key_pos <= query_pos)  # [B, T, max_len]
        # A padding query has no valid key; letting it see itself keeps SDPA from producing NaN rows.
        return (allowed | (key_pos == query_pos)).unsqueeze(1)  # broadcast over heads

    def attend(self, layer: int, write_pos: torch.Tensor, mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, dropout_p: float = 0.0) -> torch.Tensor:
        """Writes the new tokens' keys and values [B, nh, T, hd] at write_pos, then attends over the whole
        (static-size) cache under `begin`'s mask: [B, nh, T, hd]."""
        # Writing at an index *tensor* keeps the step shape-static and capturable in a CUDA graph.
        self.write(layer, k, v, write_pos)
        k, v = self.layer(layer)
        return F.scaled_dot_product_attention(q.to(k.dtype), k, v, attn_mask=mask)


class GroupCache:
    """Keys and values for eager decoding, where rows come in groups of `rows_per_prompt` that share a prompt:
    each group's prompt once [g, n_head, P, head_dim] a layer (`GPT.prompt_trunk`'s keys and values), and each
    row's own tokens after it, in order. Attention reads a prompt once for its group (one [rows, hd] x [hd, P]
    product a head, not one matrix-vector product a row over a copy) and only the own slots written so far;
    `keep` drops whole groups whose rows are done. Its shapes change as decoding goes, so it is not for CUDA
    graphs (`KVCache` is).
    """

    def __init__(self, prefix: list[tuple[torch.Tensor, torch.Tensor]], prefix_mask: torch.Tensor,
                 rows_per_prompt: int, max_new: int) -> None:
        k = prefix[0][0]
        g, H, P, D = k.shape
        self.rows_per_prompt = rows_per_prompt
        self.prefix = [(pk.contiguous(), pv.contiguous()) for pk, pv in prefix]
        self.prefix_bias = prompt_bias(prefix_mask)
        # A tensor a layer, not one for all: under glibc's mmap threshold, the next step's cache reuses this one's
        # memory instead of faulting it in afresh (BENCHMARKS.md). Empty: a slot is written before it is read.
        self.own = [k.new_empty(2, g * rows_per_prompt, H, max_new, D) for _ in prefix]
        self.length = 0  # own slots written
        self._start = 0

    def begin(self, write_pos: torch.Tensor, new_valid: torch.Tensor) -> None:
        """Takes the next T own slots (write_pos is `KVCache`'s; here slots follow each other). Every new token
        is a real one: decoding has no padding after the prompt."""
        T = new_valid.shape[1]
        if self.length + T > self.own[0].shape[3]:
            raise ValueError(f"GroupCache holds {self.own[0].shape[3]} new tokens a row; {self.length + T} asked")
        self._start, self.length = self.length, self.length + T

    def attend(self, layer: int, write_pos: torch.Tensor, mask: None, q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, dropout_p: float = 0.0) -> torch.Tensor:
        """Attention of the new tokens q [B, nh, T, hd] (keys and values k, v) over their prompt and every own
        token up to theirs: [B, nh, T, hd]."""
        s, n = self._start, self.length
        own = self.own[layer]
        own[0, :, :, s:n], own[1, :, :, s:n] = k, v
        prefix_k, prefix_v = self.prefix[layer]
        return grouped_attention(q.to(own.dtype), own[0, :, :, :n], own[1, :, :, :n], prefix_k, prefix_v,
                                 self.prefix_bias, s)

    def keep(self, groups: torch.Tensor) -> torch.Tensor:
        """Keeps only these groups (indices, ascending), dropping the others' rows; returns the rows kept."""
        r = self.rows_per_prompt
        rows = (groups.unsqueeze(1) * r + torch.arange(r, device=groups.device)).reshape(-1)
        self.prefix = [(k[groups], v[groups]) for k, v in self.prefix]
        self.prefix_bias = self.prefix_bias[groups]
        kept = []
        for own in self.own:
            new = own.new_empty((2, len(rows)) + own.shape[2:])
            new[:, :, :, : self.length] = own[:, rows, :, : self.length]
            kept.append(new)
        self.own = kept
        return rows


# -- the decoder ---------------------------------------------------------------------------------------------

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
        self.step_fn = _DECODE_STEP.pick(device_type, True, mode=mode, dynamic=True) if compile else decode_step
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
        else:
            logits = decode_step(*args)
        self.write_pos = self.write_pos + 1
        self.position_ids = self.position_ids + 1
        return logits
