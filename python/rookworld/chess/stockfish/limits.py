"""What a search and a pool may be asked for, the same through every route (the CLI's settings, the Python API, the
integrations): a depth or a node count in range, and no more engines than the machine's cores can carry."""

from __future__ import annotations

import os
from typing import Any

from rookworld.io.quote import ECHO_LIMIT, quoted, shortened

#: Engines a core may carry. More only share it, and so many starting at once outlast the handshake's limit.
WORKERS_PER_CORE = 4


#: The deepest search and the most nodes a setting may ask of an engine. Past them one search takes hours
#: (`default_timeout` doubles every two plies of depth), which no run here means; a typo of a few digits would
#: otherwise hold a worker, or a served game's opponent, for longer than anyone waits.
MAX_DEPTH = 30
MAX_NODES = 100_000_000


def search_problem(depth: Any, nodes: Any) -> str | None:
    """What is wrong with a search's limits (a depth of 1 to `MAX_DEPTH`, or nodes of 1 to `MAX_NODES`), or None:
    every route to a pool (the CLI's settings, the Python API, the integrations) is held to the same bounds."""
    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if nodes is not None:
        ok = whole(nodes) and 1 <= nodes <= MAX_NODES
        return None if ok else f"nodes must be a whole number from 1 to {MAX_NODES:,}, not {quoted(nodes)}"
    ok = whole(depth) and 1 <= depth <= MAX_DEPTH
    return None if ok else f"depth must be a whole number from 1 to {MAX_DEPTH} (or give nodes), not {quoted(depth)}"


def default_timeout(depth: int | None, nodes: int | None) -> float:
    """A generous per-position limit: at least 10 s (Stockfish's depth 10 takes about 0.1 s on a busy core), more
    for deep or many-node searches."""
    if nodes is not None:
        return max(10.0, nodes / 20_000)
    return max(10.0, 2.0 ** ((depth or 0) / 2) / 10)


def max_workers() -> int:
    """The most engines this machine runs: `WORKERS_PER_CORE` a core."""
    return WORKERS_PER_CORE * (os.cpu_count() or 1)


def workers_count_problem(option: str, workers: Any) -> str | None:
    """What is wrong with a number of engines asked for through the Python API (None: the default), or None: a whole
    number of at least 1, within `workers_problem`'s bound. 1.5 was a TypeError deep in the pool, and 0 silently the
    default."""
    if workers is None:
        return None
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        return f"{option} must be a whole number of at least 1 (or None: one a core), not " \
               f"{shortened(repr(workers), ECHO_LIMIT)}"
    return workers_problem(option, workers)


def workers_problem(option: str, workers: int) -> str | None:
    """Why ``workers`` engines are too many for this machine, or ``None`` (a settings check, as `positive`)."""
    cores, most = os.cpu_count() or 1, max_workers()
    if workers <= most:
        return None
    return (f"{option} {workers} is more Stockfish processes than this machine's {cores} cores can run: give at most "
            f"{most} ({WORKERS_PER_CORE} a core; the default is one a core)")
