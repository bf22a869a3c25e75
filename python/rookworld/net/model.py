"""GPT-2 in plain PyTorch, loadable from (and savable to) the Hugging Face GPT-2 checkpoint layout.

This is the policy that GRPO trains: RookWorld-LM-124M is a GPT-2 small, so the module below is exactly GPT-2
(tanh-approximated GELU, LayerNorm eps 1e-5, learned absolute positions, tied input/output embedding), written
in the style of nanoGPT's model.py. Attention goes through `F.scaled_dot_product_attention`.

Two things differ from a textbook GPT-2, both for RL:
- Left-padded batches are first-class: position ids come from the attention mask, and padded keys are masked,
  so a prompt's logits do not depend on the padding around it.
- `trunk()` can decode against a cache: a preallocated `KVCache` written at an index tensor, whose static shapes
  CUDA graphs need, or a `GroupCache`, which keeps each group's shared prompt once and reads only the slots
  written so far (eager decoding). The decoder in `rookworld.net.decoding` picks one.

And two for speed on the CPU: every Linear's product goes through oneDNN's inner product in float32 (`linear`),
and eager decoding can keep the trunk's products (`ProductMemo`) for the update's first pass over the same
tokens with the same weights, which then makes none of them again.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
from contextlib import contextmanager
from contextvars import ContextVar
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from rookworld.ground.files import publish, temporary_directory
from rookworld.settings.hub import is_local_path

DEFAULT_REPO = "jrahn/RookWorld-LM-124M"
#: The GPT-2 vocabulary as the hub's GPT-2 repos carry it; `rookworld.net.tokenizer` reads and writes these.
TOKENIZER_FILES = ("vocab.json", "merges.txt")

# HF's GPT-2 uses Conv1D, which stores weights as [in, out]; nn.Linear wants [out, in].
_CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# HF buffers (causal-mask tables) that older checkpoints carry; SDPA makes them unnecessary.
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")
# Both spellings mean GELU with the tanh approximation.
_TANH_GELU_NAMES = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


class ModelNotAvailableError(OSError):
    """The checkpoint could not be found locally and could not be fetched from the hub."""


@dataclass
class GPTConfig:
    block_size: int = 1024  # HF n_positions
    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0  # off by default: with dropout on, the policy/reference KL is noise from step 1
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> GPTConfig:
        """Read a Hugging Face GPT-2 `config.json` dict, refusing variants this module does not implement."""
        act = hf.get("activation_function", "gelu_new")
        if act not in _TANH_GELU_NAMES:
            raise ValueError(f"unsupported activation_function {act!r}: this GPT-2 uses the tanh GELU (gelu_new)")
        n_embd = hf.get("n_embd", 768)
        if hf.get("n_inner") not in (None, 4 * n_embd):
            raise ValueError(f"unsupported n_inner {hf['n_inner']}: only 4 * n_embd is implemented")
        if not hf.get("tie_word_embeddings", True):
            raise ValueError("unsupported tie_word_embeddings=false: GPT-2 ties lm_head to wte")
        if hf.get("scale_attn_by_inverse_layer_idx", False) or not hf.get("scale_attn_weights", True):
            raise ValueError("unsupported attention scaling: only 1/sqrt(head_dim) is implemented")
        if hf.get("add_cross_attention", False):
            raise ValueError("unsupported add_cross_attention=true")
        return cls(
            block_size=hf.get("n_positions", hf.get("n_ctx", 1024)),
            vocab_size=hf.get("vocab_size", 50257),
            n_layer=hf.get("n_layer", 12),
            n_head=hf.get("n_head", 12),
            n_embd=n_embd,
            layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        )

    def to_hf(self) -> dict[str, Any]:
        """The `config.json` that `transformers.GPT2LMHeadModel.from_pretrained` expects."""
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "activation_function": "gelu_new",
            "n_positions": self.block_size,
            "n_ctx": self.block_size,
            "vocab_size": self.vocab_size,
            "n_layer": self.n_layer,
            "n_head": self.n_head,
            "n_embd": self.n_embd,
            "n_inner": None,
            "layer_norm_epsilon": self.layer_norm_eps,
            "attn_pdrop": self.dropout,
            "embd_pdrop": self.dropout,
            "resid_pdrop": self.dropout,
            "initializer_range": 0.02,
            "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False,
            "reorder_and_upcast_attn": False,
            "tie_word_embeddings": True,
            # <|endoftext|> is the last id of every vocabulary rookworld writes: 50256 in GPT-2's, 4363 in the chess one.
            "bos_token_id": self.vocab_size - 1,
            "eos_token_id": self.vocab_size - 1,
            "use_cache": True,
        }


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
        # done in place. (In eager mode that form is ~10x slower than index_copy_, hence two paths.)
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


def grouped_attention(q: torch.Tensor, own_k: torch.Tensor, own_v: torch.Tensor, prefix_k: torch.Tensor,
                      prefix_v: torch.Tensor, prefix_bias: torch.Tensor, first: int) -> torch.Tensor:
    """Attention of rows that come in groups sharing a prompt: queries q [B, nh, T, hd] over their group's prompt
    (keys and values [g, nh, P, hd], B / g consecutive rows a group; prefix_bias [g, 1, 1, P] float, -inf on
    padding) and over their own keys and values [B, nh, n, hd], the T queries being own positions first ..
    first + T - 1, each seeing own keys up to its own. [B, nh, T, hd].

    A prompt's keys are read once for its group (one [rows x T, hd] x [hd, P] product a head), not copied to every
    row. Scores and softmax in float32 at least. A right-padded query sees its padding neighbours before it (harmless: its
    output is never used), as a real query never does."""
    B, H, T, D = q.shape
    g, P, n = prefix_k.shape[0], prefix_k.shape[2], own_k.shape[2]
    r = B // g
    by_group = lambda x: x.view(g, r, H, T, -1).transpose(1, 2).reshape(g, H, r * T, -1)  # noqa: E731
    by_row = lambda x: x.view(g, H, r, T, -1).transpose(1, 2).reshape(B, H, T, -1)  # noqa: E731
    q, wide = q * (1.0 / math.sqrt(D)), torch.promote_types(q.dtype, torch.float32)
    prompt_scores = (by_group(q) @ prefix_k.transpose(-1, -2)).to(wide) + prefix_bias  # [g, nh, r * T, P]
    own_scores = (q @ own_k.transpose(-1, -2)).to(wide)  # [B, nh, T, n]
    if first + T < n or T > 1:
        seen = torch.ones(T, n, dtype=torch.bool, device=q.device).tril(first)
        own_scores = own_scores.masked_fill(~seen, float("-inf"))
    weights = torch.cat([by_row(prompt_scores), own_scores], dim=-1).softmax(-1).to(q.dtype)
    return by_row(by_group(weights[..., :P]) @ prefix_v) + weights[..., P:] @ own_v


def prompt_bias(prompt_mask: torch.Tensor) -> torch.Tensor:
    """`grouped_attention`'s bias [g, 1, 1, P] from prompts' mask [g, P]: 0 on real tokens, -inf on padding."""
    g, P = prompt_mask.shape
    bias = torch.zeros(g, 1, 1, P, device=prompt_mask.device)
    return bias.masked_fill(~prompt_mask.to(torch.bool).view(g, 1, 1, P), float("-inf"))


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
        # A tensor a layer (13 MB each for GPT-2 small's 64 rows and 32 new tokens), not one for all: under glibc's
        # mmap threshold, the next step's cache reuses this one's memory instead of faulting in 150 MB afresh
        # (37,000 page faults a generation). Empty: a slot is written before it is read.
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


# ----------------------------------------------------------------------------------------------------------
# The products of the CPU

# oneDNN's inner product (the op inductor emits for a CPU linear) multiplies by a dense float32 weight as it is. On
# a 2-core EPYC (AVX-512) it ran GPT-2 small's [rows, C] x [C, N] products at 130-150 GFLOP/s for a decode step's
# 64 rows against 111-124 for F.linear (MKL's sgemm), 187-206 against 146-177 at 2,048 rows, and the lm_head at
# 156-172 against 87-106: torch.mm itself reached 186-200 at 2048 cubed.
_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _inner_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T (+ bias) by oneDNN."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def uses_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` multiplies x by weight with oneDNN: float32 on the CPU, outside autocast and compiled
    code (inductor makes its own choice), with a contiguous weight."""
    return (_ONEDNN and x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and weight.is_contiguous() and not torch.is_autocast_enabled("cpu")
            and not torch.compiler.is_compiling())


