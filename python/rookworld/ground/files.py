"""Files written whole or not at all: a temporary file or directory beside the target, renamed into place.

tempfile makes them private (-rw------- and drwx------) for safety while they are being written; once in place
they get the permissions any other file of the user gets (0666 or 0777 less the umask), so a run directory can
be read by a colleague or a web server exactly as the user's umask allows.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


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
