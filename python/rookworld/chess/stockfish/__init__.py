"""Stockfish analysis service: a pool of UCI engines behind futures, with a memory and disk cache.

    with StockfishPool(depth=10) as pool:
        futures = pool.submit(fens)          # returns at once; analysis runs in the background
        ...                                  # GPU work overlaps the analysis
        analyses = [f.result() for f in futures]

An `Analysis` holds up to ``multipv`` (5) `Candidate` moves ranked best first, with evals from the side to
move's view, as the RookWorld ``P:`` task prints them (``Candidate.eval_text``). Positions without legal moves
(checkmate, stalemate) get no candidates and never reach an engine.

An engine is trusted no more than a file: every wait on it is bounded, what it says is checked (scores in range, mates
that fit, legal moves), one that fails is restarted and asked again, and once positions keep failing the pool gives
up on it (`StockfishPool.failure`) rather than wait on it position after position.

The pieces: `engine` (one UCI process, finding the binary), `cache` (memory and sqlite), `pool` (the front:
futures, identical positions sharing one analysis, the caches, the builders by role), `workers` (the back: a thread
and an engine each, restarts, retries and giving up), `reading` (what an engine says, checked), `limits` (what a
search and a pool may be asked for), `analysis` (the results).
"""

from rookworld.chess.stockfish.analysis import MATE_SCORE, Analysis, Candidate
from rookworld.chess.stockfish.engine import StockfishError, StockfishNotFoundError, find_stockfish
from rookworld.chess.stockfish.limits import default_timeout, workers_count_problem
from rookworld.chess.stockfish.pool import LazyPool, Role, StockfishPool, StockfishStats, pool_for, pool_workers

__all__ = ["Analysis", "Candidate", "LazyPool", "MATE_SCORE", "Role", "StockfishError", "StockfishNotFoundError",
           "StockfishPool", "StockfishStats", "default_timeout", "find_stockfish", "pool_for", "pool_workers",
           "workers_count_problem"]
