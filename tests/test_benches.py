"""The benchmarks run (as CPU smoke checks with tiny models or tiny batches) and report what they promise."""

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_bench(script: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(REPO / "benches" / script), *args], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


@pytest.mark.parametrize("objective", [[], ["--kl-estimator", "full", "--advantage", "gae"]], ids=["k3", "full-gae"])
def test_grpo_step_benchmark_smoke(tmp_path, objective):
    out = tmp_path / "figures.json"
    proc = run_bench("grpo_step.py", "--device", "cpu", "--tiny", "--prompts", "2", "--group", "2", "--p-len", "4",
                     "--a-len", "8", "--steps", "1", "--warmup", "1", "--stockfish-depth", "4", "--json", str(out),
                     *objective)
    figures = json.loads(out.read_text())
    assert figures["samples_per_s"] > 0 and figures["generated_tokens_per_s"] > 0
    for phase in ("generate_s", "reward_s", "reference_s", "update_s"):
        assert figures[phase] >= 0
    assert figures["lengths"] == {"P": 4, "A": 8}
    assert "samples/s" in proc.stdout and "MFU" in proc.stdout
    assert 0 <= figures["update_padding"] < 1 and "update padding" in proc.stdout
    assert figures["kl_estimator"] == ("full" if objective else "k3")


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


def test_sampler_benchmark_smoke(tmp_path):
    out = tmp_path / "sampler.json"
    proc = run_bench("sampler.py", "--device", "cpu", "--batch-sizes", "2", "--repeats", "1", "--threads", "1",
                     "--json", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in rows] == [2] and rows[0]["eager_s"] > 0 and rows[0]["compiled_s"] > 0
    assert "speed-up" in proc.stdout


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


def test_trl_baseline_smoke(tmp_path):
    pytest.importorskip("trl", reason="TRL is only needed for the side-by-side benchmark")
    pytest.importorskip("datasets")
    out = tmp_path / "trl.json"
    run_bench("trl_baseline.py", "--device", "cpu", "--tiny", "--prompts", "2", "--group", "2", "--length", "4",
              "--steps", "1", "--warmup", "1", "--micro-batch-size", "4", "--stockfish-depth", "4", "--json", str(out))
    figures = json.loads(out.read_text())
    assert figures["samples_per_s"] > 0 and len(figures["step_times"]) == 2


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


def test_gpu_suite_smoke(tmp_path):
    """The one command for a lent GPU, at toy sizes on the CPU: every stage runs or says why not, suite.json holds
    the figures of each, and the table comes last (the device tool returns only the end of the output)."""
    out = tmp_path / "suite"
    proc = run_bench("gpu_suite.py", "--device", "cpu", "--tiny", "--out", str(out), "--budget", "500")
    results = json.loads((out / "suite.json").read_text())
    stages = results["stages"]
    assert list(stages) == ["env", "cuda-tests", "grpo-step", "every-prompt", "fused-head", "generate", "sampler",
                            "decode-cache", "grpo-step-u64", "trl", "sft", "sft-eager", "auto-batch", "weights"]
    for name in ("env", "grpo-step", "every-prompt", "fused-head", "generate", "sampler", "decode-cache",
                 "grpo-step-u64", "sft", "sft-eager", "weights"):
        assert stages[name]["status"] == "ok", (name, stages[name])
    assert stages["cuda-tests"]["status"] == "ok" and stages["cuda-tests"]["figures"]["skipped"] >= 5
    assert stages["grpo-step"]["figures"]["samples_per_s"] > 0
    assert stages["generate"]["figures"]["rows"][0]["generated_tokens_per_s"] > 0
    assert stages["every-prompt"]["figures"]["shared_prompt"] is False and stages["grpo-step"]["figures"]["shared_prompt"]
    assert stages["fused-head"]["figures"]["rows"][0]["checkpointed_forward_backward_tokens_per_s"] > 0
    assert stages["sft"]["figures"]["tokens_per_s"] > 0
    assert stages["sft-eager"]["figures"]["compiled_over_eager"] > 0
    assert stages["decode-cache"]["figures"]["rows"][0]["bucket_ms"] > 0
    assert set(stages["weights"]["figures"]["copy_over_fp32"]) == {"P", "A"}
    assert stages["env"]["figures"]["commit"]  # a checkout: git names it
    assert stages["auto-batch"]["status"] == "skipped" and "needs CUDA" in stages["auto-batch"]["summary"]
    if importlib.util.find_spec("trl"):
        assert stages["trl"]["figures"]["rookworld_over_trl"] > 0
    assert (out / "suite.log").read_text().count("$ ") >= 6
    tail = proc.stdout.strip().splitlines()
    assert tail[0].startswith("gpu suite:") and any(line.startswith("grpo-step ") for line in tail[-18:])


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
    """With too little time left, stages are listed as not run and the table names the call that runs them."""
    out = tmp_path / "suite"
    proc = run_bench("gpu_suite.py", "--device", "cpu", "--tiny", "--out", str(out), "--budget", "20",
                     "--stages", "generate", "sft")
    stages = json.loads((out / "suite.json").read_text())["stages"]
    assert stages["sft"]["status"] == "not run" and stages["sft"]["summary"] == "out of time"
    assert "--stages" in proc.stdout.splitlines()[-1] and proc.stdout.splitlines()[-1].endswith("sft")
