"""Everything a lent GPU is for, in one command: the CUDA tests, then every GPU benchmark, most important first,
inside a time budget, each result written under --out as soon as it exists, and one short table last.

A GPU is lent for 30 minutes of device time at most, 10 minutes a command, and what a command leaves running is
lost when it ends; so every stage runs as its own process with a timeout cut to what is left of --budget, a
stage that does not fit is listed as not run (with the command that runs the rest), and `suite.json` is
rewritten after every stage. Under --out: suite.json (every figure), suite.log (every stage's output) and the
learning chain's curves when that stage runs: few files, since the device tool returns at most 8.

Here, first: `mkdir -p .git/info && bash ../shared/tools/gpu-pack` (wheel, Stockfish, vocabulary into .gpu/), then
`bash benches/gpu_extras.sh` (the wheels the TRL baseline needs). On the device machine, with carry [".gpu"]:

    python3 benches/gpu_suite.py --pack .gpu --out $OUT                                   # first call, 9 min
    python3 benches/gpu_suite.py --pack .gpu --out $OUT --stages sft sft-eager auto-batch weights  # what is left
    python3 benches/gpu_suite.py --pack .gpu --out $OUT --stages learning                  # issue 13's chain

On a machine without a GPU (the CI smoke test): `python benches/gpu_suite.py --device cpu --tiny --out DIR`
runs every stage at a toy size; the CUDA tests skip themselves there.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCHES = REPO / "benches"
#: The goals of issue 10 and 13 (one H100, 124M model).
GOAL_SAMPLES_PER_S = 2000
GOAL_TOKENS_PER_S_AT_1024 = 200_000
GOAL_TRL_RATIO = 5.0
GOAL_SFT_MFU = 0.40


class Skip(Exception):
    """A stage that did not run: status "skipped" (it cannot run here) or "not run" (no time left), and why."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


class Suite:
    def __init__(self, args: argparse.Namespace):
        self.args, self.tiny, self.device = args, args.tiny, args.device
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="gpu_suite_"))  # run directories: they stay on the machine
        self.deadline = time.monotonic() + args.budget
        self.log = (self.out / "suite.log").open("a")
        self.results: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": sys.argv[1:], "stages": {}}
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        tmp = self.out / "suite.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=1, default=str) + "\n")
        tmp.replace(self.out / "suite.json")

    def run(self, cmd: list[str], cap: float, ok_codes: tuple[int, ...] = (0,)) -> tuple[int, str]:
        """Runs cmd with a timeout of min(cap, the budget left less a margin for the table); its output goes to
        suite.log. Returns (exit code, output); -1 when it was stopped at the timeout."""
        timeout = min(cap, self.left() - 10)
        if timeout < 15:
            raise Skip("not run", "out of time")
        self.log.write(f"\n$ {' '.join(cmd)}\n")
        self.log.flush()
        out_file = self.work / "last_output.txt"
        with out_file.open("w") as sink:
            # Its own process group, so that a timeout also stops what it started (Stockfish, compile workers).
            proc = subprocess.Popen(cmd, cwd=REPO, env=self.env, stdout=sink, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = -1
        text = out_file.read_text(errors="replace")
        self.log.write(text + (f"\n(stopped after {timeout:.0f} s)\n" if code == -1 else f"\n(exit {code})\n"))
        self.log.flush()
        return code, text


def python() -> list[str]:
    return [sys.executable]


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _failed(code: int, text: str) -> str:
    if code == -1:
        return "timed out"
    return f"failed (exit {code}): " + (text.strip().splitlines() or [""])[-1][:160]


# -- stages ---------------------------------------------------------------------------------------------------
# Each returns (status, figures, one-line summary); Skip says why it did not run.


def stage_env(s: Suite) -> tuple[str, dict, str]:
    import torch

    f = {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
         "cuda": torch.cuda.is_available(), "device": s.device}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        f.update(gpu=props.name, gpu_memory_gib=props.total_memory / 2**30, sms=props.multi_processor_count,
                 capability=f"{props.major}.{props.minor}")
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True)
        f["nvidia_smi"] = smi.stdout.strip()
    f["commit"] = source_commit(s.args.pack)
    for name in ("ROOKWORLD_STOCKFISH", "ROOKWORLD_TIKTOKEN_FILE"):
        f[name] = os.environ.get(name)
    return "ok", f, f"{f.get('gpu', 'no GPU')}, torch {f['torch']}, {f['cpus']} CPUs, commit {f['commit']}"


