"""The benchmarks run (as CPU smoke checks with tiny models or tiny batches) and report what they promise."""

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def run_bench(script: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(REPO / "benches" / script), *args], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("objective", [[], ["--kl-estimator", "full", "--advantage", "gae"]], ids=["k3", "full-gae"])
def test_grpo_step_benchmark_smoke(tmp_path, objective):
    out, profiled = tmp_path / "figures.json", tmp_path / "profile.json"
    proc = run_bench("grpo_step.py", "--device", "cpu", "--tiny", "--prompts", "2", "--group", "2", "--p-len", "4",
                     "--a-len", "8", "--steps", "1", "--warmup", "1", "--stockfish-depth", "4", "--json", str(out),
                     "--profile", str(profiled), *objective)
    figures = json.loads(out.read_text())
    # One more step under the profiler: its rows are the operators' own times (kernels on a GPU), each in the phase
    # whose range it ran in, and none longer than the step, nor all together.
    account = json.loads(profiled.read_text())
    assert account == figures["profile"] and account["device"] == "cpu"
    assert len(account["top"]) >= 25 and {"generate", "reference", "update"} <= set(account["phases"])
    assert all(0 < row["share"] <= 1 and row["calls"] > 0 for row in account["top"])
    assert sum(p["seconds"] for p in account["phases"].values()) <= account["wall_s"] * 1.05
    for phase, wall in account["phase_wall_s"].items():  # a phase's operators ran within the phase's own time
        assert account["phases"].get(phase, {"seconds": 0})["seconds"] <= wall * 1.05, phase
    assert account["syncs_total"] > 0 and account["peak_memory_gb"] > 0  # sampling reads its "all done?" on the host
    assert "profile of one step (operators' own CPU time)" in proc.stderr
    assert figures["samples_per_s"] > 0 and figures["generated_tokens_per_s"] > 0
    for phase in ("generate_s", "reward_s", "reference_s", "update_s"):
        assert figures[phase] >= 0
    assert figures["lengths"] == {"P": 4, "A": 8}
    assert "samples/s" in proc.stdout and "MFU" in proc.stdout
    # each step's line names its phases, so that a stage cut off by its time limit shows where the time went
    phases = r"\(generate [\d.]+ s, reward [\d.]+ s, reference [\d.]+ s, update [\d.]+ s\)"
    assert re.search(r"step 1 \(warm-up\): .*" + phases, proc.stderr)
    assert 0 <= figures["update_padding"] < 1 and "update padding" in proc.stdout
    assert figures["kl_estimator"] == ("full" if objective else "k3")
    assert figures["dtype"] in ("fp32", "bf16") and f"in {figures['dtype']}, the run's compute dtype" in proc.stdout


@pytest.mark.slow
def test_sft_dtype_benchmark_smoke(tmp_path):
    """bf16 against float32 SFT, the steps alternated: the CPU, mm per dtype, tokens/s, the ratio, both losses."""
    out = tmp_path / "figures.json"
    proc = run_bench("sft_dtype.py", "--shapes", "chess-cpu", "--steps", "2", "--warmup", "0", "--rows", "2",
                     "--json", str(out))
    figures = json.loads(out.read_text())
    # Both dtypes at 768; at 2048 too, unless the CPU has no bf16 instructions (bf16 is then measured at 768 alone).
    assert {"fp32_768", "bf16_768", "fp32_2048"} <= set(figures["mm_gflops"]) <= {"fp32_768", "bf16_768", "fp32_2048",
                                                                                   "bf16_2048"}
    bf16_size = 2048 if "bf16_2048" in figures["mm_gflops"] else 768
    r = figures["shapes"]["chess-cpu"]
    assert r["fp32"]["tokens_per_s"] > 0 and r["bf16"]["tokens_per_s"] > 0 and r["speedup"] > 0
    assert len(r["fp32"]["loss"]) == len(r["bf16"]["loss"]) == 2 and r["max_rel_loss_diff"] < 0.01
    assert "CPU: " in proc.stdout and "bf16 / fp32:" in proc.stdout and f"% of bf16 mm {bf16_size}^3" in proc.stdout


