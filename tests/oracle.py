"""A plain python-chess reference implementation of the RookWorld A: environment.

This is the oracle the tests (and ``benches/env_vs_python_chess.py``) compare ``rookworld.chess.rules``
against. It depends on python-chess only, never on rookworld, and follows the contract in
ROOKWORLD.md literally:

* prompt ``A: {fen}+{move}+{history}+``, target ``{new_fen}+{reward}+{terminated}+{truncated}``;
* the move is legal when ``chess.Move.from_uci(text)`` parses and the move is
  ``in board.legal_moves``; anything else (parse errors included) is illegal;
* new_fen is ``board.fen()``; reward ``0.001`` (legal, game goes on), ``1.0`` (checkmate: the
  mover wins), ``0.5`` (any draw of ``board.outcome(claim_draw=False)``), ``-1.0`` (illegal: board
  unchanged, terminated 0, truncated 1); the flags print as ``0`` / ``1``.

Prompt parsing accepts what the documented shape needs and the same leniency the Rust core
documents (surrounding whitespace, ``A:`` without the space, a missing final ``+``). Whitespace
means the Unicode ``White_Space`` property (Python's ``str.isspace`` additionally counts the ASCII
separators U+001C..U+001F, which are not whitespace in Unicode).
"""

from __future__ import annotations

from collections.abc import Sequence

import chess

HISTORY_LEN = 10
PREFIX = "A: "

REWARD_LEGAL = "0.001"
REWARD_WIN = "1.0"
REWARD_DRAW = "0.5"
REWARD_ILLEGAL = "-1.0"
REWARD_VALUES = {REWARD_LEGAL: 0.001, REWARD_WIN: 1.0, REWARD_DRAW: 0.5, REWARD_ILLEGAL: -1.0}

#: The Unicode White_Space property.
WHITESPACE = "".join(
    map(
        chr,
        [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000],
    )
)


def legal_move(board: chess.Board, text: str) -> chess.Move | None:
    """The move ``text`` names when it is legal in ``board`` (python-chess's own test), else None."""
    try:
        move = chess.Move.from_uci(text)
    except ValueError:
        return None
    return move if move in board.legal_moves else None


def step_board(board: chess.Board, text: str) -> tuple[str, str, bool, bool]:
    """Plays ``text`` on a copy of ``board``: ``(new_fen, reward_text, terminated, truncated)``."""
    move = legal_move(board, text)
    if move is None:
        return board.fen(), REWARD_ILLEGAL, False, True
    board = board.copy(stack=False)
    board.push(move)
    outcome = board.outcome(claim_draw=False)
    if outcome is None:
        reward = REWARD_LEGAL
    elif outcome.winner is None:
        reward = REWARD_DRAW
    else:
        # After the push it is the opponent's turn; a decisive result can only be the mover's mate.
        assert outcome.winner != board.turn
        reward = REWARD_WIN
    return board.fen(), reward, outcome is not None, False


def step(fen: str, text: str) -> tuple[str, str, bool, bool]:
    """``step_board`` on ``chess.Board(fen)``; ``ValueError`` if python-chess rejects the FEN."""
    return step_board(chess.Board(fen), text)


def format_target(new_fen: str, reward: str, terminated: bool, truncated: bool) -> str:
    return f"{new_fen}+{reward}+{int(terminated)}+{int(truncated)}"


def reference_step(fen: str, text: str) -> str:
    """The A: target text for playing ``text`` in ``fen``."""
    return format_target(*step(fen, text))


def parse_prompt(prompt: str) -> tuple[str, str, list[str]]:
    """``(fen, move, history)`` of an A: prompt; ``ValueError`` if it lacks the shape.

    The FEN is returned as written (python-chess splits it on whitespace itself), the move with
    surrounding whitespace removed, the history split on whitespace.
    """
    body = prompt.strip(WHITESPACE)
    if not body.startswith("A:"):
        raise ValueError(f"an A: prompt starts with 'A: ': {prompt!r}")
    body = body[2:]
    if body.endswith("+"):
        body = body[:-1]
    parts = body.split("+")
    if len(parts) != 3:
        raise ValueError(f"an A: prompt has the shape 'A: {{fen}}+{{move}}+{{history}}+': {prompt!r}")
    fen, move, history = parts
    return fen, move.strip(WHITESPACE), history.split()


def reference_target(prompt: str) -> str:
    """A: prompt -> exact target text, computed with python-chess.

    ``ValueError`` when the prompt lacks the A: shape or python-chess rejects its FEN.
    """
    fen, move, _history = parse_prompt(prompt)
    return reference_step(fen, move)


def build_prompt(fen: str, move: str, history: Sequence[str] = ()) -> str:
    """The A: prompt for ``move`` in ``fen`` after ``history`` (oldest first, without ``move``).

    The history field holds the last ``HISTORY_LEN`` moves, oldest first, the move itself last.
    """
    recent = [*list(history)[-(HISTORY_LEN - 1) :], move]
    return f"{PREFIX}{fen}+{move}+{' '.join(recent)}+"


def split_target(target: str) -> tuple[str, str, str, str]:
    """``(new_fen, reward, terminated, truncated)`` of a target text."""
    new_fen, reward, terminated, truncated = target.split("+")
    return new_fen, reward, terminated, truncated
