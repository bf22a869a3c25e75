"""Bad input (issue 35): FENs that python-chess refuses, histories that do not lead to their position, analyses
that do not check out (from a data file or the Stockfish cache), cache files that cannot be read. Each is refused
with one line saying what is wrong and where, or, for the cache, recomputed or set aside with one warning line."""

from __future__ import annotations

import json
import os
import random
import sqlite3
from pathlib import Path

import chess as pychess
import pytest

from conftest import REPO, cli, one_line_error
from rookworld.chess import data, rules
from rookworld.chess.stockfish import StockfishPool, find_stockfish
from rookworld.chess.stockfish.cache import DiskCache, StockfishCacheError

STOCKFISH = find_stockfish()
MODEL = REPO / "models" / "chess-cpu-sft"
AFTER_E4 = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"
ITALIAN = "r1bqk1nr/pppp1ppp/2n5/2b1p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 4"


def game_positions(games: int, seed: int) -> list[tuple[pychess.Board, pychess.Board, pychess.Move, list[str]]]:
    """`(board before, board after, move, history up to and including it)` at every ply of random python-chess
    games, half of them capture- and promotion-hungry so that promotions and castling show up."""
    rng = random.Random(seed)
    out = []
    for _ in range(games):
        board, history = pychess.Board(), []
        hungry = rng.random() < 0.5
        for _ in range(rng.randrange(2, 160)):
            moves = list(board.legal_moves)
            if not moves or board.is_insufficient_material():
                break
            eager = [m for m in moves if board.is_capture(m) or m.promotion or board.is_castling(m)]
            move = rng.choice(eager if eager and hungry and rng.random() < 0.7 else moves)
            before = board.copy()
            board.push(move)
            history.append(move.uci())
            out.append((before, board.copy(), move, list(history)))
    return out


# ---- 1. FENs: the board field as python-chess reads it ----------------------------------------------------


@pytest.mark.parametrize("fen, why", [
    ("4k3/8/8/8/8/8/8/4K3/Q w - - 0 1", "9 ranks, a FEN has 8"),
    ("4k3/8/8/8/8/8/4K3 w - - 0 1", "7 ranks, a FEN has 8"),
    ("4k3/8/8/8/8/8/44/4K3 w - - 0 1", "rank 2 ('44'): two digits in a row"),
    ("4k3/8/8/8/8/8/8/4K12 w - - 0 1", "rank 1 ('4K12'): two digits in a row"),
    ("4k3/8/8/8/8/p7p/8/4K3 w - - 0 1", "rank 3 ('p7p') has 9 squares, a rank has 8"),
    ("4k3/8/8/8/8/8/8/4K2 w - - 0 1", "rank 1 ('4K2') has 7 squares, a rank has 8"),
])
def test_a_board_field_python_chess_refuses_is_refused_naming_the_rank(fen, why):
    with pytest.raises(ValueError):
        pychess.Board(fen)
    assert rules.fen_problem(fen) == f"invalid board part in FEN: {why}"
    assert rules.normalize_fens([fen]) == [None]
    with pytest.raises(ValueError, match="invalid board part"):
        rules.legal_moves(fen)


def test_every_board_field_python_chess_refuses_is_refused():
    """Mutated board fields of real positions: whatever python-chess cannot read, rookworld refuses too (it may
    refuse more: python-chess reads positions without kings, which are no position to play)."""
    rng = random.Random(35)
    boards = [after for _, after, _, _ in game_positions(30, seed=5)]
    refused = 0
    for board in rng.sample(boards, 400):
        ranks = board.board_fen().split("/")
        i = rng.randrange(8)
        mutation = rng.randrange(5)
        if mutation == 0:
            ranks.append(rng.choice(["Q", "8", "p7"]))  # a 9th rank
        elif mutation == 1:
            del ranks[i]
        elif mutation == 2:  # a digit split in two: the same squares, two digits in a row
            ranks[i] = "".join(f"{int(c) - 1}1" if c.isdigit() and c != "1" else c for c in ranks[i])
        elif mutation == 3:
            ranks[i] += rng.choice(["1", "p", "44"])
        else:
            ranks[i] = ranks[i][1:]
        fen = "/".join(ranks) + " " + " ".join(board.fen().split()[1:])
        try:
            pychess.Board(fen)
        except ValueError:
            refused += 1
            assert rules.fen_problem(fen) is not None, fen
    assert refused > 300


