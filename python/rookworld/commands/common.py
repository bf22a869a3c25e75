"""What the commands share without torch: the user error, settings from flags, Stockfish from the settings, the
output and input files."""

from __future__ import annotations

import argparse
import errno
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from rookworld.chess import data
from rookworld.io import files
from rookworld.chess.stockfish import Role, StockfishError, StockfishNotFoundError, StockfishPool, pool_for
from rookworld.io.errors import RookworldError
from rookworld.settings.base import ConfigError
from rookworld.settings.declare import Settings
from rookworld.settings.flags import from_args


class CliError(RookworldError):
    """A user error: printed as one line, exit status 2, no traceback."""


def settings(args: argparse.Namespace, cls: type[Settings], streams: dict[str, str] | None = None):
    """The command's settings from its flags, checked; a bad one is one line. `streams` ({attribute: flag}) are
    input files, one or a list, that may be a pipe, a FIFO or a device (`--from <(zcat f.gz)`, `--pgn /dev/stdin`):
    each is read once, now, into a copy that `read_positions` (or `read_from`) reads, so that the checks see a file
    and no reader waits on a FIFO for ever. A directory given as one is one line saying so."""
    given = {}
    for name, flag in (streams or {}).items():
        value = getattr(args, name, None)
        paths = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        _refuse_directories(paths, flag)
        if any(_is_stream(p) for p in paths):
            given[name] = value
            copies = {p: _copy_stream(p, flag) for p in dict.fromkeys(paths) if _is_stream(p)}
            setattr(args, name, copies[value] if isinstance(value, str) else [copies.get(p, p) for p in value])
    try:
        s = from_args(args, cls)
    except ConfigError as e:
        raise CliError(str(e)) from None
    finally:
        for name, value in given.items():
            setattr(args, name, value)
    for name, value in given.items():  # the names the user gave, in every message and record
        setattr(s, name, value)
    return s


def _refuse_directories(paths: list[str], flag: str) -> None:
    for path in paths:
        if os.path.isdir(path):
            raise CliError(f"{flag} {path} is a directory: give a file in it, such as {flag} "
                           f"{os.path.join(path, 'FILE')}")


class StreamCopies:
    """What was read from each input that can be read only once (a pipe, a FIFO, a device), by the name the user
    gave it: the process reads such an input once, and every reader after reads the copy."""

    def __init__(self):
        self._copies: dict[str, BinaryIO] = {}

    def keep(self, path: str, copy: BinaryIO) -> str:
        """`copy` as what `path` gave; the name a reader opens it by."""
        self._copies[path] = copy
        return _stand_in(copy)

    def read_from(self, path: str) -> str:
        """The file a reader opens for an input the user named `path`: its copy, when it was a pipe, a FIFO or a
        device, else `path` itself."""
        copy = self._copies.get(path)
        return _stand_in(copy) if copy else path

    def as_given(self, text: str, paths: list[str]) -> str:
        """`text` (a message, a record's source) with the name of each copy `read_from` gave put back to the
        user's."""
        for path in paths:
            if path in self._copies:
                text = text.replace(_stand_in(self._copies[path]), path)
        return text


#: Process-wide, as the inputs it copies are: a pipe or a FIFO the user named gives its bytes once a process, to
#: whichever reader of whichever command opens it first; every later reader gets the copy.
STREAMS = StreamCopies()
read_from, as_given = STREAMS.read_from, STREAMS.as_given


def _is_stream(path: str) -> bool:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def _copy_stream(path: str, flag: str) -> str:
    """A private temporary copy of what the pipe or FIFO `path` gives, named as an open descriptor."""
    copy = tempfile.TemporaryFile()
    try:
        if not files.copy_stream(path, copy, files.PEER_WAIT_S):
            raise CliError(f"{flag} {path}: nothing wrote to the FIFO in {files.PEER_WAIT_S:.0f} s: start its "
                           f"writer first (cat FILE > {path} &), or give the file itself")
    except OSError as e:
        copy.close()
        raise CliError(f"{flag} {path}: cannot read it ({e.strerror or e})") from None
    except files.LineTooLong as e:  # /dev/zero, or any endless source without newlines: read no further
        copy.close()
        raise CliError(f"{flag} {path}: {e}") from None
    except BaseException:
        copy.close()
        raise
    copy.flush()
    return STREAMS.keep(path, copy)


def _stand_in(copy: BinaryIO) -> str:
    return f"/dev/fd/{copy.fileno()}"


