"""A training run's optimizer and its schedule: AdamW or Muon over the policy (`optimizer_for`), the learning rate at
each step (`lr_factor`), a step taken only when it is finite (`step_if_finite`), and the check that a resumed run
continues with the optimizer whose state it saved."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rookworld.harness.checkpoint import CheckpointError
from rookworld.io.errors import RookworldError
from rookworld.net.muon import Muon
from rookworld.settings.config import RunConfig


def lr_factor(step: int, cfg: RunConfig) -> float:
    """Linear warm-up to the peak; then cosine decay to min_lr_ratio x peak at the last step, or with
    cooldown_steps the peak held until a linear cooldown to min_lr_ratio x peak over the last cooldown_steps (warm-up,
    stable, decay: a longer run shares every rate of a shorter one's stable phase)."""
    if step < cfg.warmup_steps:
        return (step + 1) / (cfg.warmup_steps + 1)
    if cfg.cooldown_steps:
        into = step - (cfg.steps - cfg.cooldown_steps) + 1  # steps into the cooldown, this one included
        return 1.0 - (1.0 - cfg.min_lr_ratio) * min(1.0, max(0.0, into / cfg.cooldown_steps))
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class Diverged(RookworldError, RuntimeError):
    """The loss, the gradients or the weights a step made stopped being finite. The run stops there and saves
    nothing after it, so the last checkpoint is still good; its message says whether the step was applied."""


def step_if_finite(optimizer: torch.optim.Optimizer, grad_norm: torch.Tensor, loss: float | torch.Tensor = 0.0
                   ) -> None:
    """`optimizer.step()`, unless the gradients or the loss are NaN or infinite: one such step makes every weight
    NaN (and AdamW's moments with them), and the run would go on reporting `loss: null`. (One device sync per
    optimizer step, which a GRPO step takes a handful of.)"""
    if not (math.isfinite(float(grad_norm)) and math.isfinite(float(loss))):
        raise Diverged(f"the {'gradients are' if not math.isfinite(float(grad_norm)) else 'loss is'} not finite "
                       f"(grad norm {float(grad_norm):g}, loss {float(loss):g}), so the step was not applied")
    optimizer.step()
    # Finite gradients can still carry a weight past its dtype's range (a learning rate of 1e308): the weights
    # are checked too, so that no NaN model is ever saved: each tensor's largest magnitude (a max, which cannot
    # overflow as a 2-norm's squares do), in a few multi-tensor kernels and one sync.
    weights = [p for group in optimizer.param_groups for p in group["params"]]
    if weights and not bool(torch.stack(torch._foreach_norm(weights, math.inf)).isfinite().all()):
        lr = max(float(group["lr"]) for group in optimizer.param_groups)
        raise Diverged(f"the weights this step made are not finite (the learning rate was {lr:g})")


def optimizer_for(policy: nn.Module, cfg: RunConfig, extra_groups: Sequence[dict] = ()) -> torch.optim.Optimizer:
    """AdamW over the policy and `extra_groups`, weight decay on the matrices; or with --optimizer muon, `Muon` over
    the blocks' matrices (not the embeddings: a row is looked up, not multiplied) and AdamW over the rest."""
    embeddings = {id(m.weight) for m in policy.modules() if isinstance(m, nn.Embedding)}
    decay = [p for p in policy.parameters() if p.dim() >= 2]
    no_decay = [p for p in policy.parameters() if p.dim() < 2]
    if cfg.optimizer == "muon":
        matrices = [p for p in decay if id(p) not in embeddings]
        groups = [{"params": matrices, "weight_decay": cfg.weight_decay, "use_muon": True},
                  {"params": [p for p in decay if id(p) in embeddings], "weight_decay": cfg.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}, *extra_groups]
        return Muon(groups, lr=cfg.lr, betas=(0.9, 0.95))
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0},
              *extra_groups]
    # Fused on the CPU too: one pass over each parameter's state, where foreach made a temporary per term
    # (GPT-2 small: 0.06 s a step against 0.6 s here).
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=next(policy.parameters()).device.type in ("cuda", "cpu"))


def check_saved_optimizer(state: dict[str, Any], optimizer: str, checkpoint_dir: Path) -> None:
    """Refuses a resume whose saved trainer state was made by another --optimizer than `optimizer` (its state has
    another shape), naming the one it was; a state of no known shape is left to the restore's own checks."""
    groups = state.get("optimizer", {}).get("param_groups") if isinstance(state.get("optimizer"), dict) else None
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        return
    saved = "muon" if any(g.get("use_muon") for g in groups) else "adamw"
    if saved != optimizer:
        raise CheckpointError(f"cannot resume from {checkpoint_dir} with --optimizer {optimizer}: it was trained with "
                              f"--optimizer {saved}, whose state the other cannot take; resume with --optimizer "
                              f"{saved}, or train its model as a new run with --model {checkpoint_dir} --output-dir "
                              f"NEW_DIR")