def test_a_bad_board_in_a_data_file_names_file_line_and_rank_and_skip_bad_skips_it(tmp_path):
    path = tmp_path / "positions.txt"
    path.write_text(f"{rules.START_FEN}\n4k3/8/8/8/8/8/8/4K3/Q w - - 0 1\n4k3/8/8/8/8/8/44/4K3 w - - 0 1\n")
    with pytest.raises(data.DataError) as e:
        data.read_records(path)
    assert str(e.value).startswith(f"{path}:2: not a legal position (invalid board part in FEN: 9 ranks")
    records, skipped = data.read_records(path, skip_bad=True)
    assert [r.fen for r in records] == [rules.START_FEN] and skipped == 2


def test_a_bad_board_is_one_line_from_ask_play_and_positions(tmp_path):
    fen = "4k3/8/8/8/8/8/8/4K3/Q w - - 0 1"
    one_line_error(cli("ask", "--model", MODEL, fen), "9 ranks, a FEN has 8")
    one_line_error(cli("play", "--model", MODEL, "--fen", fen, input="quit\n"), "9 ranks, a FEN has 8")
    src = tmp_path / "in.txt"
    src.write_text("4k3/8/8/8/8/8/44/4K3 w - - 0 1\n")
    one_line_error(cli("positions", "--from", src, "--out", tmp_path / "out.jsonl"),
                   f"{src}:1", "rank 2 ('44'): two digits in a row")
    assert not (tmp_path / "out.jsonl").exists()


# ---- 2. histories: the last move must lead to the position ------------------------------------------------


def test_every_real_history_passes_and_a_wrong_last_move_is_caught():
    """python-chess games as the oracle: the true history passes at every ply; with its last move swapped for
    another legal move of the same position, it is refused, except after castling, where the rook's or king's
    one-square move ends on a square the castling also filled (that takes the start position to see)."""
    tried = 0
    for before, after, move, history in game_positions(40, seed=11):
        assert rules.history_problem(after.fen(), history) is None, (after.fen(), history)
        if before.is_castling(move):
            continue
        for other in before.legal_moves:
            if other != move:
                tried += 1
                problem = rules.history_problem(after.fen(), [*history[:-1], other.uci()])
                assert problem is not None and problem.startswith(f'the last history move "{other.uci()}"'), \
                    (after.fen(), history, other)
    assert tried > 10_000


def _could_have_been_played(after: pychess.Board, move: pychess.Move) -> bool:
    """python-chess's verdict on `move` as the last move into `after` (castling aside): with the piece that stands
    on its destination put back on its departure (a pawn, for a promotion) and the side that moved to move, is it
    pseudo-legal? A pawn's diagonal step is given something to capture there."""
    before = after.copy(stack=False)
    mover = not after.turn
    piece = before.remove_piece_at(move.to_square)
    if piece is None or piece.color != mover or before.piece_at(move.from_square) is not None:
        return False
    if move.promotion and piece.piece_type != move.promotion:
        return False
    role = pychess.PAWN if move.promotion else piece.piece_type
    if role == pychess.PAWN and pychess.square_rank(move.from_square) in (0, 7):
        return False  # no pawn stands on a first or last rank (python-chess would push one from there)
    before.set_piece_at(move.from_square, pychess.Piece(role, mover))
    if role == pychess.PAWN and pychess.square_file(move.from_square) != pychess.square_file(move.to_square):
        before.set_piece_at(move.to_square, pychess.Piece(pychess.KNIGHT, not mover))
    before.turn, before.castling_rights, before.ep_square = mover, pychess.BB_EMPTY, None
    return before.is_pseudo_legal(move)