class _OneDnnLinear(torch.autograd.Function):
    """oneDNN's products forward and for the input's gradient (by the weight transposed in memory: 190-200 GFLOP/s
    at 2,048 rows of GPT-2 small, against 120-140 for torch.mm by the weight, and 3 ms to transpose 9 MB); the
    weight's gradient, which reduces over the rows, by torch.mm (about 190)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _inner_product(x, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dy = dy.contiguous()
        dx = _inner_product(dy, weight.t().contiguous(), None) if ctx.needs_input_grad[0] else None
        dw = torch.mm(dy.t(), x) if ctx.needs_input_grad[1] else None
        db = dy.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), by oneDNN where `uses_onednn` (with gradients where any input wants one)."""
    if not uses_onednn(x, weight):
        return F.linear(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    wants_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    y = _OneDnnLinear.apply(rows, weight, bias) if wants_grad else _inner_product(rows, weight, bias)
    return y.view(*x.shape[:-1], weight.shape[0])


class _ReplayedLinear(_OneDnnLinear):
    """A product already made (by sampling, with the same weights): its value as it was, `_OneDnnLinear`'s
    gradients."""

    @staticmethod
    def forward(ctx, x, weight, bias, y):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        return (*_OneDnnLinear.backward(ctx, dy), None)


class Linear(nn.Linear):
    """nn.Linear whose product is `linear`'s, or, inside `ProductMemo.recording` / `replaying`, one that sampling
    kept. `memo_key`: its name in the model (set by GPT)."""

    memo_key = ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        memo = _memo.get()
        if memo is not None and memo.replays:
            y = memo.replay(self.memo_key, x.shape[:-1], self.out_features)
            if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, self.weight, self.bias)):
                rows = x.reshape(-1, x.shape[-1]).contiguous()
                y = _ReplayedLinear.apply(rows, self.weight, self.bias, y.reshape(rows.shape[0], -1))
            return y.view(*x.shape[:-1], self.out_features)
        y = linear(x, self.weight, self.bias)
        if memo is not None:
            memo.record(self.memo_key, y)
        return y


