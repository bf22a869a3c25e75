"""Positions from the model's own games (`rookworld positions --from-model`): where the shipped model goes wrong.
Its games are replayed with python-chess: every position is where the game was, every move played is legal, and
with failures only, the model's own B: move there (read back from its answer) is not."""

from __future__ import annotations

import json
from pathlib import Path

import chess as pychess
import pytest

from conftest import cli
from rookworld.chess import data
from rookworld.lm.answers import GREEDY, RookWorldLM
from rookworld.lm.games import Game, ModelPlayer, play_games
from rookworld.lm.moves import BEST
from rookworld.lm.own_games import game_records

MODEL = str(Path(__file__).resolve().parents[1] / "models" / "chess-play-grpo")


@pytest.mark.slow
def test_game_records_replay_and_keep_the_failures():
    """Six greedy games of the shipped model with its fall-back, 16 plies: each record's position is its game's after
    its history, its move is the one played, and the failures are exactly the moves its B: move did not give."""
    lm = RookWorldLM.load(MODEL, device="cpu")
    games = [Game() for _ in range(2)] + [Game(start_fen=f) for f in (
        "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
        "rnbqkb1r/pppp1ppp/5n2/4p3/2B1P3/8/PPPP1PPP/RNBQK1NR w KQkq - 2 3",
        "8/5pk1/6p1/8/3R4/6P1/5PKP/2r5 w - - 0 40", "4k3/8/8/8/8/8/4P3/4K3 w - - 0 1")]
    play_games(games, [ModelPlayer(lm, GREEDY, fallback=True)], lambda g: 0, max_plies=16)
    every = [r for i, g in enumerate(games) for r in game_records(g, f"g{i}", failures_only=False)]
    failures = [r for i, g in enumerate(games) for r in game_records(g, f"g{i}", failures_only=True)]
    assert len(every) == sum(len(g.moves) for g in games) > 40
    wanted = sum(s != BEST for g in games for s in g.sources)
    assert 0 < len(failures) == wanted < len(every)  # the model fails sometimes, not always
    by_source = {r.source: r for r in every}
    for r in every:
        game = games[int(r.source.split(":")[0][1:])]
        board = pychess.Board(game.start_fen)
        for move in r.history:
            board.push_uci(move)
        assert data.position_key(board.fen()) == data.position_key(r.fen)
        assert pychess.Move.from_uci(r.move) in board.legal_moves
    for r in failures:
        assert by_source[r.source] == r
        game, ply = games[int(r.source.split(":")[0][1:])], int(r.source.split(":")[1])
        assert game.sources[ply] != BEST and game.moves[ply] == r.move


@pytest.mark.slow
def test_the_positions_command_writes_the_model_s_failures(tmp_path):
    out = tmp_path / "own.jsonl"
    result = cli("positions", "--from-model", MODEL, "--count", "12", "--max-plies", "10", "--annotate",
                 "--stockfish-depth", "2", "--layout", "compact", "--quiet", "--out", out)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 12 and len({data.position_key(d["fen"]) for d in lines}) == 12
    for d in lines:
        board = pychess.Board(d["fen"])
        assert pychess.Move.from_uci(d["move"]) in board.legal_moves
        assert d["p_prompt"] == "P: " + d["fen"] and d["analysis"]["moves"]
    both = cli("positions", "--from-model", MODEL, "--selfplay", "--count", "5", "--out", tmp_path / "x.jsonl")
    assert both.returncode == 2 and "different sources" in both.stderr