@pytest.mark.slow
def test_sft_step_benchmark_smoke(tmp_path):
    """Today's SFT step against bf16, compiled and Muon, alternated: each arm's speed against fp32 and its losses;
    the compiled fp32 arm computes what the eager one does."""
    out = tmp_path / "figures.json"
    proc = run_bench("sft_step.py", "--arms", "fp32,compiled,muon", "--steps", "1", "--warmup", "1", "--rows", "2",
                     "--json", str(out))
    figures = json.loads(out.read_text())
    assert figures["fp32"]["speed_vs_fp32"] == 1.0 and figures["muon"]["speed_vs_fp32"] > 0
    assert len(figures["compiled"]["losses"]) == 2 and figures["compiled"]["max_rel_loss_diff_vs_fp32"] < 1e-3
    # Muon moves the weights otherwise from the first step on: the second step's loss differs
    assert figures["muon"]["losses"][0] == figures["fp32"]["losses"][0] != figures["muon"]["losses"][1]
    assert "CPU: " in proc.stdout and re.search(r"muon: median step [\d.]+ s, [\d.]+x fp32", proc.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("mode", [[], ["--mixed"], ["--weights", "copy", "--dtype", "bfloat16", "--backward"]])
def test_generate_benchmark_smoke(mode):
    proc = run_bench("generate.py", "--device", "cpu", *mode, "--batch-sizes", "3", "--prompt-len", "3", "5",
                     "--new-tokens", "2", "4", "--repeats", "1", "--warmup", "0", "--threads", "1")
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip().startswith(("P ", "A ", "3 "))]
    if "--weights" in mode:  # the trainer's way: fp32 weights, sampled and scored through their bf16 copy
        assert "fp32 weights read through their autocast copy" in proc.stdout
        assert [len(r) for r in rows] == [10, 10]  # generation, log-prob pass, forward + backward fused and not
    if "--mixed" in mode:  # 3 rows: 2 P: (2 new tokens) and 1 A: (4), both ways
        assert len(rows) == 1 and rows[0][:3] == ["3", "2", "eager"] and rows[0][-1].endswith("x")
    else:
        assert [r[:4] for r in rows] == [["P", "3", "3", "2"], ["A", "3", "5", "4"]]


@pytest.mark.slow
@pytest.mark.parametrize("draw, name", [("device", "_draw"), ("blocks", "_draw_in_blocks")])
def test_sampler_benchmark_smoke(tmp_path, draw, name):
    out = tmp_path / "sampler.json"
    proc = run_bench("sampler.py", "--device", "cpu", "--batch-sizes", "2", "--repeats", "1", "--threads", "1",
                     "--draw", draw, "--json", str(out))
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [r["batch"] for r in rows] == [2] and rows[0]["eager_s"] > 0 and rows[0]["compiled_s"] > 0
    assert "speed-up" in proc.stdout and result["draw"] == name and name in proc.stdout


@pytest.mark.slow
def test_decode_cache_benchmark_smoke(tmp_path):
    """Times the decode step at the live, exact and bucketed cache lengths the docstring names, and counts the
    keys and values the bucketed cache reads beyond the live ones (12 layers x 768 wide, fp32 on the CPU)."""
    out = tmp_path / "decode_cache.json"
    proc = run_bench("decode_cache.py", "--device", "cpu", "--batch-sizes", "2", "--prompt-len", "3", "5",
                     "--new-tokens", "2", "4", "--repeats", "2", "--threads", "1", "--json", str(out))
    rows = json.loads(out.read_text())["rows"]
    # P: 3 + 2/2 = 4 live slots (+1 for the step's own), 5 exact, 64 bucketed; A: 5 + 2 (+1), 9, 64.
    assert [(r["task"], r["live_slots"], r["exact_slots"], r["bucket_slots"]) for r in rows] == [
        ("P", 5, 5, 64), ("A", 8, 9, 64)]
    assert rows[0]["extra_kv_bytes"] == 2 * 12 * 2 * (64 - 5) * 768 * 4
    assert all(r["live_ms"] > 0 and r["bucket_ms"] > 0 for r in rows)
    assert "bucket-live ms" in proc.stdout


@pytest.mark.slow
def test_trl_baseline_smoke(tmp_path):
    pytest.importorskip("trl", reason="TRL is only needed for the side-by-side benchmark")
    pytest.importorskip("datasets")
    out = tmp_path / "trl.json"
    run_bench("trl_baseline.py", "--device", "cpu", "--tiny", "--prompts", "2", "--group", "2", "--length", "4",
              "--steps", "1", "--warmup", "1", "--micro-batch-size", "4", "--stockfish-depth", "4", "--json", str(out))
    figures = json.loads(out.read_text())
    assert figures["samples_per_s"] > 0 and len(figures["step_times"]) == 2


