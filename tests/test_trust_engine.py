"""An engine is trusted no more than a file (issue 45): one that stops answering is given up on in a bounded time,
what it says is checked as a data file's analysis is, and the pool it runs in fits the machine. Each misbehaviour is
injected for real, by a scripted UCI engine (the real Stockfish cannot be made to misbehave on demand), against
the commands that use one: each gives one line and a non-zero exit, writes nothing, and ends in seconds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from rookworld.chess import rules
from rookworld.chess.stockfish import StockfishError, StockfishPool
from rookworld.chess.stockfish.limits import max_workers
from rookworld.lm.games import Choice, Game, StockfishPlayer

from test_trainer import run_cli, train_args

#: A UCI engine that answers the handshake and `isready`, and whose answer to `go` is ANSWER: a Python expression
#: of `fen` and `legal` (its legal moves, sorted) giving the lines to print, or None to print nothing at all.
FAKE = textwrap.dedent(
    """\
    import sys
    from rookworld.chess import rules
    fen = ""
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "uci":
            print(HANDSHAKE, flush=True)
        elif cmd[0] == "isready":
            print("readyok", flush=True)
        elif cmd[0] == "position":
            fen = " ".join(cmd[2:8])
            if "moves" in cmd:
                for move in cmd[cmd.index("moves") + 1:]:
                    fen = rules.env_steps([fen], [move])[0].fen
        elif cmd[0] == "go":
            legal = sorted(rules.legal_moves(fen))
            lines = ANSWER
            if lines is not None:
                print("\\n".join(lines), flush=True)
        elif cmd[0] == "quit":
            break
    """
)

MATE_IN_ONE = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1"  # Ra8# (a1a8)


def fake_engine(tmp_path, answer: str, handshake: str = '"id name Fake\\nuciok"') -> str:
    script = tmp_path / "fake-stockfish"
    script.write_text(f"#!{sys.executable}\n" + FAKE.replace("HANDSHAKE", handshake).replace("ANSWER", answer))
    script.chmod(0o755)
    return str(script)


def scored(score: str, move: str = "legal[0]") -> str:
    """An answer whose one line scores its move `score`."""
    return f'[f"info depth 5 seldepth 5 multipv 1 score {score} nodes 9 pv {{{move}}}", f"bestmove {{{move}}}"]'


SILENT = "None"  # answers the handshake, never `go`
GOOD = scored("cp 12")


def one_line_error(proc) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, proc.stderr
    return errors[0]


# -- an engine that stops answering: given up on, in a bounded time ----------------------------------------------

@pytest.mark.slow
def test_positions_against_an_engine_that_never_answers_go_stops_in_seconds(tmp_path):
    """It took 724 s: four tries of 30 s for each of six positions."""
    out = tmp_path / "out.jsonl"
    started = time.monotonic()
    proc = run_cli(["positions", "--count", "6", "--annotate", "--stockfish-workers", "1", "--quiet",
                    "--stockfish-path", fake_engine(tmp_path, SILENT), "--out", out])
    took = time.monotonic() - started
    line = one_line_error(proc)
    assert "cannot analyse: 3 positions in a row failed" in line
    assert "gave no answer to `go depth 10` within 5 s" in line and "--stockfish-path" in line
    assert took < 30, took
    assert not out.exists()


@pytest.mark.slow
def test_eval_against_an_engine_that_never_answers_go_stops_in_seconds(tiny_dir, tmp_path):
    """It took 488 s."""
    started = time.monotonic()
    proc = run_cli(["eval", "--model", tiny_dir, "--device", "cpu", "--suite", "best-move", "--eval-size", "4",
                    "--max-new-tokens", "8", "--stockfish-path", fake_engine(tmp_path, SILENT)])
    assert "cannot analyse" in one_line_error(proc)
    assert time.monotonic() - started < 40


@pytest.mark.slow
def test_self_play_against_an_engine_that_never_answers_go_stops_in_seconds(tmp_path):
    """Self-play asks about one position at a time: its tries are the bound (it was a traceback after 4 x 30 s)."""
    out = tmp_path / "out.jsonl"
    started = time.monotonic()
    proc = run_cli(["positions", "--selfplay", "--count", "4", "--quiet", "--stockfish-path",
                    fake_engine(tmp_path, SILENT), "--out", out])
    assert "4 times; last: engine pid" in one_line_error(proc)
    assert time.monotonic() - started < 40
    assert not out.exists()


@pytest.mark.slow
def test_train_against_an_engine_that_never_answers_go_stops_in_seconds(tiny_dir, tmp_path):
    """It went on at 242 s a step, its P: prompts left out."""
    out = tmp_path / "run"
    started = time.monotonic()
    proc = run_cli(train_args(tiny_dir, out, "--steps", "3", "--stockfish-path", fake_engine(tmp_path, SILENT)))
    line = one_line_error(proc)
    assert "cannot analyse" in line and "no step was done" in line
    assert time.monotonic() - started < 50
    assert not (out / "checkpoints").exists()


@pytest.mark.slow
def test_train_whose_engine_stops_answering_keeps_its_steps_and_says_how_to_go_on(tiny_dir, tmp_path):
    """The engine answers the first step's positions, then nothing: the step done is saved, the next dropped."""
    out = tmp_path / "run"
    answered = tmp_path / "answered"
    answered.write_text("")
    # Answers `go` 4 times over all its restarts (one step's P: prompts), then never again.
    answer = (f'({GOOD} if __import__("os").path.getsize({str(answered)!r}) < 4 '
              f'and open({str(answered)!r}, "a").write("x") else None)')
    proc = run_cli(train_args(tiny_dir, out, "--steps", "3", "--task-mix", "1.0",
                              "--stockfish-path", fake_engine(tmp_path, answer)))
    line = one_line_error(proc)
    assert "cannot analyse" in line and f"step 1 is saved: continue with rookworld train --resume {out}" in line
    assert (out / "checkpoints" / "step-000001").is_dir()


