"""The lm_head's numerics: logits in float32 whatever the compute dtype, and the gradients `rookworld.net.logprobs`'
fused vocabulary pass takes by hand, rounded as the logits are."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rookworld.net.onednn import inner_product, linear, uses_onednn

def head_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The lm_head's logits [..., V] in float32. Under autocast (or with 16-bit weights) the inputs are rounded to
    the 16-bit type, as autocast's matmul rounds them, but the products are summed and returned in float32: rounded
    to bf16, GPT-2's logits of -50 to -100 would lose 0.1-0.3 each, which the log-softmax keeps."""
    device_type = hidden.device.type
    dtype = _head_dtype(hidden, weight)
    if dtype not in (torch.bfloat16, torch.float16):
        if uses_onednn(hidden, weight):
            return linear(hidden, weight)
        if device_type == "cpu" and hidden.dim() == 2:
            # MKL makes [V, C] x [C, rows] faster than [rows, C] x [C, V] at GPT-2's shapes (BENCHMARKS.md); the
            # copy that transposes it back costs less than a log-softmax and a draw over the strided view.
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
    where oneDNN makes the products (faster than torch.mm by the weight as it is; the copy is made once for all
    chunks), else None."""
    return weight.detach().t().contiguous() if uses_onednn(hidden, weight) else None


def head_input_grad(dz: torch.Tensor, weight: torch.Tensor, transposed: torch.Tensor | None = None) -> torch.Tensor:
    """dz @ W: the gradient w.r.t. a chunk's hidden states [rows, C] of the loss's gradient w.r.t. its logits dz
    [rows, V], rounded as `head_logits` rounds. `transposed`: `head_grad_weight`'s layout of W, if made."""
    if _head_dtype(dz, weight) in (torch.bfloat16, torch.float16):
        return head_logits(dz, weight.t())
    if transposed is not None:
        return inner_product(dz.contiguous(), transposed, None)
    return torch.mm(dz, weight)


def add_head_grad(grad: torch.Tensor, dz: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor) -> None:
    """grad += dz^T @ hidden: a chunk's share of the lm_head weight's gradient [V, C] (float32), rounded as
    `head_logits` rounds. In float32, accumulated in place: a fresh [V, C] product a chunk would be new pages
    for GPT-2 (the allocator maps blocks that large afresh), which took longer than the product itself on the CPU."""
    if _head_dtype(hidden, weight) in (torch.bfloat16, torch.float16):
        grad += head_logits(dz.t(), hidden.t())
    else:
        grad.addmm_(dz.t().to(grad.dtype), hidden.to(grad.dtype))


def _head_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    device_type = hidden.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else weight.dtype
