"""`rookworld eval`: metrics from real scored completions, and the command end to end."""

import json

import numpy as np
import pytest

from conftest import cli
from rookworld.chess import rules
from rookworld.chess.data import Record
from rookworld.lm.bestmove import eval_items, position_outcomes, summarize
from rookworld.chess.rewards import RewardScorer, policy_targets
from rookworld.lm.suites import SuiteResult, format_report

FEN = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"
TRUTH = (["f1b5", "d2d4", "f1c4", "b1c3", "c2c3"], [0.45, 0.38, 0.3, 0.21, 0.12])


def test_metrics_from_scored_completions():
    exact = policy_targets([FEN], [TRUTH[0]], [TRUTH[1]], ["f1b5"])[0]
    second = exact.replace("B: f1b5", "B: d2d4")
    evals_off = policy_targets([FEN], [TRUTH[0]], [[e + 1.0 for e in TRUTH[1]]], ["f1b5"])[0]
    a_prompt = rules.env_prompt(FEN, "f1b5", [])
    a_target = rules.env_targets([a_prompt])[0]
    prompts = [f"P: {FEN}"] * 4 + [a_prompt] * 3
    completions = [exact, second, evals_off, "garbage", a_target, a_target.replace("+0.001+", "+0.5+"), "x"]
    truth = [TRUTH] * 4 + [None] * 3
    scores = RewardScorer().score_batch(prompts, completions, ground_truth=truth)
    assert scores.tasks.tolist() == ["P"] * 4 + ["A"] * 3
    m = summarize(scores, np.array([5] * 4 + [0] * 3))
    p, a = m["P"], m["A"]
    assert p["n"] == 4 and a["n"] == 3
    assert p["format_valid"] == 0.75
    assert p["best_move_accuracy"] == 0.5       # exact and evals_off
    assert p["top5_accuracy"] == 0.75           # + second best
    assert p["legal_best_move"] == 0.75
    assert p["candidate_overlap"] == 0.75       # 5/5 for the three well-formed answers
    assert p["eval_mae"] == pytest.approx(1.0 / 3)  # errors 0, 0, 1 pawn
    assert a["next_state_exact"] == pytest.approx(2 / 3)
    assert a["reward_accuracy"] == pytest.approx(1 / 3)
    assert a["format_valid"] == pytest.approx(2 / 3)
    table = format_report([SuiteResult("best-move", "greedy", m)])
    assert "best move" in table and "50.0%" in table and "next state exact" in table
    # The same figures position by position, in the prompts' order, as a run's held-out.jsonl keeps them.
    outcomes = position_outcomes([scores.breakdown(i) for i in range(len(prompts))])
    assert outcomes == {"P/legal_best_move": "1110", "P/top5_accuracy": "1110", "P/best_move_accuracy": "1010",
                        "A/next_state_exact": "110"}
    for key, bits in outcomes.items():
        task, figure = key.split("/")
        assert bits.count("1") / len(bits) == pytest.approx(m[task][figure])


def test_eval_items_cover_both_tasks():
    records = [Record(fen=FEN, move="f1b5", analysis={"moves": TRUTH[0], "evals": TRUTH[1]}),
               Record(fen=rules.START_FEN)]
    items = eval_items(records)
    assert [i.task for i in items] == ["P", "P", "A"]
    assert items[0].truth == (TRUTH[0], TRUTH[1]) and items[1].truth is None
    assert [i.task for i in eval_items(records, ("A",))] == ["A"]


def test_eval_command_end_to_end(tiny_dir, tmp_path):
    data = tmp_path / "held_out.fen"
    data.write_text("\n".join(p.fen for p in rules.generate_positions(6, 11)) + "\n")
    out = tmp_path / "results.json"
    proc = cli("eval", "--model", str(tiny_dir), "--data", str(data), "--stockfish-depth", "4", "--max-new-tokens",
               "16", "--device", "cpu", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "P: policy (6 positions, greedy)" in proc.stdout and "A: environment (6 positions, greedy)" in proc.stdout
    result = json.loads(out.read_text())["suites"]["best-move"]
    p, a = result["sections"]["P"], result["sections"]["A"]
    assert p["n"] == 6 and a["n"] == 6
    # A random model writes no well-formed answer: every metric says so.
    assert p["format_valid"] == 0.0 and p["mean_reward"] == pytest.approx(-0.3)
    assert a["next_state_exact"] == 0.0
    # Every prompt's completion and score, with the ground truth it was scored against.
    assert len(result["items"]) == 12 and {i["task"] for i in result["items"]} == {"P", "A"}
    first = result["items"][0]
    assert first["prompt"].startswith("P: ") and "completion" in first and first["reward"] == pytest.approx(-0.3)
    assert len(first["truth"]["moves"]) >= 1


def test_eval_bad_input(tiny_dir, tmp_path):
    def run(*args):
        return cli("eval", *args)

    proc = run("--model", str(tmp_path / "none"), "--data", str(tmp_path / "none.fen"))
    assert proc.returncode == 2 and "no such file" in proc.stderr and "Traceback" not in proc.stderr
    data = tmp_path / "d.fen"
    data.write_text(rules.START_FEN + "\n")
    proc = run("--model", str(tmp_path / "none"), "--data", str(data), "--tasks", "A")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    proc = run("--model", str(tiny_dir), "--data", str(data), "--tasks", "Q")
    assert proc.returncode == 2 and "--tasks" in proc.stderr


def test_eval_checks_its_output_before_any_work(tiny_dir, tmp_path):
    data = tmp_path / "d.fen"
    data.write_text(rules.START_FEN + "\n")
    proc = cli("eval", "--model", str(tiny_dir), "--data", str(data), "--out", str(tmp_path / "missing" / "r.json"))
    assert proc.returncode == 2 and f"its directory {tmp_path / 'missing'} does not exist" in proc.stderr
