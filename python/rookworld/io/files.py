"""Files written whole or not at all: a temporary file or directory beside the target, renamed into place; the
outputs a user names, written as their kind allows (`Output`); pipes and FIFOs read once (`copy_stream`); text read
a bounded line at a time (`read_bounded`, `LineBound`).

tempfile makes them private (-rw------- and drwx------) for safety while they are being written; once in place
they get the permissions any other file of the user gets (0666 or 0777 less the umask), so a run directory can
be read by a colleague or a web server exactly as the user's umask allows.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TextIO


#: The longest line of a text file read (positions, samples, and PGN, whose Rust reader has the same
#: `pgn::MAX_LINE`), in bytes: the movetext of the longest game, with Lichess's clock and evaluation comments, takes
#: under 1 MB, a position with its analysis, prompts and even that game's history under 200 KB. Past it a reader
#: stops with a `LineTooLong`, where it read on for ever (/dev/zero) or held gigabytes without a newline.
MAX_LINE = 4 << 20


class LineTooLong(ValueError):
    """A line longer than the reader's limit; `line` is its number, 1-based."""

    def __init__(self, line: int, limit: int):
        super().__init__(f"line {line} goes on past {limit:,} bytes without an end: no file of lines (a binary "
                         "file, or /dev/zero?)")
        self.line = line


class LineBound:
    """Counts the lines of text read in chunks, and raises `LineTooLong` as soon as one passes `limit` bytes. Lines
    end as an editor ends them: at \\n, \\r\\n or a lone \\r."""

    def __init__(self, limit: int = MAX_LINE):
        self.limit = limit
        self.line = 1
        self._open = 0  # bytes of the line not yet ended
        self._after_cr = False  # the last chunk ended with \r: a \n that starts the next one ends no new line

    def feed(self, chunk: bytes) -> None:
        breaks = chunk.count(b"\n") + chunk.count(b"\r") - chunk.count(b"\r\n")
        if self._after_cr and chunk.startswith(b"\n"):
            breaks -= 1
        first = min((i for i in (chunk.find(b"\n"), chunk.find(b"\r")) if i >= 0), default=-1)
        if first < 0:
            self._open += len(chunk)
        else:
            # A line between two breaks of one chunk is shorter than the chunk, which readers keep under the limit.
            if self._open + first > self.limit:
                raise LineTooLong(self.line, self.limit)
            self._open = len(chunk) - 1 - max(chunk.rfind(b"\n"), chunk.rfind(b"\r"))
            self.line += breaks
        if chunk:
            self._after_cr = chunk.endswith(b"\r")
        if self._open > self.limit:
            raise LineTooLong(self.line, self.limit)

    @property
    def chunk_size(self) -> int:
        return min(1 << 16, self.limit)


def next_line(f: TextIO, limit: int = MAX_LINE) -> tuple[str, bool] | None:
    """The next line of text stream `f` (None at its end) and whether it is whole: one longer than `limit`
    characters comes back as its first `limit` and False, the rest read past to its end and never held (a log
    without newlines, /dev/zero, a GUI that never ends its command)."""
    line = f.readline(limit)
    if not line:
        return None
    if len(line) < limit or line.endswith("\n"):
        return line, True
    while (rest := f.readline(limit)) and not rest.endswith("\n"):
        pass
    return line, False


def lines_within(f: TextIO, limit: int = MAX_LINE) -> Iterator[str | None]:
    """The lines of text stream `f` (without their ends), each of at most `limit` characters; None in place of a
    longer one (`next_line`)."""
    while (got := next_line(f, limit)) is not None:
        line, whole = got
        yield line.rstrip("\r\n") if whole else None


def what_is_at(path: str | os.PathLike) -> str:
    """What `path` names, its links followed, in words: "nothing", "a symlink loop", "a link to nothing", or its
    kind ("a file", "a directory", "a socket", "a FIFO", ...). A message that says "no such file" of a socket or of
    a link loop sends its reader looking for a file that is there."""
    try:
        return kind(os.stat(path).st_mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symlink loop"
        if os.path.islink(path):
            return "a link to nothing"
        return "nothing" if e.errno in (errno.ENOENT, errno.ENOTDIR) else f"unreadable ({e.strerror})"


def no_file_there(path: str | os.PathLike) -> str | None:
    """None where `path` is a regular file (or a link to one); else what is wrong, for a message: "no such file",
    or what is there instead ("a socket, not a file")."""
    what = what_is_at(path)
    return None if what == "a file" else "no such file" if what == "nothing" else f"{what}, not a file"


def no_directory_there(path: str | os.PathLike) -> str | None:
    """As `no_file_there`, for a directory: None, "no such directory" or "a file, not a directory"."""
    what = what_is_at(path)
    return None if what == "a directory" else "no such directory" if what == "nothing" else f"{what}, not a directory"


def not_regular(path: str | os.PathLike) -> str | None:
    """Why something at `path` is no file to read whole from a library call (a pipe nobody writes would block the
    call for ever, a device or a socket never end), in words; None for a regular file or for nothing there."""
    what = what_is_at(path)
    return None if what in ("a file", "nothing") else f"it is not a regular file ({what})"


def read_small(path: str | os.PathLike, limit: int) -> bytes:
    """A small file's bytes (a record, settings or vocabulary file), read as data: what stands in its place that is
    no regular file is refused unopened (a pipe or a device would be read for ever, a socket never opens), and so is
    one over `limit` bytes, never read whole. OSError for what the system says (FileNotFoundError: none there),
    ValueError for the rest, saying why (the caller names the file)."""
    if (why := not_regular(path)) is not None:
        raise ValueError(why)
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"it is over {limit:,} bytes, more than such a file holds")
    return data