def source_commit(pack: Path | None) -> str | None:
    """The commit of the tree being measured: from git where the tree is a checkout, else the one gpu_extras.sh
    stamped into the pack (the device machine gets a copy of the tree without .git), marked as such."""
    if shutil.which("git"):
        git = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=REPO,
                             capture_output=True, text=True)
        if git.returncode == 0 and git.stdout.strip():
            return git.stdout.strip()
    stamp = pack / "commit" if pack is not None else None
    commit = stamp.read_text().strip() if stamp is not None and stamp.is_file() else ""
    return f"{commit} (pack)" if commit else None


def stage_cuda_tests(s: Suite) -> tuple[str, dict, str]:
    # One process (not pyproject's -n auto): the CUDA tests share one GPU, and pytest-xdist may not be installed here.
    code, text = s.run(python() + ["-m", "pytest", "-m", "cuda", "tests/test_cuda.py", "-q", "-rfEs",
                                   "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "addopts=", "--durations=5"],
                       cap=300)
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", text.splitlines()[-1]
                                                 if text.strip() else "")}
    f = {**counts, "failures": re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)}
    summary = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no summary"
    if code == -1:
        return "timed out", f, summary
    return ("ok" if code == 0 else f"failed (exit {code})"), f, summary


def _grpo_step(s: Suite, name: str, extra: list[str], cap: float) -> tuple[str, dict, str]:
    path = s.work / f"{name}.json"
    tiny = ["--device", "cpu", "--tiny", "--prompts", "2", "--group", "2", "--p-len", "4", "--a-len", "8",
            "--steps", "1", "--warmup", "1", "--stockfish-depth", "4"] if s.tiny else []
    code, text = s.run(python() + [str(BENCHES / "grpo_step.py"), *tiny, *extra, "--json", str(path)], cap=cap)
    f = _json(path)
    if code != 0 or f is None:
        return _failed(code, text), f or {}, ""
    mfu = "n/a" if f["mfu"] is None else f"{100 * f['mfu']:.1f}%"
    return "ok", f, (f"{f['samples_per_s']:,.0f} samples/s, {f['generated_tokens_per_s']:,.0f} generated tok/s, "
                     f"MFU {mfu}, {f['peak_memory_gb']:.1f} GB")


def stage_grpo_step(s: Suite) -> tuple[str, dict, str]:
    return _grpo_step(s, "grpo_step", [], cap=200)


def stage_grpo_step_u64(s: Suite) -> tuple[str, dict, str]:
    return _grpo_step(s, "grpo_step_u64", ["--uniform-length", "4" if s.tiny else "64"], cap=150)


def stage_every_prompt(s: Suite) -> tuple[str, dict, str]:
    """The default GRPO step with every row's prompt computed (--no-shared-prompt), beside grpo-step's shared one."""
    status, f, summary = _grpo_step(s, "grpo_step_every_prompt", ["--no-shared-prompt"], cap=200)
    shared = s.results["stages"].get("grpo-step", {}).get("figures", {}).get("samples_per_s")
    if shared and f.get("samples_per_s"):
        summary += f"; each prompt once is {shared / f['samples_per_s']:.2f}x"
    return status, f, summary


