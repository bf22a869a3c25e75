"""Frozen copies of a model whose Linear weights are stored in the autocast dtype, for sampling and the reference."""

from __future__ import annotations

from copy import deepcopy

import torch
import torch.nn as nn

from rookworld.net.model import GPT


def autocast_copy(model: GPT, dtype: torch.dtype) -> GPT:
    """A frozen copy of `model` that computes, under `dtype` autocast, the same bits as `model` does, without
    casting its weights on every call.

    Autocast casts each Linear's weight and bias to `dtype` before its matmul and runs embeddings and LayerNorms
    in their own dtype. Here the Linear weights are stored in `dtype` already (the lm_head untied, since the
    embedding lookup needs wte as it was), so those casts are no-ops: a decode step reads the 16-bit weights
    instead of reading the float32 ones and writing and reading a 16-bit copy of them. Bring it up to date with
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
