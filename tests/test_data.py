"""Position files: FEN, EPD and JSONL lines, errors that name file and line, annotation."""

import json

import chess as pychess
import pytest

from rookworld.chess import data
from rookworld.chess.rules import START_FEN
from rookworld.io.quote import ECHO_LIMIT, shortened


def write(tmp_path, text, name="positions.txt"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_reads_fen_epd_and_json_lines(tmp_path):
    path = write(tmp_path, "\n".join([
        "# a comment, then a blank line",
        "",
        START_FEN,
        'r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - bm f1b5; hmvc 2; fmvn 3; id "ruy";',
        json.dumps({"fen": "8/8/8/4k3/8/8/4P3/4K3 w - - 0 1", "history": "e2e4 e6e5", "move": "e2e4",
                    "phase": "endgame"}),
        "  rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1  ",
    ]))
    records, skipped = data.read_records(path)
    assert skipped == 0
    assert [r.fen for r in records] == [
        START_FEN,
        "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
        "8/8/8/4k3/8/8/4P3/4K3 w - - 0 1",
        # Normalised as python-chess prints it: no capture can use e3.
        pychess.Board("rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1").fen(),
    ]
    assert records[2].history == ("e2e4", "e6e5") and records[2].move == "e2e4"
    assert records[0].source == f"{path}:3"


@pytest.mark.parametrize("line, reason", [
    ("not a position", "expected a FEN"),
    ("8/8/8/8/8/8/8/K7 w - - 0 1", "missing king"),
    ("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1 extra", "text after it"),
    ('{"fen": 3}', '"fen" string'),
    ('{"fen": "8/8/8/8/8/8/8/K6k w - - 0 1", "history": [1, 2]}', "history"),
    ("{broken json", "invalid JSON"),
    ('{"fen": "8/8/8/8/8/8/8/K6k w - - 0 1", "history": "e2e4", "move": 5, "note": "d\\u00e9j\\u00e0 \'q\'"}',
     '"move" must be a string'),
    ("PPPPPPPP/8/8/8/8/8/8/K6k w - - 0 1", "back rank"),
    # A 1 MB move filled the model's context at evaluation, said with no file or line (issue 71).
    ('{"fen": "8/8/8/8/8/8/8/K6k w - - 0 1", "move": "' + "e2e4" * 250_000 + '"}', '"move" is 1,000,000 characters'),
    ('{"fen": "8/8/8/8/8/8/8/K6k w - - 0 1", "move": "a1a2a3a4a5a6a7a8a"}', '"move" is 17 characters'),
])
def test_a_bad_line_names_file_and_line(tmp_path, line, reason):
    path = write(tmp_path, f"{START_FEN}\n{line}\n{START_FEN}\n")
    with pytest.raises(data.DataError) as e:
        data.read_records(path)
    assert f"{path}:2:" in str(e.value)
    assert reason in str(e.value)
    # As written, not escaped, and cut to the 80 characters every message quotes.
    assert str(e.value).endswith(f": {shortened(line, ECHO_LIMIT)}"), "the line is quoted as written, not escaped"
    records, skipped = data.read_records(path, skip_bad=True)
    assert (len(records), skipped) == (2, 1)


def test_unreadable_files_are_clear_errors(tmp_path):
    with pytest.raises(data.DataError, match="no such file"):
        data.read_records(tmp_path / "missing.jsonl")
    binary = tmp_path / "binary.fen"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(data.DataError, match="not UTF-8"):
        data.read_records(binary)
    with pytest.raises(data.DataError, match="no positions"):
        data.read_records(write(tmp_path, "# only a comment\n"))


def test_assign_moves_picks_legal_moves_deterministically(tmp_path):
    fens = [START_FEN, "7k/8/8/8/8/8/8/K5R1 w - - 0 1", "7k/5Q2/6K1/8/8/8/8/8 b - - 0 1"]  # last: stalemate
    records = [data.Record(fen=f) for f in fens]
    a, b = data.assign_moves(records, seed=5), data.assign_moves(records, seed=5)
    assert a == b
    for r in a[:2]:
        assert pychess.Move.from_uci(r.move) in pychess.Board(r.fen).legal_moves
    assert a[2].move is None
    kept = data.assign_moves([data.Record(fen=START_FEN, move="e7e5")], seed=1)
    assert kept[0].move == "e7e5", "an existing (even illegal) move is kept"


def test_write_records_is_atomic(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text("old\n")

    def lines():
        yield {"fen": START_FEN}
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        data.write_records(lines(), out)
    assert out.read_text() == "old\n"
    assert list(tmp_path.iterdir()) == [out], "no temporary file left behind"
    assert data.write_records([{"fen": START_FEN}] * 3, out) == 3
    assert len(out.read_text().splitlines()) == 3


def test_the_human_play_sets_are_real_positions_apart_from_each_other_and_from_the_training_data():
    """data/human-*.jsonl (docs/data.md): each position is valid in python-chess, with a legal A: move and
    Stockfish's best move legal; no position is in two of the sets or in the shipped models' training prompts."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "data"
    sets = {name: data.read_records(root / f"human-{name}.jsonl")[0] for name in ("report", "choose", "prompts")}
    assert {n: len(r) for n, r in sets.items()} == {"report": 1000, "choose": 1000, "prompts": 24000}
    keys = {n: {data.position_key(r.fen) for r in rs} for n, rs in sets.items()}
    trained = {data.position_key(r.fen) for r in data.read_records(root / "chess-play-prompts-s5.jsonl")[0]}
    assert all(len(k) == len(sets[n]) for n, k in keys.items())
    for a, b in (("report", "choose"), ("report", "prompts"), ("choose", "prompts")):
        assert not keys[a] & keys[b], (a, b)
    assert not (keys["report"] | keys["choose"] | keys["prompts"]) & trained
    for r in sets["report"] + sets["choose"] + sets["prompts"][::40]:
        board = pychess.Board(r.fen)
        assert board.is_valid() and pychess.Move.from_uci(r.move) in board.legal_moves
        assert r.analysis["depth"] == 6 and r.analysis["moves"][0] in {m.uci() for m in board.legal_moves}