def stage_fused_head(s: Suite) -> tuple[str, dict, str]:
    """Forward + backward of the log-prob pass: the fused pass over the vocabulary against checkpointed chunks."""
    path = s.work / "fused_head.json"
    sizes = ["--device", "cpu", "--batch-sizes", "3", "--prompt-len", "3", "5", "--new-tokens", "2", "4",
             "--repeats", "1", "--warmup", "0", "--threads", "1"] if s.tiny else ["--batch-sizes", "64", "256"]
    code, text = s.run(python() + [str(BENCHES / "generate.py"), *sizes, "--backward", "--json", str(path)], cap=200)
    f = _json(path) or {}
    rows = [r for r in f.get("rows", []) if "checkpointed_forward_backward_tokens_per_s" in r]
    if not rows:
        return _failed(code, text), f, ""
    r = rows[-1]
    fused, plain = r["forward_backward_tokens_per_s"], r["checkpointed_forward_backward_tokens_per_s"]
    return "ok", f, (f"{r['task']} batch {r['batch']}: fused {fused:,.0f} tok/s, checkpointed {plain:,.0f} "
                     f"({fused / plain:.2f}x)")


def stage_generate(s: Suite) -> tuple[str, dict, str]:
    path = s.work / "generate.json"
    sizes = ["--device", "cpu", "--batch-sizes", "3", "--prompt-len", "3", "5", "--new-tokens", "2", "4",
             "--repeats", "1", "--warmup", "0", "--threads", "1"] if s.tiny else ["--batch-sizes", "64", "256",
                                                                                 "1024", "2048"]
    code, text = s.run(python() + [str(BENCHES / "generate.py"), *sizes, "--json", str(path)], cap=240)
    f = _json(path) or {}
    rows = [r for r in f.get("rows", []) if "generated_tokens_per_s" in r]
    if not rows:
        return _failed(code, text), f, ""
    best = max(rows, key=lambda r: (r["batch"] == (3 if s.tiny else 1024), r["generated_tokens_per_s"]))
    floor = best.get("decode_floor_tokens_per_s")
    summary = (f"{best['task']}: batch {best['batch']} {best['decode']}: {best['generated_tokens_per_s']:,.0f} tok/s"
               + (f" ({100 * best['generated_tokens_per_s'] / floor:.0f}% of the bandwidth floor)" if floor else ""))
    return ("ok" if code == 0 else f"partial ({len(rows)} rows): " + _failed(code, text)), f, summary


def stage_sampler(s: Suite) -> tuple[str, dict, str]:
    path = s.work / "sampler.json"
    sizes = ["--device", "cpu", "--batch-sizes", "2", "--repeats", "1", "--threads", "1"] if s.tiny else []
    code, text = s.run(python() + [str(BENCHES / "sampler.py"), *sizes, "--json", str(path)], cap=90)
    f = _json(path)
    if code != 0 or f is None:
        return _failed(code, text), f or {}, ""
    r = next((r for r in f["rows"] if r["batch"] == 1024), f["rows"][-1])
    return "ok", f, (f"batch {r['batch']}: eager {1e3 * r['eager_s']:.2f} ms, compiled {1e3 * r['compiled_s']:.2f} ms "
                     f"({r['eager_s'] / r['compiled_s']:.1f}x); one logits copy {1e3 * r['logits_copy_s']:.2f} ms")


def stage_decode_cache(s: Suite) -> tuple[str, dict, str]:
    path = s.work / "decode_cache.json"
    sizes = ["--device", "cpu", "--batch-sizes", "2", "--prompt-len", "3", "5", "--new-tokens", "2", "4",
             "--repeats", "2", "--threads", "1"] if s.tiny else []
    code, text = s.run(python() + [str(BENCHES / "decode_cache.py"), *sizes, "--json", str(path)], cap=90)
    f = _json(path)
    if code != 0 or f is None:
        return _failed(code, text), f or {}, ""
    r = next((r for r in f["rows"] if r["task"] == "P" and r["batch"] == 1024), f["rows"][0])
    return "ok", f, (f"{r['task']}: batch {r['batch']}: {r['bucket_slots']}-slot cache {r['bucket_ms']:.2f} ms, "
                     f"live {r['live_slots']} {r['live_ms']:.2f} ms a step")