def test_the_last_move_is_refused_exactly_when_no_piece_could_have_made_it_python_chess_says():
    """Every from-to pair onto a square the side that moved holds, from an empty square, at every ply of random
    games: the check agrees with python-chess's pseudo-legality on the position before it (castling, which needs
    the rook's move too, is left to the castling test)."""
    cases = []
    for _, after, _, history in game_positions(4, seed=5):
        mover, fen = not after.turn, after.fen()
        for to in pychess.SquareSet(after.occupied_co[mover]):
            for frm in pychess.SQUARES:
                if frm == to or after.piece_at(frm) is not None:
                    continue
                if after.piece_type_at(to) == pychess.KING and abs(frm - to) == 2:
                    continue  # castling
                cases.append((after, fen, [*history[:-1], pychess.Move(frm, to).uci()]))
    problems = rules.history_problems([fen for _, fen, _ in cases], [h for _, _, h in cases])
    agreed = refused = 0
    for (after, _, history), problem in zip(cases, problems):
        move = pychess.Move.from_uci(history[-1])
        if problem is not None and problem.startswith("history move"):  # no piece could ever make it
            assert not _could_have_been_played(after, move), (after.fen(), move)
            continue
        assert (problem is None) == _could_have_been_played(after, move), (after.fen(), move.uci(), problem)
        agreed += 1
        refused += problem is not None
    assert agreed > 20_000 and 0.2 < refused / agreed < 0.95, (agreed, refused)


@pytest.mark.parametrize("history, why", [
    (["e2e4", "Nf3"], 'history move 2 "Nf3" is not a UCI move'),
    (["e2e4", "e7e5", "e2e4 "], 'history move 3 "e2e4 " is not a UCI move'),
    (["e1e9"], 'history move 1 "e1e9" is not a UCI move'),
    (["a1c4", "e2e4"], 'history move 1 "a1c4" is no move any piece can make'),
    (["e2e4q"], 'history move 1 "e2e4q" promotes without a pawn reaching the last rank'),
    (["e7e5"], 'the last history move "e7e5" does not lead to this position: e7 holds a black pawn'),
    (["d2d4"], 'the last history move "d2d4" does not lead to this position: d2 holds a white pawn'),
    (["e2e3"], 'the last history move "e2e3" does not lead to this position: e3 holds no white piece (Black is '
               'to move, so white moved last)'),
])
def test_a_history_that_cannot_lead_to_the_position_is_refused_saying_why(history, why):
    assert rules.history_problem(AFTER_E4, history).startswith(why)


def test_castling_and_promotion_as_the_last_move():
    castled = pychess.Board(ITALIAN)
    castled.push_uci("e1g1")
    assert rules.history_problem(castled.fen(), ["e1g1"]) is None
    assert rules.history_problem(castled.fen(), ["e1h1"]) is None  # king takes rook, as python-chess reads it
    promoted = pychess.Board("8/4P1k1/8/8/8/8/8/4K3 w - - 0 1")
    promoted.push_uci("e7e8n")
    assert rules.history_problem(promoted.fen(), ["e7e8n"]) is None
    assert "e8 holds no white queen" in rules.history_problem(promoted.fen(), ["e7e8q"])


def test_a_bad_history_in_a_data_file_names_file_and_line_and_skip_bad_skips_it(tmp_path):
    path = tmp_path / "positions.jsonl"
    path.write_text("\n".join([
        json.dumps({"fen": AFTER_E4, "history": ["e2e4"], "move": "e7e5"}),
        json.dumps({"fen": AFTER_E4, "history": ["e2e4", "e7e5"]}),
        "not a position",
        json.dumps({"fen": AFTER_E4, "history": "d2d4"}),
    ]) + "\n")
    with pytest.raises(data.DataError) as e:
        data.read_records(path, skip_bad=False)
    message = str(e.value)
    # The parse error on line 3 comes first in the file's first pass; the history's own error after it.
    assert message.startswith(f"{path}:3:")
    path.write_text(path.read_text().replace("not a position\n", ""))
    with pytest.raises(data.DataError) as e:
        data.read_records(path)
    assert str(e.value).startswith(f'{path}:2: bad history: the last history move "e7e5" does not lead to this '
                                   f'position: e7 holds a black pawn')
    records, skipped = data.read_records(path, skip_bad=True)
    assert [r.history for r in records] == [("e2e4",)] and skipped == 2


def test_ask_with_a_history_that_does_not_lead_to_the_position_is_one_line():
    one_line_error(cli("ask", "--model", MODEL, AFTER_E4, "e7e5", "--history", "g1f3"),
                   '--history: the last history move "g1f3" does not lead to this position: g1 holds a white knight')
    one_line_error(cli("ask", "--model", MODEL, AFTER_E4, "e7e5", "--history", "e2e4,Nf3"),
                   'history move 2 "Nf3" is not a UCI move')


# ---- 3. analyses: from a data file and from the cache -----------------------------------------------------


