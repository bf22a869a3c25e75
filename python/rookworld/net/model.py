"""GPT-2 in plain PyTorch: the policy that GRPO trains (RookWorld-LM-124M is a GPT-2 small), in the style of nanoGPT's
model.py: tanh-approximated GELU, LayerNorm eps 1e-5, learned absolute positions, a tied input/output embedding.

Two things differ from a textbook GPT-2, both for RL:
- Left-padded batches are first-class: position ids come from the attention mask and padded keys are masked, so a
  prompt's logits do not depend on the padding around it.
- A group's completions can share one pass over their prompt (`prompt_trunk`, `continue_trunk`), and decoding runs
  against a cache (`rookworld.net.decoding`). How each layer of a pass attends is a `rookworld.net.attention`
  function over that layer's tensors.

Loading and saving in the Hugging Face layout: `rookworld.net.pretrained`. On the CPU each Linear's product goes
through `linear` (oneDNN's inner product, below); during eager CPU sampling and the update's first pass a `ProductMemo`
(`rookworld.net.memo`) may make it instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from rookworld.net.attention import (LayerAttention, after_prompts, causal, grouped_prompts, padded_causal,
                                     prompt_bias)


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

    def parameter_shapes(self) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
        """The shapes of a GPT's parameters, in its own names and layout ([out, in] weights): those outside the
        blocks, and those of each block (named after `transformer.h.{i}.`); the lm_head is the tied wte. Worked out
        from the sizes rather than read off a model, so that a config is measured, however large, before any
        memory is taken (a test holds them to a built model's)."""
        C, V, T = self.n_embd, self.vocab_size, self.block_size
        top = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (T, C),
               "transformer.ln_f.weight": (C,), "transformer.ln_f.bias": (C,)}
        block = {"ln_1.weight": (C,), "ln_1.bias": (C,), "attn.c_attn.weight": (3 * C, C), "attn.c_attn.bias": (3 * C,),
                 "attn.c_proj.weight": (C, C), "attn.c_proj.bias": (C,), "ln_2.weight": (C,), "ln_2.bias": (C,),
                 "mlp.c_fc.weight": (4 * C, C), "mlp.c_fc.bias": (4 * C,), "mlp.c_proj.weight": (C, 4 * C),
                 "mlp.c_proj.bias": (C,)}
        return top, block

    @property
    def n_params(self) -> int:
        """The parameter count of a GPT of these sizes (`GPT.num_params` of one built)."""
        top, block = self.parameter_shapes()
        return sum(map(math.prod, top.values())) + self.n_layer * sum(map(math.prod, block.values()))

    def describe(self) -> str:
        return (f"{self.n_layer} layer{'s' if self.n_layer != 1 else ''}, {self.n_head} heads, {self.n_embd} wide, "
                f"{self.vocab_size} tokens, {self.block_size} positions: {self.n_params:,} parameters")


# -- the CPU's products: oneDNN's inner product for a float32 Linear, with its gradients -----------------------
#
# oneDNN's inner product (the op inductor emits for a CPU linear) multiplies by the dense float32 weight as it is,
# with no packing; BENCHMARKS.md ("Every core busy") has what it gains over F.linear (MKL's sgemm) at the step's
# shapes. Everywhere else (CUDA, other dtypes, autocast, compiled code, a torch built without the op) `linear` is
# F.linear.

#: Whether this torch has the op: builds without oneDNN, or older ones without `_linear_pointwise`, do not.
AVAILABLE = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def inner_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T (+ bias) by oneDNN."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def uses_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether x times weight goes through oneDNN: float32 on the CPU, outside autocast and compiled code
    (inductor makes its own choice), with a contiguous weight."""
    return (AVAILABLE and x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and weight.is_contiguous() and not torch.is_autocast_enabled("cpu")
            and not torch.compiler.is_compiling())


def linear_grads(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, needs: tuple[bool, ...],
                 has_bias: bool) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The gradients of y = x [M, K] @ weight [N, K]^T + bias given dy [M, N]: the input's by oneDNN with the weight
    transposed in memory where it applies (else torch.mm, on any device and dtype), the weight's (a reduction over
    the rows) and the bias's by torch."""
    dy = dy.contiguous()
    dx = dw = db = None
    if needs[0]:
        dx = inner_product(dy, weight.t().contiguous(), None) if uses_onednn(dy, weight) else torch.mm(dy, weight)
    if needs[1]:
        dw = torch.mm(dy.t(), x)
    if has_bias and needs[2]:
        db = dy.sum(0)
    return dx, dw, db


