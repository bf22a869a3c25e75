"""What the commands share without torch: the user error, settings from flags, Stockfish from the settings, the
output and input files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rookworld.ground import data
from rookworld.ground.stockfish import StockfishError, StockfishNotFoundError, StockfishPool
from rookworld.settings.base import ConfigError
from rookworld.settings.declare import Settings
from rookworld.settings.flags import from_args


class CliError(Exception):
    """A user error: printed as one line, exit status 2, no traceback."""


def settings(args: argparse.Namespace, cls: type[Settings]):
    """The command's settings from its flags, checked; a bad one is one line."""
    try:
        return from_args(args, cls)
    except ConfigError as e:
        raise CliError(str(e)) from None


def stockfish_pool(s) -> StockfishPool:
    """A StockfishPool from the Stockfish settings, with a one-line error when Stockfish is missing."""
    try:
        return StockfishPool(path=s.stockfish_path, workers=s.stockfish_workers, depth=s.stockfish_depth,
                             nodes=s.stockfish_nodes, cache_path=s.stockfish_cache)
    except StockfishNotFoundError as e:
        raise CliError(str(e)) from None
    except (StockfishError, OSError) as e:
        raise CliError(f"cannot start Stockfish: {e}") from None


def check_out_dir(out: str | None) -> None:
    """Before any work: an output that cannot be written is an error now, not after an hour."""
    if out and out != "-" and not Path(out).parent.exists():
        raise CliError(f"output directory does not exist: {Path(out).parent}")


def read_positions(path: str, skip_bad: bool) -> list[data.Record]:
    """A positions file's records that have a legal move; bad lines and finished games are said on stderr."""
    try:
        records, skipped = data.read_records(path, skip_bad=skip_bad)
    except data.DataError as e:
        raise CliError(str(e)) from None
    if skipped:
        print(f"skipped {skipped} bad lines of {path}", file=sys.stderr)
    kept, finished = data.playable(records)
    if finished:
        print(f"warning: {data.finished_message(finished, len(records))}", file=sys.stderr)
    if not kept:
        raise CliError("no position with a legal move to work on")
    return kept