def read_json_object(path: str | os.PathLike, limit: int) -> dict:
    """A small file (`read_small`) holding one JSON object, a byte order mark before it read past; ValueError saying
    why for text that is not UTF-8, not JSON, nested past the parser's depth, or not an object."""
    data = read_small(path, limit)
    try:
        value = json.loads(data.decode("utf-8-sig"))
    except RecursionError:
        raise ValueError("it is nested too deep for what it should hold") from None
    except ValueError as e:  # not UTF-8, not JSON, or a number longer than Python converts
        raise ValueError(f"it is not a JSON text: {str(e)[:200]}") from None
    if not isinstance(value, dict):
        raise ValueError(f"it holds a JSON {type(value).__name__}, not an object")
    return value


def read_bounded(path: str | os.PathLike, limit: int = MAX_LINE) -> bytes:
    """A text file's bytes, read a chunk at a time with no line longer than `limit` (`LineTooLong` as soon as one
    is), so that a file without newlines is refused at its first megabyte, not held whole."""
    bound, parts = LineBound(limit), []
    with open(path, "rb") as f:
        while chunk := f.read(bound.chunk_size):
            bound.feed(chunk)
            parts.append(chunk)
    return b"".join(parts)


def _umask() -> int:
    try:  # Linux says it without changing it (os.umask can only be read by setting it, which races with threads)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def publish(path: str | os.PathLike) -> None:
    """Gives `path` (and, for a directory, everything in it) the permissions of a file the user creates: tempfile
    made it private, and some writers (safetensors) make their files private too."""
    umask = _umask()
    path = Path(path)
    for p in [path, *(path.rglob("*") if path.is_dir() else ())]:
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~umask)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", *, fsync: bool = False) -> Iterator:
    """Opens a temporary file beside `path` and renames it to `path` when the block ends without an error."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        publish(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def temporary_directory(prefix: str, parent: str | os.PathLike) -> Path:
    """A new private directory in `parent`, to be filled, `publish`ed and renamed into place."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


#: How long the other end of a FIFO is waited for: its reader when it is an output, its writer when it is an
#: input. Opening a FIFO blocks until the other end opens it, so one that nobody opens would hang a command.
PEER_WAIT_S = 60.0

# An open descriptor named as a file: /dev/stdout, /dev/fd/N, /proc/self/fd/N.
_DESCRIPTOR = re.compile(r"^/(proc/[^/]+|dev)/fd/\d+$")
_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a file"))


class OutputError(ValueError):
    """An output that cannot be written the way it is; the message follows its name."""


def kind(mode: int) -> str:
    """What a file of this st_mode is, in words ("a FIFO")."""
    return next((name for test, name in _KINDS if test(mode)), "not a file")


def _follow_links(path: str) -> tuple[str, bool]:
    """The file `path` names once its symlinks are followed, and whether one of them named an open descriptor
    (/dev/stdout, /dev/fd/N), whose file is the descriptor's, not a path that could be renamed over."""
    p, descriptor = os.path.abspath(path), False
    for _ in range(40):  # the kernel's own limit on the links one lookup follows
        p = os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))
        descriptor = descriptor or bool(_DESCRIPTOR.match(p))
        try:
            link = os.readlink(p)
        except OSError:  # not a link, or nothing there: the end of the chain
            return p, descriptor
        p = os.path.join(os.path.dirname(p), link)
    raise OutputError("is a symlink loop: point the link at a file, or give another name")