# ----------------------------------------------------------------------------------------------------------
# The trunk's products kept from sampling for the update

def recording_memo() -> ProductMemo | None:
    """The memo that products made now are recorded to, if any (`ProductMemo.recording`)."""
    memo = _memo.get()
    return None if memo is None or memo.replays else memo


@dataclass(frozen=True)
class Replay:
    """Which of a memo's products a log-prob pass over rollout rows `rows` (prompt columns from `left` on, `width`
    completion columns) takes: `phase("prompt")` around its prompt trunk, `phase("completion")` around the rest."""

    memo: ProductMemo
    rows: torch.Tensor
    left: int
    width: int

    def phase(self, name: str):
        return self.memo.replaying(self.rows, self.left, self.width, name)


_memo: ContextVar[ProductMemo | None] = ContextVar("rookworld_product_memo", default=None)


class ProductMemo:
    """The trunk's Linear products that eager decoding made, kept so that the update's first pass over the same
    tokens, with the same weights, takes them instead of making them again: with one minibatch and one epoch (the
    defaults), the update's forward then costs its LayerNorms, attention and GELUs, not its products (for GPT-2
    small, 170 MFLOP a token). Its backward is the same.

    Layout, for each Linear by name: `prompts` [g, P, N] (prefill's, g prompts over their last P columns) and
    `completions` [B, n, N] (column j: the product for completion token j, made when decoding fed that token;
    zero where decoding never fed it: a row's last token or a dropped group's, whose products no loss term reaches).

    Recording: `with memo.recording():` around `generate`; prefill and each decode step say what their products
    are (`at(("prompt",))`, `at(("column", rows, j))`). Replaying: `with memo.replaying(rows, left, width, phase)` around a
    `GPT.prompt_trunk` (phase "prompt": groups rows[::G], prompt columns from `left` on) or `GPT.continue_trunk`
    (phase "completion": rows, the first `width` completion columns) of the model that sampled.
    """

    def __init__(self, rows: int, new_tokens: int, rows_per_prompt: int, prompt_left: int):
        self.shape, self.rows_per_prompt, self.prompt_left = (rows, new_tokens), rows_per_prompt, prompt_left
        self.prompts: dict[str, torch.Tensor] = {}
        self.completions: dict[str, torch.Tensor] = {}
        self.replays = False
        self._at: tuple | None = None  # where a recorded product goes: ("prompt",) or ("column", rows, j)
        self._sel: tuple | None = None  # what a replayed product is: (rows, left, width, phase)

    @staticmethod
    def bytes_needed(config: GPTConfig, prompts: int, prompt_width: int, rows: int, new_tokens: int) -> int:
        """What a memo of these shapes holds, in float32."""
        widths = config.n_layer * 9 * config.n_embd  # c_attn 3C, attn c_proj C, c_fc 4C, mlp c_proj C
        return 4 * widths * (prompts * prompt_width + rows * new_tokens)

    @contextmanager
    def recording(self):
        token = _memo.set(self)
        try:
            yield self
        finally:
            _memo.reset(token)
            self._at = None

    @contextmanager
    def at(self, where: tuple):
        """Products made inside go to `where`: ("prompt",) or ("column", rows [b] long, j)."""
        self._at = where
        try:
            yield
        finally:
            self._at = None

    def record(self, key: str, y: torch.Tensor) -> None:
        if self._at is None:
            return
        if self._at[0] == "prompt":
            self.prompts[key] = y
            return
        _, rows, j = self._at
        buf = self.completions.get(key)
        if buf is None:
            buf = self.completions[key] = y.new_zeros(*self.shape, y.shape[-1])
        buf[rows, j] = y.reshape(len(rows), -1)

    @contextmanager
    def replaying(self, rows: torch.Tensor, left: int, width: int, phase: str):
        """Replays, for the policy's pass over rollout rows `rows` (whole groups, in order) cut to prompt columns
        from `left` and `width` completion columns."""
        self._sel, self.replays = (rows, left, width, phase), True
        token = _memo.set(self)
        try:
            yield
        finally:
            _memo.reset(token)
            self.replays = False

    def replay(self, key: str, shape: torch.Size, features: int) -> torch.Tensor:
        rows, left, width, phase = self._sel
        if phase == "prompt":
            kept = self.prompts[key]
            y = kept[rows[:: self.rows_per_prompt] // self.rows_per_prompt, left - self.prompt_left:]
        elif key in self.completions:
            y = self.completions[key][rows, :width]
        else:  # decoding fed no token (every row ended at its first): no product any loss term reaches
            y = torch.zeros(*shape, features, device=rows.device)
        if y.shape[:-1] != shape:
            raise RuntimeError(f"ProductMemo: {key} kept {tuple(y.shape[:-1])} where the pass asks {tuple(shape)}")
        return y


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids for a (left-)padded batch: the first real token of every row gets position 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def head_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The lm_head's logits [..., V] in float32. Under autocast (or with 16-bit weights) the inputs are rounded to
    the 16-bit type, as autocast's matmul rounds them, but the products are summed and returned in float32: rounded
    to bf16, GPT-2's logits of -50 to -100 lose 0.1-0.3 each, which the log-softmax keeps (a log-prob error of
    0.12 on average, against 0.006 for the inputs' rounding alone)."""
    device_type = hidden.device.type
    dtype = _head_dtype(hidden, weight)
    if dtype not in (torch.bfloat16, torch.float16):
        if uses_onednn(hidden, weight):
            return linear(hidden, weight)
        if device_type == "cpu" and hidden.dim() == 2:
            # MKL makes GPT-2's [V, C] x [C, rows] product at 150-160 GFLOP/s here (2-core EPYC, 64-512 rows, a
            # multiple of 8), [rows, C] x [C, V] at 80-120: the first, then a transposing copy (about a tenth of the
            # product's time), since the log-softmax and the draw on the strided view ran 2x slower.
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
    where oneDNN makes the products (167 GFLOP/s for GPT-2's [120, V] x [V, C] here, against 117 for torch.mm by
    the weight as it is; the copy is made once for all chunks), else None."""
    return weight.detach().t().contiguous() if uses_onednn(hidden, weight) else None


def head_input_grad(dz: torch.Tensor, weight: torch.Tensor, transposed: torch.Tensor | None = None) -> torch.Tensor:
    """dz @ W: the gradient w.r.t. a chunk's hidden states [rows, C] of the loss's gradient w.r.t. its logits dz
    [rows, V], rounded as `head_logits` rounds. `transposed`: `head_grad_weight`'s layout of W, if made."""
    if _head_dtype(dz, weight) in (torch.bfloat16, torch.float16):
        return head_logits(dz, weight.t())
    if transposed is not None:
        return _inner_product(dz.contiguous(), transposed, None)
    return torch.mm(dz, weight)


def add_head_grad(grad: torch.Tensor, dz: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor) -> None:
    """grad += dz^T @ hidden: a chunk's share of the lm_head weight's gradient [V, C] (float32), rounded as
    `head_logits` rounds. In float32, accumulated in place: a fresh [V, C] product a chunk is 154 MB of new pages
    for GPT-2 (the allocator maps blocks that large afresh), which took longer than the product itself on the CPU."""
    if _head_dtype(hidden, weight) in (torch.bfloat16, torch.float16):
        grad += head_logits(dz.t(), hidden.t())
    else:
        grad.addmm_(dz.t().to(grad.dtype), hidden.to(grad.dtype))


def _head_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    device_type = hidden.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else weight.dtype


def _padded_causal(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T, T] bool: query t sees the real keys at or before it; a padding query also sees itself, which keeps
    SDPA from writing NaN for a row with no key (its output is never read)."""
    T = attention_mask.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=attention_mask.device).tril()
    return (attention_mask.unsqueeze(1) & causal) | torch.eye(T, dtype=torch.bool, device=attention_mask.device)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx  # which slice of a KVCache is ours
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.c_attn = Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = Linear(config.n_embd, config.n_embd)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None,
        kv_cache: KVCache | GroupCache | None = None,
        write_pos: torch.Tensor | None = None,
        prefix: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The attention's output [B, T, C], and this call's own keys and values [B, nh, T, hd] (a prompt's, which
        its completions then attend to as their `prefix`).

        prefix: the keys and values [g, nh, P, hd] of g prompts, each shared by B / g consecutive rows: the T
        positions attend to them before their own. `attn_mask` is then either the bool mask over the P + T keys
        (SDPA over each row's copy of its prompt) or the prompts' float bias [g, 1, 1, P] (`grouped_attention`).
        """
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # [B, nh, T, hd]
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        own = (k, v)
        if kv_cache is not None:
            y = kv_cache.attend(self.layer_idx, q, k, v, write_pos, attn_mask)
        elif prefix is not None and attn_mask.dtype != torch.bool:  # the prompts' bias: see GPT.continue_trunk
            y = grouped_attention(q, k, v, prefix[0].to(q.dtype), prefix[1].to(q.dtype), attn_mask, 0)
        else:
            if prefix is not None:
                k, v = _after_prefix(prefix[0], k), _after_prefix(prefix[1], v)
            y = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=attn_mask,
                dropout_p=self.dropout if self.training else 0.0,
                is_causal=attn_mask is None,
            )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y)), own


