"""`rookworld play`: a game against the model in the terminal."""

from __future__ import annotations

import argparse
import sys

from rookworld.commands.common import CliError, settings
from rookworld.commands.model import load_lm
from rookworld.chess import rules
from rookworld.lm.answers import PROTOCOLS
from rookworld.lm.games import BLACK, WHITE, ModelPlayer
from rookworld.lm.play import play_game
from rookworld.lm.uci_protocol import read_command
from rookworld.settings.commands import PlaySettings


def run(args: argparse.Namespace) -> int:
    s = settings(args, PlaySettings)
    try:
        start = rules.normalize_fen(s.fen) if s.fen else rules.START_FEN
    except ValueError as e:
        raise CliError(str(e)) from None
    if not rules.legal_moves(start):
        raise CliError(f"the game is over in this position (no legal move): {start}")
    lm = load_lm(s)
    player = ModelPlayer(lm, PROTOCOLS[s.protocol], seed=s.seed, fallback=True)
    read = input if sys.stdin.isatty() else _read_piped
    play_game(player, user=WHITE if s.colour == "white" else BLACK, start_fen=start, read=read, out=sys.stdout,
              max_plies=s.max_plies)
    return 0


def _read_piped(prompt: str) -> str:
    """A move from a pipe: the prompt and the line echoed, so that a transcript reads like a session."""
    sys.stdout.write(prompt)
    line = read_command(sys.stdin)
    if line is None:
        raise EOFError
    sys.stdout.write(line if line.endswith("\n") else line + "\n")
    return line
