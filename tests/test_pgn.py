"""Real games from PGN files, against python-chess's `chess.pgn` as the oracle.

tests/data holds real games: famous.pgn (Morphy's Opera game, Byrne-Fischer 1956, Kasparov-Topalov 1999 cut off
after 25...Kb6 with no result, the Saavedra study from a FEN with its promotion to a rook), annotated with comments,
variations and NAGs; lichess_study_charles_xii_at_bender.pgn (a Lichess study shipped by Debian's pychess package,
GPL-3+: FEN headers, comments, variations); malformed.pgn (an illegal move in its second game).
"""

import gzip
import shutil
import subprocess
from pathlib import Path

import chess
import chess.pgn
import pytest

from rookworld.chess import rules as rw_chess
from rookworld.chess.pgn import HISTORY_WINDOW, pgn_positions, read_games

DATA = Path(__file__).parent / "data"
FAMOUS = DATA / "famous.pgn"
STUDY = DATA / "lichess_study_charles_xii_at_bender.pgn"
MALFORMED = DATA / "malformed.pgn"


def oracle(path):
    """python-chess's games of a file."""
    games = []
    with open(path, encoding="utf-8") as f:
        while (game := chess.pgn.read_game(f)) is not None:
            games.append(game)
    return games


def fens(game):
    """python-chess's FEN of every mainline position, en passant only when a capture can use it."""
    board = game.board()
    out = [board.fen(en_passant="legal")]
    for move in game.mainline_moves():
        board.push(move)
        out.append(board.fen(en_passant="legal"))
    return out


@pytest.mark.parametrize("path", [FAMOUS, STUDY], ids=lambda p: p.name)
def test_mainlines_and_every_position_match_python_chess(path):
    expected = oracle(path)
    assert all(not g.errors for g in expected)
    games, bad, reasons = read_games(path)
    assert (bad, reasons) == (0, [])
    assert len(games) == len(expected)
    sample = pgn_positions(path, dedup=False, history_len=None)
    window = pgn_positions(path, dedup=False)
    assert [p.fen for p in window.positions] == [p.fen for p in sample.positions]
    for whole, cut in zip(sample.positions, window.positions):
        assert cut.history == whole.history[-HISTORY_WINDOW:] if whole.history else cut.history == ()
    for game, theirs in zip(games, expected):
        moves = [m.uci() for m in theirs.mainline_moves()]
        assert list(game.moves) == moves, game.source
        assert game.start_fen == theirs.board().fen()
        positions = [p for p in sample.positions if p.game == game.index]
        assert [p.fen for p in positions] == fens(theirs)
        assert [p.ply for p in positions] == list(range(len(moves) + 1))
        for p in positions:
            assert p.history == tuple(moves[:p.ply])
            assert p.move == (moves[p.ply] if p.ply < len(moves) else None)
            assert p.source == game.source
            assert rw_chess.history_problem(p.fen, p.history) is None


def test_what_the_famous_games_hold():
    games, _, _ = read_games(FAMOUS)
    opera, century, immortal, saavedra = games
    assert [g.source for g in games] == [f"{FAMOUS}:1", f"{FAMOUS}:17", f"{FAMOUS}:36", f"{FAMOUS}:53"]
    assert opera.moves[22] == "e1c1" and opera.moves[-1] == "d1d8"  # 12. O-O-O, 17. Rd8#
    assert century.moves[7] == "e8g8"  # 4... 0-0, castled with zeros
    assert century.moves[-1] == "a2c2" and len(century.moves) == 82
    # Cut off mid-game: the mainline stops at 25... Kb6, the variations and comments add nothing.
    assert len(immortal.moves) == 50 and immortal.moves[46] == "d1d4"
    assert immortal.headers["WhiteElo"] == "2812" and immortal.headers["Result"] == "1-0"
    assert saavedra.start_fen == "8/8/1KP5/3r4/8/8/8/k7 w - - 0 1"
    assert "c7c8r" in saavedra.moves  # 6. c8=R!, not the queen of the variation
    assert opera.headers == {"Event": "Paris", "Site": "Paris FRA", "Result": "1-0"}


def test_a_malformed_game_names_file_line_game_and_move():
    (theirs_error,) = oracle(MALFORMED)[1].errors
    assert "illegal san: 'Nf3'" in str(theirs_error)
    fen = "r3kb1r/p2nqppp/5n2/1B2p1B1/4P3/1Q6/PPP2PPP/R3K2R w KQkq - 1 12"
    assert fen in str(theirs_error)
    message = f'{MALFORMED}:6: game 2: move 12 "Nf3" (line 11) is not legal in {fen}'
    with pytest.raises(ValueError) as raised:
        read_games(MALFORMED)
    assert str(raised.value) == message
    with pytest.raises(ValueError, match="game 2: move 12"):
        pgn_positions(MALFORMED)
    games, bad, reasons = read_games(MALFORMED, skip_bad=True)
    assert [g.index for g in games] == [0, 2] and bad == 1 and reasons == [message]
    sample = pgn_positions([FAMOUS, MALFORMED], skip_bad=True, dedup=False)
    assert (sample.games, sample.bad_games, sample.bad_reasons) == (7, 1, [message.replace(":6: game 2:", ":6: game 6:")])
    assert {p.game for p in sample.positions} == {0, 1, 2, 3, 4, 6}