class Output:
    """A file a user named for a command's output, written as its kind allows. A regular file, or a new one, is
    written whole or not at all (a temporary file beside it renamed over it); a symlink's file the same way, beside
    that file, so the link stays a link. A FIFO, a character device (/dev/null, a terminal) or an open descriptor
    (/dev/stdout) is written through: a file renamed over it would replace the pipe or the device itself, which as
    root is /dev/null for the whole system. `-` is standard output."""

    def __init__(self, name: str):
        self.name = name
        self.fifo = False
        self._fd: int | None = None
        if name == "-":
            self.through, self.target = True, None
            return
        target, descriptor = _follow_links(name)
        try:
            mode = os.stat(name).st_mode
        except FileNotFoundError:  # a new file, or a symlink to one: made where the link points
            mode = None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise OutputError("is a symlink loop: point the link at a file, or give another name") from None
            mode = None  # a directory on the way that is not one: the caller's checks of the parent say it
        if mode is not None and (stat.S_ISBLK(mode) or stat.S_ISSOCK(mode)):
            raise OutputError(f"is {kind(mode)}, not a file to write: give a file name")
        self.through = descriptor or (mode is not None and not stat.S_ISREG(mode))
        self.fifo = mode is not None and stat.S_ISFIFO(mode)
        self.target = Path(target) if os.path.islink(name) and not self.through else Path(name)

    def connect(self, wait_s: float) -> bool:
        """A FIFO's write end, opened now (before the work, as a shell's `> fifo` does) waiting up to `wait_s` for
        its reader; False when none came. Held open until the write, so the reader sees no end before it."""
        if not self.fifo or self._fd is not None:
            return True
        self._fd = open_fifo(str(self.target), wait_s)
        return self._fd is not None

    @contextlib.contextmanager
    def open(self, mode: str = "w") -> Iterator:
        """The output as a file object, `mode` "w" or "wb"."""
        if self.target is None:
            stream = sys.stdout.buffer if "b" in mode else sys.stdout
            yield stream
            stream.flush()
            return
        if not self.through:
            with atomic_write(self.target, mode) as f:
                yield f
            return
        # O_APPEND, not O_TRUNC: through /dev/stdout that is the shell's file, which `>>` asked to be appended to.
        fd = self._fd if self._fd is not None else os.open(self.target, os.O_WRONLY | os.O_APPEND)
        self._fd = None
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def open_fifo(path: str, wait_s: float) -> int | None:
    """A descriptor of the FIFO `path` for writing, once a reader has it open; None when none came within `wait_s`
    seconds. The descriptor blocks as usual."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
        else:
            os.set_blocking(fd, True)
            return fd


#: Room a stream's copy leaves on its disk: an endless source with newlines (/dev/urandom) stops there, not at a full
#: disk, checked every `ROOM_CHECK_BYTES` copied.
DISK_RESERVE, ROOM_CHECK_BYTES = 1 << 30, 64 << 20


class StreamFillsDisk(OSError):
    """A stream's copy came within `DISK_RESERVE` of filling its disk."""


def copy_stream(path: str, into: BinaryIO, wait_s: float, line_limit: int = MAX_LINE) -> bool:
    """Copies all that a pipe, a FIFO or a device gives into `into`, reading it once; False when `path` is a FIFO
    that no writer opened within `wait_s` seconds (opening it the usual way would have waited for ever). A line
    longer than `line_limit` is a `LineTooLong` at once: an endless source without newlines (/dev/zero) ends there;
    one with newlines (/dev/urandom) ends with a `StreamFillsDisk` before the copy leaves its disk `DISK_RESERVE`."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # never blocks, writer or not
    bound = LineBound(line_limit)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:  # a writer has it open and has not written yet
                chunk = None
                break
            if chunk or not _named_fifo(fd):  # data, or the end of a pipe or a device
                break
            if time.monotonic() >= deadline:  # the end of a FIFO only says that no writer has it open (yet)
                return False
            time.sleep(0.05)
        os.set_blocking(fd, True)
        if chunk is None:
            chunk = os.read(fd, 1 << 16)
        copied = 0
        while chunk:  # to the end: every writer has closed it
            bound.feed(chunk)
            into.write(chunk)
            copied += len(chunk)
            if copied % ROOM_CHECK_BYTES < len(chunk):
                into.flush()
                room = os.fstatvfs(into.fileno())
                if room.f_bavail * room.f_frsize < DISK_RESERVE:
                    raise StreamFillsDisk(errno.ENOSPC, f"its copy reached {copied:,} bytes and would fill the disk "
                                                        f"(under {DISK_RESERVE >> 30} GiB left): give a file")
            chunk = os.read(fd, bound.chunk_size)
        return True
    finally:
        os.close(fd)


def _named_fifo(fd: int) -> bool:
    """A FIFO in the file system, which a writer may open later (not an anonymous pipe, such as bash's
    <(command), whose writer had it from the start)."""
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        return False
    try:
        return not os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
    except OSError:  # no /proc: taken as named, which only means waiting for a writer that is there
        return True
