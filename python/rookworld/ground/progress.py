"""A progress bar on stderr with rate and ETA, quiet enough for logs when stderr is not a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class Progress:
    def __init__(self, total: int, desc: str = "", unit: str = "it", stream: TextIO | None = None,
                 enabled: bool = True):
        self.total, self.desc, self.unit = total, desc, unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.done = 0
        self.start = time.monotonic()
        self.first = 0  # items done before this run (a resumed job), left out of the rate
        self._last_draw = 0.0
        self._last_decile = -1

    def update(self, n: int = 1, postfix: str = "") -> None:
        self.done += n
        if not self.enabled:
            return
        now = time.monotonic()
        if self.tty:
            if now - self._last_draw >= 0.1 or self.done >= self.total:
                self._last_draw = now
                self.stream.write("\r" + self.line(now, postfix))
                self.stream.flush()
        else:
            decile = 10 * self.done // max(self.total, 1)
            if decile != self._last_decile:
                self._last_decile = decile
                self.stream.write(self.line(now, postfix) + "\n")
                self.stream.flush()

    def line(self, now: float | None = None, postfix: str = "") -> str:
        elapsed = (now if now is not None else time.monotonic()) - self.start
        frac = self.done / self.total if self.total else 1.0
        rate = (self.done - self.first) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        width = 24
        filled = int(width * min(frac, 1.0))
        bar = "#" * filled + "-" * (width - filled)
        text = (f"{self.desc} [{bar}] {self.done}/{self.total} {frac:4.0%} "
                f"{_duration(elapsed)}<{_duration(eta)} {rate:,.1f} {self.unit}/s")
        return f"{text} {postfix}".rstrip()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