def test_text_files_gzip_and_zstd_read_alike(tmp_path):
    text = FAMOUS.read_text(encoding="utf-8")
    plain, _, _ = read_games(text=text, name="famous")
    assert plain[2].source == "famous:36"
    gz = tmp_path / "famous.pgn.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    paths = [gz]
    if shutil.which("zstd"):
        subprocess.run(["zstd", "-q", str(FAMOUS), "-o", str(tmp_path / "famous.pgn.zst")], check=True)
        paths.append(tmp_path / "famous.pgn.zst")
    games, _, _ = read_games(paths)
    assert len(games) == 4 * len(paths)
    for i, game in enumerate(games):
        assert game.moves == plain[i % 4].moves and game.index == i
        assert game.source == f"{paths[i // 4]}:{plain[i % 4].source.split(':')[1]}"


def test_filters_dedup_and_sampling():
    both = [FAMOUS, STUDY]
    rated = pgn_positions(both, min_elo=2700)
    assert {p.game for p in rated.positions} == {2} and rated.filtered_games == 7
    assert pgn_positions(both, max_elo=2750).positions == []
    assert pgn_positions(both, min_base_seconds=60).filtered_games == 8, "no game has a TimeControl"
    everything = pgn_positions(both, dedup=False)
    deduped = pgn_positions(both)
    # The three standard games share their start position; the Loyd studies share theirs too.
    assert deduped.duplicates == len(everything.positions) - len(deduped.positions) > 0
    keys = [" ".join(p.fen.split()[:4]) for p in deduped.positions]
    assert len(keys) == len(set(keys))
    sampled = pgn_positions(both, per_game=3, min_ply=1, seed=3, dedup=False)
    assert len(sampled.positions) == 3 * 8 and all(p.ply >= 1 for p in sampled.positions)
    assert sampled == pgn_positions(both, per_game=3, min_ply=1, seed=3, dedup=False)
    assert pgn_positions(both, max_positions=10).positions == deduped.positions[:10]
    assert pgn_positions(both, max_games=1).games == 1


def test_held_out_games_share_no_position_with_training_games():
    both = [FAMOUS, STUDY]
    sample = pgn_positions(both, held_out=0.5, seed=1)
    assert 0 < sample.held_out_games < 8
    held = {p.game for p in sample.held_out}
    trained = {p.game for p in sample.positions}
    assert held and not held & trained
    expected = oracle(FAMOUS) + oracle(STUDY)
    training_keys = {" ".join(f.split()[:4]) for i, g in enumerate(expected) if i in trained for f in fens(g)}
    assert all(" ".join(p.fen.split()[:4]) not in training_keys for p in sample.held_out)
    assert pgn_positions(both, held_out=0.5, seed=1) == sample


def test_bad_arguments_and_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.pgn"):
        read_games(tmp_path / "missing.pgn")
    with pytest.raises(ValueError, match="either paths or text"):
        read_games()
    with pytest.raises(ValueError, match="either paths or text"):
        pgn_positions(FAMOUS, text="1. e4 *")
    with pytest.raises(ValueError, match="held_out"):
        pgn_positions(FAMOUS, held_out=1.0)
    with pytest.raises(ValueError, match="per_game"):
        pgn_positions(FAMOUS, per_game=-1)


def test_the_positions_command_reads_pgn_files(tmp_path):
    import json

    from conftest import cli
    from rookworld.chess.data import position_key

    out = tmp_path / "games.jsonl"
    result = cli("positions", "--pgn", FAMOUS, "--pgn", STUDY, "--annotate", "--stockfish-depth", "2", "--quiet",
                 "--out", out)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    games = oracle(FAMOUS) + oracle(STUDY)
    # Every position is one of the games' (with its real history and next move where the game goes on), none twice.
    played = {}
    for game in games:
        board = game.board()
        for move in game.mainline_moves():
            played.setdefault(position_key(board.fen(en_passant="legal")), move.uci())
            board.push(move)
    assert len({position_key(d["fen"]) for d in lines}) == len(lines) > 100
    for d in lines:
        assert rw_chess.history_problem(d["fen"], d["history"]) is None
        assert len(d["history"]) <= 9
        if position_key(d["fen"]) in played:
            assert d["move"] == played[position_key(d["fen"])]
        assert d["a_target"] == rw_chess.env_steps([d["fen"]], [d["move"]])[0].target
        assert all(m in d["p_target"].split() for m in d["analysis"]["moves"])
    # A malformed game stops the command naming file and line, or is skipped and counted.
    bad = cli("positions", "--pgn", MALFORMED, "--out", tmp_path / "bad.jsonl")
    assert bad.returncode == 2 and f"{MALFORMED}:6: game 2: move 12 \"Nf3\"" in bad.stderr
    assert not (tmp_path / "bad.jsonl").exists()
    skipped = cli("positions", "--pgn", MALFORMED, "--skip-bad", "--count", "5", "--out", tmp_path / "ok.jsonl")
    assert skipped.returncode == 0 and "skipped 1 bad games" in skipped.stderr
    assert len((tmp_path / "ok.jsonl").read_text().splitlines()) == 5
    # --exclude: a held-out file's positions are never written again.
    again = cli("positions", "--pgn", FAMOUS, "--exclude", tmp_path / "ok.jsonl", "--quiet", "--out", tmp_path / "x")
    assert again.returncode == 0
    held = {position_key(json.loads(line)["fen"]) for line in (tmp_path / "ok.jsonl").read_text().splitlines()}
    assert not held & {position_key(json.loads(line)["fen"]) for line in (tmp_path / "x").read_text().splitlines()}
