"""Readers bounded by their own limits, not the input's (issue 58): PGN, position and sample files have a longest
line, a game a most plies, a FEN's move counters a largest value, a number crossing into the Rust core a range; a
history is shared, not copied for every position; quoted input is cut to 80 characters. Each case is injected for
real (files, FIFOs, pipes, gzip and zstd streams, /dev/zero, a memory limit on a real process), and a fuzz test
feeds the PGN and FEN readers through the Python API for a bounded time."""

from __future__ import annotations

import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import chess as pychess
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO, cli, one_line_error
from rookworld import _core
from rookworld.chess import data, rules
from rookworld.io.files import MAX_LINE
from rookworld.chess.pgn import HISTORY_WINDOW, pgn_positions, read_games
from rookworld.harness.rundir import read_rows

FAMOUS = REPO / "tests" / "data" / "famous.pgn"
#: A knight dance: legal move after legal move, and the same four positions for ever.
DANCE = "Nf3 Nf6 Ng1 Ng8 "
#: The most plies a game may have (rust/pgn.rs MAX_PLIES): the 75-move and fivefold rules end every game within
#: 17,697.
MAX_PLIES = 18_000
#: Address space for a process that reads a PGN: Python and the Rust core take under 100 MB of it; the
#: 20,000-ply game of the probe took 5.7 GB, and a 17,998-ply one 18.6 GB, before histories were shared.
MEMORY_LIMIT = 1 << 30


def dance(plies: int) -> str:
    return f'[Event "dance"]\n\n{DANCE * (plies // 4)}*\n\n'


def limited(code: str, *args: str, limit: int = MEMORY_LIMIT) -> subprocess.CompletedProcess:
    """`python -c code args` with at most `limit` bytes of address space, as `ulimit -v` gives."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          preexec_fn=cap, cwd=REPO)


# ---- 1. A game's length: memory linear in it, and a game longer than any game of chess is one bad game ----------


READ_UNDER_A_LIMIT = """
import sys
from rookworld.chess.pgn import pgn_positions
s = pgn_positions(sys.argv[1], dedup=False, skip_bad=True)
print(len(s.positions), s.bad_games, max(len(p.history) for p in s.positions) if s.positions else 0)
"""


def test_the_longest_legal_game_is_read_in_bounded_memory(tmp_path):
    path = tmp_path / "long.pgn"
    path.write_text(dance(MAX_PLIES - 4) + "1. e4 *\n")
    result = limited(READ_UNDER_A_LIMIT, str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(MAX_PLIES - 4 + 1 + 2), "0", str(HISTORY_WINDOW)]


def test_a_game_longer_than_any_game_of_chess_is_one_bad_game(tmp_path):
    path = tmp_path / "probe.pgn"  # the probe's: 20,000 plies in 80 KB
    path.write_text(dance(20_000) + "1. d4 d5 *\n")
    assert path.stat().st_size < 81_000
    result = limited(READ_UNDER_A_LIMIT, str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "1", "2"]
    with pytest.raises(ValueError, match=r"probe.pgn:1: game 1: it has more than 18000 plies, more than any game"):
        read_games(path)
    games, bad, reasons = read_games(path, skip_bad=True)
    assert [g.moves for g in games] == [("d2d4", "d7d5")] and bad == 1
    # From the command line too, gzipped as the probe sent it.
    gz = tmp_path / "probe.pgn.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    one_line_error(cli("positions", "--pgn", gz, "--out", tmp_path / "out.jsonl"), "game 1: it has more than 18000")
    skipped = cli("positions", "--pgn", gz, "--skip-bad", "--out", tmp_path / "out.jsonl")
    assert skipped.returncode == 0 and "skipped 1 bad games" in skipped.stderr, skipped.stderr
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 3  # 1. d4 d5's: the bad game gave none


def test_histories_are_the_window_a_prompt_shows_unless_asked_for_whole():
    text = f"{DANCE * 10} e4 *"
    sample = pgn_positions(text=text, dedup=False)
    whole = pgn_positions(text=text, dedup=False, history_len=None)
    (game,), _, _ = read_games(text=text)
    moves = game.moves
    assert len(sample.positions) == len(whole.positions) == 42
    for cut, full in zip(sample.positions, whole.positions):
        assert full.history == moves[:full.ply]
        assert cut.history == full.history[-HISTORY_WINDOW:] if full.ply else cut.history == ()
        assert rules.history_problem(cut.fen, cut.history) is None
    # Whole histories grow with the square of a game's length: past a bound they are refused, not built.
    with pytest.raises(ValueError, match="the histories asked for hold 20483200 moves in all") as raised:
        pgn_positions(text=dance(6_400), dedup=False, history_len=None)  # 6,401 positions: 1 + 2 + ... + 6,400
    assert "give a smaller history_len" in str(raised.value)


# ---- 2, 3. Lines without an end: one error naming file and line, whatever the source -------------------------


READ_OR_SAY_WHY = """
import sys
from rookworld.chess.pgn import read_games
try:
    read_games(sys.argv[1])