def analysis_line(moves, evals, fen=ITALIAN, **extra) -> str:
    return json.dumps({"fen": fen, "analysis": {"depth": 8, "moves": moves, "evals": evals, **extra}})


@pytest.mark.parametrize("line, why", [
    (analysis_line(["e1g1", "e7e5"], [0.3, 999.99]), 'bad analysis: move 2 "e7e5" is not a legal move (UCI) here'),
    (analysis_line(["e1h1"], [0.3]), 'bad analysis: move 1 "e1h1" is not a legal move (UCI) here'),
    (analysis_line(["e1g1", "d2d3", "e1g1"], [0.3, 0.2, 0.3]), 'bad analysis: move "e1g1" is listed twice'),
    (analysis_line(["e1g1", "d2d3"], [0.3]), "bad analysis: 2 moves but 1 evals; one eval a move"),
    (analysis_line(["e1g1"], [1500]), "bad analysis: eval 1 (1500) is outside -999.99..999.99 pawns"),
    (analysis_line(["e1g1"], [10**400]), "bad analysis: eval 1 (inf) is not a finite number"),
    (analysis_line(["e1g1"], [0.3]).replace("0.3", "NaN"), "bad analysis: eval 1 (NaN) is not a finite number"),
    (analysis_line(["e1g1"], [0.3]).replace("0.3", "-Infinity"), "bad analysis: eval 1 (-inf) is not a finite"),
    (analysis_line([], []), "bad analysis: no moves, though the position has legal moves"),
    (analysis_line(["e1g1"], [0.3], depth=-1), '"analysis" "depth" must be a whole number >= 0, got -1'),
    (analysis_line(["e1g1"], ["0.3"]), '"analysis" must hold a "moves" list of UCI strings and an "evals" list'),
])
def test_a_bad_analysis_in_a_data_file_names_file_and_line_and_skip_bad_skips_it(tmp_path, line, why):
    path = tmp_path / "annotated.jsonl"
    good = analysis_line(["e1g1", "d2d3"], [0.31, 0.25])
    path.write_text(f"{good}\n{line}\n")
    with pytest.raises(data.DataError) as e:
        data.read_records(path)
    assert str(e.value).startswith(f"{path}:2: {why}"), str(e.value)
    records, skipped = data.read_records(path, skip_bad=True)
    assert len(records) == 1 and records[0].truth == (["e1g1", "d2d3"], [0.31, 0.25]) and skipped == 1


def test_analyses_stockfish_wrote_read_back(tmp_path):
    """What `positions --annotate` writes (real Stockfish, mates included) passes the checks it is read with."""
    src = tmp_path / "in.txt"
    src.write_text("\n".join([rules.START_FEN, ITALIAN, "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1"]) + "\n")
    out = tmp_path / "out.jsonl"
    result = cli("positions", "--from", src, "--annotate", "--stockfish-depth", "6", "--quiet", "--out", out)
    assert result.returncode == 0, result.stderr
    records, skipped = data.read_records(out)
    assert len(records) == 3 and skipped == 0
    assert max(e for r in records for e in r.truth[1]) == 999.99  # the mate in one, at the edge of the range


def cache_rows(path) -> dict[str, dict]:
    with sqlite3.connect(path) as db:
        return {fen: json.loads(result) for fen, result in db.execute("SELECT fen, result FROM analyses")}


