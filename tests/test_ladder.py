"""The ladder and its rating fit. The fit is checked against the likelihood written out here on its own, in float64:
its peak by the likelihood's gradient, its interval by the likelihood's curvature, both by finite differences. The
rungs' moves are checked against python-chess, the PGN is read back by python-chess and by rookworld's own reader,
and the suite runs end to end on a tiny model against the real Stockfish."""

import io
import json
import math
import random

import chess as pychess
import chess.pgn
import numpy as np
import pytest

from conftest import cli, needs_stockfish
from rookworld.chess import rules
from rookworld.chess.pgn import game_pgn, read_games
from rookworld.lm.games import WHITE, Game, play_games
from rookworld.lm.ladder import MaterialPlayer, RandomPlayer, material
from rookworld.lm.rating import fit_ratings


Z95 = 1.959963984540054


def log_likelihood(ratings: dict[str, float], games, prior_draws: float) -> float:
    """The fit's objective written out game by game: Elo's logistic, and `prior_draws` drawn games a pair that met."""
    def expected(a, b):
        return 1.0 / (1.0 + 10.0 ** ((ratings[b] - ratings[a]) / 400.0))

    total, pairs = 0.0, set()
    for a, b, s in games:
        e = expected(a, b)
        total += s * math.log(e) + (1 - s) * math.log(1 - e)
        pairs.add(tuple(sorted((a, b))))
    for a, b in pairs:
        e = expected(a, b)
        total += prior_draws * (0.5 * math.log(e) + 0.5 * math.log(1 - e))
    return total


def test_two_players_are_rated_by_their_score_and_its_prior_draw():
    """7 wins, 2 draws and a loss, one virtual draw beside them: a score of 8.5 in 11, and the interval of a
    binomial's Fisher information at that score."""
    games = [("a", "b", 1.0)] * 7 + [("b", "a", 0.5)] * 2 + [("b", "a", 1.0)]
    got = fit_ratings(games, "b", 1000.0)
    e = (7 + 1 + 0.5) / 11
    elo = 1000 + 400 * math.log10(e / (1 - e))
    k = math.log(10) / 400
    half = Z95 / math.sqrt(k * k * 11 * e * (1 - e))
    assert got["a"].elo == pytest.approx(elo, abs=1e-8)
    assert got["a"].low == pytest.approx(elo - half, abs=1e-8) and got["a"].high == pytest.approx(elo + half, abs=1e-8)
    assert got["b"].elo == got["b"].low == got["b"].high == 1000.0  # the anchor is fixed, not estimated
    assert (got["a"].games, got["a"].points, got["b"].points) == (10, 8.0, 2.0)


def test_a_pool_is_fitted_where_the_likelihood_peaks_with_its_curvature_s_interval():
    """Four players who did not all meet: each free rating is where the independent likelihood's gradient is zero,
    and its interval is 1.96 standard errors from the inverse of that likelihood's curvature."""
    rng = random.Random(3)
    strength = {"w": 0.0, "x": 150.0, "y": 400.0, "z": 700.0}
    games = []
    for a, b in [("w", "x"), ("x", "y"), ("y", "z"), ("w", "y")]:
        for i in range(12):
            first, second = (a, b) if i % 2 == 0 else (b, a)
            e = 1 / (1 + 10 ** ((strength[second] - strength[first]) / 400))
            u = rng.random()
            games.append((first, second, 1.0 if u < e - 0.1 else 0.5 if u < e + 0.1 else 0.0))
    got = fit_ratings(games, "y", 1350.0, prior_draws=2.0)
    free = ["w", "x", "z"]
    at = {n: got[n].elo for n in strength}

    def ll(shift: dict[str, float]) -> float:
        return log_likelihood({n: at[n] + shift.get(n, 0.0) for n in at}, games, 2.0)

    h = 1e-3
    for n in free:
        slope = (ll({n: h}) - ll({n: -h})) / (2 * h)
        assert abs(slope) < 1e-6, (n, slope)
    h = 0.5
    curvature = np.array([[(ll({a: h, b: h} if a != b else {a: 2 * h}) - ll({a: h, b: -h} if a != b else {})
                            - ll({a: -h, b: h} if a != b else {}) + ll({a: -h, b: -h} if a != b else {a: -2 * h}))
                           / (4 * h * h) for b in free] for a in free])
    se = np.sqrt(np.diag(np.linalg.inv(-curvature)))
    for n, s in zip(free, se):
        assert got[n].high - got[n].elo == pytest.approx(Z95 * s, rel=1e-4)
        assert got[n].elo - got[n].low == pytest.approx(Z95 * s, rel=1e-4)
    assert got["w"].elo < got["x"].elo < got["y"].elo < got["z"].elo


def test_every_rating_is_finite_when_a_player_wins_or_loses_every_game():
    games = [("strong", "anchor", 1.0)] * 20 + [("weak", "anchor", 0.0)] * 20
    got = fit_ratings(games, "anchor", 1350.0)
    assert all(math.isfinite(v) for r in got.values() for v in (r.elo, r.low, r.high))
    assert got["weak"].elo < 1350 < got["strong"].elo
    assert got["strong"].elo - 1350 == pytest.approx(400 * math.log10(20.5 / 0.5), abs=1e-6)


def test_what_cannot_be_rated_is_refused_by_name():
    with pytest.raises(ValueError, match="the anchor 'c' played no game"):
        fit_ratings([("a", "b", 1.0)], "c", 1000.0)
    with pytest.raises(ValueError, match="no chain of games joins 'c', 'd' to the anchor 'a'"):
        fit_ratings([("a", "b", 1.0), ("c", "d", 0.5)], "a", 1000.0)
    with pytest.raises(ValueError, match="a game's score is 1, 0.5 or 0, not 0.7"):
        fit_ratings([("a", "b", 0.7)], "a", 1000.0)


