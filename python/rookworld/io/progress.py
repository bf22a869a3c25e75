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
    """Work done out of `total`, its rate and the time left.

    The rate is measured from the first update that does work on: what comes before it (loading a model, starting
    engines, the first batch's compiling and warming up) is paid once, and counted into the rate it made a
    three-minute suite show an hour left. Until a rate is measured (a second update) the time left shows as `?`;
    work whose length is not known ahead (`eta=False`: games, which end when they end) shows none."""

    def __init__(self, total: int, desc: str = "", unit: str = "it", stream: TextIO | None = None,
                 enabled: bool = True, eta: bool = True):
        self.total, self.desc, self.unit = total, desc, unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.shows_eta = eta
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.done = 0
        self.start = time.monotonic()
        self.first = 0  # items done before this run (a resumed job), left out of the rate
        self._origin: tuple[float, int] | None = None  # (when, done) at the first update: where the rate starts
        self._last_draw = 0.0
        self._last_decile = -1

    def update(self, n: int = 1, postfix: str = "") -> None:
        now = time.monotonic()
        if self._origin is None and n > 0:
            self._origin = (now, self.done + n)
        self.done += n
        if not self.enabled:
            return
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

    def pause(self, seconds: float) -> None:
        """`seconds` of other work (a held-out evaluation between steps) left out of the elapsed time and the rate."""
        self.start += seconds
        if self._origin is not None:
            self._origin = (self._origin[0] + seconds, self._origin[1])

    def rate(self, now: float | None = None) -> float | None:
        """Items a second since the first update; at the end, over the whole run if no later update measured one.
        None before."""
        now = now if now is not None else time.monotonic()
        if self._origin is not None:
            since, done = self._origin
            if self.done > done and now > since:
                return (self.done - done) / (now - since)
        if self.done >= self.total and now > self.start:
            return (self.done - self.first) / (now - self.start)
        return None

    def eta(self, now: float | None = None) -> float | None:
        """Seconds left at the measured rate: 0 when done, None while no rate is measured or none is shown."""
        if not self.shows_eta:
            return None
        if self.done >= self.total:
            return 0.0
        rate = self.rate(now)
        return (self.total - self.done) / rate if rate else None

    def line(self, now: float | None = None, postfix: str = "") -> str:
        now = now if now is not None else time.monotonic()
        frac = self.done / self.total if self.total else 1.0
        width = 24
        filled = int(width * min(frac, 1.0))
        bar = "#" * filled + "-" * (width - filled)
        timing = _duration(now - self.start)
        if self.shows_eta:
            left = self.eta(now)
            timing += f"<{'?' if left is None else _duration(left)}"
        text = f"{self.desc} [{bar}] {self.done}/{self.total} {frac:4.0%} {timing} {self.speed(now)}"
        return f"{text} {postfix}".rstrip()

    def speed(self, now: float | None = None) -> str:
        """The rate as it reads best: "3.2 pos/s", or below one a second "2.1 s/step" (not "0.0 step/s")."""
        rate = self.rate(now)
        if rate is None:
            return f"? {self.unit}/s"
        return f"{rate:,.1f} {self.unit}/s" if rate >= 1 else f"{1 / rate:,.1f} s/{self.unit}"

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
