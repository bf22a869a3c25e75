"""Stockfish analysis throughput: analyses/s with one worker and with the whole pool.

    python benches/stockfish.py [--depth 10] [--count 60] [--workers N] [--multipv 5] [--stockfish-path P]

Positions are ``--count`` distinct FENs from ``rookworld.chess.rules.generate_positions``; no cache, engines
started and warmed up before the clock starts. "per core" divides by the cores the run can use
(min(workers * threads, cpu count)).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from rookworld.chess import rules as rchess
from rookworld.chess.stockfish import StockfishPool, find_stockfish


def distinct_positions(count: int, seed: int) -> list[str]:
    fens: dict[str, None] = {}
    start = 0
    while len(fens) < count:
        batch = rchess.generate_positions(count, seed, start=start)
        start += count
        for p in batch:
            if rchess.legal_moves(p.fen):
                fens.setdefault(rchess.normalize_fen(p.fen))
    return list(fens)[:count]


def run(path: str, workers: int, fens: list[str], args) -> dict:
    with StockfishPool(path, workers=workers, depth=args.depth, multipv=args.multipv, hash_mb=args.hash) as pool:
        pool.analyse(distinct_positions(workers * 2, seed=args.seed + 1))  # warm-up: NNUE, page cache
        warm = pool.stats.engine_analyses
        t0 = time.perf_counter()
        analyses = pool.analyse(fens)
        seconds = time.perf_counter() - t0
        stats = pool.stats
    assert stats.engine_analyses - warm == len(fens), stats
    cores = min(workers, os.cpu_count() or 1)
    return {
        "workers": workers,
        "positions": len(fens),
        "seconds": seconds,
        "per_s": len(fens) / seconds,
        "per_core": len(fens) / seconds / cores,
        "ms_each": 1000 * seconds * workers / len(fens),
        "candidates": statistics.mean(len(a.candidates) for a in analyses),
        "restarts": stats.restarts,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=10)
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--workers", type=int, default=None, help="pool size of the second row (cpu count)")
    parser.add_argument("--multipv", type=int, default=5)
    parser.add_argument("--hash", type=int, default=16, help="MB per engine")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--stockfish-path", default=None)
    args = parser.parse_args(argv)

    path = find_stockfish(args.stockfish_path)
    cpus = os.cpu_count() or 1
    pool_workers = args.workers or cpus
    fens = distinct_positions(args.count, args.seed)
    print(f"{path}, depth {args.depth}, MultiPV {args.multipv}, hash {args.hash} MB, 1 thread/engine, "
          f"{len(fens)} distinct positions, {cpus} CPUs")
    rows = [run(path, 1, fens, args)]
    if pool_workers != 1:
        rows.append(run(path, pool_workers, fens, args))
    header = f"{'workers':>7} {'positions':>9} {'seconds':>8} {'analyses/s':>10} {'per core':>9} {'ms/analysis':>11} {'cands':>5}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['workers']:>7} {r['positions']:>9} {r['seconds']:>8.2f} {r['per_s']:>10.1f} {r['per_core']:>9.1f} "
              f"{r['ms_each']:>11.1f} {r['candidates']:>5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