@pytest.mark.slow
def test_learning_chain_smoke(tmp_path):
    """Every stage of benches/learning.py at a tiny size (the chess vocabulary, unpadded P: text): the files each
    one writes, and the table."""
    out = tmp_path / "chain"
    proc = run_bench("learning.py", "--out", str(out), "--smoke", "--device", "cpu", "--vocabulary", "chess",
                     "--layout", "compact")
    for name in ("train.jsonl", "held_out.jsonl", "sft/config.json", "sft/vocab.json", "sft/metrics.jsonl",
                 "eval_sft.json", "eval_sft_suites.json", "grpo_seed0/metrics.jsonl", "eval_grpo_seed0.json",
                 "learning.json"):
        assert (out / name).is_file(), name
    figures = json.loads((out / "learning.json").read_text())
    assert set(figures["grpo"]) == {"0"} and "P" in figures["sft"] and "A" in figures["grpo"]["0"]
    for section in ("mate-in-one", "selfplay/greedy", "vs-stockfish"):  # every suite, before and after
        assert section in figures["sft"] and section in figures["grpo"]["0"], section
    held_out = {json.loads(line)["fen"] for line in (out / "held_out.jsonl").read_text().splitlines()}
    train = {json.loads(line)["fen"] for line in (out / "train.jsonl").read_text().splitlines()}
    assert held_out and not held_out & train, "held-out positions are never training positions"
    for label in ("best-move accuracy", "next state exact", "mate in one", "legal half-moves"):
        assert label in proc.stdout, label
    if importlib.util.find_spec("matplotlib"):
        assert (out / "grpo_curves.png").read_bytes()[:4] == b"\x89PNG"
    made = figures["sft_model"]
    assert not made["reused"] and made["config"]["n_layer"] == 2 and made["training"]["steps"] == 4
    first = json.loads((out / "train.jsonl").read_text().splitlines()[0])
    assert made["config"]["vocab_size"] == 4364 and first["p_target"].startswith(" M: ")

    # --reuse keeps the SFT model, whatever this call's SFT flags say, and the figures name the model it kept.
    weights = (out / "sft" / "model.safetensors").read_bytes()
    run_bench("learning.py", "--out", str(out), "--smoke", "--device", "cpu", "--reuse", "--sft-lr", "0.5")
    assert (out / "sft" / "model.safetensors").read_bytes() == weights
    figures = json.loads((out / "learning.json").read_text())
    kept = figures["sft_model"]
    assert figures["settings"]["sft_lr"] == 0.5 and kept["reused"] and kept["training"]["lr"] == made["training"]["lr"]
    assert kept["config"] == made["config"]


