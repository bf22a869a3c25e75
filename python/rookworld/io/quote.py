"""Input quoted back in a message: at most ECHO_LIMIT characters of it, so that an error about a megabyte of input
(a FEN, a move, a UCI command, a request's field) stays one readable line. The Rust core cuts its own quotes to
the same limit (`fen::ECHO_LIMIT`)."""

from __future__ import annotations

#: Characters of input a message quotes: enough to recognise it, whatever was sent.
ECHO_LIMIT = 80


def shortened(text: str, limit: int) -> str:
    """`text` cut to `limit` characters with an ellipsis: what a message quotes from a file stays one short line."""
    return text if len(text) <= limit else text[:limit] + "..."


def quoted(text: object) -> str:
    """`text` as a message quotes it (repr), cut to ECHO_LIMIT characters with an ellipsis when it was longer."""
    return repr(shortened(str(text), ECHO_LIMIT))


#: The longest file name quoted whole: Linux's PATH_MAX. A longer one is no name the system opens, and is cut.
PATH_LIMIT = 4096


def quoted_path(path: object) -> str:
    """A file name as a message quotes it (repr): whole, as the user must see it to find it, up to PATH_LIMIT."""
    return repr(shortened(str(path), PATH_LIMIT))