def test_cached_analyses_that_do_not_check_out_are_recomputed_and_overwritten_with_one_warning(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text(f"{rules.START_FEN}\n{ITALIAN}\n{AFTER_E4}\n")
    db = tmp_path / "cache.sqlite"
    args = ["positions", "--from", src, "--annotate", "--stockfish-depth", "5", "--stockfish-cache", db, "--quiet"]
    first = cli(*args, "--out", tmp_path / "first.jsonl")
    assert first.returncode == 0 and "warning" not in first.stderr, first.stderr
    truth = cache_rows(db)
    # What a stale or damaged cache could hold: an illegal move as a mate in one (it became a P: target), a
    # repeated move, a score too big for the format.
    start, italian, after_e4 = rules.START_FEN, ITALIAN, AFTER_E4
    bad = {start: {**truth[start], "candidates": [{"move": "e7e5", "cp": None, "mate": 1}]},
           italian: {**truth[italian], "candidates": [truth[italian]["candidates"][0]] * 2},
           after_e4: {**truth[after_e4], "candidates": [{"move": "e7e5", "cp": 10**12, "mate": None}]}}
    with sqlite3.connect(db) as con:
        for fen, result in bad.items():
            con.execute("UPDATE analyses SET result = ? WHERE fen = ?", (json.dumps(result), fen))

    second = cli(*args, "--out", tmp_path / "second.jsonl")
    assert second.returncode == 0, second.stderr
    warnings = [line for line in second.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and f"Stockfish cache {db} holds analyses that do not check out" in warnings[0]
    assert cache_rows(db) == truth  # recomputed (depth 5 is deterministic with one thread) and overwritten
    lines = [json.loads(line) for line in (tmp_path / "second.jsonl").read_text().splitlines()]
    for line in lines:
        board = pychess.Board(line["fen"])
        assert all(pychess.Move.from_uci(m) in board.legal_moves for m in line["analysis"]["moves"])
    assert (tmp_path / "second.jsonl").read_text() == (tmp_path / "first.jsonl").read_text()


def test_a_cached_row_of_another_position_or_malformed_is_a_miss(tmp_path):
    path = tmp_path / "cache.sqlite"
    with StockfishPool(STOCKFISH, workers=1, depth=4, cache_path=path) as pool:
        real = pool.analyse_one(AFTER_E4)
    cache = DiskCache(path)
    key = (AFTER_E4, 4, None, 5)
    assert cache.get_many([key]) == {key: real}
    for result in [{**real.to_dict(), "fen": rules.START_FEN},
                   {**real.to_dict(), "candidates": [{"move": "e7e5", "cp": 20, "mate": 3}]},
                   {**real.to_dict(), "candidates": [{"move": "e7e5", "cp": None, "mate": 0}]},
                   {**real.to_dict(), "depth": "deep"},
                   [1, 2, 3]]:
        with sqlite3.connect(path) as con:
            con.execute("UPDATE analyses SET result = ?", (json.dumps(result),))
        assert cache.get_many([key]) == {}, result
    cache.close()


# ---- 4. cache files that cannot be read, and paths where none can be made ---------------------------------


def real_cache(path: Path, fens: list[str]) -> None:
    with StockfishPool(STOCKFISH, workers=1, depth=3, cache_path=path) as pool:
        pool.analyse(fens)


def not_sqlite(path: Path) -> str:
    path.write_text("fen,eval\nthis is a CSV file, not sqlite\n" * 50)
    return "file is not a database"


def other_tables(path: Path) -> str:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE runs (id INTEGER, name TEXT)")
        db.execute("INSERT INTO runs VALUES (1, 'mine')")
    db.close()
    return "it holds other tables (runs), not analyses"


def other_columns(path: Path) -> str:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE analyses (fen TEXT, eval REAL)")
    db.close()
    return "its analyses table has the columns fen, eval"


def truncated(path: Path) -> str:
    fens = [after.fen() for _, after, _, _ in game_positions(6, seed=3)][:150]
    real_cache(path, fens)
    size = path.stat().st_size
    assert size > 8 * 4096 and not Path(f"{path}-wal").exists()
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    return "malformed"


@pytest.mark.parametrize("spoil", [not_sqlite, other_tables, other_columns, truncated])
def test_a_cache_file_that_cannot_be_read_is_set_aside_with_one_warning_and_a_fresh_one_used(tmp_path, spoil):
    db = tmp_path / "cache.sqlite"
    why = spoil(db)
    spoiled = db.read_bytes()
    src = tmp_path / "in.txt"
    src.write_text(f"{rules.START_FEN}\n{ITALIAN}\n")
    out = tmp_path / "out.jsonl"
    result = cli("positions", "--from", src, "--annotate", "--stockfish-depth", "4", "--stockfish-cache", db,
                 "--quiet", "--out", out)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    (warning,) = result.stderr.strip().splitlines()
    (aside,) = tmp_path.glob("cache.sqlite.corrupt-*")
    assert warning.startswith(f"warning: Stockfish cache {db} cannot be used as one (") and why in warning
    assert warning.endswith(f"moved it to {aside} and started a fresh cache")
    assert aside.read_bytes() == spoiled  # nothing of what was there is lost
    assert len(out.read_text().splitlines()) == 2
    assert set(cache_rows(db)) == {rules.START_FEN, ITALIAN}  # the fresh cache keeps this run's analyses


def test_a_cache_whose_directory_cannot_be_made_is_one_line_before_any_work(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a regular file where the cache's directory should be\n")
    src = tmp_path / "in.txt"
    src.write_text(f"{rules.START_FEN}\n")
    out = tmp_path / "out.jsonl"
    for path in [blocker / "cache.sqlite", blocker / "deeper" / "cache.sqlite"]:
        result = cli("positions", "--from", src, "--annotate", "--stockfish-cache", path, "--out", out)
        one_line_error(result, f"Stockfish cache {path} cannot be made: {blocker} is a file, not a directory")
        assert not out.exists()
        with pytest.raises(StockfishCacheError, match="is a file, not a directory"):
            DiskCache(path)
    one_line_error(cli("positions", "--from", src, "--annotate", "--stockfish-cache", tmp_path, "--out", out),
                   f"Stockfish cache {tmp_path} is a directory; give a file name")
    # Training said so only when it first analysed (sft: at its first evaluation); now with the other settings.
    for command in ("train", "sft"):
        one_line_error(cli(command, "--stockfish-cache", blocker / "cache.sqlite", "--output-dir", tmp_path / "run"),
                       f"{command}: error: Stockfish cache {blocker / 'cache.sqlite'} cannot be made")
    assert blocker.read_text().startswith("a regular file")
    assert set(os.listdir(tmp_path)) == {"not-a-dir", "in.txt"}


# -- what reaches a terminal (the family: input quoted back raw, or whole) ------------------------------------------

ESCAPES = "\x1b]0;pwned\x07\x1b[2J"


def test_control_characters_of_a_name_or_a_line_reach_no_terminal(tmp_path):
    """An ESC or a BEL in a file name or a data line would set the terminal's title or clear it: every message a
    command writes has them escaped (one rule, at the output), on each route tried."""
    line = tmp_path / "line.jsonl"
    line.write_text('{"fen": "8/8/8/8/8/8/8/K6k w - - 0 1' + ESCAPES + '"}\n')
    missing = tmp_path / f"x{ESCAPES}y.jsonl"
    for args in (["positions", "--from", str(line), "--out", str(tmp_path / "o.jsonl")],
                 ["positions", "--from", str(missing), "--out", str(tmp_path / "o.jsonl")],
                 ["eval", "--data", str(missing)],
                 ["train", "--data", str(missing), "--steps", "1", "--output-dir", str(tmp_path / "run")],
                 ["positions", f"--cuont{ESCAPES}", "3", "--out", str(tmp_path / "o.jsonl")]):
        err = cli(*args).stderr
        assert "\x1b" not in err and "\x07" not in err, (args, err)
        assert "\\x1b" in err, (args, err)


def test_names_too_long_for_the_file_system_are_one_short_line(tmp_path):
    """A name one part of which is over 255 bytes, a 100,000-character path, a 100,000-character engine cache: one
    line, cut, naming the length, under each command that writes or reads it; no traceback quoting 100 KB."""
    long_part = tmp_path / ("a" * 304 + ".jsonl")
    deep = str(tmp_path) + "/a" * 50_000 + ".jsonl"
    for args in (["positions", "--count", "3", "--out", str(long_part)],
                 ["positions", "--count", "3", "--out", deep],
                 ["train", "--stockfish-cache", str(tmp_path / ("b" * 100_000)), "--steps", "1",
                  "--output-dir", str(tmp_path / "run")],
                 ["positions", "--from", str(tmp_path / ("c" * 100_000)), "--out", str(tmp_path / "o.jsonl")]):
        err = one_line_error(cli(*args))
        assert len(err) < 4_500, (args[:2], len(err))


def test_a_count_past_its_layer_s_bound_is_refused_with_the_settings(tmp_path):
    """prompts_per_step = 1000000000 passed the settings and died in the Rust generator mid-run: it is refused by
    its name with the settings, from a TOML file and from a flag alike."""
    config = tmp_path / "big.toml"
    config.write_text("[train]\nprompts_per_step = 1000000000\n")
    one_line_error(cli("train", "--config", str(config), "--output-dir", str(tmp_path / "run")),
                   "--prompts-per-step must be at most 1,000,000")
    one_line_error(cli("train", "--group-size", "100000", "--output-dir", str(tmp_path / "run")),
                   "--group-size must be at most 4,096")