def stage_weights(s: Suite) -> tuple[str, dict, str]:
    """Compiled decoding at batch 1,024 with fp32 weights under autocast (every step casts every weight again)
    against their autocast copy (Linear weights stored in bf16), as the trainer now samples."""
    sizes = (["--device", "cpu", "--dtype", "bfloat16", "--no-compile", "--batch-sizes", "3", "--prompt-len", "3", "5",
              "--new-tokens", "2", "4", "--repeats", "1", "--warmup", "0", "--threads", "1"] if s.tiny
             else ["--compile", "--batch-sizes", "1024"])
    f: dict = {}
    for weights in ("fp32", "copy"):
        path = s.work / f"generate_{weights}.json"
        code, text = s.run(python() + [str(BENCHES / "generate.py"), *sizes, "--no-logprobs", "--weights", weights,
                                       "--json", str(path)], cap=120)
        f[weights] = _json(path) or {}
        if code != 0:
            return _failed(code, text), f, ""
    rate = {w: {r["task"]: r["generated_tokens_per_s"] for r in f[w].get("rows", []) if "generated_tokens_per_s" in r}
            for w in ("fp32", "copy")}
    f["copy_over_fp32"] = {t: rate["copy"][t] / rate["fp32"][t] for t in rate["copy"] if t in rate["fp32"]}
    return "ok", f, "; ".join(f"{t}: fp32 {rate['fp32'][t]:,.0f}, copy {rate['copy'][t]:,.0f} tok/s ({x:.2f}x)"
                              for t, x in f["copy_over_fp32"].items())


def stage_trl(s: Suite) -> tuple[str, dict, str]:
    probe = subprocess.run(python() + ["-c", "import trl, datasets"], capture_output=True, text=True, env=s.env)
    if probe.returncode:
        raise Skip("skipped", "trl/datasets do not import (" + (probe.stderr.strip().splitlines() or ["?"])[-1][:120]
                   + "); carry them: benches/gpu_extras.sh")
    path = s.work / "trl.json"
    tiny = ["--device", "cpu", "--tiny", "--prompts", "2", "--group", "2", "--length", "4", "--steps", "1",
            "--warmup", "1", "--micro-batch-size", "4", "--stockfish-depth", "4"] if s.tiny else ["--length", "64"]
    code, text = s.run(python() + [str(BENCHES / "trl_baseline.py"), *tiny, "--json", str(path)], cap=240)
    f = _json(path)
    if code != 0 or f is None:
        return _failed(code, text), f or {}, ""
    ours = s.results["stages"].get("grpo-step-u64", {}).get("figures", {}).get("samples_per_s")
    if ours:
        f["rookworld_over_trl"] = ours / f["samples_per_s"]
    return "ok", f, (f"{f['samples_per_s']:,.1f} samples/s"
                     + (f"; rookworld at the same work: {f['rookworld_over_trl']:.1f}x" if ours else ""))