class _InnerProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return inner_product(x, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        return linear_grads(dy, x, weight, ctx.needs_input_grad, ctx.has_bias)


def wants_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), by oneDNN where `uses_onednn` (with gradients where any input wants one)."""
    if not uses_onednn(x, weight):
        return F.linear(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    y = _InnerProduct.apply(rows, weight, bias) if wants_grad(x, weight, bias) else inner_product(rows, weight, bias)
    return y.view(*x.shape[:-1], weight.shape[0])


# -- the network ----------------------------------------------------------------------------------------------

class Products(Protocol):
    """Who makes a trunk Linear's product in one pass, when the pass is given one (`rookworld.net.memo`, CPU
    only): it records the product, or gives back the one it recorded."""

    def product(self, module: nn.Linear, x: torch.Tensor) -> torch.Tensor: ...


class Linear(nn.Linear):
    """nn.Linear by `linear` (oneDNN on the CPU), or by the pass's `products` when it has them."""

    def forward(self, x: torch.Tensor, products: Products | None = None) -> torch.Tensor:
        if products is not None:
            return products.product(self, x)
        return linear(x, self.weight, self.bias)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids for a (left-)padded batch: the first real token of every row gets position 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.c_attn = Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = Linear(config.n_embd, config.n_embd)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, attend: LayerAttention, products: Products | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The attention's output [B, T, C], and this call's own keys and values [B, nh, T, hd] (a prompt's, which
        its completions then attend to)."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x, products).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # [B, nh, T, hd]
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = attend(q, k, v, self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y, products)), (k, v)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, products: Products | None = None) -> torch.Tensor:
        # GPT-2 was trained with the tanh approximation (HF "gelu_new"); exact GELU shifts the logits.
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x, products), approximate="tanh"), products))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, attend: LayerAttention, products: Products | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The block's output, and its attention's own keys and values."""
        a, kv = self.attn(self.ln_1(x), attend, products)
        x = x + a
        return x + self.mlp(self.ln_2(x), products), kv


#: Who runs a block in a pass, in place of `Block.__call__`: (block, x, its layer's attention) -> (x, the block's
#: keys and values). The log-prob passes give one compiled once for every layer (`rookworld.net.logprobs`).
BlockRunner = Callable[[Block, torch.Tensor, LayerAttention], tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]]


#: The device types whose continuations read their group's prompt through `grouped_prompts`: on the CPU the copies
#: of `after_prompts` cost more than the attention (BENCHMARKS.md, "Every core busy"); a GPU's fused SDPA is worth them.
GROUPED_PROMPTS_ON = frozenset({"cpu"})


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps),
            )
        )
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as in GPT-2
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

    def trunk(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
              position_ids: torch.Tensor | None = None, kv_cache=None,
              write_pos: torch.Tensor | None = None, products: Products | None = None,
              blocks: BlockRunner | None = None) -> torch.Tensor:
        """Final hidden states [B, T, n_embd] (after ln_f), before the lm_head; `products`: who makes the trunk
        Linears' products in this pass (`Products`), else they are made here; `blocks`: who runs each block
        (`BlockRunner`; not with `products`), else each runs as it is.

        attention_mask [B, T] (1/True = real token) marks padding; position ids default to its cumulative sum.
        With `kv_cache` (`rookworld.net.decoding`), the T new tokens are written to cache slots `write_pos` [T] (long)
        and attend to every valid slot at or before their own; without it, attention is over the T tokens given.
        """
        B, T = input_ids.shape
        if attention_mask is not None:
            attention_mask = attention_mask.to(torch.bool)
        if position_ids is None:
            position_ids = (positions_from_mask(attention_mask) if attention_mask is not None
                            else torch.arange(T, device=input_ids.device).unsqueeze(0))
        if kv_cache is not None:
            if write_pos is None:
                raise ValueError("write_pos is required with kv_cache")
            new_valid = attention_mask
            if new_valid is None:
                new_valid = torch.ones(B, T, dtype=torch.bool, device=input_ids.device)
            mask = kv_cache.begin(write_pos, new_valid)
            attends = [partial(kv_cache.attend, i, write_pos, mask) for i in range(self.config.n_layer)]
        else:
            mask = None if attention_mask is None else padded_causal(attention_mask).unsqueeze(1)
            attends = [partial(causal, mask)] * self.config.n_layer
        return self._layers(input_ids, position_ids, attends, products=products, blocks=blocks)[0]

    def prompt_trunk(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, products: Products | None = None,
                     blocks: BlockRunner | None = None) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """`trunk` of left-padded prompts [g, P], and every layer's keys and values [g, nh, P, hd]: the `prefix` of
        `continue_trunk`, so that a group's completions share one pass over their prompt."""
        attention_mask = attention_mask.to(torch.bool)
        attends = [partial(causal, padded_causal(attention_mask).unsqueeze(1))] * self.config.n_layer
        return self._layers(input_ids, positions_from_mask(attention_mask), attends, keep=True, products=products,
                            blocks=blocks)

    def continue_trunk(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       prefix: list[tuple[torch.Tensor, torch.Tensor]], prefix_mask: torch.Tensor,
                       products: Products | None = None, blocks: BlockRunner | None = None) -> torch.Tensor:
        """Final hidden states [B, T, n_embd] of right-padded continuations [B, T] of g prompts (`prompt_trunk`'s
        `prefix` and mask [g, P]), each prompt's B / g continuations consecutive: they attend to their prompt's
        real tokens, then causally to their own, at the positions that follow the prompt's. The same states as
        `trunk` over prompt + continuation, with the prompt computed once per group."""
        B, T = input_ids.shape
        g, P = prefix_mask.shape
        attention_mask, prompt_mask = attention_mask.to(torch.bool), prefix_mask.to(torch.bool)
        row_prompt_mask = prompt_mask.repeat_interleave(B // g, 0)
        position_ids = row_prompt_mask.sum(1, keepdim=True) + positions_from_mask(attention_mask)
        if input_ids.device.type in GROUPED_PROMPTS_ON and not (self.training and self.config.dropout > 0):
            bias = prompt_bias(prompt_mask)
            attends = [partial(grouped_prompts, k, v, bias) for k, v in prefix]
        else:
            seen = row_prompt_mask.unsqueeze(1).expand(B, T, P)
            mask = torch.cat([seen, padded_causal(attention_mask)], dim=2).unsqueeze(1)
            attends = [partial(after_prompts, k, v, mask) for k, v in prefix]
        return self._layers(input_ids, position_ids, attends, products=products, blocks=blocks)[0]

    def _layers(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attends: list[LayerAttention],
                keep: bool = False,
                products: Products | None = None, blocks: BlockRunner | None = None
                ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Embeddings, blocks (each attending through its own of `attends`) and ln_f: the hidden states, and each
        layer's own keys and values if `keep`."""
        if blocks is not None and products is not None:
            raise ValueError("a pass takes its products from a memo or runs its blocks through `blocks`, not both")
        x = self.transformer.wte(input_ids) + self.transformer.wpe(position_ids)  # [B, T, C]
        x = self.transformer.drop(x)
        kept = []
        for block, attend in zip(self.transformer.h, attends, strict=True):
            x, kv = block(x, attend, products) if blocks is None else blocks(block, x, attend)
            if keep:
                kept.append(kv)
        return self.transformer.ln_f(x), kept

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, vocab_size]. For large batches prefer `rookworld.net.logprobs.token_logprobs`."""
        return self.lm_head(self.trunk(input_ids, attention_mask))
