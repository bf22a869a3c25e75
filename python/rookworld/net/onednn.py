"""The CPU's products: oneDNN's inner product for a Linear in float32, with its gradients.

oneDNN's inner product (the op inductor emits for a CPU linear) multiplies by the dense float32 weight as it is,
with no packing; BENCHMARKS.md ("Every core busy") has what it gains over F.linear (MKL's sgemm) at the
step's shapes. Everywhere else (CUDA, other dtypes, autocast, compiled code, a torch built without the op)
`linear` is F.linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