def _sft(s: Suite, name: str, data: Path, extra: list[str], steps: int) -> tuple[str, dict, str]:
    """`rookworld sft` of the 124M model (a 2-layer one with --tiny) on `data`, packed 1,024-token rows; its
    tokens/s and MFU are medians of the last two thirds of the steps (the first ones compile)."""
    out = s.work / name
    size = (["--init", "tiny", "--steps", "3", "--rows-per-step", "4", "--micro-batch-size", "2", "--seq-len", "256"]
            if s.tiny else ["--init", "small", "--steps", str(steps), "--rows-per-step", "128",
                            "--micro-batch-size", "32", "--seq-len", "1024"])
    code, text = s.run(python() + ["-m", "rookworld", "sft", *size, "--pack", "--data", str(data), "--output-dir",
                                   str(out), "--overwrite", "--eval-every", "0", "--save-every", "0",
                                   "--warmup-steps", "0", "--device", s.device, *extra], cap=180)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()] \
        if (out / "metrics.jsonl").is_file() else []
    if code != 0 or not rows:
        return _failed(code, text), {}, ""
    steady = rows[len(rows) // 3:] or rows
    f = {"steps": len(rows), "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady),
         "mfu": statistics.median(r["mfu"] for r in steady) if "mfu" in rows[-1] else None,
         "peak_memory_gb": max(r["peak_memory_gb"] for r in rows), "loss_first": rows[0]["loss"],
         "loss_last": rows[-1]["loss"], "model_dir": str(out), "data": str(data)}
    mfu = "n/a" if f["mfu"] is None else f"{100 * f['mfu']:.1f}%"
    return "ok", f, f"{f['tokens_per_s']:,.0f} tokens/s, MFU {mfu}, loss {f['loss_first']:.2f} -> {f['loss_last']:.2f}"


def stage_sft(s: Suite) -> tuple[str, dict, str]:
    data = s.work / "sft_data.jsonl"
    count, depth = ("16", "2") if s.tiny else ("4000", "4")
    code, text = s.run(python() + ["-m", "rookworld", "positions", "--count", count, "--seed", "7", "--annotate",
                                   "--stockfish-depth", depth, "--out", str(data), "--quiet"], cap=90)
    if code != 0:
        return "positions " + _failed(code, text), {}, ""
    return _sft(s, "sft", data, [], steps=30)


def stage_sft_eager(s: Suite) -> tuple[str, dict, str]:
    """The same SFT without torch.compile: what compiling the trunk and the log-softmax gains a training step."""
    compiled = s.results["stages"].get("sft", {}).get("figures", {})
    if not compiled.get("data"):
        raise Skip("skipped", "needs the sft stage's data and figures (run sft in the same call)")
    status, f, summary = _sft(s, "sft_eager", Path(compiled["data"]), ["--no-compile"], steps=15)
    if status == "ok":
        f["compiled_over_eager"] = compiled["tokens_per_s"] / f["tokens_per_s"]
        # Runs compile only on CUDA: elsewhere both were eager, and the ratio is the noise between two runs.
        label = "compiled" if s.device.startswith("cuda") else "sft over this (both eager off CUDA)"
        summary += f"; {label} {f['compiled_over_eager']:.2f}x"
    return status, f, summary


def stage_auto_batch(s: Suite) -> tuple[str, dict, str]:
    model = s.results["stages"].get("sft", {}).get("figures", {}).get("model_dir")
    if not model or not Path(model, "config.json").is_file():
        raise Skip("skipped", "needs the sft stage's model (run sft in the same call)")
    out = s.work / "auto_batch"
    code, text = s.run(python() + ["-m", "rookworld", "train", "--model", model, "--output-dir", str(out),
                                   "--overwrite", "--auto-batch", "--prompts-per-step", "2" if s.tiny else "32",
                                   "--auto-batch-max", "4" if s.tiny else "1024", "--steps", "1", "--eval-every",
                                   "0", "--save-every", "0", "--device", s.device], cap=240)
    if s.device == "cpu" and "needs a CUDA device" in text:
        raise Skip("skipped", "--auto-batch needs CUDA (the command was refused, as it should be)")
    probes = [{"prompts": int(p), "completions": int(c), "result": r}
              for p, c, r in re.findall(r"auto-batch: (\d+) prompts x \d+ = (\d+) completions: (.*)", text)]
    chosen = re.findall(r"auto-batch: training with (\d+) prompts", text)
    f = {"probes": probes, "chosen": int(chosen[0]) if chosen else None}
    if code != 0 or not chosen:
        return _failed(code, text), f, ""
    return "ok", f, f"{f['chosen']} prompts per step ({len(probes)} probes)"


def stage_learning(s: Suite) -> tuple[str, dict, str]:
    out = s.work / "learning"
    size = ["--smoke"] if s.tiny else [
        # Sized to finish in one call (estimated, not yet timed: about 6 minutes on an H100 with 16 cores).
        "--init", "small", "--layers", "12", "--heads", "12", "--train-positions", "12000", "--eval-positions", "300",
        "--depth", "8", "--sft-steps", "1000", "--rows-per-step", "64", "--sft-lr", "3e-4", "--grpo-steps", "40",
        "--prompts", "64", "--group", "16", "--grpo-lr", "1e-5", "--eval-every", "10", "--seeds", "0", "1"]
    code, text = s.run(python() + [str(BENCHES / "learning.py"), "--out", str(out), "--device", s.device, *size],
                       cap=560)
    f = _json(out / "learning.json")
    for png in ("grpo_curves.png", "sft_curves.png"):
        if (out / png).is_file():
            shutil.copy(out / png, s.out / f"learning_{png}")
    if code != 0 or f is None:
        return _failed(code, text), f or {}, ""
    table = text[text.rfind("held-out positions:"):]
    f["table"] = table
    gain = [line for line in table.splitlines() if "mean reward" in line]
    return "ok", f, "; ".join(f"{g.split()[0]} {g.split()[-2]}" for g in gain) + " (mean reward gain)"


STAGES: dict[str, Callable[[Suite], tuple[str, dict, str]]] = {
    "env": stage_env, "cuda-tests": stage_cuda_tests, "grpo-step": stage_grpo_step, "generate": stage_generate,
    "sampler": stage_sampler, "decode-cache": stage_decode_cache, "grpo-step-u64": stage_grpo_step_u64,
    "trl": stage_trl, "sft": stage_sft, "sft-eager": stage_sft_eager, "auto-batch": stage_auto_batch,
    "weights": stage_weights, "learning": stage_learning, "every-prompt": stage_every_prompt,
    "fused-head": stage_fused_head,
}
#: The stages a plain call runs, most important first; `learning` needs a call of its own.
DEFAULT = ["env", "cuda-tests", "grpo-step", "every-prompt", "fused-head", "generate", "sampler", "decode-cache",
           "grpo-step-u64", "trl", "sft", "sft-eager", "auto-batch", "weights"]


def unpack(pack: Path) -> None:
    """Installs what gpu-pack and gpu_extras.sh put in `pack` (the device machine has no registry and no Rust)
    and points rookworld at its Stockfish and vocabulary."""
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--disable-pip-version-check",
           "--force-reinstall"]
    ours = sorted(glob.glob(str(pack / "wheels" / "*.whl")))
    if ours:
        subprocess.run(pip + ours, check=True)
    extra = sorted(glob.glob(str(pack / "extra" / "*.whl")))
    # Only the TRL baseline needs these (built for the GPU machine's Python 3.12): without them, it is skipped.
    if extra and subprocess.run(pip + extra).returncode:
        print("gpu suite: the extra wheels did not install; the trl stage will say why", file=sys.stderr)
    packed = pack / "stockfish.xz"
    if packed.is_file():
        import lzma

        binary = pack / "stockfish"
        with lzma.open(packed) as src, binary.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        binary.chmod(0o755)
        os.environ["ROOKWORLD_STOCKFISH"] = str(binary.resolve())
    if (pack / "gpt2.tiktoken").is_file():
        os.environ["ROOKWORLD_TIKTOKEN_FILE"] = str((pack / "gpt2.tiktoken").resolve())


