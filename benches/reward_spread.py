"""How much does a GRPO group learn about legality? Samples groups of P: answers from a model, as a GRPO step would,
scores them with RookWorld's reward, and prints where the group-relative advantages go.

RookWorld's P: reward gives a legal B: move outside Stockfish's five 0.05 of the best-move part (0.02 of the reward,
docs/rewards.md) and legal M: candidates outside the five nothing at all. For a model whose answers rarely reach the
five, the question is whether that leaves legality without a signal. The figures: the share of answers whose B:
move is legal, in the five, Stockfish's best; the share of groups with any spread and of groups whose spread comes
from legality alone; and the mean advantage (`rookworld.grpo.formulas.group_advantages`, the group's mean and
std, as `rookworld train` computes it by default) of answers with a legal and with an illegal B: move. And where a
group's spread comes from: each weighted part of quality's within-group variance, as a share of quality's own.

    python benches/reward_spread.py --model runs/chess-cpu-sft --data data/chess-cpu-held-out.jsonl \
        --prompts 256 --group 8 --temperature 0.7
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from rookworld.chess.rewards import P_QUALITY_WEIGHTS, RewardScorer, policy_prompt
from rookworld.grpo.formulas import group_advantages, group_std
from rookworld.lm.answers import Decoding, RookWorldLM


def variance_shares(parts: dict[str, np.ndarray], group: int) -> dict[str, float]:
    """Each part's within-group variance at its weight in quality (P_QUALITY_WEIGHTS), pooled over the groups, as a
    share of quality's; the shares and twice the parts' covariances sum to 1. An answer without structure has no
    parts (NaN): 0 in each, as in its quality."""
    pooled = lambda a: float(np.nan_to_num(a).reshape(-1, group).var(axis=1).mean())  # noqa: E731
    total = pooled(parts["quality"])
    return {k: pooled(w * np.nan_to_num(parts[k])) / total if total > 0 else 0.0 for k, w in P_QUALITY_WEIGHTS.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="annotated positions (JSONL with Stockfish's analysis)")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()

    records = [json.loads(line) for line in open(args.data) if line.strip()]
    records = [r for r in records if r["analysis"]["moves"]][: args.prompts]
    lm = RookWorldLM.load(args.model, device=args.device, batch_size=32 * args.group)
    prompts = [policy_prompt(r["fen"]) for r in records for _ in range(args.group)]
    truths = [(r["analysis"]["moves"], r["analysis"]["evals"]) for r in records for _ in range(args.group)]
    t0 = time.perf_counter()
    completions = lm.complete(prompts, decoding=Decoding("sampled", temperature=args.temperature), seed=args.seed)
    seconds = time.perf_counter() - t0
    scores = RewardScorer().score_batch(prompts, completions, ground_truth=truths)

    rewards = torch.tensor(scores.rewards)
    advantages = group_advantages(rewards, args.group, std=group_std(rewards, args.group)).double().numpy()
    legal = scores.parts["best_legal"].astype(bool) & scores.well_formed
    rank = scores.parts["best_rank"]
    top5, best = legal & (rank >= 1), legal & (rank == 1)
    hits = scores.parts["hits"] > 0
    groups = lambda a: a.reshape(-1, args.group)  # noqa: E731
    spread = groups(scores.rewards).std(axis=1) > 1e-9
    # A group whose answers differ only in the B: move's legality: none reaches the five with B: or with M:.
    legality_only = spread & ~groups(top5 | hits).any(axis=1) & groups(legal).any(axis=1)
    mixed = groups(legal).any(axis=1) & ~groups(legal).all(axis=1)

    figures = {
        "model": args.model, "prompts": len(records), "group": args.group, "temperature": args.temperature,
        "answers": len(prompts), "sampling_s": round(seconds, 1),
        "well_formed": float(scores.well_formed.mean()), "b_legal": float(legal.mean()),
        "b_in_top5": float(top5.mean()),
        "b_best": float(best.mean()), "any_hit": float(hits.mean()),
        "mean_reward": {"all": float(scores.rewards.mean()),
                        "b_illegal": float(scores.rewards[scores.well_formed & ~legal].mean()),
                        "b_legal_outside_top5": float(scores.rewards[legal & ~top5].mean()),
                        "b_in_top5": float(scores.rewards[top5].mean()) if top5.any() else None},
        "groups_with_spread": float(spread.mean()), "groups_mixed_legality": float(mixed.mean()),
        "quality_variance_share": variance_shares(scores.parts, args.group),
        "groups_best_part_varies": float((groups(np.nan_to_num(scores.parts["best"])).std(axis=1) > 1e-9).mean()),
        "groups_legality_only": float(legality_only.mean()),
        "mean_advantage": {"b_legal": float(advantages[legal].mean()), "b_illegal": float(advantages[~legal].mean()),
                           "b_legal_outside_top5": float(advantages[legal & ~top5].mean()),
                           "b_in_top5": float(advantages[top5].mean()) if top5.any() else None},
        # Of the advantage that reaches legal answers, the share that comes from groups with a top-5 answer.
        "legal_advantage_from_top5_groups": float(
            advantages[legal & np.repeat(groups(top5 | hits).any(axis=1), args.group)].clip(0).sum()
            / max(1e-12, advantages[legal].clip(0).sum())),
    }
    for key, value in figures.items():
        print(f"{key:<34}{json.dumps(value)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
