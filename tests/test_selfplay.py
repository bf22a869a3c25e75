"""Engine self-play positions and the A: histories of every length: checked against python-chess, with the real
Stockfish."""

from __future__ import annotations

import json
import math
import random
from collections import Counter

import chess as pychess
import pytest

from conftest import cli
from rookworld.chess import data, rules, selfplay
from rookworld.chess.selfplay import SelfPlay
from rookworld.chess.stockfish import StockfishPool
from rookworld.chess.stockfish.analysis import Candidate


@pytest.fixture(scope="module")
def games():
    with StockfishPool(depth=3, multipv=5, workers=2) as pool:
        return list(selfplay.play(pool, 6, seed=5, how=SelfPlay(max_plies=80), in_flight=4))


def test_every_position_replays_from_the_start_and_its_move_is_legal(games):
    assert sorted(g.index for g in games) == list(range(6))
    for g in games:
        board = pychess.Board()
        assert len(g.records) == len(g.analyses) == len(g.moves) > 0
        for ply, (record, analysis) in enumerate(zip(g.records, g.analyses)):
            assert record.fen == board.fen(en_passant="legal"), (g.index, ply)
            assert list(record.history) == [m.uci() for m in board.move_stack]
            assert rules.history_problem(record.fen, record.history) is None
            assert pychess.Move.from_uci(record.move) in board.legal_moves
            # The move played is one of the analysis's candidates, which are the best of the legal moves.
            assert record.move in analysis.moves and len(analysis.moves) == min(5, board.legal_moves.count())
            board.push_uci(record.move)
        # The game ended where the rules (or the ply limit) end it.
        if g.reason == "checkmate":
            assert board.is_checkmate()
        elif g.reason == "draw":
            assert board.is_stalemate() or board.is_insufficient_material() or board.is_seventyfive_moves()
        elif g.reason == "threefold repetition":
            assert board.is_repetition(3)
        else:
            assert g.reason == "ply limit" and len(g.moves) == 80 and board.outcome() is None


def test_games_differ_and_are_fixed_by_the_seed(games):
    openings = {tuple(g.moves[:8]) for g in games}
    assert len(openings) == len(games)  # the opening temperature spreads them
    with StockfishPool(depth=3, multipv=5, workers=1) as pool:
        again = {g.index: g.moves for g in selfplay.play(pool, 2, seed=5, how=SelfPlay(max_plies=80), in_flight=2)}
    # Game i's draws come from its own generator: the first move (at depth 3, a position's analysis is the same
    # with any engine's hash) repeats with another number of engines and games in flight.
    for g in games[:2]:
        assert again[g.index][:1] == g.moves[:1]


def test_a_move_is_drawn_with_the_softmax_of_its_eval_over_the_temperature():
    cands = [Candidate("e2e4", 50, None), Candidate("d2d4", 20, None), Candidate("g1f3", -30, None)]
    assert selfplay.draw(cands, 0.0, random.Random(0)) == "e2e4"
    t = 0.25
    weights = [math.exp((0.5 - 0.5) / t), math.exp((0.2 - 0.5) / t), math.exp((-0.3 - 0.5) / t)]
    expected = [w / sum(weights) for w in weights]  # 0.7325, 0.2206, 0.0469
    rng = random.Random(1)
    n = 40_000
    counts = Counter(selfplay.draw(cands, t, rng) for _ in range(n))
    for move, p in zip(["e2e4", "d2d4", "g1f3"], expected):
        sd = math.sqrt(p * (1 - p) / n)
        assert abs(counts[move] / n - p) < 5 * sd, (move, counts[move] / n, p)
    # A mate is the best by far: at a low temperature nothing else is drawn.
    mate = [Candidate("h5f7", None, 1), Candidate("e2e4", 300, None)]
    assert {selfplay.draw(mate, 0.3, rng) for _ in range(200)} == {"h5f7"}


def test_histories_of_every_length_end_where_the_game_was(games):
    records = [r for g in games for r in g.records]
    full = data.cut_histories(records, 0, "full")
    every = data.cut_histories(records, 0, "every")
    assert full == records
    lengths = Counter(len(e.history) for e, r in zip(every, records) if len(r.history) >= 9)
    assert set(lengths) == set(range(10))  # the move alone up to the nine before it
    for e, r in zip(every, records):
        assert e.history == (r.history[len(r.history) - len(e.history):] if e.history else ())
        # Its A: prompt shows exactly those moves and the move, and the environment's answer is the game's.
        prompt = e.env_prompt
        assert prompt.split("+")[2].split() == [*e.history, e.move]
    assert data.cut_histories(records, 0, "every") == every  # fixed by the seed
    assert data.cut_histories(records, 1, "every") != every
    with pytest.raises(ValueError, match="full"):
        data.cut_histories(records, 0, "some")


@pytest.mark.slow
def test_the_positions_command_writes_new_self_play_positions(tmp_path):
    out, held_out = tmp_path / "train.jsonl", tmp_path / "held_out.jsonl"
    common = ["--selfplay", "--annotate", "--stockfish-depth", "2", "--per-game", "15", "--quiet"]
    assert cli("positions", *common, "--count", "60", "--seed", "1", "--out", out).returncode == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 60
    keys = [data.position_key(d["fen"]) for d in lines]
    assert len(set(keys)) == 60  # no position twice
    for d in lines:
        board = pychess.Board(d["fen"])
        assert pychess.Move.from_uci(d["move"]) in board.legal_moves
        assert d["move"] in d["analysis"]["moves"]
        assert d["a_prompt"].startswith("A: " + d["fen"] + "+" + d["move"] + "+")
        assert rules.env_steps([d["fen"]], [d["move"]])[0].target == d["a_target"]
    assert cli("positions", *common, "--count", "30", "--seed", "2", "--exclude", out,
               "--out", held_out).returncode == 0
    held = [data.position_key(json.loads(line)["fen"]) for line in held_out.read_text().splitlines()]
    assert len(held) == 30 and not set(held) & set(keys)
    # Both sources at once are refused before any work.
    result = cli("positions", "--selfplay", "--from", out, "--count", "5", "--out", tmp_path / "x.jsonl")
    assert result.returncode == 2 and "--from and --selfplay are different sources" in result.stderr


def test_self_play_that_brings_nothing_new_stops_with_one_line(tmp_path):
    """At temperature 0 every game is the same game: the command stops after EMPTY_GAMES of them, saying why and what
    to change, instead of playing forever."""
    out = tmp_path / "same.jsonl"
    result = cli("positions", "--selfplay", "--count", "400", "--selfplay-temperature", "0", "--opening-temperature",
                 "0", "--stockfish-depth", "1", "--quiet", "--out", out)
    assert result.returncode == 2, result.stderr
    line, = result.stderr.strip().splitlines()
    assert line.startswith("rookworld positions: error: --selfplay: 512 games in a row gave no new position (")
    assert "of --count 400 found): raise --selfplay-temperature or --opening-temperature" in line
    assert not out.exists()
