"""A: environment throughput: rookworld's Rust core against plain python-chess.

Builds the same A: prompts for both (``rookworld.chess.rules.generate_positions(count, seed)`` ->
``p.env_prompt``), times ``rookworld.chess.rules.env_targets(prompts)`` (best of a few runs after a
warm-up) and the python-chess reference implementation in tests/oracle.py, checks that the
targets are identical, and prints both throughputs and their ratio. Exits non-zero on any
mismatch.

    python benches/env_vs_python_chess.py [--count 100000] [--seed 0] [--threads N]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_oracle():
    spec = importlib.util.spec_from_file_location("rookworld_oracle", ROOT / "tests" / "oracle.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def best_of(fn, runs: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="number of A: prompts (default 100000)")
    parser.add_argument("--seed", type=int, default=0, help="generate_positions seed (default 0)")
    parser.add_argument("--threads", type=int, default=None, help="RAYON_NUM_THREADS for the Rust core")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of env_targets, best taken (default 3)")
    parser.add_argument("--python-runs", type=int, default=1, help="timed runs of python-chess (default 1)")
    args = parser.parse_args()

    if args.threads is not None:
        os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # before rookworld starts its pool
    import chess

    import rookworld.chess.rules as rc

    oracle = load_oracle()

    t0 = time.perf_counter()
    positions = rc.generate_positions(args.count, args.seed)
    prompts = [p.env_prompt for p in positions]
    gen_s = time.perf_counter() - t0
    threads = os.environ.get("RAYON_NUM_THREADS", f"default ({os.cpu_count()} CPUs)")
    print(f"{len(prompts):,} A: prompts from generate_positions(seed={args.seed}) in {gen_s:.2f} s")
    print(f"python {platform.python_version()}, python-chess {chess.__version__}, rayon threads: {threads}")

    rc.env_targets(prompts[: min(len(prompts), 10_000)])  # warm-up: thread pool, page faults
    rust_s, rust = best_of(lambda: rc.env_targets(prompts), args.runs)
    py_s, reference = best_of(lambda: [oracle.reference_target(p) for p in prompts], args.python_runs)

    mismatches = [(p, a, b) for p, a, b in zip(prompts, rust, reference) if a != b]
    rust_rate = len(prompts) / rust_s
    py_rate = len(prompts) / py_s
    print(f"rookworld env_targets : {rust_s:8.3f} s  {rust_rate:12,.0f} prompts/s  (best of {args.runs})")
    print(f"python-chess (oracle) : {py_s:8.3f} s  {py_rate:12,.0f} prompts/s  (best of {args.python_runs})")
    print(f"speed-up              : {rust_rate / py_rate:8.1f}x")
    print(f"mismatches            : {len(mismatches)}")
    for prompt, got, want in mismatches[:5]:
        print(f"  {prompt!r}\n    rookworld    {got!r}\n    python-chess {want!r}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