def stockfish_pool(s) -> StockfishPool:
    """A StockfishPool from the Stockfish settings, with a one-line error when Stockfish is missing."""
    try:
        return pool_for(Role.ANALYSIS, path=s.stockfish_path, workers=s.stockfish_workers, depth=s.stockfish_depth,
                        nodes=s.stockfish_nodes, cache_path=s.stockfish_cache)
    except StockfishNotFoundError as e:
        raise CliError(str(e)) from None
    except (StockfishError, OSError) as e:
        raise CliError(f"cannot start Stockfish: {e}") from None


def output_file(out: str | None, flag: str = "--out") -> files.Output | None:
    """Before any work: an output that cannot be written is an error now, not after an hour. A file is made and
    removed beside it, since permission bits say nothing for root or on a read-only mount. A FIFO's reader is
    waited for now (a bounded time), as a shell's `> fifo` would."""
    if not out:
        return None
    path = Path(out)
    if out != "-" and path.is_dir():
        raise CliError(f"{flag} {out} is a directory: give a file name, such as {path / 'out.json'}")
    try:
        output = files.Output(out)
    except files.OutputError as e:
        raise CliError(f"{flag} {out} {e}") from None
    if output.through:
        _connect(output, flag)
    else:
        _check_not_kept(output.target, out, flag)
        _check_writable(output.target, out, flag)
    return output


@contextmanager
def opened_output(out: str | None, flag: str = "--out") -> Iterator[files.Output | None]:
    """`output_file`, closed when the command is done with it, however it ends."""
    output = output_file(out, flag)
    try:
        yield output
    finally:
        if output is not None:
            output.close()


#: The files of a model, a run or a checkpoint directory: what `--model`, `plot` and `--resume` read there.
_KEPT = ("model.safetensors", "config.json", "vocab.json", "merges.txt", "generation_config.json", "metrics.jsonl",
         "samples.jsonl", "run.json", "trainer_state.pt", "train_config.json", "latest")


def _check_not_kept(target: Path, out: str, flag: str) -> None:
    """An output named as one of the files of a model or a run directory would replace it (`eval --model m --out
    m/config.json`, `plot RUN --out RUN/metrics.jsonl`)."""
    parent = target.parent
    if target.name in _KEPT and any((parent / name).exists() for name in ("config.json", "run.json",
                                                                          "metrics.jsonl", "trainer_state.pt")):
        raise CliError(f"{flag} {out} would replace the {target.name} of the model or run in {parent}: give "
                       "another file name")


def _connect(output: files.Output, flag: str) -> None:
    out = output.name
    if output.target is not None and not os.access(output.target, os.W_OK):
        raise CliError(f"{flag} {out}: cannot write to it (permission denied)")
    try:
        if output.connect(0):
            return
        print(f"{flag} {out}: waiting up to {files.PEER_WAIT_S:.0f} s for a reader of the FIFO", file=sys.stderr)
        if not output.connect(files.PEER_WAIT_S):
            raise CliError(f"{flag} {out}: nothing read the FIFO in {files.PEER_WAIT_S:.0f} s: start its reader "
                           f"first (cat {out} > FILE &), or give a file")
    except OSError as e:
        raise CliError(f"{flag} {out}: cannot open it ({e.strerror or e})") from None


def _check_writable(target: Path, out: str, flag: str) -> None:
    """A file renamed into place: its directory must take a new file."""
    parent = target.parent
    shown = f"{out}: its directory {parent}" if Path(out).parent == parent else f"{out} (a link to {target}): {parent}"
    if not parent.exists():
        raise CliError(f"{flag} {shown} does not exist (mkdir -p {parent})")
    if not parent.is_dir():
        raise CliError(f"{flag} {out}: {parent} is a file, not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{target.name}.", dir=parent)
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
        records, skipped = data.read_records(read_from(path), skip_bad=skip_bad)
    except data.DataError as e:
        message = as_given(str(e), [path])
        if isinstance(e, data.PgnGiven):
            message += f": read its games with --pgn {path}"
        raise CliError(message) from None
    if read_from(path) != path:  # the lines named by the pipe or FIFO read, not by the copy's descriptor
        records = [replace(r, source=as_given(r.source, [path])) if r.source else r for r in records]
    if skipped:
        print(f"skipped {skipped} bad lines of {path}", file=sys.stderr)
    kept, finished = data.playable(records)
    if finished:
        print(f"warning: {data.finished_message(finished, len(records))}", file=sys.stderr)
    if not kept:
        raise CliError("no position with a legal move to work on")
    return kept