def python_chess_material(board: pychess.Board, colour: bool) -> int:
    values = {pychess.PAWN: 1, pychess.KNIGHT: 3, pychess.BISHOP: 3, pychess.ROOK: 5, pychess.QUEEN: 9}
    return sum(v * (len(board.pieces(p, colour)) - len(board.pieces(p, not colour))) for p, v in values.items())


def test_the_material_rung_mates_first_then_takes_the_most_and_counts_as_python_chess_does():
    mate = "6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1"  # Ra8#
    queen = "4k3/8/8/3q4/8/8/8/3RK3 w - - 0 1"  # Rxd5
    rook_or_pawn = "4k3/8/8/8/8/2r1p3/3K4/8 w - - 0 1"  # Kxc3 (a rook) over Kxe3 (a pawn)
    games = [Game(start_fen=f) for f in (mate, queen, rook_or_pawn)]
    assert [c.move for c in MaterialPlayer(0).choose(games)] == ["a1a8", "d1d5", "d2c3"]
    counted = [material(p.fen, "w") for p in rules.generate_positions(60, 5)]
    for p in rules.generate_positions(60, 5):
        board = pychess.Board(p.fen)
        for colour, name in ((pychess.WHITE, "w"), (pychess.BLACK, "b")):
            assert material(p.fen, name) == python_chess_material(board, colour)
    assert len(set(counted)) > 1  # positions with the material apart, not only level ones


def test_the_random_rung_plays_legal_moves_and_the_same_ones_from_the_same_seed():
    fens = [p.fen for p in rules.generate_positions(50, 8, illegal_share=0.0) if rules.legal_moves(p.fen)]
    games = [Game(start_fen=f) for f in fens]
    moves = [c.move for c in RandomPlayer(4).choose(games)]
    assert moves == [c.move for c in RandomPlayer(4).choose(games)]
    assert all(pychess.Move.from_uci(m) in pychess.Board(f).legal_moves for f, m in zip(fens, moves))
    assert len(set(moves)) > 1


def played_games() -> list[Game]:
    """Random against material from the start and from a position after castling rights and a promotion are near."""
    starts = [rules.START_FEN, "r3k2r/1P6/8/8/8/8/6p1/R3K2R w KQkq - 0 30"]
    games = [Game(start_fen=f) for f in starts for _ in range(3)]
    play_games(games, [RandomPlayer(2), MaterialPlayer(3)], lambda g: 0 if g.turn == WHITE else 1, max_plies=120)
    return games


def test_a_game_s_pgn_reads_back_to_the_same_moves_and_result_in_python_chess_and_rookworld():
    games = played_games()
    assert any(g.result for g in games) and any(len(g.moves) > 20 for g in games)
    texts = [game_pgn({"Event": "test", "White": "random", "Black": "material", "Round": str(i)}, g.start_fen,
                      g.moves, g.result) for i, g in enumerate(games)]
    for g, text in zip(games, texts):
        read = chess.pgn.read_game(io.StringIO(text))
        assert not read.errors, read.errors
        assert [m.uci() for m in read.mainline_moves()] == g.moves
        assert read.headers["Result"] == (g.result or "*")
        assert list(read.headers)[:7] == ["Event", "Site", "Date", "Round", "White", "Black", "Result"]
        assert read.board().fen() == pychess.Board(g.start_fen).fen()
        assert max(map(len, text.splitlines())) < 80
    ours, bad, _ = read_games(text="\n".join(texts))
    assert bad == 0 and [list(p.moves) for p in ours] == [g.moves for g in games]
    with pytest.raises(ValueError):
        game_pgn({}, rules.START_FEN, ["e2e5"], None)


@needs_stockfish
def test_eval_ladder_rates_a_tiny_model_in_one_fit_and_writes_every_game(tiny_dir, tmp_path):
    """The whole ladder on a random model: it is rated, with an interval, beside every rung; each rung's own games
    are there too; every game's PGN reads back in python-chess; and every one of its own B: moves is illegal."""
    out = tmp_path / "ladder.json"
    proc = cli("eval", "--model", str(tiny_dir), "--suite", "ladder", "--games", "2", "--max-plies", "12",
               "--max-new-tokens", "8", "--device", "cpu", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "ladder: the model (14 games, greedy): 7 rungs from random to stockfish-elo-1600" in proc.stdout
    assert "rating (Elo)" in proc.stdout and "ladder/stockfish-elo-1350 (2 games, greedy)" in proc.stdout
    got = json.loads(out.read_text())["suites"]["ladder"]
    model = got["sections"]["ladder"]
    assert model["rating_low"] < model["rating"] < model["rating_high"]
    assert model["own_move_illegal"] == 1.0 and model["model_moves"] > 0
    assert got["sections"]["ladder/stockfish-elo-1350"]["rating"] == 1350.0
    items = got["items"]
    assert len(items) == 2 * 13 and sum(i["white"] == "model" or i["black"] == "model" for i in items) == 14
    for item in items:
        read = chess.pgn.read_game(io.StringIO(item["pgn"]))
        assert [m.uci() for m in read.mainline_moves()] == item["moves"]
        assert {read.headers["White"], read.headers["Black"]} == {item["white"], item["black"]}


def test_a_ladder_without_its_engine_is_one_line_and_no_traceback(tiny_dir, tmp_path):
    missing = tmp_path / "no-stockfish"
    proc = cli("eval", "--model", str(tiny_dir), "--suite", "ladder", "--stockfish-path", str(missing))
    assert proc.returncode == 2 and str(missing) in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