except ValueError as e:
    print(e)
"""


def test_a_pgn_line_without_an_end_is_one_error_naming_file_and_line(tmp_path):
    path = tmp_path / "zeros.pgn.gz"
    with gzip.open(path, "wb", compresslevel=1) as f:  # 256 MiB without a newline, in a 250 KB file
        f.write(b'[Event "x"]\n\n1. e4 *\n\n')
        for _ in range(256):
            f.write(bytes(1 << 20))
    result = limited(READ_OR_SAY_WHY, str(path), limit=512 << 20)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (f"{path}:5: the line goes on past 4 MiB without an end, longer than any PGN "
                                     "game's: not a PGN file?")


@pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd command")
def test_a_zstd_dump_of_gigabytes_without_a_newline_stops_at_the_line_limit(tmp_path):
    path = tmp_path / "zeros.pgn.zst"
    # A GiB of zeros in 36 KB (the probe's 101 KB .zst held 3 GiB); the reader stops at its first 4 MiB.
    subprocess.run(f"head -c {1 << 30} /dev/zero | zstd -q -1 -o {path}", shell=True, check=True, timeout=120)
    with pytest.raises(ValueError, match=r"zeros.pgn.zst:1: the line goes on past 4 MiB"):
        read_games(path)
    one_line_error(cli("positions", "--pgn", path, "--out", tmp_path / "o.jsonl"), f"{path}:1: the line goes on")


def test_a_position_file_line_without_an_end_names_file_and_line(tmp_path):
    path = tmp_path / "positions.jsonl"
    path.write_bytes(b'{"fen": "8/8/8/8/8/8/8/K6k w - - 0 1"}\r\n# a comment\r\n' + b"x" * (MAX_LINE + 1) + b"\n")
    with pytest.raises(data.DataError, match=rf"positions.jsonl: line 3 goes on past {MAX_LINE:,} bytes"):
        data.read_records(path, skip_bad=True)
    path.write_bytes(b"8/8/8/8/8/8/8/K6k w - - 0 1\n" + b"x" * MAX_LINE + b"\n")  # a line of the limit is read
    assert data.read_records(path, skip_bad=True)[1] == 1


def test_positions_from_dev_zero_stops_at_the_line_limit(tmp_path):
    for flag in ("--from", "--pgn"):
        result = cli("positions", flag, "/dev/zero", "--out", tmp_path / "o.jsonl")
        one_line_error(result, f"{flag} /dev/zero: line 1 goes on past {MAX_LINE:,} bytes without an end")
        assert not (tmp_path / "o.jsonl").exists()


# ---- 4. Numbers as wide as Python's: accepted (a limit never reached) or one ValueError -------------------------


@pytest.mark.parametrize("name", ["min_elo", "max_elo", "per_game", "min_base_seconds", "max_games",
                                  "max_positions", "min_ply", "history_len"])
def test_wide_numbers_cross_into_the_rust_core_as_limits(name):
    positions, held, stats = _core.pgn_positions([], "1. e4 e5 *", "t", **{name: 10**20})
    # The game has no Elo or TimeControl header: any bound on them leaves it out.
    kept = {"min_elo": 0, "max_elo": 0, "min_base_seconds": 0, "min_ply": 0}.get(name, 3)
    assert len(positions) == kept, name
    with pytest.raises(ValueError, match=f"{name} must be >= 0"):
        _core.pgn_positions([], "1. e4 *", "t", **{name: -10**20})


def test_wide_numbers_that_cannot_be_limits_are_refused_by_name():
    for call, why in [
        (lambda: _core.pgn_positions([], "1. e4 *", "t", seed=2**64), "seed must be at most 18446744073709551615"),
        (lambda: _core.generate_positions(10**20, 1), "n must be at most 100000000"),
        (lambda: _core.generate_positions(5, 2**70), "seed must be at most"),
        (lambda: _core.generate_positions(5, 1, 2**64 - 2), "start must be at most 18446744073709551610"),
        (lambda: _core.mate_in_one_positions(1, 1, -1), "start must be >= 0"),
        (lambda: _core.perft(rules.START_FEN, 2**40), "depth must be at most 4294967295"),
        (lambda: _core.pgn_games([], "1. e4 *", "t", False, -5), "max_games must be >= 0"),
    ]:
        with pytest.raises(ValueError, match=why):
            call()
    assert len(_core.pgn_games([], "1. e4 *", "t", False, 10**30)[0]) == 1
    assert len(_core.analysis_problems([rules.START_FEN], [["e2e4"]], [[0.3]], 10**30)) == 1


@pytest.mark.parametrize("flag", ["--min-elo", "--per-game", "--min-base-time", "--count"])
def test_wide_pgn_flags_are_one_line(tmp_path, flag):
    result = cli("positions", "--pgn", FAMOUS, flag, str(10**20), "--out", tmp_path / "o.jsonl")
    one_line_error(result, flag)


# ---- 5. FEN move counters a game can carry to its end ---------------------------------------------------------


def test_a_fullmove_number_no_game_reaches_is_refused_wherever_a_fen_enters():
    fen = "7k/8/5K2/8/8/8/8/R7 w - - 0 4294967294"
    why = "fullmove number in FEN is too large (at most 1000000: no game is that long)"
    assert _core.normalize_fens([fen]) == [(False, why)]
    assert _core.legal_moves([fen])[0][2] == why
    assert _core.mating_moves([fen])[0][2] == why
    assert _core.parse_moves([fen], ["a1a2"]) == [(False, why)]
    assert _core.san_moves([fen], ["a1a2"]) == [(False, why)]
    assert _core.is_legal([fen], ["a1a2"]) == [False]
    assert _core.env_steps([fen], ["a1a2"])[0][:2] == (False, why)
    assert why in _core.env_targets([f"A: {fen}+a1a2+a1a2+"])[1][0][1]
    assert _core.history_problems([fen], [["a2a1"]]) == [why]
    assert _core.analysis_problems([fen], [["a1a2"]], [[0.1]]) == [why]
    assert why in _core.score([f"P: {fen} "], ["M: a1a2 E: 0.1 B: a1a2"], [0], [(["a1a2"], [0.1])])[1][0][1]
    with pytest.raises(ValueError, match="fullmove number in FEN is too large"):
        _core.perft(fen, 1)
    with pytest.raises(ValueError, match=r"its FEN header \"7k/.* is no legal position: fullmove number"):
        read_games(text=f'[FEN "{fen}"]\n\n1. Ra2 *')
    # A game from near the largest number a FEN may give plays on past where any game ends.
    board = pychess.Board("7k/8/8/8/8/8/8/K7 w - - 0 990000")
    for mv in ["a1a2", "h8h7", "a2a1", "h7h8"] * 250:
        (ok, after, *_), = _core.env_steps([board.fen()], [mv])
        board.push_uci(mv)
        assert ok and after == board.fen()


# ---- 6. Input quoted back at most 80 characters --------------------------------------------------------------


def test_quoted_input_is_cut_to_80_characters(tmp_path):
    huge_fen = "8/" * 500_000
    with pytest.raises(ValueError) as raised:
        read_games(text=f'[FEN "{huge_fen}"]\n\n*')
    assert len(str(raised.value)) < 300 and '..." is no legal position' in str(raised.value)
    path = tmp_path / "huge.pgn"
    path.write_text(f'[FEN "{huge_fen}"]\n\n*\n')
    # Named from its folder: the line's length is the message's, whatever TMPDIR's is.
    err = one_line_error(cli("positions", "--pgn", path.name, "--out", "o.jsonl", cwd=tmp_path), "its FEN header")
    assert len(err) < 400, len(err)
    problem = rules.history_problem(rules.START_FEN, ["e2e4" * 250_000])
    assert len(problem) < 200 and problem.startswith(f'history move 1 "{("e2e4" * 20)}..."'), problem


# ---- 7. --pgn reads what --from reads; --from says when it was given PGN --------------------------------------


def test_pgn_from_a_fifo_a_pipe_and_a_directory(tmp_path):
    fifo = tmp_path / "games.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(FAMOUS.read_bytes()))
    writer.start()
    from_fifo = cli("positions", "--pgn", fifo, "--count", "5", "--quiet", "--out", tmp_path / "fifo.jsonl")
    writer.join()
    assert from_fifo.returncode == 0, from_fifo.stderr
    # An anonymous pipe named as an open descriptor, as bash's <(gzip -c games.pgn) gives it.
    read_end, write_end = os.pipe()
    payload = gzip.compress(FAMOUS.read_bytes())
    writer = threading.Thread(target=lambda: (os.write(write_end, payload), os.close(write_end)))
    writer.start()
    try:
        from_pipe = cli("positions", "--pgn", f"/dev/fd/{read_end}", "--count", "5", "--quiet",
                        "--out", tmp_path / "pipe.jsonl")
    finally:
        writer.join()
        os.close(read_end)
    assert from_pipe.returncode == 0, from_pipe.stderr
    from_file = cli("positions", "--pgn", FAMOUS, "--count", "5", "--quiet", "--out", tmp_path / "file.jsonl")
    assert (tmp_path / "fifo.jsonl").read_text() == (tmp_path / "pipe.jsonl").read_text() == \
        (tmp_path / "file.jsonl").read_text() != ""
    one_line_error(cli("positions", "--pgn", tmp_path, "--out", tmp_path / "o.jsonl"),
                   f"--pgn {tmp_path} is a directory: give a file in it")
    assert from_file.returncode == 0


def test_pgn_from_process_substitution_and_stdin_in_a_real_shell(tmp_path):
    out = tmp_path / "o.jsonl"
    command = (f"{sys.executable} -m rookworld positions --quiet --count 300 --pgn <(gzip -c {FAMOUS}) "
               f"--pgn /dev/stdin --out {out} < {FAMOUS}")
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    alone = tmp_path / "alone.jsonl"
    assert cli("positions", "--quiet", "--count", "300", "--pgn", FAMOUS, "--out", alone).returncode == 0
    # The same games twice: their positions once, as the file alone gives them.
    assert [json.loads(line)["fen"] for line in out.read_text().splitlines()] == \
        [json.loads(line)["fen"] for line in alone.read_text().splitlines()]


def test_a_pgn_file_given_to_from_says_to_use_pgn(tmp_path):
    for flags in ([], ["--skip-bad"]):
        result = cli("positions", "--from", FAMOUS, *flags, "--out", tmp_path / "o.jsonl")
        one_line_error(result, f'{FAMOUS}:1: [Event "Paris"] is a PGN tag', f"read its games with --pgn {FAMOUS}")


# ---- 8. Fuzz: the PGN and FEN readers give results or a ValueError, never a crash ------------------------------


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

PGN_WORDS = st.sampled_from(['[Event "x"]', '[FEN "8/8/8/8/8/8/8/K6k w - - 0 1"]', '[Variant "Chess960"]',
                             "[FEN", "1.", "1...", "e4", "e5", "Nf3", "O-O", "0-0-0", "exd5", "e8=Q", "Nf9", "--",
                             "{", "}", "(", ")", ";", "%", "$1", "!?", "1-0", "*", "1/2-1/2", "\n", "\n\n", "\r\n",
                             "\x00", "\ufeff", "é", "+-", "e.p.", "99999999999999999999."])


@FUZZ
@given(st.lists(st.one_of(PGN_WORDS, st.text(max_size=12)), max_size=60).map(" ".join))
def test_fuzzed_pgn_text_gives_games_or_a_value_error(text):
    try:
        games, bad, reasons = read_games(text=text, skip_bad=True)
        sample = pgn_positions(text=text, skip_bad=True, per_game=3, held_out=0.3)
    except ValueError as e:
        assert len(str(e).splitlines()) <= 1 and len(str(e)) < 1000
        return
    assert bad == len(reasons) or len(reasons) == 5
    for g in games:
        board = pychess.Board(g.start_fen)
        for m in g.moves:
            board.push_uci(m)  # python-chess as the oracle: every move legal in turn
    assert all(len(p.history) <= HISTORY_WINDOW for p in sample.positions + sample.held_out)


FEN_PARTS = st.sampled_from(["8", "7k", "K7", "rnbqkbnr", "pppppppp", "PPPPPPPP", "RNBQKBNR", "4P3", "/", " ", "w",
                             "b", "KQkq", "-", "e3", "0", "1", "4294967294", "1000001", "99999999999999999999",
                             "[", "_", "~", "+", "\x00", "é", "\t"])


@FUZZ
@given(st.lists(st.one_of(FEN_PARTS, st.text(max_size=6)), max_size=30).map("".join), st.text(max_size=6))
def test_fuzzed_fens_give_results_or_errors_never_a_crash(fen, move):
    (ok, text), = _core.normalize_fens([fen])
    if ok:
        assert pychess.Board(text).is_valid()
        assert text.split()[-1].isdigit() and int(text.split()[-1]) <= 1_000_000
    else:
        assert len(text) < 300, text
    for result in (_core.legal_moves([fen]), _core.env_steps([fen], [move]), _core.parse_moves([fen], [move]),
                   _core.history_problems([fen], [[move]])):
        assert len(result) == 1
    try:
        _core.perft(fen, 1)
    except ValueError as e:
        assert len(str(e)) < 300


def test_a_bad_line_and_a_megabyte_move_in_an_analysis_are_quoted_in_80_characters(tmp_path):
    """A position file's bad line and an analysis' bad move are named, not copied into the message whole."""
    huge = "e2e4" + "x" * 1_000_000
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"fen": rules.START_FEN, "history": [], "move": "e2e4",
                               "analysis": {"moves": [huge], "evals": [0.1]}}) + "\n")
    with pytest.raises(data.DataError) as e:
        data.read_records(bad)
    assert len(str(e.value)) < 600 and "xxx..." in str(e.value), str(e.value)[:700]
    assert rules.analysis_problems([rules.START_FEN], [[huge, huge]], [[0.1, 0.2]])[0].count("x") < 200


def test_a_run_s_metrics_with_a_line_past_any_row_plot_without_holding_it(tmp_path):
    """A metrics.jsonl is read a bounded line at a time: a 10 MB line (a disk error, /dev/zero copied in) is one
    line that is no row, as a line cut short by a crash is."""
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n" + "x" * (MAX_LINE + 10) + "\n"
                    + json.dumps({"step": 2, "loss": 0.5}) + "\n")
    assert read_rows(path) == ([{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}], 1)
    proc = cli("plot", tmp_path, "--out", tmp_path / "p.png")
    assert proc.returncode == 0 and (tmp_path / "p.png").stat().st_size > 0, proc.stderr


def test_an_endless_stream_with_newlines_stops_before_its_copy_fills_the_disk(tmp_path, monkeypatch):
    """`--from /dev/urandom` (or `--exclude`) filled the disk: its bytes hold newlines, so no line is too long
    (issue 71). The copy checks its disk's room as it grows and stops `DISK_RESERVE` short; here the reserve is set
    past what the disk has, so the first check stops it."""
    import tempfile

    from rookworld.io import files

    monkeypatch.setattr(files, "ROOM_CHECK_BYTES", 1 << 20)
    monkeypatch.setattr(files, "DISK_RESERVE", shutil.disk_usage(tmp_path).free + (1 << 30))
    with tempfile.TemporaryFile(dir=tmp_path) as copy:
        with pytest.raises(files.StreamFillsDisk, match="would fill the disk"):
            files.copy_stream("/dev/urandom", copy, wait_s=1)
        assert copy.tell() < 2 << 20  # stopped at its first check, a megabyte in


# -- what stands where a file or a directory was named -------------------------------------------------------------

def _odd(tmp_path, what: str) -> Path:
    """A socket, or a symlink that leads to itself, at a fresh path."""
    import socket

    path = tmp_path / what
    if what == "socket":
        # Bound by its name from inside its folder: an AF_UNIX address holds 108 bytes, which a path under a long
        # TMPDIR can pass.
        here = os.getcwd()
        os.chdir(tmp_path)
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.bind(what)
        finally:
            os.chdir(here)
    else:
        path.symlink_to(path.name)
    return path


@pytest.mark.parametrize("what, said", [("socket", "a socket"), ("loop", "a symlink loop")])
@pytest.mark.parametrize("route", [
    ("eval", "--model", "models/chess-play-sft", "--data", "{}"),
    ("sft", "--data", "{}", "--steps", "1"),
    ("positions", "--from", "{}", "--count", "1", "--out", "/dev/null"),
    ("plot", "{}"),
    ("eval", "--model", "{}"),
    ("train", "--config", "{}"),
    ("train", "--resume", "{}"),
])
def test_a_socket_or_a_symlink_loop_is_named_for_what_it_is_on_every_route(tmp_path, what, said, route):
    """A socket or a symlink loop named as a file or a directory is said to be one, in one line: "no such file"
    (issue 71) sent its reader looking for a file that is there."""
    path = _odd(tmp_path, what)
    err = one_line_error(cli(*(str(path) if a == "{}" else a for a in route), cwd=REPO), said, str(path))
    assert "no such" not in err


# -- readers in linear time (the family: a scan of untrusted text whose time is more than linear in its length) -----

#: Each reader's worst case at the line limit: a quadratic scan of any of them takes hours there (the JSON nesting
#: check's regex took 34 s at 64 KB); linear, each is a fraction of a second. The bound is loose on purpose (a loaded
#: 2-core machine): it tells linear from quadratic, it does not time the reader.
LINEAR_S = 10.0


def _worst_json_lines():
    n = MAX_LINE - 100
    yield "escaped quotes in an unterminated string", '{"fen":"' + '\\"' * (n // 2) + "[" * 65
    yield "the same, ending on a lone backslash", '{"fen":"' + '\\"' * (n // 2) + "[" * 65 + "\\"
    yield "empty strings then brackets", '"' * n + "[" * 65
    yield "brackets alone", "[" * n
    yield "many short strings in lists", '["a",' * (n // 5)


@pytest.mark.parametrize("name, line", list(_worst_json_lines()), ids=[n for n, _ in _worst_json_lines()])
def test_every_json_line_is_judged_in_linear_time_at_the_line_limit(name, line, tmp_path):
    """Every JSON-lines route reads through json_value (positions files, SFT's JSONL, eval's data, TRL's dataset,
    verifiers' info text): its worst line at the 4 MiB limit is a bad line, named, in bounded time."""
    import time

    from rookworld.io.json_line import json_value

    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="invalid JSON"):
        json_value(line)
    assert time.perf_counter() - t0 < LINEAR_S, name
    # And through a route: a positions file holding it is one error naming file and line, as quickly.
    path = tmp_path / "bad.jsonl"
    path.write_text('{"fen": "8/8/8/8/8/8/8/K6k w - - 0 1"}\n' + line + "\n")
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=rf"{path.name}:2"):
        data.read_records(str(path))
    assert time.perf_counter() - t0 < LINEAR_S, name


def test_a_target_s_move_fields_are_found_in_linear_time():
    """SFT's legality loss finds the M: words of every target (a training file's line): a line of "M:" without an
    "E:" was a lazy regex searched from every "M:", quadratic; found once now, the same words as before."""
    import time

    from rookworld.sft.legality import _move_words

    t0 = time.perf_counter()
    assert _move_words("M:" * (MAX_LINE // 2)) == []
    assert _move_words("M:" * (MAX_LINE // 4) + "B: e2e4") == [(MAX_LINE // 2 + 3, "e2e4")]
    assert time.perf_counter() - t0 < LINEAR_S
    text = "M: e2e4 d2d4  E: 0.3 0.2  B: e2e4"
    assert _move_words(text) == [(3, "e2e4"), (8, "d2d4"), (29, "e2e4")]
    assert _move_words("M: e2e4 B: d2d4") == [(11, "d2d4")]  # no E: field: the B: word alone, as before
