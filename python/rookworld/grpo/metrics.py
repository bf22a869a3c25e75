"""Step 5 of a GRPO step: what the step did, as numbers reduced over every rank (metrics.jsonl's rows), and the
warnings they call for (`warn_about`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from rookworld.grpo import formulas
from rookworld.grpo.objective import Objective
from rookworld.grpo.rollout import Rollout
from rookworld.grpo.update import UpdateSums
from rookworld.harness.distributed import Comm
from rookworld.net import compiling
from rookworld.net.device import peak_memory_gb

_TASK_CODES = {"P": 1, "A": 0}
_UNSCORED = 3  # a row without ground truth counts in no task's statistics


def _pct(x: np.ndarray, q: float) -> float | None:
    return float(np.percentile(x, q)) if len(x) else None


def _mean(x: np.ndarray) -> float | None:
    return float(np.mean(x)) if len(x) else None


def step_metrics(comm: Comm, rollout: Rollout, sums: UpdateSums, objective: Objective, *, step_time: float,
                 update_time: float) -> dict[str, Any]:
    """What one GRPO step did, over every rank (metrics.jsonl's row, less what the trainer adds)."""
    m = {**reward_metrics(comm, rollout), **update_metrics(comm, rollout, sums, measured_kl=objective.measures_kl)}
    sampled = sampling_metrics(comm, rollout)
    samples, tokens = sampled.pop("samples"), sampled.pop("generated_tokens")
    m.update(sampled)
    m.update(rollout.info)
    m.update({"beta": objective.step_beta, "samples_per_s": samples / step_time, "tokens_per_s": tokens / step_time,
              "time/step": step_time, "time/update": update_time, **{f"time/{k}": v for k, v in rollout.times.items()},
              "peak_memory_gb": peak_memory_gb(rollout.ids.device),
              # In this process so far: a count that keeps growing means recompiles; a failure means eager code.
              "compile/graphs": compiling.graphs_compiled(), "compile/failed": len(compiling.FALLBACKS)})
    return m


def reward_metrics(comm: Comm, rollout: Rollout) -> dict[str, Any]:
    """Rewards, format validity and task shares, per task, over every rank's rows."""
    device, scores = rollout.rewards.device, rollout.scores
    rewards = comm.gather(rollout.rewards).cpu().numpy()
    codes = torch.as_tensor([_TASK_CODES.get(str(t), 2) if ok else _UNSCORED
                             for t, ok in zip(scores.tasks, scores.valid)], device=device)
    tasks = comm.gather(codes).cpu().numpy()
    well = comm.gather(torch.tensor(np.asarray(scores.well_formed), device=device)).cpu().numpy()
    kept = rewards[tasks != _UNSCORED]
    m: dict[str, Any] = {"reward/mean": float(kept.mean()) if len(kept) else None,
                         "reward/std": float(kept.std()) if len(kept) else None,
                         "unscored": float((tasks == _UNSCORED).mean())}
    for name, code in _TASK_CODES.items():
        r = rewards[tasks == code]
        m[f"reward/{name}/mean"] = _mean(r)
        for q in (10, 50, 90):
            m[f"reward/{name}/p{q}"] = _pct(r, q)
        m[f"format_valid/{name}"] = _mean(well[tasks == code])
        m[f"share/{name}"] = float((tasks == code).mean())
    # The chess of the samples, as the evaluation measures it greedily (a reward function without these parts,
    # a custom one, has none).
    for name, code, parts in (("P", 1, (("best_legal", "legal_best_move"), ("top5", "top5_accuracy"))),
                              ("A", 0, (("fen_exact", "next_state_exact"),))):
        for part, key in parts:
            values = _chess_part(scores, part)
            if values is not None:
                m[f"{key}/{name}"] = _mean(comm.gather(torch.as_tensor(values, device=device)).cpu().numpy()
                                           [tasks == code])
    return m


def _chess_part(scores, part: str) -> np.ndarray | None:
    """A part of the rewards as a float per row: "top5" is a best move among the ground truth's five."""
    if part == "top5":
        return None if "best_rank" not in scores.parts else (np.asarray(scores.parts["best_rank"]) >= 1) \
            .astype(np.float64)
    return None if part not in scores.parts else np.asarray(scores.parts[part], dtype=np.float64)


def update_metrics(comm: Comm, rollout: Rollout, acc: UpdateSums, measured_kl: bool) -> dict[str, Any]:
    """KL, clipping, entropy, loss, gradient norm and padding of the update."""
    totals = dict(zip(acc.sums, torch.stack(list(acc.sums.values())).tolist()))  # the update's one host sync
    kl_sum, clipped, ent, tokens, v_loss, slots, real, kl_a, tokens_a, nll_a, targets_a = comm.sum(
        [totals["kl"], totals["clipped"], totals["entropy"], totals["tokens"], totals["value_loss"],
         float(acc.slots), float(acc.real), totals["kl_A"], totals["tokens_A"], totals["nll_A"], totals["targets_A"]])
    measured_kl = measured_kl and tokens > 0
    kl_p95 = None
    if measured_kl:
        kl_all = torch.cat([kl[m] for kl, m in acc.kl_parts]).float().cpu()
        # p95 over each rank's tokens, averaged over ranks: exact gathering would move every token's KL.
        kl_p95 = comm.mean([float(torch.quantile(kl_all, 0.95)) if kl_all.numel() else 0.0])[0]
    m = {"kl/mean": kl_sum / tokens if measured_kl else None, "kl/p95": kl_p95,
         "clip_fraction": clipped / max(tokens, 1.0), "entropy": ent / max(tokens, 1.0),
         "loss": comm.mean([totals["loss"]])[0] / acc.done if acc.done else None,
         "grad_norm": comm.mean([float(torch.stack(acc.grad_norms).float().mean())])[0] if acc.done else None,
         "updates/skipped": acc.skipped,
         # Share of the update's token slots that were padding (see `micro_batches`).
         "padding": 1.0 - real / max(slots, 1.0),
         # Each task's KL per token: what the leash costs each of them (with --a-beta-scale, A:'s weighs more).
         "kl/P": (kl_sum - kl_a) / (tokens - tokens_a) if measured_kl and tokens > tokens_a else None,
         "kl/A": kl_a / tokens_a if measured_kl and tokens_a else None,
         # --a-likelihood-weight: the A: targets' mean NLL per token (nats) as the update's passes found it.
         "nll/A": nll_a / targets_a if targets_a else None,
         **advantage_metrics(comm, rollout)}
    if rollout.returns is not None:
        m["value/loss"] = v_loss / tokens if tokens else None
        m.update(value_metrics(comm, rollout.old_values, rollout.returns, rollout.loss_mask))
    return m


def advantage_metrics(comm: Comm, rollout: Rollout) -> dict[str, Any]:
    """Each task's mean |advantage| over its usable tokens, over every rank: how hard the update pushes each task's
    tokens (a task whose rewards spread more in a group is pushed harder)."""
    if rollout.advantages is None:
        return {}
    size = (rollout.advantages.abs() * rollout.loss_mask).sum(1)
    count = rollout.loss_mask.sum(1).to(size.dtype)
    env = rollout.a_rows
    sums = comm.sum([float(size[~env].sum()), float(count[~env].sum()), float(size[env].sum()),
                     float(count[env].sum())])
    return {f"advantage/abs/{task}": total / n if n else None
            for task, total, n in (("P", sums[0], sums[1]), ("A", sums[2], sums[3]))}


def value_metrics(comm: Comm, values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
    """The critic's explained variance, 1 - Var(R - V) / Var(R) over every rank's usable tokens (1: a perfect
    critic, 0: one no better than a constant), and its mean value."""
    _, _, var_ret = comm.moments(returns, mask)
    _, _, var_res = comm.moments(returns - values, mask)
    return {"value/explained_variance": 1.0 - var_res / var_ret if var_ret > 0 else None,
            "value/mean": comm.moments(values, mask)[1]}


def sampling_metrics(comm: Comm, rollout: Rollout) -> dict[str, Any]:
    """Completion lengths, truncation and reward spread of the sampled groups."""
    G = rollout.group_size
    scored_groups = rollout.scores.valid[::G]
    flat_groups = (~formulas.group_has_spread(rollout.rewards, G).cpu().numpy()[::G]) & scored_groups
    gen_tokens, truncated, zero_spread, n_groups, rows = comm.sum(
        [float(rollout.completion_mask.sum()), float((~rollout.stopped).sum()), float(flat_groups.sum()),
         float(scored_groups.sum()), float(len(rollout.completions))])
    return {"completion_len": gen_tokens / rows, "truncated": truncated / rows,
            # Among the groups that were scored: an unscored group has no rewards to spread.
            "groups/zero_spread": zero_spread / n_groups if n_groups else None,
            "generated_tokens": gen_tokens, "samples": rows}


def warn_about(m: dict[str, Any], cfg, log) -> None:
    """Warnings of what a step's metrics `m` show: a KL drifting fast, samples the format penalty makes alike, groups
    without spread, clipping too often (each with its remedy)."""
    step = m["step"]
    kl, spread, clip = m.get("kl/mean"), m.get("groups/zero_spread"), m.get("clip_fraction")
    if kl is not None and math.isfinite(kl) and kl > cfg.kl_warn:
        log.warn("kl", step, f"KL to the reference is {kl:.3f} per token (> {cfg.kl_warn}): the policy is "
                             "drifting fast; consider a lower --lr or a higher --beta")
    formats = {t: m.get(f"format_valid/{t}") for t in ("P", "A") if m.get(f"format_valid/{t}") is not None}
    unformed = [t for t, share in formats.items() if share == 0]
    if unformed:  # the real cause of the missing spread: no temperature or group size fixes it
        which = "no sample of this step is" if len(unformed) == len(formats) else \
            f"no {' or '.join(t + ':' for t in unformed)} sample of this step is"
        log.warn("unformed", step, f"{which} well formed, so every such sample gets the same format penalty and "
                                   "teaches nothing: the model does not write the task's format yet; train it "
                                   "with rookworld sft first (rookworld sft --config cpu-demo shows how)")
    elif spread is not None and spread > 0.5:
        log.warn("spread", step, f"{100 * spread:.0f}% of groups have no reward spread and teach nothing; "
                                 "consider a higher --temperature or a larger --group-size")
    if clip is not None and math.isfinite(clip) and clip > cfg.clip_warn:
        log.warn("clip", step, f"clip fraction {clip:.2f} (> {cfg.clip_warn}): updates are too large; "
                               "consider a lower --lr or fewer --mu epochs")
