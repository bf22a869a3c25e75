"""The `rookworld` command as a user runs it: `python -m rookworld`, real files, real Stockfish. The command runs in
this process (conftest.cli) except where the process is what is tested: the entry point, and what gets imported."""

import json
import subprocess
import sys

import chess as pychess
import pytest

import rookworld
from conftest import cli, rookworld_process
from rookworld.chess import rules
from rookworld.chess.rewards import RewardScorer
from rookworld.chess.stockfish import find_stockfish


def run(*args, check=True):
    proc = cli(*args)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {proc.stderr}")
    return proc


def test_version_and_help():
    assert run("--version").stdout.strip() == f"rookworld {rookworld.__version__}"
    assert "positions" in run("--help").stdout
    assert "--count" in run("positions", "--help").stdout
    # The same through the entry point, a process of its own.
    proc = rookworld_process("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"rookworld {rookworld.__version__}", proc.stderr
    proc = rookworld_process("positions", "--help")
    assert proc.returncode == 0 and "--count" in proc.stdout, proc.stderr


@pytest.mark.parametrize("args, old, new", [
    (["positions", "--count", "2", "--out", "x", "--depth", "4"], "--depth", "--stockfish-depth"),
    (["positions", "--count", "2", "--out", "x", "--nodes=100"], "--nodes", "--stockfish-nodes"),
    (["eval", "--limit", "3"], "--limit", "--eval-size"),
    (["eval", "--batch-size", "8"], "--batch-size", "--decode-batch-size"),
    (["eval", "--micro-batch-size", "8"], "--micro-batch-size", "--decode-batch-size"),
    (["eval", "--depth"], "--depth", "--stockfish-depth"),
])
def test_a_renamed_flag_is_one_line_naming_the_new_one(args, old, new):
    proc = run(*args, check=False)
    assert proc.returncode == 2 and f"{old} is now {new}" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("args, line", [
    (["train", "--stockfish-deth", "3"], "rookworld train: error: unrecognized arguments: --stockfish-deth 3 "
                                         "(did you mean --stockfish-depth?) (see rookworld train --help)"),
    (["eval", "--model", "x", "--outt=y"], "rookworld eval: error: unrecognized arguments: --outt=y "
                                           "(did you mean --out?) (see rookworld eval --help)"),
    (["sft", "--zzzzzz"], "rookworld sft: error: unrecognized arguments: --zzzzzz (see rookworld sft --help)"),
    (["--zzzzzz"], "rookworld: error: unrecognized arguments: --zzzzzz (see rookworld --help)"),
])
def test_an_unknown_flag_is_reported_by_its_subcommand_with_the_nearest_flag(args, line):
    proc = run(*args, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [line], proc.stderr


def test_sft_help_says_the_default_row_layout():
    text = " ".join(run("sft", "--help").stdout.split())
    assert "one a row (or packed into full rows with --pack)" in text and "packed into rows;" not in text


@pytest.mark.parametrize("args", [["--help"], ["positions", "--help"], ["train", "--help"], ["sft", "--help"],
                                  ["eval", "--help"], ["train", "--no-such-flag"], ["positions", "--count", "x"]])
def test_parsing_flags_does_not_load_torch(args):
    """Help and flag errors answer at once: torch takes seconds to import. (--help exits 0, a bad flag 2.)"""
    code = ("import sys; from rookworld.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch was imported'")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_positions_writes_the_same_file_for_the_same_seed(tmp_path):
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    run("positions", "--count", "300", "--seed", "9", "--a-history", "full", "--out", str(a))
    run("positions", "--count", "300", "--seed", "9", "--a-history", "full", "--out", str(b), "--quiet")
    run("positions", "--count", "300", "--seed", "10", "--a-history", "full", "--out", str(c), "--quiet")
    assert a.read_text() == b.read_text() != c.read_text()
    lines = [json.loads(line) for line in a.read_text().splitlines()]
    assert len(lines) == 300
    assert lines == [p.to_dict() for p in rules.generate_positions(300, 9)]
    for line in lines[:50]:
        board = pychess.Board()
        for move in line["history"]:
            board.push_uci(move)
        assert board.fen() == line["fen"]


@pytest.mark.parametrize("args, message", [
    (["positions", "--count", "0", "--out", "x"], "must be a positive integer"),
    (["positions", "--count", "5", "--out", "/nonexistent/dir/x.jsonl"], "its directory /nonexistent/dir does not exist"),
    (["positions", "--out", "x.jsonl"], "--count is required"),
    (["positions", "--count", "5", "--opening-share", "0.7", "--endgame-share", "0.5", "--out", "x"], "must not exceed 1"),
    (["positions", "--count", "5", "--illegal-share", "2", "--out", "x"], "must lie in [0, 1]"),
    (["positions", "--from", "/nonexistent.fen", "--out", "x"], "no such file"),
    (["positions", "--count", "2", "--annotate", "--stockfish-path", "/nonexistent/stockfish", "--out", "x"],
     "--stockfish-path"),
])
def test_bad_input_is_one_clear_line_and_exit_2(tmp_path, args, message):
    proc = cli(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # not the whole usage


def test_annotate_user_file_names_the_bad_line(tmp_path):
    src = tmp_path / "mine.fen"
    src.write_text(f"{rules.START_FEN}\n8/8/8/8/8/8/8/8 w - - 0 1\n")
    proc = run("positions", "--from", str(src), "--out", str(tmp_path / "o.jsonl"), check=False)
    assert proc.returncode == 2 and f"{src}:2:" in proc.stderr and "Traceback" not in proc.stderr
    run("positions", "--from", str(src), "--skip-bad", "--out", str(tmp_path / "o.jsonl"))
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 1


def test_annotate_writes_targets_that_score_one(tmp_path):
    find_stockfish()  # real Stockfish, as .ci/run installs it
    out = tmp_path / "annotated.jsonl"
    run("positions", "--count", "12", "--seed", "4", "--annotate", "--stockfish-depth", "6", "--out", str(out),
        "--quiet")
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 12
    for line in lines:
        assert line["p_prompt"] == f"P: {line['fen']}"
        a = line["analysis"]
        assert 1 <= len(a["moves"]) <= 5 and len(a["moves"]) == len(a["evals"])
        legal = set(rules.legal_moves(line["fen"]))
        assert set(a["moves"]) <= legal
        assert line["a_prompt"] == rules.env_prompt(line["fen"], line["move"], line["history"])
        assert rules.env_targets([line["a_prompt"]]) == [line["a_target"]]
    scorer = RewardScorer()
    prompts = [l["p_prompt"] for l in lines] + [l["a_prompt"] for l in lines]
    completions = [l["p_target"] for l in lines] + [l["a_target"] for l in lines]
    truth = [(l["analysis"]["moves"], l["analysis"]["evals"]) for l in lines] + [None] * len(lines)
    assert scorer.score_batch(prompts, completions, ground_truth=truth).rewards.tolist() == [1.0] * 24
    # The targets follow the training layout: FEN padded to 90 columns, moves to 30, evals to 40.
    text = lines[0]["p_prompt"] + lines[0]["p_target"]
    assert text.index("M:") == 93 and text.index("E:") - text.index("M:") == 33
    assert text.index("B:") - text.index("E:") == 43


def test_exclude_keeps_a_held_out_set_s_positions_out_and_still_writes_count(tmp_path):
    """The same seed would give the same positions: with --exclude, none of the held-out ones, and --count all the
    same (further indices in their place); position identity ignores the clocks."""
    held = tmp_path / "held.jsonl"
    run("positions", "--count", "300", "--seed", "7", "--out", str(held), "--quiet")
    key = lambda fen: " ".join(fen.split()[:4])  # noqa: E731
    held_keys = {key(json.loads(line)["fen"]) for line in held.read_text().splitlines()}
    train = tmp_path / "train.jsonl"
    run("positions", "--count", "500", "--seed", "7", "--exclude", str(held), "--out", str(train), "--quiet")
    fens = [json.loads(line)["fen"] for line in train.read_text().splitlines()]
    assert len(fens) == 500 and not {key(f) for f in fens} & held_keys
    run("positions", "--count", "500", "--seed", "7", "--out", str(tmp_path / "same.jsonl"), "--quiet")
    same = [json.loads(line)["fen"] for line in (tmp_path / "same.jsonl").read_text().splitlines()]
    assert len({key(f) for f in same} & held_keys) >= 250  # without --exclude the seed repeats them
    from_file = tmp_path / "from.jsonl"
    run("positions", "--from", str(tmp_path / "same.jsonl"), "--exclude", str(held), "--out", str(from_file), "--quiet")
    assert not {key(json.loads(line)["fen"]) for line in from_file.read_text().splitlines()} & held_keys
