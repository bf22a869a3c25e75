"""Step 4 of a GRPO step: `mu` epochs over the rollout, each split into `minibatches` optimizer steps, each
accumulated over micro-batches of similar length. The loss of each token is `micro_batch_loss`."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch

from rookworld.train.distributed import Comm
from rookworld.train.models import MicroBatch, Models
from rookworld.train.objective import Objective
from rookworld.train.rollout import Rollout, seed_of

_SUMS = ("kl", "clipped", "entropy", "tokens", "loss", "value_loss")


@dataclass
class UpdateSums:
    """What the update adds up for the step's metrics (device scalars until the one sync at the end)."""

    sums: dict[str, torch.Tensor]
    kl_parts: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (KL, usable mask), every epoch
    grad_norms: list[torch.Tensor] = field(default_factory=list)
    slots: int = 0  # token slots the update's passes computed, padding included
    real: int = 0  # of which real tokens
    skipped: int = 0  # minibatches without a usable token: no optimizer step
    done: int = 0  # optimizer steps taken


def update(cfg, objective: Objective, models: Models, optimizer: torch.optim.Optimizer, comm: Comm, rollout: Rollout,
           step: int) -> UpdateSums:
    n = rollout.ids.shape[0]
    # Running sums stay on the device: a host sync per micro-batch would stall the GPU between them.
    acc = UpdateSums({k: torch.zeros((), dtype=torch.float64, device=models.device) for k in _SUMS})
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for epoch in range(cfg.mu):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed_of(cfg.seed, step, epoch)))
        for mb in order.chunk(cfg.minibatches):
            # The token mean is over every rank's tokens: DDP averages the ranks' gradients, so each rank
            # divides its sum by the global count over the number of ranks.
            mb_tokens = comm.sum([float(rollout.loss_mask[mb.to(models.device)].sum())])[0]
            if mb_tokens == 0:  # nothing to learn from: no step, or AdamW's momentum would move the weights
                acc.skipped += 1
                continue
            optimizer.zero_grad(set_to_none=True)
            # Gradients add up over micro-batches, so their order and make-up within the minibatch are free.
            micro = rollout.micro_batches(mb.numpy(), cfg.micro_batch_size)
            for j, b in enumerate(micro):
                last = j == len(micro) - 1
                no_sync = models.logprobs.no_sync() if comm.info.enabled and not last else contextlib.nullcontext()
                with no_sync:
                    micro_batch_loss(cfg, objective, models, rollout, b, acc,
                                     total_tokens=mb_tokens / comm.info.world, total_sequences=float(len(mb)))
            grads = [p for p in params if p.grad is not None]
            norm = torch.nn.utils.clip_grad_norm_(grads, cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf)
            acc.grad_norms.append(norm.detach())
            optimizer.step()
            acc.done += 1
    return acc


def micro_batch_loss(cfg, objective: Objective, models: Models, r: Rollout, b: MicroBatch, acc: UpdateSums, *,
                     total_tokens: float, total_sequences: float) -> None:
    """Forward and backward of one micro-batch: the objective's loss of each of its tokens, aggregated."""
    P, W = r.prompt_width, b.width
    rows, cols = torch.from_numpy(b.rows).to(models.device), slice(b.left, P + W)
    with models.autocast():
        lp, entropy, kl, values = models.logprobs(r.ids[rows, cols], r.mask[rows, cols], P - b.left, cfg.temperature,
                                                  models.reference if objective.exact_kl else None,
                                                  objective.kl_weights)
    lp, entropy = lp.float(), entropy.float()
    per_token, clipped, kl, v_loss = objective.token_loss(lp, entropy, kl, values, beta=r.beta, **r.rows(rows, W))
    m = r.loss_mask[rows, :W]
    loss = objective.aggregate(per_token, m, total_tokens=total_tokens, total_sequences=total_sequences)
    loss.backward()
    with torch.no_grad():
        mf, s = m.float(), acc.sums
        s["loss"] += loss.detach()
        s["tokens"] += mf.sum()
        s["clipped"] += (clipped.float() * mf).sum()
        s["entropy"] += (entropy * mf).sum()
        if kl is not None:
            s["kl"] += (kl * mf).sum()
            acc.kl_parts.append((kl.detach(), m))
        if v_loss is not None:
            s["value_loss"] += (v_loss.detach() * mf).sum()
    acc.slots += len(b.rows) * (P - b.left + W)
    acc.real += int(r.prompt_lens[b.rows].sum() + r.completion_lens[b.rows].sum())