@pytest.mark.slow
def test_sigterm_while_train_waits_on_an_engine_ends_it_in_seconds(tiny_dir, tmp_path):
    """It took 115 s to exit after SIGTERM."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "rookworld",
                             *train_args(tiny_dir, out, "--steps", "3", "--task-mix", "1.0",
                                         "--stockfish-path", fake_engine(tmp_path, SILENT))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:  # the run starts its loop: the tiny model samples in well under a second
            if line.startswith("prompts:"):
                break
        time.sleep(2)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert time.monotonic() - sent < 8  # the engines' last second, then the step dropped and torch's exit
    assert proc.returncode == 143 and "Traceback" not in stderr, stderr
    assert "cannot analyse" not in stderr  # the stop ended it, not the engine's give-up


@pytest.mark.slow
def test_sigterm_while_positions_waits_on_an_engine_ends_it_in_seconds(tmp_path):
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "rookworld", "positions", "--count", "6", "--annotate",
                             "--stockfish-workers", "1", "--stockfish-path", fake_engine(tmp_path, SILENT),
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(4)  # started, and waiting on its first position
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert time.monotonic() - sent < 5  # not the engine's tries and retries
    assert proc.returncode == 143 and "terminated" in stderr and "Traceback" not in stderr, stderr
    assert not out.exists()


@pytest.mark.slow
def test_sigterm_while_eval_waits_on_an_engine_ends_it_in_seconds(tiny_dir, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "rookworld", "eval", "--model", str(tiny_dir), "--device", "cpu",
                             "--suite", "best-move", "--eval-size", "8", "--max-new-tokens", "8",
                             "--stockfish-path", fake_engine(tmp_path, SILENT)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if line.startswith("best-move:"):
                break
        time.sleep(5)  # the tiny model has answered; the analyses are what it waits on
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert time.monotonic() - sent < 8  # not the engines' tries and retries: it waited about 25 s
    assert proc.returncode == 143 and "terminated" in stderr and "Traceback" not in stderr, stderr


@pytest.mark.slow
def test_an_engine_silent_at_the_handshake_is_given_up_in_seconds(tmp_path):
    started = time.monotonic()
    with pytest.raises(StockfishError, match="gave no `uciok` to `uci` within 10 s"):
        StockfishPool(fake_engine(tmp_path, GOOD, handshake='"id name Fake"'), workers=1)
    assert time.monotonic() - started < 15


def test_closing_a_pool_that_waits_on_a_silent_engine_is_prompt(tmp_path):
    pool = StockfishPool(fake_engine(tmp_path, SILENT), workers=1)
    futures = pool.submit([rules.START_FEN])
    time.sleep(0.5)
    started = time.monotonic()
    pool.close(cancel_pending=True)
    assert time.monotonic() - started < 2
    assert futures[0].done()


@pytest.mark.slow
def test_an_opponent_that_never_answers_is_given_up_in_seconds(tmp_path):
    player = StockfishPlayer(fake_engine(tmp_path, SILENT), retries=0)
    try:
        started = time.monotonic()
        with pytest.raises(StockfishError, match="gave no answer to `go nodes 20000` within 5 s"):
            player.choose([Game(rules.START_FEN)])
        assert time.monotonic() - started < 8
    finally:
        player.close()


# -- what an engine says is checked ------------------------------------------------------------------------------

NONSENSE = {  # what the engine answers `go` with, and what the error then says
    "cp 1e29": (scored("cp 100000000000000000000000000000"), "cp 100000000000000000000000000000, outside -99999..99999"),
    "cp past a mate": (scored("cp -100000"), "outside -99999..99999"),
    "mate -1e20": (scored("mate -100000000000000000000"), "longer than any engine sees"),
    "mate 0": (scored("mate 0"), "mate 0 where there is a legal move"),
    "a mate in 1 that does not mate": (scored("mate 1"), "a mate in 1, which does not mate"),
    "mated in 1 with no mate after": (scored("mate -1"), "mated in 1, though no mate in 1 follows it"),
    "an illegal best line": (scored("cp 12", move="'a1a1'"), "its best line starts with 'a1a1', not a legal move here"),
    "an illegal bestmove": ('[f"info depth 5 multipv 1 score cp 3 pv {legal[0]}", "bestmove a1a1"]',
                            "bestmove 'a1a1' is not a legal move"),
    "depth 0": ('[f"info depth 0 multipv 1 score cp 3 pv {legal[0]}", f"bestmove {legal[0]}"]', "depth 0"),
    "no line": ('["bestmove (none)"]', "no scored line"),
}


@pytest.mark.parametrize(("answer", "said"), NONSENSE.values(), ids=NONSENSE.keys())
def test_positions_never_writes_an_engine_s_nonsense(tmp_path, answer, said):
    """`score cp 1e29` was written as 1e27 pawns, `mate -1e20` as +1e18 and `mate 0` as -1000, exit 0; `train --data`
    then refused line 1 of the file written."""
    out = tmp_path / "out.jsonl"
    proc = run_cli(["positions", "--count", "6", "--annotate", "--quiet", "--stockfish-path",
                    fake_engine(tmp_path, answer), "--out", out])
    line = one_line_error(proc)
    assert "cannot analyse" in line and "with nonsense" in line and said in line, line
    assert not out.exists()


def test_a_position_the_engine_talks_nonsense_about_fails_alone_and_the_others_stand(tmp_path):
    bad = "rnbqkbnr/pppp1ppp/8/4p3/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 2"
    answer = f'({scored("cp 12")} if fen != {bad!r} else {scored("mate 0")})'
    fens = [rules.START_FEN, bad, MATE_IN_ONE.replace("R5K1", "R4K2")]
    with StockfishPool(fake_engine(tmp_path, answer), workers=1) as pool:
        futures = pool.submit(fens)
        with pytest.raises(StockfishError, match="4 times; last: .*mate 0 where there is a legal move"):
            futures[1].result(timeout=30)
        assert futures[0].result().candidates[0].cp == 12 and futures[2].result().candidates
        assert pool.failure is None and pool.cached(bad) is None


def test_true_mates_in_one_and_scores_at_the_ends_of_the_range_are_taken(tmp_path):
    mated_in_one = "7k/8/6K1/8/8/8/8/R7 b - - 0 1"  # Kg8 forced, then Ra8#
    answer = ('["info depth 3 seldepth 3 multipv 1 score mate 1 nodes 9 pv a1a8", '
              '"info depth 3 seldepth 3 multipv 2 score cp -99999 nodes 9 pv a1a2", "bestmove a1a8"] '
              f'if fen == {MATE_IN_ONE!r} else '
              '["info depth 3 seldepth 3 multipv 1 score mate -1 nodes 9 pv h8g8", "bestmove h8g8"]')
    with StockfishPool(fake_engine(tmp_path, answer), workers=1, multipv=2) as pool:
        mates, mated = pool.analyse([MATE_IN_ONE, mated_in_one])
    assert mates.moves == ("a1a8", "a1a2") and mates.evals == (999.99, -999.99)
    assert mated.moves == ("h8g8",) and mated.evals == (-999.99,)


def test_an_opponent_s_illegal_move_is_refused(tmp_path):
    player = StockfishPlayer(fake_engine(tmp_path, scored("cp 1", move="'e2e4'")), retries=1)
    try:
        game = Game(rules.START_FEN)
        assert player.choose([game])[0].move == "e2e4"
        game.play(Choice("e2e4"))
        with pytest.raises(StockfishError, match="bestmove 'e2e4', not a legal move in the game"):
            player.choose([game])
        assert player.restarts == 2
    finally:
        player.close()


# -- a pool that fits the machine ----------------------------------------------------------------------------------

def test_more_engines_than_the_machine_can_run_are_refused_up_front(tmp_path):
    """300 on 2 cores failed after 72 s, blaming "engine pid N gave no answer in time"."""
    cores, most = os.cpu_count(), max_workers()
    started = time.monotonic()
    proc = run_cli(["positions", "--count", "2", "--annotate", "--stockfish-workers", str(most + 1), "--quiet",
                    "--out", tmp_path / "out.jsonl"])
    line = one_line_error(proc)
    assert f"--stockfish-workers {most + 1} is more Stockfish processes than this machine's {cores} cores" in line
    assert f"give at most {most}" in line
    assert time.monotonic() - started < 10
    with StockfishPool(workers=most, depth=1) as pool:  # as many as it allows do start
        assert len(pool.engine_pids()) == most and pool.analyse([rules.START_FEN])[0].candidates
