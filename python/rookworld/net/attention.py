"""How a block's attention sees its keys. A pass gives each layer a `LayerAttention`: called with that layer's
queries, keys and values of the new tokens [B, nh, T, hd] (and the dropout), it returns the attention's output
[B, nh, T, hd]. Each is a `functools.partial` of one function here over that layer's tensors, which `GPT` picks for
the pass: `causal` (the tokens given, padding masked), `after_prompts` or `grouped_prompts` (continuations of
prompts whose keys and values are computed once a group), or a cache's `attend` (decoding,
`rookworld.net.decoding`).

A layer's attention holds that layer's tensors, not its index: a block compiled once then serves every layer
(`rookworld.net.logprobs`), since nothing it reads tells one layer from another."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

#: A layer's attention: (q, k, v, dropout_p) -> [B, nh, T, hd].
LayerAttention = Callable[..., torch.Tensor]


def causal(mask: torch.Tensor | None, q, k, v, dropout_p: float = 0.0) -> torch.Tensor:
    """Attention over the tokens given: `mask` [B, 1, T, T] bool (`padded_causal`), or None for plain causal
    attention, which lets SDPA pick its fastest kernel."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=mask is None)


def after_prompts(prefix_k: torch.Tensor, prefix_v: torch.Tensor, mask: torch.Tensor, q, k, v,
                  dropout_p: float = 0.0) -> torch.Tensor:
    """Rows attend to their prompt's real tokens, then causally to their own: SDPA over each row's copy of its
    prompt (keys and values [g, nh, P, hd], B / g consecutive rows a prompt) under `mask` [B, 1, T, P + T] bool. A
    GPU's fused kernels never hold the scores, which is worth the copies there."""
    k, v = after_prefix(prefix_k, k), after_prefix(prefix_v, v)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


def grouped_prompts(prefix_k: torch.Tensor, prefix_v: torch.Tensor, bias: torch.Tensor, q, k, v,
                    dropout_p: float = 0.0) -> torch.Tensor:
    """`after_prompts` without the copies: each prompt read once for its group (`grouped_attention`), under `bias`
    [g, 1, 1, P] (`prompt_bias`). On the CPU the copies (and their gradients' sums) cost more than the attention
    itself. No dropout."""
    return grouped_attention(q, k, v, prefix_k.to(q.dtype), prefix_v.to(q.dtype), bias, 0)


def grouped_attention(q: torch.Tensor, own_k: torch.Tensor, own_v: torch.Tensor, prefix_k: torch.Tensor,
                      prefix_v: torch.Tensor, prefix_bias: torch.Tensor, first: int) -> torch.Tensor:
    """Attention of rows that come in groups sharing a prompt: queries q [B, nh, T, hd] over their group's prompt
    (keys and values [g, nh, P, hd], B / g consecutive rows a group; prefix_bias [g, 1, 1, P] float, -inf on
    padding) and over their own keys and values [B, nh, n, hd], the T queries being own positions first ..
    first + T - 1, each seeing own keys up to its own. [B, nh, T, hd].

    A prompt's keys are read once for its group (one [rows x T, hd] x [hd, P] product a head), not copied to every
    row. Scores and softmax in float32 at least. A right-padded query sees its padding neighbours before it
    (harmless: its output is never used), as a real query never does."""
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


def padded_causal(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T, T] bool: query t sees the real keys at or before it; a padding query also sees itself, which keeps
    SDPA from writing NaN for a row with no key (its output is never read)."""
    T = attention_mask.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=attention_mask.device).tril()
    return (attention_mask.unsqueeze(1) & causal) | torch.eye(T, dtype=torch.bool, device=attention_mask.device)


def after_prefix(prefix: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """Keys (or values) of g shared prompts [g, nh, P, hd], then each row's own [B, nh, T, hd]: [B, nh, P + T, hd].
    Written into one new tensor (one copy; the gradient of each prompt is the sum over its rows)."""
    g, H, P, D = prefix.shape
    B, _, T, _ = own.shape
    out = own.new_empty(B, H, P + T, D)
    out.view(g, B // g, H, P + T, D)[:, :, :, :P] = prefix.unsqueeze(1).to(own.dtype)
    out[:, :, P:] = own
    return out
