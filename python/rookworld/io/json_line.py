"""One JSON line's value, read as data: whatever a line holds is a ValueError saying why it is not JSON (a bad line
for its reader to name), never another exception, and its nesting has a bound of its own."""

from __future__ import annotations

import json
import re

#: The deepest nesting a JSON line may have: a record or a sample holds lists in an object (3 levels). A bound of its
#: own, not the parser's recursion limit, which a library (torch's compiler) may have raised in the same process.
MAX_JSON_DEPTH = 64
#: A string, or a bracket outside one. A string runs to its closing quote or, unterminated, to the end of the line
#: (an odd backslash last): every match succeeds, so the scan is linear. A string that must close, as before, made
#: each escaped quote of an unterminated string a new attempt that read to the end: quadratic in the line.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*(?:"|\\?\Z)|[\[\]{}]', re.S)


def _too_deep(text: str) -> bool:
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:  # the common case, without a scan
        return False
    depth = 0
    for m in _JSON_TOKEN.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return True
        elif c in "]}":
            depth -= 1
    return False


def json_value(text: str):
    """One JSON line's value; ValueError saying why the line is not JSON. Whatever a line holds stays a bad line:
    nesting deeper than `MAX_JSON_DEPTH`, or a number longer than Python converts, too."""
    if _too_deep(text):
        raise ValueError("invalid JSON: nested too deeply")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON: {e.msg} at column {e.colno}") from None
    except RecursionError:
        raise ValueError("invalid JSON: nested too deeply") from None
    except ValueError as e:  # a number of thousands of digits
        raise ValueError(f"invalid JSON: {str(e).split(':')[0]}") from None
