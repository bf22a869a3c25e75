"""What a model can be asked for, checked without torch (the CLI reports it as one line)."""

from __future__ import annotations

from rookworld.io.errors import RookworldError


class ContextTooLong(RookworldError, ValueError):
    """A prompt and the new tokens asked for do not fit the model's context (a user's --max-new-tokens)."""