@pytest.mark.slow
def test_gpu_suite_smoke(tmp_path):
    """The lent GPU's commands, every call at toy sizes on the CPU: every stage runs or says why not, suite.json
    holds the figures of each, and the table and the verdict come last (the device tool returns only the end of
    the output). What needs CUDA says so and is skipped, which is no failure: the exit status is 0."""
    out = tmp_path / "suite"
    proc = run_bench("gpu_suite.py", "--device", "cpu", "--tiny", "--out", str(out), "--budget", "600")
    results = json.loads((out / "suite.json").read_text())
    stages = results["stages"]
    # call 1's order first: the eager step, its TRL-sized twin and TRL, then the compiled step; each stage once
    assert list(stages) == ["env", "grpo-step-eager", "grpo-step-u64-eager", "trl", "grpo-step", "grpo-step-logprobs",
                            "cuda-core", "cuda-tests", "train-fp32", "sampler", "auto-batch-oom", "train-compiled", "decode-cache",
                            "fused-head", "sft", "sft-eager", "auto-batch", "every-prompt", "generate", "weights",
                            "sft-chess-play"]
    for name in ("env", "grpo-step-eager", "grpo-step-u64-eager", "grpo-step", "train-fp32", "train-compiled",
                 "every-prompt", "fused-head", "sft", "sft-eager", "generate", "sampler", "decode-cache", "weights",
                 "sft-chess-play"):
        assert stages[name]["status"] == "ok", (name, stages[name])
    core, every = stages["cuda-core"]["figures"], stages["cuda-tests"]["figures"]
    assert stages["cuda-core"]["status"] == stages["cuda-tests"]["status"] == "skipped"
    assert 5 <= core["skipped"] < every["skipped"]  # -k chose some of the CUDA tests, not none and not all
    assert stages["train-fp32"]["figures"]["steps"] == [1, 2]
    compiled = stages["train-compiled"]["figures"]
    assert compiled["evaluations"] == [2] and compiled["compile_failed"] == 0 and len(compiled["graphs"]) == 2
    for name in ("grpo-step-eager", "grpo-step-u64-eager", "grpo-step", "grpo-step-logprobs", "every-prompt"):
        f = stages[name]["figures"]
        # the bench's last rewrite of its --json: complete, each step's line, what it compiled
        assert f["complete"] and f["samples_per_s"] > 0 and [x["step"] for x in f["steps"]] == [1, 2], name
        assert isinstance(f["compiled"], list), name
    assert stages["grpo-step-eager"]["figures"]["compile"] is False
    assert stages["grpo-step-u64-eager"]["figures"]["lengths"] == {"P": 4, "A": 4}
    assert "gen/reward/ref/update" in stages["grpo-step-eager"]["summary"]
    assert stages["generate"]["figures"]["rows"][0]["generated_tokens_per_s"] > 0
    assert stages["every-prompt"]["figures"]["shared_prompt"] is False
    assert stages["grpo-step"]["figures"]["shared_prompt"]
    assert stages["grpo-step"]["figures"]["compile_logprobs"] is False  # train's default
    # asked for by its command; on the CPU nothing compiles, which the figures say
    assert "grpo_step.py --warmup 2 --steps 3 --compile-logprobs" in (out / "suite.log").read_text()
    # the eager and the default steps each bring back a profile of one more step, written under --out too
    for name in ("grpo-step-eager", "grpo-step"):
        profiled = stages[name]["figures"]["profile"]
        assert len(profiled["top"]) >= 25 and profiled["syncs_total"] > 0, name
        assert {"generate", "update"} <= set(profiled["phases"]) and "profiled:" in stages[name]["summary"], name
        assert json.loads((out / f"{name}-profile.json").read_text())["top"] == profiled["top"], name
    # issue 57's SFT at scale brings its model back under --out, whole, as a model directory
    scaled = out / "sft-chess-play"
    assert stages["sft-chess-play"]["figures"]["steps"] == 6 and (scaled / "model.safetensors").stat().st_size > 1e6
    assert json.loads((scaled / "config.json").read_text())["n_embd"] == 256
    assert stages["fused-head"]["figures"]["rows"][0]["checkpointed_forward_backward_tokens_per_s"] > 0
    assert stages["sft"]["figures"]["tokens_per_s"] > 0 and stages["sft"]["figures"]["mfu"] is None  # no CUDA
    assert stages["sft-eager"]["figures"]["compiled_over_eager"] > 0
    assert stages["decode-cache"]["figures"]["rows"][0]["bucket_ms"] > 0
    assert set(stages["weights"]["figures"]["copy_over_fp32"]) == {"P", "A"}
    assert stages["env"]["figures"]["commit"]  # a checkout: git names it
    for name in ("auto-batch", "auto-batch-oom"):  # the command was run, and refused the CPU
        assert stages[name]["status"] == "skipped" and "needs CUDA" in stages[name]["summary"], stages[name]
    if importlib.util.find_spec("trl"):
        trl = stages["trl"]["figures"]
        assert trl["rookworld_stage"] == "grpo-step-u64-eager" and trl["rookworld_over_trl"] > 0  # eager over eager
        assert trl["rookworld_over_trl"] == pytest.approx(
            stages["grpo-step-u64-eager"]["figures"]["samples_per_s"] / trl["samples_per_s"])
    assert any(k.startswith(">= 2000 samples/s (grpo-step)") for k in results["goals"])  # the compiled one, once there
    assert (out / "suite.log").read_text().count("$ ") >= 6
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("gpu suite:") and any(line.startswith("grpo-step ") for line in lines[-24:])
    assert any(line.startswith("   grpo-step-eager: step 1 (warm-up)") for line in lines)  # each step as it ends
    assert lines[-1] == results["verdict"] and lines[-1].startswith("gpu suite: passed (")


