"""Keys and values kept while decoding: `KVCache`, preallocated with static shapes (what CUDA graphs need), and
`GroupCache`, which keeps each group's shared prompt once and reads only the slots written so far (eager
decoding). `rookworld.net.decoding` picks one; `rookworld.net.attention.Cached` attends through it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rookworld.net.attention import grouped_attention, prompt_bias
from rookworld.net.model import GPTConfig


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

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, write_pos: torch.Tensor,
               mask: torch.Tensor) -> torch.Tensor:
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

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, write_pos: torch.Tensor,
               mask: None) -> torch.Tensor:
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
