"""Reward scoring throughput: the Rust batch scorer against a plain python-chess implementation.

    python benches/rewards_vs_python.py [--count 100000] [--seed 0] [--threads N] [--python-count N]

Builds ``--count`` (prompt, completion) pairs, 80% P: and 20% A:, from
``rookworld.chess.rules.generate_positions``: exact targets and mutated completions (swapped, repeated,
illegal and extra moves, wrong and non-numeric evals, bad B: moves, missing markers, truncations,
unicode junk, trailing text; for A: edited FENs, reward/flag variants, missing fields), as built by
``tests/reward_oracle.py``. P: ground truth is synthetic, one per position in the shape of a MultiPV-5
analysis (random legal moves with random evals, mate evals and ties), built once and held in memory,
so no Stockfish runs here: the benchmark measures scoring alone.

The pairs are scored by ``RewardScorer(...).score_batch(prompts, completions, ground_truth=...)``
(one warm-up, then best of 3) and by ``tests/reward_oracle.py`` (python-chess, one pair at a time,
one pass), in one run. The two must agree within 1e-9 on every pair the Python side scored; the
script exits 1 otherwise. ``--python-count`` times the Python side on the first N pairs of the
(shuffled) batch and extrapolates its per-pair throughput to the whole batch.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOL = 1e-9


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=100_000, help="pairs to score (default 100000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="RAYON_NUM_THREADS for the Rust scorer")
    ap.add_argument("--python-count", type=int, default=None,
                    help="score only the first N pairs in Python and extrapolate (default: all)")
    ap.add_argument("--shaping", choices=("continuous", "graduated"), default="continuous")
    ap.add_argument("--per-position", type=int, default=16, help="P: completions per position (default 16)")
    args = ap.parse_args()
    if args.count < 10:
        ap.error("--count must be >= 10")
    if args.python_count is not None and not 1 <= args.python_count <= args.count:
        ap.error("--python-count must lie in 1..--count")
    return args


def load_oracle():
    # tests/reward_oracle.py builds on tests/oracle.py; both are plain modules in tests/.
    sys.path.insert(0, str(REPO / "tests"))
    import reward_oracle

    return reward_oracle


def build_pairs(count: int, seed: int, per_position: int, oracle):
    """(prompts, completions, truths, tasks): 80% P:, 20% A:, shuffled."""
    import chess

    from rookworld.chess.rules import env_targets, generate_positions

    rng = random.Random(seed)
    n_policy = round(0.8 * count)
    n_env = count - n_policy
    n_positions = max(20, -(-n_policy // per_position))
    positions = generate_positions(n_positions, seed, illegal_share=0.02)
    fens = [p.fen for p in positions]
    truths = {fen: oracle.synthetic_truth(chess.Board(fen), rng) for fen in dict.fromkeys(fens)}

    pairs: list[tuple[str, str, object]] = []
    i = 0
    while len(pairs) < n_policy:
        fen = fens[i % len(fens)]
        i += 1
        prompt = f"P: {fen}"
        for completion in oracle.policy_completions(fen, truths[fen], rng, per_position):
            if len(pairs) < n_policy:
                pairs.append((prompt, completion, truths[fen]))

    env_prompts = [p.env_prompt for p in positions]
    targets = dict(zip(env_prompts, env_targets(env_prompts)))
    per_prompt = max(1, -(-n_env // len(env_prompts)))
    start = len(pairs)
    i = 0
    while len(pairs) - start < n_env:
        prompt = env_prompts[i % len(env_prompts)]
        i += 1
        for completion in oracle.env_completions(prompt, targets[prompt], rng, per_prompt, fens[:200]):
            if len(pairs) - start < n_env:
                pairs.append((prompt, completion, None))
    rng.shuffle(pairs)
    prompts = [p for p, _, _ in pairs]
    completions = [c for _, c, _ in pairs]
    ground = [t for _, _, t in pairs]
    return prompts, completions, ground, len(truths)


def time_rust(scorer, prompts, completions, truths, repeats: int = 3):
    warm = min(len(prompts), 2000)
    scorer.score_batch(prompts[:warm], completions[:warm], ground_truth=truths[:warm])
    best, scores = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        scores = scorer.score_batch(prompts, completions, ground_truth=truths)
        best = min(best, time.perf_counter() - t0)
    return best, scores


def main() -> int:
    args = parse_args()
    if args.threads is not None:
        os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # before rookworld starts its thread pool
    import numpy as np

    from rookworld import _core
    from rookworld.chess.rewards import RewardScorer

    oracle = load_oracle()
    t0 = time.perf_counter()
    prompts, completions, truths, n_positions = build_pairs(args.count, args.seed, args.per_position, oracle)
    build_s = time.perf_counter() - t0
    tasks = np.array([p[0] for p in prompts])
    n_p, n_a = int((tasks == "P").sum()), int((tasks == "A").sum())
    threads = os.environ.get("RAYON_NUM_THREADS") or f"{os.cpu_count()} (all cores)"
    print(f"pairs: {len(prompts):,} ({n_p:,} P: over {n_positions:,} positions with synthetic ground truths "
          f"built once in memory, {n_a:,} A:), built in {build_s:.1f} s")
    print(f"shaping: {args.shaping}; Rust threads (RAYON_NUM_THREADS): {threads}; CPU cores: {os.cpu_count()}")

    # Rust: whole batch, then each task alone.
    scorer = RewardScorer(shaping=args.shaping)
    rust_s, scores = time_rust(scorer, prompts, completions, truths)
    rust_rate = len(prompts) / rust_s
    split = {}
    for task in ("P", "A"):
        idx = np.flatnonzero(tasks == task)
        sub = [prompts[i] for i in idx], [completions[i] for i in idx], [truths[i] for i in idx]
        split[task] = len(idx) / time_rust(scorer, *sub)[0]
    core_s = float("inf")  # the Rust call alone, without RewardScorer's de-duplication and numpy wrapping
    slot: dict[int, int] = {}
    unique, index = [], []
    for t in truths:
        if t is None:
            index.append(-1)
        else:
            if id(t) not in slot:
                slot[id(t)] = len(unique)
                unique.append((list(t[0]), list(t[1])))
            index.append(slot[id(t)])
    for _ in range(3):
        t0 = time.perf_counter()
        _core.score(prompts, completions, index, unique, args.shaping)
        core_s = min(core_s, time.perf_counter() - t0)
    exact = float((scores.rewards == 1.0).mean())
    well_formed = float(scores.well_formed.mean())
    print(f"rewards: mean {scores.rewards.mean():.4f}, exact (1.0) {exact:.1%}, well formed {well_formed:.1%}")

    # Python (python-chess oracle): one pass over the first python_count pairs.
    n_py = args.python_count or len(prompts)
    py_rewards = np.empty(n_py)
    py_well_formed = np.empty(n_py, dtype=bool)
    per_task = {"P": [0, 0.0], "A": [0, 0.0]}
    reference_score = oracle.reference_score
    clock = time.perf_counter
    t_start = clock()
    for i in range(n_py):
        t_i = clock()
        score = reference_score(prompts[i], completions[i], truths[i], args.shaping)
        acc = per_task[score.task]
        acc[1] += clock() - t_i
        acc[0] += 1
        py_rewards[i] = score.reward
        py_well_formed[i] = score.well_formed
    py_s = clock() - t_start
    py_rate = n_py / py_s

    diff = np.abs(scores.rewards[:n_py] - py_rewards)
    worst = int(diff.argmax())
    wf_mismatch = int((scores.well_formed[:n_py] != py_well_formed).sum())
    over = int((diff > TOL).sum())

    print()
    print(f"Rust   RewardScorer.score_batch : {rust_rate:>12,.0f} pairs/s  (best of 3: {rust_s * 1e3:.1f} ms "
          f"for {len(prompts):,}; P: {split['P']:,.0f}/s, A: {split['A']:,.0f}/s)")
    print(f"       of which rookworld._core.score: {core_s * 1e3:.1f} ms ({len(prompts) / core_s:,.0f} pairs/s); "
          f"the rest is RewardScorer's Python side: list copies, error check, numpy arrays")
    note = "" if n_py == len(prompts) else (
        f"; timed on the first {n_py:,} pairs, extrapolated: {len(prompts) / py_rate:.1f} s for all {len(prompts):,}")
    p_rate = per_task["P"][0] / per_task["P"][1] if per_task["P"][1] else float("nan")
    a_rate = per_task["A"][0] / per_task["A"][1] if per_task["A"][1] else float("nan")
    print(f"Python reward_oracle (python-chess): {py_rate:>8,.0f} pairs/s  (one pass: {py_s:.1f} s for {n_py:,}"
          f"{note}; P: {p_rate:,.0f}/s, A: {a_rate:,.0f}/s)")
    print(f"ratio (Rust / Python): {rust_rate / py_rate:,.0f}x")
    print()
    print(f"agreement on {n_py:,} pairs: max |reward diff| = {diff.max():.3g} (pair {worst}), "
          f"{over} over {TOL:g}, well_formed mismatches: {wf_mismatch}")
    if over or wf_mismatch:
        print(f"DISAGREEMENT, e.g. prompt={prompts[worst][:120]!r} completion={completions[worst][:300]!r} "
              f"truth={truths[worst]!r}: Rust {scores.rewards[worst]!r}, Python {py_rewards[worst]!r}",
              file=sys.stderr)
        return 1
    print("OK: the Rust scorer and the python-chess implementation agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
