"""Step 4 of a GRPO step: `mu` epochs over the rollout, each split into `minibatches` optimizer steps, each
accumulated over micro-batches of similar length. A micro-batch's loss is `micro_batch_loss`: each token's
`grpo.loss.GRPOLoss`, made in the log-prob pass with its gradient."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from rookworld.grpo.likelihood import likelihood_backward
from rookworld.grpo.loss import GRPOLoss
from rookworld.grpo.models import Models
from rookworld.grpo.objective import Objective, Totals
from rookworld.grpo.rollout import MicroBatch, Rollout, seed_of
from rookworld.harness.distributed import Comm, accumulating
from rookworld.harness.optimizer import step_if_finite
from rookworld.net.logprobs import TokenLogProbs
from rookworld.net.memo import Replay
from rookworld.settings.base import Slice

_SUMS = ("kl", "clipped", "entropy", "tokens", "loss", "value_loss", "kl_A", "tokens_A", "nll_A", "targets_A")


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


@dataclass(frozen=True)
class UpdateSettings(Slice):
    """The settings the update reads (`UpdateSettings.of(cfg)` from a `TrainConfig`)."""

    mu: int
    minibatches: int
    micro_batch_size: int
    max_grad_norm: float
    seed: int


def update(settings: UpdateSettings, objective: Objective, models: Models, optimizer: torch.optim.Optimizer, comm: Comm,
           rollout: Rollout, step: int) -> UpdateSums:
    G = rollout.group_size
    # Running sums stay on the device: a host sync per micro-batch would stall the GPU between them.
    acc = UpdateSums({k: torch.zeros((), dtype=torch.float64, device=models.device) for k in _SUMS})
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for epoch in range(settings.mu):
        # Whole groups, shuffled: a micro-batch computes each of its prompts once.
        shuffle = torch.Generator().manual_seed(seed_of(settings.seed, step, epoch))
        order = torch.randperm(len(rollout.prompts), generator=shuffle)
        for groups in order.chunk(settings.minibatches):
            mb = (groups[:, None] * G + torch.arange(G)).reshape(-1)
            # The token mean is over every rank's tokens: DDP averages the ranks' gradients, so each rank
            # divides its sum by the global count over the number of ranks.
            usable = rollout.loss_mask[mb.to(models.device)]
            mb_tokens, mb_sequences = comm.sum([float(usable.sum()), float(usable.any(1).sum())])
            if mb_tokens == 0:  # nothing to learn from: no step, or AdamW's momentum would move the weights
                acc.skipped += 1
                continue
            totals = Totals(mb_tokens / comm.info.world, mb_sequences / comm.info.world, float(len(mb)))
            optimizer.zero_grad(set_to_none=True)
            if objective.a_likelihood_weight > 0:  # before the micro-batches: the last one all-reduces its gradient
                nll, counted = likelihood_backward(models, rollout.targets, groups.numpy(),
                                                   objective.a_likelihood_weight, comm, settings.micro_batch_size)
                acc.sums["nll_A"] += nll
                acc.sums["targets_A"] += counted
            # Gradients add up over micro-batches, so their order and make-up within the minibatch are free.
            micro = rollout.micro_batches(mb.numpy(), settings.micro_batch_size, models.rows_per_prompt)
            for j, b in enumerate(micro):
                with accumulating(models.policy_pass, last=j == len(micro) - 1):
                    micro_batch_loss(objective, models, rollout, b, acc, totals)
            rollout.memo = None  # sampling's products are the weights' before this optimizer step
            grads = [p for p in params if p.grad is not None]
            limit = settings.max_grad_norm if settings.max_grad_norm > 0 else math.inf
            norm = torch.nn.utils.clip_grad_norm_(grads, limit)
            acc.grad_norms.append(norm.detach())
            step_if_finite(optimizer, norm)
            acc.done += 1
    return acc


def micro_batch_loss(objective: Objective, models: Models, r: Rollout, b: MicroBatch, acc: UpdateSums,
                     totals: Totals) -> None:
    """Forward and backward of one micro-batch: the objective's loss of each of its tokens, weighted by the
    aggregation, and what the metrics count of them, in one pass over the vocabulary."""
    P, W = r.prompt_width, b.width
    rows, cols = torch.from_numpy(b.rows).to(models.device), slice(b.left, P + W)
    m = r.loss_mask[rows, :W]  # the usable tokens [b, W]: the only positions the lm_head runs on
    weights = objective.weights(m, totals)
    replay = None if r.memo is None else Replay(r.memo, rows, b.left, W)
    with models.autocast():
        out = models.policy_pass(r.ids[rows, cols], r.mask[rows, cols], P - b.left, wanted=m,
                              loss=GRPOLoss.of(objective, r.experience(rows, W, weights)), replay=replay,
                              reference=models.reference if objective.exact_kl else None)
    loss, v_loss = out.loss, None
    if out.values is not None:
        v_term, v_loss = objective.value_loss(out.values.float(), r.old_values[rows, :W], r.returns[rows, :W])
        loss = loss + (v_term * weights).sum()
    loss.backward()
    _count(acc, out, m, m & r.a_rows[rows, None], loss.detach(), v_loss)
    # Token slots the passes computed: each micro-batch's prompts (once a group when shared), and its completions.
    prompts = b.rows[:: models.rows_per_prompt]
    acc.slots += len(prompts) * (P - b.left) + len(b.rows) * W
    acc.real += int(r.prompt_lens[prompts].sum() + r.completion_lens[b.rows].sum())


@torch.no_grad()
def _count(acc: UpdateSums, out: TokenLogProbs, m: torch.Tensor, env: torch.Tensor, loss: torch.Tensor,
           v_loss: torch.Tensor | None) -> None:
    """What the metrics add up of a micro-batch's usable tokens `m` (`env`: those of A: rows), from its pass `out`."""
    mf, s, kl = m.float(), acc.sums, out.metrics.get("kl")
    s["tokens_A"] += env.sum()
    s["loss"] += loss
    s["tokens"] += mf.sum()
    s["clipped"] += (out.metrics["clipped"].float() * mf).sum()
    s["entropy"] += (out.entropy * mf).sum()
    if kl is not None:
        s["kl"] += (kl * mf).sum()
        s["kl_A"] += (kl * env).sum()
        acc.kl_parts.append((kl, m))
    if v_loss is not None:
        s["value_loss"] += (v_loss.detach() * mf).sum()
