"""`rookworld ask`: the model's P: answer for a position, and its A: answer for a move played in it."""

from __future__ import annotations

import argparse
import json
import sys

from rookworld.commands.common import CliError, settings, stockfish_pool
from rookworld.commands.model import load_lm
from rookworld.chess import rules
from rookworld.chess.stockfish import StockfishNotFoundError, find_stockfish
from rookworld.lm.answers import PROTOCOLS
from rookworld.lm.ask import ask_env, ask_policy, format_env, format_policy
from rookworld.settings.commands import AskSettings


def run(args: argparse.Namespace) -> int:
    s = settings(args, AskSettings)
    try:
        fen = rules.normalize_fen(s.position)
        move = rules.parse_move(fen, s.move) if s.move else None
    except ValueError as e:
        raise CliError(str(e)) from None
    history = s.history.replace(",", " ").split()
    if (problem := rules.history_problem(fen, history)) is not None:
        raise CliError(f"--history: {problem}")
    if not rules.legal_moves(fen):
        raise CliError(f"the game is over in this position (no legal move): {fen}")
    try:
        find_stockfish(s.stockfish_path)
        pool = stockfish_pool(s)
    except StockfishNotFoundError as e:
        if s.stockfish_path:  # asked for by name: a typo is an error, not a quiet answer without a reward
            raise CliError(str(e)) from None
        pool = None
        print("Stockfish not found: no reward (install it, or give --stockfish-path)", file=sys.stderr)
    lm = load_lm(s)
    decoding = PROTOCOLS[s.protocol]
    try:
        policy = ask_policy(lm, fen, decoding=decoding, seed=s.seed, stockfish=pool)
    finally:
        if pool is not None:
            pool.close()
    env = ask_env(lm, fen, move, history, decoding=decoding, seed=s.seed) if move else None
    if s.json:
        print(json.dumps({"fen": fen, "protocol": decoding.name, "policy": policy,
                          **({"env": env} if env else {})}, indent=2))
    else:
        print(format_policy(fen, policy))
        if env:
            print(format_env(env))
    return 0