FAKE_GRPO_STEP = """
import argparse, json, os, time
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("--json")
path = ap.parse_known_args()[0].json


def write(figures):
    Path(path + ".tmp").write_text(json.dumps(figures))
    Path(path + ".tmp").replace(path)


steps, compiled = [], []
figures = {"complete": False, "prompts": 2, "group": 2, "steps": steps, "compiled": compiled}
write(figures)
for i in (1, 2):
    time.sleep(0.5)
    compiled.append({"name": "decode_step", "seconds": 12.0 * i, "reason": "size changed" if i > 1 else "", "step": i})
    steps.append({"step": i, "warmup": True, "step_s": 40.0 / i, "samples_per_s": 0.1 * i, "generate_s": 30.0 / i,
                  "reward_s": 1.0, "reference_s": 2.0, "update_s": 3.0, "compiling_s": 12.0 * i, "graphs": 1})
    write(figures)
# What the suite's suite.json says while this still runs, for the test to read: the polling, not the stage's end.
suite = Path(os.environ["FAKE_SUITE_JSON"])
for _ in range(100):
    try:
        seen = json.loads(suite.read_text())["stages"]["grpo-step"]
    except (OSError, ValueError, KeyError):
        seen = None
    if seen and len(seen["figures"].get("steps", [])) == 2:
        Path(os.environ["FAKE_SEEN"]).write_text(json.dumps(seen))
        break
    time.sleep(0.2)
time.sleep(600)  # a first step still compiling when the time runs out
"""


def _gpu_suite_with_fake_grpo_step(tmp_path, monkeypatch):
    """gpu_suite, loaded here, with benches/grpo_step.py replaced by FAKE_GRPO_STEP: it writes its --json as the
    real one does (two steps, what they compiled) and then never ends."""
    spec = importlib.util.spec_from_file_location("gpu_suite_fake", REPO / "benches" / "gpu_suite.py")
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    benches = tmp_path / "benches"
    benches.mkdir()
    (benches / "grpo_step.py").write_text(FAKE_GRPO_STEP)
    monkeypatch.setattr(suite, "BENCHES", benches)
    monkeypatch.setenv("FAKE_SUITE_JSON", str(tmp_path / "out" / "suite.json"))
    monkeypatch.setenv("FAKE_SEEN", str(tmp_path / "seen.json"))
    return suite


@pytest.mark.slow
def test_gpu_suite_keeps_the_steps_of_a_grpo_step_the_budget_cut_off(tmp_path, monkeypatch, capsys):
    """The compiled step, last in the first call, may be cut off by the budget in its first steps: suite.json holds
    its steps while it runs and after, the stage is "partial" (no failure), and the table names the graphs
    compiled and their seconds and gives the command that runs it again."""
    suite = _gpu_suite_with_fake_grpo_step(tmp_path, monkeypatch)
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["gpu_suite.py", "--device", "cpu", "--tiny", "--out", str(out),
                                      "--stages", "grpo-step", "--budget", "32"])
    assert suite.main() == 0
    seen = json.loads((tmp_path / "seen.json").read_text())  # read by the fake while it still ran
    assert seen["status"] == "running" and [s["step"] for s in seen["figures"]["steps"]] == [1, 2]
    stage = json.loads((out / "suite.json").read_text())["stages"]["grpo-step"]
    assert stage["status"] == "partial: 2 steps"
    assert [s["step_s"] for s in stage["figures"]["steps"]] == [40.0, 20.0]
    assert [c["seconds"] for c in stage["figures"]["compiled"]] == [12.0, 24.0]
    assert "compiled 2 graphs in 36 s (longest decode_step 24 s)" in stage["summary"]
    assert "cut off by --budget" in stage["summary"]
    lines = capsys.readouterr().out.strip().splitlines()
    step = ("step 2 (warm-up) 20.0 s, 0 samples/s (generate 15.0, reward 1.0, reference 2.0, update 3.0 s, "
            "compiling 24 s)")
    assert f"   grpo-step: {step}" in lines  # printed as it ended, not only in the table
    assert any(line.startswith("grpo-step ") and "partial: 2 steps" in line for line in lines)
    assert lines[-2].endswith("--stages grpo-step") and lines[-1] == "gpu suite: passed (1 ok, 1 partial)"


@pytest.mark.slow
def test_gpu_suite_keeps_the_steps_of_a_grpo_step_past_its_own_limit(tmp_path, monkeypatch):
    """Past its own limit, a GRPO step has failed ("timed out"), and still keeps the steps it measured."""
    suite = _gpu_suite_with_fake_grpo_step(tmp_path, monkeypatch)
    args = argparse.Namespace(tiny=True, device="cpu", out=str(tmp_path / "out"), budget=200, pack=None)
    s = suite.Suite(args)
    s.stage = "grpo-step"
    status, figures, summary = suite._grpo_step(s, "grpo_step", [], cap=4, need=1)
    assert status == "timed out: 2 steps" and not suite.passed(status)
    assert [x["step"] for x in figures["steps"]] == [1, 2] and len(figures["compiled"]) == 2
    assert summary.startswith("2 steps of 40, 20 s; last: step 2")


