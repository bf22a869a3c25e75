"""Input quoted back in a message: at most ECHO_LIMIT characters of it, so that an error about a megabyte of input
(a FEN, a move, a UCI command, a request's field) stays one readable line. The Rust core cuts its own quotes to
the same limit (`fen::ECHO_LIMIT`). And what a message shows a terminal has its control characters escaped
(`for_terminal`): an ESC or a BEL in a file name or a data line would set the terminal's title or clear it."""

from __future__ import annotations

import re

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


#: The characters a terminal acts on rather than shows: C0 controls but the line break and the tab, DEL, C1 controls,
#: and the bidirectional overrides that show text in another order than it is. Each is written as its escape.
_CONTROLS = {c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"
             for c in [*range(0x00, 0x09), *range(0x0b, 0x20), *range(0x7f, 0xa0), *range(0x202a, 0x202f),
                       *range(0x2066, 0x206a)]}


def for_terminal(text: str) -> str:
    """`text` with every character a terminal would act on escaped (linear: one translate): the one rule for all
    that a command writes to a terminal about its input."""
    return text.translate(_CONTROLS)


def cut_words(text: str, limit: int = PATH_LIMIT) -> str:
    """`text` with every word (a run without white space) longer than `limit` cut to it with an ellipsis: a message
    names a file whole up to the longest path a system opens, and a 100,000-character name is no such path."""
    if len(text) <= limit:
        return text
    return "".join(shortened(part, limit) for part in re.split(r"(\s+)", text))