def _after_prefix(prefix: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """Keys (or values) of g shared prompts [g, nh, P, hd], then each row's own [B, nh, T, hd]: [B, nh, P + T, hd].
    Written into one new tensor (one copy; the gradient of each prompt is the sum over its rows)."""
    g, H, P, D = prefix.shape
    B, _, T, _ = own.shape
    out = own.new_empty(B, H, P + T, D)
    out.view(g, B // g, H, P + T, D)[:, :, :, :P] = prefix.unsqueeze(1).to(own.dtype)
    out[:, :, P:] = own
    return out


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # GPT-2 was trained with the tanh approximation (HF "gelu_new"); exact GELU shifts the logits.
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None,
        kv_cache: KVCache | GroupCache | None = None,
        write_pos: torch.Tensor | None = None,
        prefix: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The block's output, and its attention's own keys and values (see `CausalSelfAttention`)."""
        a, kv = self.attn(self.ln_1(x), attn_mask, kv_cache, write_pos, prefix)
        x = x + a
        return x + self.mlp(self.ln_2(x)), kv


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps),
            )
        )
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as in GPT-2
        for name, module in self.named_modules():
            if isinstance(module, Linear):
                module.memo_key = name
        self.apply(self._init_weights)
        # GPT-2 scales the residual projections by 1/sqrt(2 * n_layer) so the residual stream keeps its scale.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        """Parameter count; the tied lm_head is counted once (124,439,808 for GPT-2 small)."""
        return sum(p.numel() for p in self.parameters())

    @property
    def device(self) -> torch.device:
        return self.transformer.wte.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.transformer.wte.weight.dtype

    def trunk(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        kv_cache: KVCache | GroupCache | None = None,
        write_pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final hidden states [B, T, n_embd] (after ln_f), before the lm_head.

        attention_mask [B, T] (1/True = real token) marks padding; position ids default to its cumulative sum.
        With `kv_cache`, the T new tokens are written to cache slots `write_pos` [T] (long) and attend to
        every valid slot at or before their own; without it, attention is over the T tokens given.
        """
        B, T = input_ids.shape
        device = input_ids.device
        if attention_mask is not None:
            attention_mask = attention_mask.to(torch.bool)
        if position_ids is None:
            if attention_mask is not None:
                position_ids = positions_from_mask(attention_mask)
            else:
                position_ids = torch.arange(T, device=device).unsqueeze(0)

        if kv_cache is not None:
            if write_pos is None:
                raise ValueError("write_pos is required with kv_cache")
            new_valid = attention_mask
            if new_valid is None:
                new_valid = torch.ones(B, T, dtype=torch.bool, device=device)
            attn_mask: torch.Tensor | None = kv_cache.begin(write_pos, new_valid)
        elif attention_mask is not None:
            attn_mask = _padded_causal(attention_mask).unsqueeze(1)
        else:
            attn_mask = None  # plain causal: lets SDPA pick its fastest kernel
        return self._layers(input_ids, position_ids, attn_mask, kv_cache, write_pos)[0]

    def prompt_trunk(self, input_ids: torch.Tensor, attention_mask: torch.Tensor
                     ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """`trunk` of left-padded prompts [g, P], and every layer's keys and values [g, nh, P, hd]: the `prefix` of
        `continue_trunk`, so that a group's completions share one pass over their prompt."""
        attention_mask = attention_mask.to(torch.bool)
        mask = _padded_causal(attention_mask).unsqueeze(1)
        return self._layers(input_ids, positions_from_mask(attention_mask), mask, keep=True)

    def continue_trunk(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       prefix: list[tuple[torch.Tensor, torch.Tensor]], prefix_mask: torch.Tensor) -> torch.Tensor:
        """Final hidden states [B, T, n_embd] of right-padded continuations [B, T] of g prompts (`prompt_trunk`'s
        `prefix` and mask [g, P]), each prompt's B / g continuations consecutive: they attend to their prompt's
        real tokens, then causally to their own, at the positions that follow the prompt's. The same states as
        `trunk` over prompt + continuation, with the prompt computed once per group."""
        B, T = input_ids.shape
        g, P = prefix_mask.shape
        attention_mask, prompt_mask = attention_mask.to(torch.bool), prefix_mask.to(torch.bool)
        prefix_mask = prompt_mask.repeat_interleave(B // g, 0)
        position_ids = prefix_mask.sum(1, keepdim=True) + positions_from_mask(attention_mask)
        if input_ids.device.type == "cpu" and not (self.training and self.config.dropout > 0):
            # On the CPU the copies of each prompt for its rows (and their gradients' sums) cost more than the
            # attention itself; on a GPU SDPA's fused kernels, which never hold the scores, are worth them.
            mask = prompt_bias(prompt_mask)
        else:
            seen = prefix_mask.unsqueeze(1).expand(B, T, P)
            mask = torch.cat([seen, _padded_causal(attention_mask)], dim=2).unsqueeze(1)
        return self._layers(input_ids, position_ids, mask, prefix=prefix)[0]

    def _layers(self, input_ids, position_ids, attn_mask, kv_cache=None, write_pos=None, prefix=None, keep=False):
        """Embeddings, blocks and ln_f: the hidden states, and each layer's own keys and values if `keep`."""
        x = self.transformer.wte(input_ids) + self.transformer.wpe(position_ids)
        x = self.transformer.drop(x)
        kept = []
        for i, block in enumerate(self.transformer.h):
            x, kv = block(x, attn_mask, kv_cache, write_pos, None if prefix is None else prefix[i])
            if keep:
                kept.append(kv)
        return self.transformer.ln_f(x), kept

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, vocab_size]. For large batches prefer `rookworld.net.logprobs.token_logprobs`."""
        return self.lm_head(self.trunk(input_ids, attention_mask))

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike = DEFAULT_REPO, **kwargs: Any) -> GPT:
        return from_pretrained(name_or_path, **kwargs)

    def save_pretrained(self, directory: str | os.PathLike, dtype: torch.dtype | None = None) -> Path:
        return save_pretrained(self, directory, dtype=dtype)


# ----------------------------------------------------------------------------------------------------------
# Weights stored in the autocast dtype


def autocast_copy(model: GPT, dtype: torch.dtype) -> GPT:
    """A frozen copy of `model` that computes, under `dtype` autocast, the same bits as `model` does, without
    casting its weights on every call.

    Autocast casts each Linear's weight and bias to `dtype` before its matmul and runs embeddings and LayerNorms
    in their own dtype. Here the Linear weights are stored in `dtype` already (the lm_head untied, since the
    embedding lookup needs wte as it was), so those casts are no-ops: for GPT-2 small in bf16 a decode step reads
    0.25 GB of weights instead of reading 0.50 GB and writing and reading a 0.25 GB copy. Bring it up to date with
    `refresh_copy` (in place: compiled CUDA graphs keep their addresses).
    """
    copy = deepcopy(model).eval().requires_grad_(False)
    copy.lm_head.weight = nn.Parameter(copy.transformer.wte.weight.detach().to(dtype), requires_grad=False)
    for module in copy.modules():
        if isinstance(module, nn.Linear):
            module.to(dtype)
    return copy


@torch.no_grad()
def refresh_copy(copy: GPT, model: GPT) -> GPT:
    """Copies `model`'s current weights into `copy` (made by `autocast_copy`), cast in place; returns `copy`."""
    copy.load_state_dict(model.state_dict())
    return copy


# ----------------------------------------------------------------------------------------------------------
# Loading and saving in the Hugging Face GPT-2 layout


def model_directory(name_or_path: str | os.PathLike = DEFAULT_REPO, revision: str | None = None,
                    cache_dir: str | os.PathLike | None = None) -> Path:
    """The local directory of a model: `name_or_path` itself, or the hub snapshot of a repo id (downloaded when it
    is not in the cache). Raises FileNotFoundError for a path that is not a directory."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise NotADirectoryError(f"{name_or_path} is a file, not a model directory")
    if is_local_path(str(name_or_path)):
        raise FileNotFoundError(f"no such model directory: {name_or_path}")
    return _resolve_hub(str(name_or_path), revision, cache_dir)


def _resolve_hub(repo_id: str, revision: str | None, cache_dir: str | os.PathLike | None) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    try:
        # Ask for safetensors first so that a repo carrying both formats is downloaded only once.
        for weights in ("model.safetensors", "pytorch_model.bin"):
            folder = Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir,
                                            allow_patterns=["config.json", weights, *TOKENIZER_FILES]))
            if (folder / weights).is_file():
                break
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as e:
        where = cache_dir if cache_dir is not None else constants.HF_HUB_CACHE
        offline = " (HF_HUB_OFFLINE is set)" if constants.HF_HUB_OFFLINE else ""
        raise ModelNotAvailableError(
            f"Cannot load {repo_id!r}{f' at revision {revision!r}' if revision else ''}: the Hugging Face hub "
            f"cannot be reached{offline} and the model is not in the local cache ({where}). "
            f"On a machine with network access run `hf download {repo_id} --local-dir DIR` "
            f"(or huggingface_hub.snapshot_download({repo_id!r}, local_dir='DIR')), copy DIR here and pass the "
            "local directory instead: --model DIR on the command line, from_pretrained('DIR') in Python. The "
            "directory needs config.json and model.safetensors (or pytorch_model.bin), and vocab.json and merges.txt "
            "for the vocabulary."
        ) from e
    return folder


class ModelFileError(ModelNotAvailableError, ValueError):
    """A model directory whose config.json or weights cannot be read: cut short, corrupt, or not what they say (a
    ValueError too, as an unsupported config always was to the Python API)."""


def _read_config(directory: Path) -> GPTConfig:
    config_file = directory / "config.json"
    if not config_file.is_file():
        inside = sorted(p.parent.name for p in directory.glob("*/config.json"))
        raise FileNotFoundError(f"{directory} has no config.json" + (
            f"; the models in it: {', '.join(inside[:8])}{' ...' if len(inside) > 8 else ''} (pass one, such as "
            f"--model {directory / inside[0]})" if inside else ""))
    try:
        hf = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ModelFileError(f"{config_file} cannot be read as JSON: {e}") from None
    if not isinstance(hf, dict):
        raise ModelFileError(f"{config_file} holds a JSON {type(hf).__name__}, not the object of a GPT-2 config")
    try:
        config = GPTConfig.from_hf(hf)
        sizes = (config.block_size, config.vocab_size, config.n_layer, config.n_head, config.n_embd)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes) \
                or config.n_embd % config.n_head:
            raise ValueError("n_positions, vocab_size, n_layer, n_head and n_embd must be positive integers, "
                             "n_embd a multiple of n_head")
    except (ValueError, TypeError) as e:
        raise ModelFileError(f"{config_file}: {e}") from None
    return config


def _read_hf_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    safetensors_file = directory / "model.safetensors"
    bin_file = directory / "pytorch_model.bin"
    if safetensors_file.is_file():
        try:
            return load_file(str(safetensors_file))
        except Exception as e:  # safetensors' own error type: a file cut short, empty or not safetensors
            raise ModelFileError(f"{safetensors_file} cannot be read ({e}): it is cut short or not a safetensors "
                                 f"file; copy or download it again") from None
    if bin_file.is_file():
        # weights_only: a .bin is a pickle, and a pickle from the internet must not run code.
        try:
            return torch.load(bin_file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            raise ModelFileError(f"{bin_file} holds more than tensors (a pickle that could run code), which "
                                 f"rookworld does not load; convert a model you trust to model.safetensors with "
                                 f"transformers (save_pretrained) and load that") from None
        except Exception as e:  # a file cut short, or not a torch file
            raise ModelFileError(f"{bin_file} cannot be read ({str(e).splitlines()[0] if str(e) else e!r}); copy or "
                                 f"download it again") from None
    raise FileNotFoundError(
        f"{directory} has neither model.safetensors nor pytorch_model.bin (sharded checkpoints are not supported)"
    )


def _from_hf_state_dict(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for key, tensor in hf_state.items():
        if key.endswith(_IGNORED_SUFFIXES) or key == "lm_head.weight":  # lm_head is tied to wte
            continue
        name = key if key.startswith("transformer.") else f"transformer.{key}"  # GPT2Model saves lack the prefix
        # Contiguous, as a fresh model's [out, in] weights are: a transposed view would give the loaded model's
        # parameters (and AdamW's state, made in their layout) another layout than a fresh model's.
        state[name] = tensor.t().contiguous() if name.endswith(_CONV1D_SUFFIXES) else tensor
    if "transformer.wte.weight" in state:
        state["lm_head.weight"] = state["transformer.wte.weight"]
    return state


def from_pretrained(
    name_or_path: str | os.PathLike = DEFAULT_REPO,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    *,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> GPT:
    """Load a GPT-2 checkpoint in the Hugging Face layout from a local directory or a hub repo id.

    The directory needs `config.json` and `model.safetensors` (preferred) or `pytorch_model.bin`. A repo id is
    fetched with `huggingface_hub.snapshot_download` (`revision`, `cache_dir` passed through; HF_HUB_OFFLINE
    and the hub cache are honoured). `dtype` defaults to float32 whatever the file holds (the hub checkpoint is
    bf16): the trainer needs fp32 master weights; pass torch.bfloat16 for an inference-only copy.
    The model is returned in eval mode (dropout off).
    """
    directory = model_directory(name_or_path, revision, cache_dir)
    config = _read_config(directory)
    state = _from_hf_state_dict(_read_hf_state_dict(directory))

    with torch.device("meta"):  # no point in random-initialising 124M parameters that are overwritten next
        model = GPT(config)
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as e:
        raise ValueError(f"{directory}: weights do not match config.json: {e}") from e
    model.lm_head.weight = model.transformer.wte.weight  # assign=True replaced the Parameter; tie again
    model.to(device=device or "cpu", dtype=dtype or torch.float32)
    return model.eval()


def save_pretrained(model: GPT, directory: str | os.PathLike, *, dtype: torch.dtype | None = None) -> Path:
    """Write `config.json` + `model.safetensors` in the HF GPT-2 layout (Conv1D weights, `transformer.` keys).

    `transformers.GPT2LMHeadModel.from_pretrained(directory)` loads the result. The files are written into a
    temporary directory next to the target and renamed into place, so a crash never leaves a half-written
    checkpoint: a new directory appears whole, and in an existing one each file is replaced atomically.
    """
    model = getattr(model, "_orig_mod", model)  # a torch.compile'd model: save the module it wraps
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":  # tied; HF re-ties it, and safetensors refuses shared tensors
            continue
        tensor = tensor.detach()
        if name.endswith(_CONV1D_SUFFIXES):
            tensor = tensor.t()
        state[name] = tensor.to(device="cpu", dtype=dtype or tensor.dtype).contiguous()
    hf_config = model.config.to_hf()
    hf_config["torch_dtype"] = str(dtype or model.dtype).removeprefix("torch.")

    tmp = temporary_directory(f".{directory.name}.tmp-", directory.parent)
    try:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        publish(tmp)
        if not directory.exists():
            os.replace(tmp, directory)
        else:
            # Weights before config, so that a config never describes weights that are not there yet.
            for name in ("model.safetensors", "config.json"):
                os.replace(tmp / name, directory / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory
