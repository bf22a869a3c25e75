"""Trust nothing that is read (issue 45): torchrun's environment, a rank that never comes or goes away, a UCI
session that quits mid-search or sends a megabyte, data lines nested deep anywhere or behind a byte-order mark.
Each case gives the right result, or one line saying what is wrong and what to type next, with a non-zero exit,
in a bounded time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rookworld.chess import rules
from conftest import REPO, TORCHRUN_BOUND_S, cli, free_port, transformers_gpt2
from test_bad_input import one_line_error
from test_trainer import train_args

START = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
LONE_KINGS = "4k3/8/8/8/8/8/8/4K3 w - - 0 1"
BOM = "\ufeff"
DEEP = 5_000  # past the JSON parser's recursion limit


def process(args, *, env=None, **kwargs) -> subprocess.Popen:
    """A real `python -m rookworld ARGS`, its output read by the caller."""
    return subprocess.Popen([sys.executable, "-m", "rookworld", *map(str, args)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, **(env or {})}, **kwargs)


# -- 10. a data line nested deep, anywhere --------------------------------------------------------------------------

def nested(depth: int = DEEP) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("line", [
    '{"fen": ' + nested() + "}",
    f'{{"fen": "{LONE_KINGS}", "history": {nested()}}}',
    f'{{"fen": "{LONE_KINGS}", "analysis": {{"moves": {nested()}, "evals": [0.1]}}}}',
    f'{{"fen": "{LONE_KINGS}", "phase": ' + '{"a": ' * DEEP + "1" + "}" * DEEP + "}",
    f'{{"fen": "{LONE_KINGS}", "move": 1{"0" * 5000}}}',  # a number Python will not convert
], ids=["fen", "history", "analysis", "phase", "long-number"])
def test_a_data_line_nested_deep_anywhere_is_a_bad_line_in_every_reader(tiny_dir, tmp_path, line):
    data = tmp_path / "nested.jsonl"
    data.write_text(f'{{"fen": "{START}"}}\n{line}\n')
    out = tmp_path / "out.jsonl"
    for args in (["positions", "--from", data, "--out", out],
                 ["positions", "--count", "2", "--exclude", data, "--out", out],
                 ["eval", "--model", tiny_dir, "--data", data, "--tasks", "A"]):
        err = one_line_error(cli(*args), f"{data}:2: ")
        assert len(err) < 600, err  # the line is quoted short, not 10,000 brackets
    skipped = cli("positions", "--from", data, "--out", out, "--skip-bad")
    assert skipped.returncode == 0 and f"skipped 1 bad lines of {data}" in skipped.stderr, skipped.stderr
    assert [json.loads(x)["fen"] for x in out.read_text().splitlines()] == [START]


def test_a_phase_that_is_no_string_is_a_bad_line_and_unread_analysis_keys_are_not_written_back(tmp_path):
    """A value the parser takes (20 deep, within MAX_JSON_DEPTH) that no reader checks would be written again by `positions --from`."""
    analysis = {"depth": 3, "moves": ["e2e4"], "evals": [0.3], "extra": json.loads(nested(20))}
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"fen": START, "phase": json.loads(nested(20))}) + "\n"
                    + json.dumps({"fen": START, "analysis": analysis}) + "\n")
    one_line_error(cli("positions", "--from", data, "--out", tmp_path / "o.jsonl"),
                   f"{data}:1: ", '"phase" must be a string, got a list')
    out = tmp_path / "o.jsonl"
    assert cli("positions", "--from", data, "--out", out, "--skip-bad").returncode == 0
    [written] = [json.loads(x) for x in out.read_text().splitlines()]
    assert written["analysis"] == {"depth": 3, "moves": ["e2e4"], "evals": [0.3]}


def test_an_sft_line_nested_deep_is_a_bad_line(tmp_path):
    data = tmp_path / "s.jsonl"
    data.write_text('{"p_prompt": ' + nested() + "}\n")
    one_line_error(cli("sft", "--init", "tiny", "--data", data, "--output-dir", tmp_path / "run", "--device", "cpu"),
                   f"{data}:1: ", "nested too deeply")


# -- 12. a byte-order mark --------------------------------------------------------------------------------------------

P_LINE = ("P: 2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34                                    "
          "M: a4a3 c8f5 h7f6 h7g5 h7f8      E: -3.06 -2.82 -3.21 -3.16 -2.3            B: h7f6")


@pytest.mark.parametrize("first", [START, json.dumps({"fen": START}), "4k3/8/8/8/8/8/8/4K3 w - - bm Ke2;"],
                         ids=["fen", "json", "epd"])
def test_a_byte_order_mark_is_read_past_in_position_files(tmp_path, first):
    """Windows editors start a UTF-8 file with one; `cat` of two such files puts one at the start of a line."""
    data = tmp_path / "bom.txt"
    data.write_text(BOM + first + "\r\n" + BOM + LONE_KINGS + "\r\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    for skip in ([], ["--skip-bad"]):
        proc = cli("positions", "--from", data, "--out", out, *skip)
        assert proc.returncode == 0 and "skipped" not in proc.stderr, proc.stderr
        assert len(out.read_text().splitlines()) == 2, "no record dropped"


def test_a_byte_order_mark_is_read_past_in_sft_files(tmp_path):
    data = tmp_path / "bom.txt"
    data.write_text(BOM + P_LINE + "\n", encoding="utf-8")
    proc = cli("sft", "--init", "tiny", "--n-embd", "32", "--data", data, "--output-dir", tmp_path / "run", "--steps",
               "1", "--seq-len", "256", "--rows-per-step", "1", "--eval-every", "0", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr


def test_utf16_says_so(tmp_path):
    data = tmp_path / "utf16.txt"
    data.write_text(START + "\n", encoding="utf-16")
    one_line_error(cli("positions", "--from", data, "--out", tmp_path / "o.jsonl"),
                   f"{data}: not UTF-8 text (UTF-16", "save it as UTF-8")


# -- 13. UCI: quit or the end of the input mid-search; a megabyte echoed ------------------------------------------

#: Tokens a search writes with the long-context model: tens of seconds of decoding on a CPU, seconds on the fastest.
LONG_GENERATION = 8000


@pytest.fixture(scope="module")
def long_context_dir(tmp_path_factory):
    """A tiny random GPT-2 with an 8,192-token context: a search that writes thousands of tokens, each step cheap, so
    a generation is long and a stop between two steps quick."""
    return transformers_gpt2(tmp_path_factory.mktemp("long_context"), n_positions=8192)


def uci_args(model, tokens: int = LONG_GENERATION) -> list:
    return ["uci", "--model", model, "--device", "cpu", "--max-new-tokens", str(tokens)]


def ready_engine(model) -> subprocess.Popen:
    """`rookworld uci` as a process on one thread, its model loaded: `readyok` read."""
    engine = process(uci_args(model), env={"OMP_NUM_THREADS": "1"}, bufsize=1)
    engine.stdin.write("uci\nisready\n")
    engine.stdin.flush()
    for line in engine.stdout:
        if line.startswith("readyok"):
            break
    return engine


@pytest.mark.slow
def test_quit_mid_search_ends_the_engine_at_once(long_context_dir):
    engine = ready_engine(long_context_dir)
    try:
        engine.stdin.write("position startpos\ngo\n")
        engine.stdin.flush()
        time.sleep(0.2)  # the search is under way
        quit_at = time.monotonic()
        engine.stdin.write("quit\n")
        engine.stdin.flush()
        out, err = engine.communicate(timeout=60)
        took = time.monotonic() - quit_at
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
    assert engine.returncode == 0 and err == "", err  # no abort of a thread killed mid-computation
    # Cut, it still answers, as Stockfish does: the first legal move, said not to be the model's.
    lines = out.splitlines()
    assert lines[-1] in {f"bestmove {m}" for m in rules.legal_moves(rules.START_FEN)}, lines[-3:]
    assert "info string stopped before the model wrote its move" in out, out[-500:]
    assert took < 15, f"quit took {took:.1f} s: the whole generation was waited for"


def test_the_end_of_the_input_mid_search_ends_the_engine_at_once(long_context_dir):
    started = time.monotonic()
    proc = cli(*uci_args(long_context_dir), input="uci\nisready\nposition startpos\ngo\n")
    took = time.monotonic() - started
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    out = proc.stdout.splitlines()
    assert "readyok" in out and out[-1].startswith("bestmove "), out[-3:]
    assert took < 15, f"the end of the input took {took:.1f} s: the whole generation was waited for"


@pytest.mark.slow
@pytest.mark.parametrize("go, most_s", [("go movetime 300", 0.3), ("go wtime 4000 btime 4000", 0.2),
                                        ("go wtime 60000 winc 1000 btime 60000 binc 1000 movestogo 30", 2.5)])
def test_an_answer_comes_within_its_time_whatever_the_generation_would_take(long_context_dir, go, most_s):
    """`go movetime` and the clock's share bound each answer, as a GUI's clock counts it: a generation of 8,000
    tokens (tens of seconds here) is cut at its time, and the search answers a legal move, said not to be the
    model's; `stop` cuts one at once. Piped in whole, `go movetime 500` then `quit` answers too (no bestmove was
    said at all)."""
    engine = ready_engine(long_context_dir)
    try:
        legal = {f"bestmove {m}" for m in rules.legal_moves(rules.START_FEN)}
        for command in (go, "go infinite"):
            engine.stdin.write(f"position startpos\n{command}\n")
            engine.stdin.flush()
            started = time.monotonic()
            if command == "go infinite":
                time.sleep(0.3)
                engine.stdin.write("stop\n")
                engine.stdin.flush()
            for line in engine.stdout:
                if line.startswith("bestmove"):
                    break
            took = time.monotonic() - started
            assert line.strip() in legal, line
            assert took < most_s + 3.0, f"{command}: {took:.1f} s"  # one decoding step past it, on a loaded CPU
        engine.stdin.write("quit\n")
        engine.stdin.flush()
        engine.communicate(timeout=30)
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
    proc = cli(*uci_args(long_context_dir), input="position startpos moves e2e4\ngo movetime 500\nquit\n")
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1].split()[0] == "bestmove", proc.stdout
    assert proc.stdout.splitlines()[-1].split()[1] in rules.legal_moves(
        "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1")


def test_quit_after_a_fast_search_still_gives_its_move(tiny_dir):
    """A session piped in whole, "go" then "quit" at once: a search that ends soon gives its bestmove."""
    proc = cli(*uci_args(tiny_dir, 8), input="position startpos\ngo\nquit\n")
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1].startswith("bestmove "), proc.stdout


def test_a_megabyte_of_input_is_echoed_short(tiny_dir):
    huge = "x" * 1_000_000
    session = [f"position fen {huge}", f"position fen {huge} w - - 0 1", f"position startpos {huge}",
               f"position startpos moves e2e4 {huge}", f"setoption name {huge} value 1",
               f"setoption name MultiPV value {huge}", f"setoption name MultiPV value 9{'9' * 4000}",
               f"setoption name Protocol value {huge}", f"setoption name Device value {huge}",
               "position startpos", f"go wtime {huge} {huge}", f"go movetime -{'9' * 4000}",
               f"go searchmoves {'a1a2 ' * 200_000}", "stop"]  # its bestmove however slow the machine is just now
    proc = cli(*uci_args(tiny_dir, 8), input="\n".join(session) + "\n")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    said = [line for line in proc.stdout.splitlines() if line.startswith("info string")]
    assert len(said) >= 12, said
    for line in said:
        assert len(line) <= 400, line[:500]
    quoted = [line for line in said if "xxx" in line or "999" in line or "a1a2" in line]
    assert len(quoted) >= 11 and all("..." in line for line in quoted), quoted
    assert "info string MultiPV must lie in 1..5, got 999" in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("bestmove ")


# -- 6. distributed start-up and a rank lost ------------------------------------------------------------------------

@pytest.mark.parametrize("env, said", [
    ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK must be a whole number, got 'abc'"),
    ({"RANK": "0"}, "RANK is set but WORLD_SIZE is not"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK must lie in 0..1"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE must be at least 1, got 0"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "WORLD_SIZE is 2 but MASTER_ADDR is not set"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}, "MASTER_PORT is not set"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "99999"},
     "MASTER_PORT must lie in 1..65535"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
      "MASTER_PORT": "29500"}, "LOCAL_RANK must be below LOCAL_WORLD_SIZE"),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "no-such-host.invalid", "MASTER_PORT": "29500"},
     "MASTER_ADDR 'no-such-host.invalid' is no address"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "192.0.2.1", "MASTER_PORT": "29500"},
     "which is no address of this machine"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
      "ROOKWORLD_DIST_TIMEOUT": "soon"}, "ROOKWORLD_DIST_TIMEOUT must be a number of seconds above 0"),
], ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) else None)
def test_an_environment_that_names_no_rank_is_one_line(tiny_dir, tmp_path, monkeypatch, env, said):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    one_line_error(cli(*train_args(tiny_dir, tmp_path / "run", "--steps", "1")), said)
    assert time.monotonic() - started < 30


@pytest.mark.slow
def test_a_rank_that_never_comes_is_named_within_the_start_up_timeout(tiny_dir, tmp_path):
    """Rank 0 alone, and rank 1 alone (no rank 0 listening): each says what it waits for, then gives up within
    ROOKWORLD_DIST_TIMEOUT with one line, and no C++ log of the store's retries."""
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "ROOKWORLD_DIST_TIMEOUT": "4", "OMP_NUM_THREADS": "1"}
    alone = {rank: process(train_args(tiny_dir, tmp_path / f"run{rank}", "--steps", "1"),
                           env={**env, "RANK": str(rank), "MASTER_PORT": str(free_port())}) for rank in (0, 1)}
    try:
        results = {rank: p.communicate(timeout=120) for rank, p in alone.items()}
    finally:
        for p in alone.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (_, err) in results.items():
        assert alone[rank].returncode == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 2 and "Traceback" not in err, err
        other = 1 - rank
        assert lines[0].startswith(f"rookworld: rank {rank} of 2: waiting for rank {other} at 127.0.0.1:"), err
        assert "ROOKWORLD_DIST_TIMEOUT" in lines[0]
        assert "start it again on every rank" in lines[1], err
    assert "rank 1 of 2 did not join at 127.0.0.1:" in results[0][1] and "within 4 s" in results[0][1]
    assert "nothing listens at 127.0.0.1:" in results[1][1] and "rank 0 did not start" in results[1][1]


@pytest.mark.slow
def test_one_rank_refusing_the_output_dir_ends_every_rank_before_rank_0_writes_there(tmp_path):
    """The ranks agree before rank 0 writes: rank 1 (without --overwrite) refuses a directory holding a model's
    config.json, which rank 0 (with it) would replace. Both end at once with a line, and config.json stays: rank 0
    went on alone and deleted it, and a rank that read the directory after rank 0 had marked it took rank 0's
    run.json for someone else's (CI, 2026-11-29)."""
    data = tmp_path / "train.txt"
    data.write_text((P_LINE + "\n") * 8)
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text('{"n_layer": 12}')
    args = ["sft", "--init", "tiny", "--n-embd", "32", "--data", data, "--output-dir", out, "--steps", "2",
            "--seq-len", "256", "--rows-per-step", "2", "--eval-every", "0", "--device", "cpu"]
    env = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "OMP_NUM_THREADS": "1"}
    ranks = [process(args + (["--overwrite"] if r == 0 else []), env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in (0, 1)]
    try:
        errs = [p.communicate(timeout=TORCHRUN_BOUND_S)[1] for p in ranks]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in ranks] == [2, 2] and "Traceback" not in "".join(errs), errs
    assert errs[1].strip().splitlines()[-1] == (f"rookworld sft: error: --output-dir {out} holds no run but files a "
                                                "run writes (config.json): give a new or empty --output-dir, or "
                                                "--overwrite to replace them"), errs[1]
    assert errs[0].strip().splitlines()[-1] == ("rookworld sft: error: rank 1 of 2 refused to start (its own line "
                                                "says why), so no rank did"), errs[0]
    assert (out / "config.json").read_text() == '{"n_layer": 12}'
    assert not (out / "run.json").exists()


@pytest.mark.slow
def test_a_killed_rank_ends_the_other_with_one_line_and_the_resume_command(tmp_path):
    data = tmp_path / "train.txt"
    data.write_text((P_LINE + "\n") * 8)
    out = tmp_path / "run"
    args = ["sft", "--init", "tiny", "--n-embd", "32", "--data", data, "--output-dir", out, "--steps", "100000",
            "--seq-len", "256", "--rows-per-step", "2", "--eval-every", "0", "--save-every", "1", "--device", "cpu"]
    env = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "OMP_NUM_THREADS": "1"}
    ranks = [process(args, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in (0, 1)]
    try:
        deadline = time.monotonic() + 180
        while not list((out / "checkpoints").glob("step-*")):  # both ranks are past their start and stepping
            if any(p.poll() is not None for p in ranks) or time.monotonic() > deadline:
                for p in ranks:
                    p.kill()
                pytest.fail("the ranks did not start stepping:\n" + "\n".join(p.communicate()[1] for p in ranks))
            time.sleep(0.2)
        ranks[1].send_signal(signal.SIGKILL)
        ranks[1].wait()
        killed_at = time.monotonic()
        _, err = ranks[0].communicate(timeout=60)
        took = time.monotonic() - killed_at
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert ranks[0].returncode == 2 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("rookworld sft: error: rank 0 lost contact with the other ranks after step "), last
    assert "its last checkpoint, step-" in last and "is intact" in last, last
    assert f"continue with rookworld sft --resume {out} on each of the 2 ranks (RANK 0 to 1)" in last, last
    assert "pair.cc" not in last and "GLHF" not in last, "gloo's message, not its source location and jokes"
    assert took < 30, took


@pytest.mark.parametrize("argv", [
    ["ask", "--model", "TINY", "HUGE"],                                     # a FEN
    ["ask", "--model", "TINY", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", "HUGE"],  # a move
    ["play", "--model", "TINY", "--fen", "HUGE"],
    ["eval", "--model", "TINY", "--suite", "HUGE"],
    ["eval", "--model", "TINY", "--device", "HUGE"],
    ["HUGE"],                                                               # a command
])
def test_a_megabyte_typed_on_the_command_line_is_quoted_in_80_characters(tiny_dir, capsys, argv):
    """Every message that quotes what was typed cuts it to 80 characters: a 1 MB FEN was quoted whole."""
    huge = "rnbqkbnr/" + "x" * 1_000_000
    proc = cli(*[str(tiny_dir) if a == "TINY" else huge if a == "HUGE" else a for a in argv])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    line, = [x for x in proc.stderr.splitlines() if "error" in x]
    assert len(line) < 400 and "xxx..." in line, line[:500]


def test_json_nesting_is_bounded_by_its_own_limit_not_the_recursion_limit():
    """A line nested past MAX_JSON_DEPTH is a bad line even where a library raised Python's recursion limit (torch's
    compiler does, in the same process): the SFT line above parsed, and was refused for another reason, once
    a test before it in the same worker had compiled. Brackets inside strings do not count."""
    from rookworld.io.json_line import MAX_JSON_DEPTH, json_value

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)
    try:
        with pytest.raises(ValueError, match="nested too deeply"):
            json_value(nested(DEEP))
    finally:
        sys.setrecursionlimit(limit)
    assert json_value(nested(MAX_JSON_DEPTH)) is not None
    with pytest.raises(ValueError, match="nested too deeply"):
        json_value(nested(MAX_JSON_DEPTH + 1))
    assert json_value(json.dumps({"s": "[" * 1000})) == {"s": "[" * 1000}