def table(s: Suite, order: list[str]) -> str:
    lines = [f"{'stage':<14} {'status':<12} {'s':>5}  figures", "-" * 100]
    for name in order:
        r = s.results["stages"].get(name)
        if r is None:
            continue
        status = r["status"] if len(r["status"]) <= 12 else r["status"][:11] + "~"
        lines.append(f"{name:<14} {status:<12} {r['seconds']:>5.0f}  {r['summary'] or r['status']}")
    goals = s.results.get("goals")
    if goals:
        toy = " (toy sizes: not the goals' work)" if s.tiny else ""
        lines.append(f"goals{toy}: " + "; ".join(f"{k} {v}" for k, v in goals.items()))
    left = [n for n in order if s.results["stages"].get(n, {}).get("status") == "not run"]
    if left:
        lines.append("not run for want of time; next call: python3 benches/gpu_suite.py --pack .gpu --out $OUT "
                     f"--stages {' '.join(left)}")
    return "\n".join(lines)


def goals(s: Suite) -> dict[str, str]:
    st = {k: v.get("figures", {}) for k, v in s.results["stages"].items()}
    verdict = lambda got, goal, fmt: f"{fmt.format(got)} ({'met' if got >= goal else 'missed'})"  # noqa: E731
    g = {}
    if "samples_per_s" in st.get("grpo-step", {}):
        g[f">= {GOAL_SAMPLES_PER_S} samples/s:"] = verdict(st["grpo-step"]["samples_per_s"], GOAL_SAMPLES_PER_S,
                                                          "{:,.0f}")
    rows = [r for r in st.get("generate", {}).get("rows", []) if r.get("batch") == 1024 and
            "generated_tokens_per_s" in r]
    if rows:
        best = max(r["generated_tokens_per_s"] for r in rows)
        g[f">= {GOAL_TOKENS_PER_S_AT_1024:,} tok/s at batch 1024:"] = verdict(best, GOAL_TOKENS_PER_S_AT_1024,
                                                                              "{:,.0f}")
    if "rookworld_over_trl" in st.get("trl", {}):
        g[f">= {GOAL_TRL_RATIO:.0f}x TRL:"] = verdict(st["trl"]["rookworld_over_trl"], GOAL_TRL_RATIO, "{:.1f}x")
    if st.get("sft", {}).get("mfu") is not None:
        g[f"SFT MFU >= {GOAL_SFT_MFU:.0%}:"] = verdict(st["sft"]["mfu"], GOAL_SFT_MFU, "{:.1%}")
    return g


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu_suite_out", help="where suite.json and suite.log "
                    "go (default $OUT)")
    ap.add_argument("--pack", type=Path, default=None, help="the .gpu folder of gpu-pack: install and use it first")
    ap.add_argument("--budget", type=float, default=540, help="seconds for every stage together (default 540: "
                    "a 10-minute command with room for the install and the transfers)")
    ap.add_argument("--stages", nargs="+", choices=list(STAGES), default=None,
                    help=f"stages to run, in this order (default: {' '.join(DEFAULT)})")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="toy sizes (with --device cpu: the CI smoke test)")
    args = ap.parse_args()
    if args.pack is not None:
        unpack(args.pack)
    suite = Suite(args)
    order = args.stages or DEFAULT
    if "env" not in order:
        order = ["env", *order]
    print(f"gpu suite: {' '.join(order)}; budget {args.budget:.0f} s; results in {suite.out}", flush=True)
    for name in order:
        t0 = time.monotonic()
        try:
            status, figures, summary = STAGES[name](suite)
        except Skip as why:
            status, figures, summary = why.status, {}, why.reason
        except Exception as e:  # a broken stage must not cost the stages after it
            status, figures, summary = f"error: {type(e).__name__}: {e}", {}, ""
        suite.results["stages"][name] = {"status": status, "seconds": time.monotonic() - t0, "figures": figures,
                                         "summary": summary}
        suite.results["goals"] = goals(suite)
        suite.save()
        print(f"== {name}: {status} in {time.monotonic() - t0:.0f} s{': ' + summary if summary else ''}", flush=True)
    print("\n" + table(suite, order), flush=True)
    shutil.rmtree(suite.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
