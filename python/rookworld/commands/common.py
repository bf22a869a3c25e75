"""What the commands share without torch: the user error, settings from flags, Stockfish from the settings, the
output and input files."""

from __future__ import annotations

import argparse
import errno
import os
import sys
import tempfile
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


def check_out_file(out: str | None, flag: str = "--out") -> None:
    """Before any work: an output file that cannot be written is an error now, not after an hour. A file is made
    and removed beside it, since permission bits say nothing for root or on a read-only mount."""
    if not out or out == "-":
        return
    path = Path(out)
    parent = path.parent
    if path.is_dir():
        raise CliError(f"{flag} {out} is a directory: give a file name, such as {path / 'out.json'}")
    if not parent.exists():
        raise CliError(f"{flag} {out}: its directory {parent} does not exist (mkdir -p {parent})")
    if not parent.is_dir():
        raise CliError(f"{flag} {out}: {parent} is a file, not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise CliError(f"{flag} {out}: cannot write in {parent} ({e.strerror or e})") from None


def write_failed(flag: str, out: str, e: OSError) -> CliError:
    """A write that failed after the work: one line saying why (a full disk above all)."""
    why = "the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else (e.strerror or str(e))
    return CliError(f"{flag} {out}: could not write it: {why}")


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
