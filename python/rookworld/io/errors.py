"""The one base of every failure rookworld expects (a bad flag, a missing engine, a full disk, a run that
diverged): a `RookworldError` knows its message, what went wrong, and its hint, what to do, each in plain words.
The command line prints one as a single line with exit status 2 and no traceback; a library user catches this one
type. Each error keeps the built-in type it is a kind of (a `ConfigError` is a `ValueError` too)."""

from __future__ import annotations


class RookworldError(Exception):
    """What went wrong (`message`) and what to do about it (`hint`, empty when the message says it); `str()` is
    both, joined by a semicolon."""

    def __init__(self, message: str = "", hint: str = ""):
        super().__init__(message)
        self.message, self.hint = message, hint

    def __str__(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message