@pytest.mark.slow
def test_gpu_suite_exits_non_zero_when_a_stage_fails(tmp_path):
    """A stage whose command really fails (here grpo_step.py, given a Stockfish that is not there) fails the suite:
    exit status 1, the stage's status and the verdict name it, and the stages after it still run."""
    out = tmp_path / "suite"
    env = dict(os.environ, ROOKWORLD_STOCKFISH=str(tmp_path / "no-stockfish"))
    proc = subprocess.run([sys.executable, str(REPO / "benches" / "gpu_suite.py"), "--device", "cpu", "--tiny",
                           "--out", str(out), "--stages", "grpo-step", "cuda-tests"], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads((out / "suite.json").read_text())
    failed = results["stages"]["grpo-step"]["status"]
    assert failed.startswith("failed (exit 1)") and "StockfishNotFoundError" in failed  # the cause, not a later one
    assert results["stages"]["cuda-tests"]["status"] == "skipped"  # no CUDA here: run, and no failure
    last = proc.stdout.strip().splitlines()[-1]
    assert last == results["verdict"] and last.startswith("gpu suite: FAILED: grpo-step: failed (exit 1)")
    assert "cuda-tests" not in last


def test_gpu_suite_help_gives_the_plan():
    """--help is the plan for 15-minute slots: the first command's stages, eager figures before the compiled step;
    a short second command of CUDA tests; later slots for every other stage; and what the exit status says."""
    proc = subprocess.run([sys.executable, str(REPO / "benches" / "gpu_suite.py"), "--help"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    calls = [text.index(f"python3 benches/gpu_suite.py --call {n} --out $OUT") for n in range(1, 11)]
    assert calls == sorted(calls) and "--call 11" not in text
    first, second = text[calls[0]:calls[1]], text[calls[1]:calls[2]]
    assert "(480 s of stages)" in first and "(200 s of stages)" in second
    order = [first.index(f"      {stage} ") for stage in ("grpo-step-eager", "grpo-step-u64-eager", "trl", "grpo-step")]
    assert order == sorted(order)
    assert "      cuda-core " in second
    assert text.index("slot 1:") < calls[0] and calls[1] < text.index("slot 2:") < calls[2]
    later = text[calls[2]:]
    for stage in ("cuda-tests", "train-fp32", "auto-batch-oom", "train-compiled", "every-prompt", "fused-head", "sft",
                  "sft-eager", "generate", "sampler", "decode-cache", "weights", "auto-batch", "learning",
                  "sft-chess-play"):
        assert f"      {stage} " in later, stage
    assert "exit status" in text and "--stages learning" in text and "time limit" in text
    both = subprocess.run([sys.executable, str(REPO / "benches" / "gpu_suite.py"), "--call", "1", "--stages", "env"],
                          capture_output=True, text=True, timeout=60)
    assert both.returncode == 2 and "not both" in both.stderr


def test_gpu_suite_calls_fit_their_slots():
    """Each slot's commands fit 15 minutes: 2 of start-up, each call's budget plus half a minute to install and
    print, every command under 9 minutes; and every stage is in some call, or runs alone (learning, grpo-step-u64)."""
    spec = importlib.util.spec_from_file_location("gpu_suite_plan", REPO / "benches" / "gpu_suite.py")
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    slots: dict[int, float] = {}
    for call in suite.CALLS.values():
        assert call.budget + 30 < 9 * 60, call
        slots[call.slot] = slots.get(call.slot, 120) + call.budget + 30
    assert slots and max(slots.values()) <= 15 * 60, slots
    assert list(slots) == sorted(slots) and suite.CALLS["1"].stages[-2:] == ["grpo-step", "grpo-step-logprobs"]
    placed = {s for call in suite.CALLS.values() for s in call.stages} | set(suite.OWN_CALL)
    assert set(suite.STAGES) - placed == {"env", "grpo-step-u64"}


def test_gpu_suite_mfu_takes_each_cards_own_peak():
    """MFU's denominator is the card's dense bf16 peak, by the name torch.cuda.get_device_name gives; a card not in
    the table, or a MIG slice of one, has no peak, and SFT then leaves MFU out rather than divide by an H100's."""
    from rookworld.net.device import peak_tflops

    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.4  # SXM
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA H100 NVL") == 835.0
    assert peak_tflops("NVIDIA H200") == 989.4
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == peak_tflops("NVIDIA A100 80GB PCIe") == 312.0
    assert peak_tflops("NVIDIA A10") == 125.0 and peak_tflops("NVIDIA L4") == 121.0
    assert peak_tflops("NVIDIA L40S") == 362.05 and peak_tflops("NVIDIA L40") == 181.05
    assert peak_tflops("NVIDIA GeForce RTX 4090") == 165.2
    for unknown in ("NVIDIA A10G", "NVIDIA GeForce RTX 4090 D", "NVIDIA GeForce RTX 4090 Laptop GPU", "Tesla T4",
                    "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "AMD Instinct MI300X", ""):
        assert peak_tflops(unknown) is None, unknown


def test_gpu_suite_names_the_commit_without_git(tmp_path):
    """The device machine gets the tree without .git: the suite then names the commit that gpu_extras.sh stamped
    into the pack, marked as the pack's, and in a checkout the commit git gives (so every figure says its code)."""
    def load(path: Path):
        spec = importlib.util.spec_from_file_location(f"gpu_suite_{abs(hash(path))}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    copy = tmp_path / "tree" / "benches"
    copy.mkdir(parents=True)
    shutil.copy(REPO / "benches" / "gpu_suite.py", copy)
    suite = load(copy / "gpu_suite.py")
    pack = tmp_path / "pack"
    pack.mkdir()
    assert suite.source_commit(pack) is None and suite.source_commit(None) is None
    (pack / "commit").write_text("8be759a1b2c3-dirty\n")
    assert suite.source_commit(pack) == "8be759a1b2c3-dirty (pack)"

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode == 0:  # a checkout: git's answer wins over any stamp
        here = load(REPO / "benches" / "gpu_suite.py")
        assert head.stdout.startswith(here.source_commit(pack).removesuffix("-dirty"))


def test_gpu_suite_stops_at_its_budget(tmp_path):
    """With too little time left, stages are listed as not run, the table names the call that runs them, and the
    exit status stays 0 (run_bench checks it)."""
    out = tmp_path / "suite"
    proc = run_bench("gpu_suite.py", "--device", "cpu", "--tiny", "--out", str(out), "--budget", "20",
                     "--stages", "generate", "sft")
    results = json.loads((out / "suite.json").read_text())
    stages = results["stages"]
    assert stages["sft"]["status"] == "not run" and stages["sft"]["summary"] == "out of time"
    *_, next_call, verdict = proc.stdout.strip().splitlines()
    left = [name for name in ("generate", "sft") if stages[name]["status"] == "not run"]
    assert next_call.endswith(f"--out {out} --device cpu --tiny --stages {' '.join(left)}")
    assert verdict == results["verdict"] and verdict.startswith("gpu suite: passed (")  # no time is no failure
    assert f"{len(left)} not run" in verdict


@pytest.mark.slow
def test_gpu_suite_tells_a_stage_past_its_limit_from_one_cut_by_the_budget(tmp_path):
    """A command stopped at its own time limit has failed ("timed out"); one stopped earlier because the call's
    --budget ran out is "not run", to run in the next call. Real processes, stopped for real."""
    spec = importlib.util.spec_from_file_location("gpu_suite_limits", REPO / "benches" / "gpu_suite.py")
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
    args = lambda budget: argparse.Namespace(tiny=True, device="cpu", out=str(tmp_path / str(budget)),  # noqa: E731
                                             budget=budget, pack=None)
    assert suite.Suite(args(200)).run(sleep, cap=15) == (-1, "")
    with pytest.raises(suite.Skip) as cut:
        suite.Suite(args(26)).run(sleep, cap=100)
    assert cut.value.status == "not run" and "--budget" in cut.value.reason


def test_chess_play_chain_collects_real_evaluations(tmp_path):
    """The chain's table from two real `rookworld eval --out` files of the shipped model: the gain over the 'SFT'
    column, and A:'s next states by history length counted independently from the same positions."""
    from conftest import cli
    held_out = REPO / "data" / "chess-play-held-out.jsonl"
    evals = tmp_path / "evals"
    evals.mkdir()
    for name, model, size in (("small", "chess-cpu-grpo", "6"), ("larger", "chess-cpu-grpo", "10"),
                              ("other", "chess-cpu-sft", "8")):
        proc = cli("eval", "--model", str(REPO / "models" / model), "--data", str(held_out),
                   "--eval-size", size, "--device", "cpu", "--out", str(evals / f"{name}.held-out.json"))
        assert proc.returncode == 0, proc.stderr
    out = tmp_path / "chain.json"
    proc = run_bench("chess_play_chain.py", "--evals", str(evals), "--sft", "small", "--seeds", "larger", "other",
                     "--out", str(out))
    chain = json.loads(out.read_text())
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in proc.stdout.splitlines()[2:]}
    for name in ("small", "larger"):
        items = json.loads((evals / f"{name}.held-out.json").read_text())["suites"]["best-move"]["items"]
        alone = [i["fen_exact"] for i in items if i["task"] == "A" and len(i["prompt"].split("+")[2].split()) == 1]
        band = chain[name]["held-out"]["suites"]["history"]["sections"]["A"]["0"]
        assert band["n"] == len(alone) and band["exact"] == (sum(alone) / len(alone) if alone else None)
    legal = [chain[n]["held-out"]["suites"]["best-move"]["sections"]["P"]["legal_best_move"]
             for n in ("small", "larger", "other")]
    assert rows["P: legal best move"][-3].strip() == f"{100 * ((legal[1] + legal[2]) / 2 - legal[0]):+.1f}"
    # Each seed's gain on the prompts it shares with SFT (the first 6), and its standard error, by hand: the same
    # model greedy gives the same answers there (a gain of 0, an error of 0); the other model's differences vary.
    items = {n: {i["prompt"]: i for i in json.loads((evals / f"{n}.held-out.json").read_text())["suites"]
                 ["best-move"]["items"]} for n in ("small", "other")}
    diffs = [float(items["other"][p]["fen_exact"]) - float(items["small"][p]["fen_exact"])
             for p in items["small"] if items["small"][p]["task"] == "A"]
    mean = sum(diffs) / len(diffs)
    se = (sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs)) ** 0.5
    assert se > 0 and chain["larger"]["paired"]["A/next_state_exact"] == {"n": 6, "gain": 0, "se": 0}
    assert chain["other"]["paired"]["A/next_state_exact"]["n"] == 6
    assert chain["other"]["paired"]["A/next_state_exact"]["gain"] == pytest.approx(mean, abs=1e-12)
    assert chain["other"]["paired"]["A/next_state_exact"]["se"] == pytest.approx(se, abs=1e-12)
    assert rows["A: next state exact"][-1].strip(" |") == f"{100 * se / 2:.1f}"  # the mean of the seeds' errors
    assert rows["self-play: legal half-moves, greedy"][1].strip() == "-"  # no games file: shown as missing


def test_reward_spread_splits_quality_s_variance_by_part_by_hand():
    """Two groups of 2 answers, parts chosen so that each variance is known: group 1's best parts 1 and 0 (at weight
    0.5: 0.5 and 0, variance 0.0625), candidates equal; group 2 differs in candidates only (1 and 0: 0.3 and 0,
    variance 0.0225), with one answer without structure (NaN parts, quality 0)."""
    spec = importlib.util.spec_from_file_location("reward_spread", REPO / "benches" / "reward_spread.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    nan = float("nan")
    parts = {"best": np.array([1.0, 0.0, 0.0, nan]), "candidates": np.array([0.5, 0.5, 1.0, nan]),
             "evals": np.array([0.0, 0.0, 0.0, nan])}
    weights = bench.P_QUALITY_WEIGHTS
    parts["quality"] = np.array([sum(weights[k] * parts[k][i] for k in weights) for i in range(3)] + [nan])
    quality_var = (np.var(np.nan_to_num(parts["quality"][:2])) + np.var(np.nan_to_num(parts["quality"][2:]))) / 2
    shares = bench.variance_shares(parts, group=2)
    assert weights == {"best": 0.5, "candidates": 0.3, "evals": 0.2}  # docs/rewards.md's
    assert shares["best"] == pytest.approx((0.0625 + 0) / 2 / quality_var, abs=1e-12)
    assert shares["candidates"] == pytest.approx((0 + 0.0225) / 2 / quality_var, abs=1e-12)
    assert shares["evals"] == 0.0
