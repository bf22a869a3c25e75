"""Muon (Jordan et al. 2024, the NanoGPT speedrun's optimizer) for a transformer's weight matrices, AdamW for the
rest, as one optimizer: one schedule and one saved state.

A matrix's update is its Nesterov momentum orthogonalised by five Newton-Schulz iterations (every singular value
pushed near 1), then scaled by 0.2 x sqrt(max(rows, columns)) so that its RMS matches AdamW's typical update
(Liu et al. 2025, "Muon is scalable"): the same learning rate and weight decay serve both kinds of parameter.
Groups with ``use_muon`` False take AdamW's update, written out here.
"""

from __future__ import annotations

import torch

#: The quintic's coefficients (Jordan's): the slope at 0 as steep as convergence allows, so that small singular values
#: grow fast; the iteration lands them in about [0.7, 1.2], not exactly on 1, which training does not need.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
#: Scale of an orthogonalised update: an m x n matrix of singular values 1 has RMS 1 / sqrt(max(m, n)); AdamW's
#: updates have RMS about 0.2.
RMS_MATCH = 0.2


def orthogonalised(g: torch.Tensor, steps: int = NS_STEPS) -> torch.Tensor:
    """g's nearest semi-orthogonal matrix, approximately: X <- a X + b (X X^T) X + c (X X^T)^2 X from g / |g|_F,
    which applies the odd polynomial a s + b s^3 + c s^5 to each singular value. Float32 (a CPU has no fast bf16 for
    these small products)."""
    x = g.float()
    wide = x.size(0) > x.size(1)
    if wide:  # X X^T of the smaller side
        x = x.T
    x = x / (x.norm() + 1e-7)
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return (x.T if wide else x).to(g.dtype)


class Muon(torch.optim.Optimizer):
    """Groups of matrices (``use_muon`` True: momentum, Nesterov) and groups of other parameters (False: AdamW,
    ``betas`` and ``eps``), each with its ``lr`` and decoupled ``weight_decay``."""

    def __init__(self, groups: list[dict], lr: float, momentum: float = 0.95, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        for group in groups:
            if group.get("use_muon") and any(p.dim() != 2 for p in group["params"]):
                raise ValueError("Muon's groups hold matrices only")
        super().__init__(groups, dict(lr=lr, momentum=momentum, betas=betas, eps=eps, weight_decay=weight_decay,
                                      use_muon=False))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                p.mul_(1 - group["lr"] * group["weight_decay"])
                update = self._muon(p, group) if group["use_muon"] else self._adamw(p, group)
                p.add_(update, alpha=-group["lr"])

    def _muon(self, p: torch.Tensor, group: dict) -> torch.Tensor:
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p)
        buf = state["momentum_buffer"]
        buf.lerp_(p.grad, 1 - group["momentum"])
        nesterov = p.grad.lerp(buf, group["momentum"])
        return orthogonalised(nesterov) * (RMS_MATCH * max(p.shape) ** 0.5)

    def _adamw(self, p: torch.Tensor, group: dict) -> torch.Tensor:
        state = self.state[p]
        if not state:
            state.update(step=torch.zeros(()), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        (b1, b2), g = group["betas"], p.grad
        state["step"] += 1
        step = float(state["step"])
        state["exp_avg"].lerp_(g, 1 - b1)
        state["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
        denominator = (state["exp_avg_sq"] / (1 - b2**step)).sqrt_().add_(group["eps"])
        return state["exp_avg"] / (1 - b1**step) / denominator
