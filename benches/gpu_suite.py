"""rookworld on a GPU lent 15 minutes at a time (start-up included, at most 10 minutes a command, a fresh machine
each time): one command per call, each within --budget seconds of stages (the call's own: 480 for a slot's first
command, 200 for its second), each stage as its own process under a time limit of its own. The first call ends
with the GRPO step's speed: the eager step and TRL's beside it first, then the compiled step with the time left.

Under --out: suite.json (every stage's status and figures, rewritten after each stage and, while
benches/grpo_step.py runs, after each of its steps, so that a command cut off still leaves its numbers), suite.log
(every command and its output) and the learning chain's curves when it runs. The output ends with a table and a
verdict line, and the exit status is the verdict: 0 when every stage that ran passed, 1 when one failed (a command
that exited non-zero or ran past its limit, a check that did not hold, a CUDA test that failed). A stage this
machine cannot run ("skipped", e.g. --auto-batch without CUDA), one that did not fit in what was left of --budget
("not run") and one the budget cut off after some figures ("partial: ...", its figures kept) are no failure; the
last two are listed in a ready command for the next call.

Where rookworld is installed (`pip install -e '.[test,bench]'`), `python benches/gpu_suite.py --call 1` runs the
first call. On a machine without network or Rust, `--pack DIR` first installs the wheel, Stockfish and vocabulary
packed there (BENCHMARKS.md, "How to take the GPU figures", says how to make it). Without a GPU,
`python benches/gpu_suite.py --device cpu --tiny` runs every stage at toy sizes (CI's smoke test).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
BENCHES = REPO / "benches"
#: The goals of issue 10 and 13 (one H100, 124M model).
GOAL_SAMPLES_PER_S = 2000
GOAL_TOKENS_PER_S_AT_1024 = 200_000
GOAL_TRL_RATIO = 5.0
GOAL_SFT_MFU = 0.40


class Skip(Exception):
    """A stage that did not run: status "skipped" (it cannot run here) or "not run" (no time left), and why; `output`
    is what its command printed before the budget stopped it, for a stage that can still read figures from it."""

    def __init__(self, status: str, reason: str, output: str = ""):
        super().__init__(reason)
        self.status, self.reason, self.output = status, reason, output


class Failed(Exception):
    """A stage that failed before its own figures: what it needed (a model to train) could not be made."""


#: cuda-tests' own limit, within a 480 s call after env. On an H100 (2026-11-26) its first 15 tests took under
#: 360 s together, most of it compiling, and the 16th (a compiled --auto-batch search) did not end in the time left.
CUDA_TESTS_CAP = 450
#: The statuses that are no failure, with "partial: ..." (passed): the exit status is 1 as soon as a stage ends
#: with any other.
PASSING = ("ok", "skipped", "not run")
#: How often a running command's partial figures are read into suite.json: a step of the GRPO bench takes seconds.
POLL_S = 3


def passed(status: str) -> bool:
    """No failure: "partial: ..." is a stage the call's --budget cut off after some figures, which says no more
    about the stage than "not run" does."""
    return status in PASSING or status.startswith("partial:")


def unfinished(status: str) -> bool:
    """What the next call should run again: it did not run, or the budget cut it off."""
    return status == "not run" or status.startswith("partial:")


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
        self.model: Path | None = None  # made once, by the first stage that trains one
        self.stage, self.stage_started = "", time.monotonic()  # the stage running now, for progress()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        tmp = self.out / "suite.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=1, default=str) + "\n")
        tmp.replace(self.out / "suite.json")

    def progress(self, figures: dict, summary: str) -> None:
        """The running stage's figures so far into suite.json (status "running"): if the whole command is stopped
        from outside, they are what is left."""
        self.results["stages"][self.stage] = {"status": "running", "seconds": time.monotonic() - self.stage_started,
                                              "figures": figures, "summary": summary}
        self.save()

    def run(self, cmd: list[str], cap: float, need: float = 15,
            watch: Callable[[], None] | None = None) -> tuple[int, str]:
        """Runs cmd with a timeout of min(cap, the budget left less a margin for the table); its output goes to
        suite.log, and `watch` runs every POLL_S seconds meanwhile and once after. Returns (exit code, output); -1
        when it ran past `cap`, its own limit. Stopped earlier by the budget, it raises Skip("not run") with the
        output: running out of the call's time says nothing about the stage. Nor does it start with less than
        `need` seconds left, which would only spend them."""
        timeout = min(cap, self.left() - 10)
        if timeout < need:
            raise Skip("not run", "out of time" if timeout < 15 else f"needs {need:.0f} s, {timeout:.0f} s left")
        self.log.write(f"\n$ {' '.join(cmd)}\n")
        self.log.flush()
        out_file = self.work / "last_output.txt"
        with out_file.open("w") as sink:
            # Its own process group, so that a timeout also stops what it started (Stockfish, compile workers).
            proc = subprocess.Popen(cmd, cwd=REPO, env=self.env, stdout=sink, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            code = _wait(proc, timeout, watch)
        text = out_file.read_text(errors="replace")
        self.log.write(text + (f"\n(stopped after {timeout:.0f} s)\n" if code == -1 else f"\n(exit {code})\n"))
        self.log.flush()
        if code == -1 and timeout < cap:
            raise Skip("not run", f"stopped at the end of --budget after {timeout:.0f} s (its own limit: {cap:.0f} s)",
                       output=text)
        return code, text


def _wait(proc: subprocess.Popen, timeout: float, watch: Callable[[], None] | None) -> int:
    """proc's exit code, or -1 once `timeout` has passed (its process group killed first). One blocking wait would
    leave suite.json without the figures a long command writes as it goes."""
    end = time.monotonic() + timeout
    code = None
    while code is None:
        try:
            code = proc.wait(timeout=max(0.0, min(POLL_S, end - time.monotonic())))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= end:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = -1
            elif watch is not None:
                watch()
    if watch is not None:
        watch()  # what it wrote last, at its end or as it was stopped
    return code


def python() -> list[str]:
    return [sys.executable]


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _failed(code: int, text: str) -> str:
    """A failed command's status: its first Python exception (what went wrong first; an error while the process
    shuts down may follow it), else its last line."""
    if code == -1:
        return "timed out"
    errors = re.findall(r"^[\w.]*(?:Error|Exception|Exit|Interrupt)(?::.*|$)", text, re.M)
    return f"failed (exit {code}): " + (errors or text.strip().splitlines() or [""])[0 if errors else -1][:160]


# -- stages ---------------------------------------------------------------------------------------------------
# Each returns (status, figures, one-line summary); Skip says why it did not run.


def stage_env(s: Suite) -> tuple[str, dict, str]:
    """The machine: GPU, driver, torch, cores, the card's bf16 peak (MFU's denominator) and the commit measured."""
    import torch

    from rookworld.net.device import peak_tflops

    f = {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
         "cuda": torch.cuda.is_available(), "device": s.device}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        f.update(gpu=props.name, gpu_memory_gib=props.total_memory / 2**30, sms=props.multi_processor_count,
                 capability=f"{props.major}.{props.minor}", peak_bf16_tflops=peak_tflops(props.name))
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True)
        f["nvidia_smi"] = smi.stdout.strip()
    f["commit"] = source_commit(s.args.pack)
    for name in ("ROOKWORLD_STOCKFISH", "ROOKWORLD_TIKTOKEN_FILE"):
        f[name] = os.environ.get(name)
    peak = "" if "gpu" not in f else (f", bf16 peak {f['peak_bf16_tflops']} TFLOP/s" if f["peak_bf16_tflops"]
                                       else ", bf16 peak unknown (no MFU)")
    return "ok", f, f"{f.get('gpu', 'no GPU')}{peak}, torch {f['torch']}, {f['cpus']} CPUs, commit {f['commit']}"


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


#: cuda-core's choice of the CUDA tests, for a slot's second command: compiled decoding replayed as CUDA graphs
#: (the smallest and the largest of its four shapes) and the compiled draw, which the GRPO step's sampling runs,
#: then train, --auto-batch and sft as processes. Not yet timed together; on the H100 of 2026-11-26 the first 15
#: CUDA tests took under 360 s, most of it compiling.
CUDA_CORE = ("compiled_decode_equals_eager and ([20-8] or [120-96]) or compiled_sampling_draws or train_three_steps "
             "or auto_batch_chooses or sft_on_cuda")


def stage_cuda_tests(s: Suite) -> tuple[str, dict, str]:
    """pytest -m cuda tests/test_cuda.py tests/test_distributed.py: compiled decoding replayed as CUDA graphs, bf16
    against float64, rookworld train, sft and --auto-batch as processes on CUDA, and what --auto-batch leaves. A
    run where every test skipped fails on CUDA."""
    return _cuda_tests(s, [], cap=CUDA_TESTS_CAP)


def stage_cuda_core(s: Suite) -> tuple[str, dict, str]:
    """The CUDA tests that matter most, cut off at 190 s: compiled decoding against eager (two of its four shapes)
    and the compiled draw, then rookworld train, --auto-batch and sft as processes on CUDA (pytest -m cuda -k)."""
    return _cuda_tests(s, ["-k", CUDA_CORE], cap=190)


def _cuda_tests(s: Suite, select: list[str], cap: float) -> tuple[str, dict, str]:
    # One process (not pyproject's -n auto): the CUDA tests share one GPU, and pytest-xdist may not be installed here.
    # -v names each test's outcome as it ends, so that a run stopped by its limit still says which passed; without
    # the logging plugin a failure's report is its traceback, not thousands of captured torch.compile DEBUG lines.
    # --tier all: a CUDA test of the slow tier runs here too.
    cmd = python() + ["-m", "pytest", "-m", "cuda", "--tier", "all", "tests/test_cuda.py", "tests/test_distributed.py",
                      *select, "-v", "-rfEs", "--tb=short", "-p", "no:logging", "-p", "no:cacheprovider", "-p",
                      "no:xdist", "-o", "addopts=", "--durations=0", "--durations-min=5"]
    try:
        code, text = s.run(cmd, cap=cap)
        cut = None
    except Skip as why:
        if not why.output:
            raise
        code, text, cut = -1, why.output, why
    f, counts = _test_outcomes(text)
    summary = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no summary"
    if cut is not None:  # the budget stopped it: what ended before still counts, a failure included
        if f["failures"]:
            return "failed (cut off by --budget)", f, summary
        if not counts:
            raise cut
        return f"partial: {counts.get('passed', 0)} passed", f, f"{summary}; cut off by --budget"
    if code == -1:
        return "timed out", f, summary
    if code != 0:
        return f"failed (exit {code})", f, summary
    if not counts.get("passed"):
        if s.device.startswith("cuda"):  # a GPU the tests cannot see proves nothing
            return "failed: every CUDA test skipped on a CUDA device", f, summary
        return "skipped", f, f"{summary}: no CUDA device (the file imports and collects)"
    return "ok", f, summary


def _test_outcomes(text: str) -> tuple[dict, dict[str, int]]:
    """pytest's counts from its last line, or from the outcomes -v printed when it was stopped before it."""
    last = text.strip().splitlines()[-1] if text.strip() else ""
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", last)}
    if not counts:
        for outcome in re.findall(r"^tests/\S+ (PASSED|FAILED|SKIPPED|ERROR)", text, re.M):
            key = {"ERROR": "errors"}.get(outcome, outcome.lower())
            counts[key] = counts.get(key, 0) + 1
    return {**counts, "failures": re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)}, counts


def model_dir(s: Suite) -> Path:
    """A GPT-2-small-shaped model (12 layers, 768 wide, GPT-2's vocabulary; 2 layers with --tiny) for the stages
    that train one, made once a call: one SFT step from random weights. Its memory and compute are a trained
    model's; a random model seldom writes EOS, so every completion runs to --max-new-tokens, a step's most."""
    if s.model is not None:
        return s.model
    data, out = s.work / "model_data.jsonl", s.work / "model"
    code, text = s.run(python() + ["-m", "rookworld", "positions", "--count", "8", "--seed", "7", "--annotate",
                                   "--stockfish-depth", "2", "--out", str(data), "--quiet"], cap=60)
    if code != 0:
        raise Failed("making the model's data: positions " + _failed(code, text))
    code, text = s.run(python() + ["-m", "rookworld", "sft", "--init", "tiny" if s.tiny else "small", "--steps", "1",
                                   "--rows-per-step", "2", "--micro-batch-size", "2", "--seq-len", "256", "--pack",
                                   "--data", str(data), "--output-dir", str(out), "--overwrite", "--eval-every", "0",
                                   "--save-every", "0", "--warmup-steps", "0", "--no-compile", "--device", s.device],
                       cap=120)
    if code != 0 or not (out / "config.json").is_file():
        raise Failed("making the model: sft " + _failed(code, text))
    s.model = out
    return out


def _metrics(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


#: Toy sizes of the train stages with --tiny: a step of seconds on two CPU cores.
TINY_TRAIN = ["--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "8", "--eval-size", "2",
              "--stockfish-depth", "2"]


def _train(s: Suite, name: str, flags: list[str], steps: int, cap: float,
           need: float = 15) -> tuple[str | None, dict, list[dict], str]:
    """`rookworld train` of model_dir's model for `steps` steps: (what went wrong or None, figures, the metrics
    rows, the output)."""
    out = s.work / name
    model = model_dir(s)
    code, text = s.run(python() + ["-m", "rookworld", "train", "--model", str(model), "--output-dir", str(out),
                                   "--overwrite", "--device", s.device, "--steps", str(steps), "--save-every", "0",
                                   *(TINY_TRAIN if s.tiny else []), *flags], cap=cap, need=need)
    rows = [r for r in _metrics(out) if r.get("step", 0) > 0]  # the steps: a row of step 0 is the evaluation before
    f = {"steps": [r["step"] for r in rows], "loss": [r.get("loss") for r in rows],
         "samples_per_s": [r.get("samples_per_s") for r in rows], "time_per_step": [r.get("time/step") for r in rows],
         "peak_memory_gb": max((r.get("peak_memory_gb") or 0 for r in rows), default=None)}
    if code != 0:
        return _failed(code, text), f, rows, text
    if f["steps"] != list(range(1, steps + 1)):
        return f"failed: metrics.jsonl holds steps {f['steps']}, not 1 to {steps}", f, rows, text
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in f["loss"]):
        return f"failed: a loss is not finite: {f['loss']}", f, rows, text
    return None, f, rows, text


def _rate(f: dict) -> str:
    rates = [x for x in f["samples_per_s"][1:] or f["samples_per_s"] if x]  # the first step compiles and warms up
    return f"{statistics.median(rates):,.0f} samples/s" if rates else "no rate"


def stage_train_fp32(s: Suite) -> tuple[str, dict, str]:
    """rookworld train --dtype fp32 --no-compile for 2 steps at 124M: fp32 weights and eager decoding on CUDA.
    A CPU-only op in the update's backward once crashed this in the first step."""
    problem, f, _, _ = _train(s, "train_fp32", ["--dtype", "fp32", "--no-compile", "--eval-every", "0"], steps=2,
                              cap=180)
    if problem:
        return problem, f, ""
    return "ok", f, f"2 steps, loss {f['loss'][-1]:.4f}, {_rate(f)}, peak {f['peak_memory_gb'] or 0:.1f} GB"


#: The most graphs dynamo may compile in train-compiled's run (its last compile/graphs): the bound that
#: tests/test_compiling.py holds a 20-step run with evaluations to on the CPU, compiled as on CUDA. A graph per
#: prompt width or per evaluation would pass it; suite.json keeps the count after each step, so that slower growth
#: shows too.
MAX_GRAPHS = 40


def stage_train_compiled(s: Suite) -> tuple[str, dict, str]:
    """rookworld train as users run it (bf16, torch.compile, CUDA graphs) for 12 steps at 124M with a held-out
    evaluation every 4, no compiled function falling back to eager and at most --max-graphs graphs compiled.
    Read from metrics.jsonl's compile/failed and compile/graphs."""
    steps, every = (2, 2) if s.tiny else (12, 4)
    # Not started with less than 4 minutes left: its compiling alone may take them, and a run cut short by the
    # budget proves nothing (the next call runs it whole).
    problem, f, rows, text = _train(s, "train_compiled", ["--eval-every", str(every)], steps=steps, cap=480,
                                    need=15 if s.tiny else 240)
    if problem:
        return problem, f, ""
    f["evaluations"] = [r["step"] for r in rows if "eval/P/best_move_accuracy" in r]
    if f["evaluations"] != list(range(every, steps + 1, every)):
        return f"failed: held-out evaluations at steps {f['evaluations']}", f, ""
    lacking = [r["step"] for r in rows if "compile/graphs" not in r or "compile/failed" not in r]
    if lacking:
        return (f"failed: metrics.jsonl rows {lacking} lack compile/graphs and compile/failed: the trainer does not "
                "report what it compiled, so this stage cannot check it"), f, ""
    f["graphs"] = [r["compile/graphs"] for r in rows]
    f["compile_failed"] = rows[-1]["compile/failed"]
    from rookworld.net.compiling import FELL_BACK  # installed by now (--pack installs it after the arguments)

    warning = next((line for line in text.splitlines() if FELL_BACK in line), None)
    if f["compile_failed"] or warning:
        return (f"failed: {f['compile_failed']} compiled function(s) fell back to eager"
                + (f": {warning.strip()[:200]}" if warning else "")), f, ""
    if max(f["graphs"]) > s.args.max_graphs:
        return f"failed: {max(f['graphs'])} graphs compiled, more than --max-graphs {s.args.max_graphs}", f, ""
    evaluations = len(f["evaluations"])
    return "ok", f, (f"{steps} steps, {evaluations} evaluation{'s' * (evaluations > 1)}, {f['graphs'][-1]} graphs "
                     f"compiled (at most {s.args.max_graphs}), none fell back; {_rate(f)}")


def stage_auto_batch_oom(s: Suite) -> tuple[str, dict, str]:
    """rookworld train --auto-batch at 124M driven into out-of-memory, then 2 real steps at the largest size that
    fitted. The search must catch the error, free what the failed trial held and train on."""
    # --memory-target 1.0: no size is over the target, so the doubling stops only at an out-of-memory (or at
    # --auto-batch-max, which no card's memory reaches: 8,192 prompts' KV caches alone are about 1 TB).
    # --micro-batch-size past any rollout: the update's forward and backward then take every row at once, so its
    # activations (about 0.3 MB a token at 124M, against the KV cache's 37 KB) grow with the batch. At group 16 and
    # 144 new tokens a prompt is about 2,400 tokens: memory runs out near 100 prompts on 80 GB, 200 on 141 GB,
    # after 4 or 5 cheap trial steps. --no-compile: each trial's new shapes would compile for minutes; the
    # compiled search is the auto-batch stage's.
    flags = ["--auto-batch", "--memory-target", "1.0", "--prompts-per-step", "2" if s.tiny else "8",
             "--auto-batch-max", "8192", "--micro-batch-size", "65536", "--no-compile", "--eval-every", "0"]
    problem, f, _, text = _train(s, "auto_batch_oom", flags, steps=2, cap=240)
    if problem and not s.device.startswith("cuda") and "needs a CUDA device" in text:
        raise Skip("skipped", "--auto-batch needs CUDA (the command was refused, as it should be)")
    probes = [{"prompts": int(p), "result": r}
              for p, r in re.findall(r"auto-batch: (\d+) prompts x \d+ = \d+ completions: (.*)", text)]
    chosen = re.findall(r"auto-batch: training with (\d+) prompts", text)
    f.update(probes=probes, chosen=int(chosen[0]) if chosen else None)
    if problem:
        return problem, f, ""
    if not probes or "out of memory" not in probes[-1]["result"]:
        return f"failed: the search ended without an out-of-memory: {probes[-1:] or 'no trial step'}", f, ""
    fitted = [p["prompts"] for p in probes if "out of memory" not in p["result"]]
    if not fitted or f["chosen"] != max(fitted):
        return f"failed: kept {f['chosen']} prompts after trials {probes}", f, ""
    return "ok", f, (f"out of memory at {probes[-1]['prompts']} prompts; trained 2 steps at {f['chosen']}, "
                     f"peak {f['peak_memory_gb'] or 0:.1f} GB")


#: The GRPO bench's steps on a GPU: eager has nothing to warm up but CUDA's own first calls; compiled, step 2
#: still compiles (a step's P:/A: split changes the decode batches), so two warm-up steps.
EAGER_STEPS = ["--no-compile", "--warmup", "1", "--steps", "3"]
COMPILED_STEPS = ["--warmup", "2", "--steps", "3"]
TINY_GRPO = ["--device", "cpu", "--tiny", "--prompts", "2", "--group", "2", "--p-len", "4", "--a-len", "8",
             "--steps", "1", "--warmup", "1", "--stockfish-depth", "4"]


def _grpo_step(s: Suite, name: str, extra: list[str], cap: float, need: float = 15,
               profiled: bool = False) -> tuple[str, dict, str]:
    """benches/grpo_step.py --json, read after each of its steps: it rewrites the file (complete: false, the steps so
    far, the graphs compiled) until its last, so that a run cut off by its limit or the budget keeps its figures.
    `profiled`: one more step under torch.profiler after the measured ones (--profile), its account in the
    figures and in OUT/NAME-profile.json."""
    path = s.work / f"{name}.json"
    if profiled:
        extra = [*extra, "--profile", str(s.out / f"{name.replace('_', '-')}-profile.json")]
    tiny = TINY_GRPO if s.tiny else []  # after `extra`: its sizes win, the rest of `extra` holds
    seen = [0]  # steps already printed

    def watch() -> None:
        f = _json(path)
        if not f:
            return
        for step in f.get("steps", [])[seen[0]:]:
            print(f"   {s.stage}: {_step_line(step)}", flush=True)
        seen[0] = len(f.get("steps", []))
        s.progress(f, grpo_summary(f))

    try:
        code, text = s.run(python() + [str(BENCHES / "grpo_step.py"), *extra, *tiny, "--json", str(path)], cap=cap,
                           need=need, watch=watch)
    except Skip as cut:
        f = _json(path)
        if cut.status != "not run" or not f or not f.get("steps"):
            raise
        return f"partial: {len(f['steps'])} steps", f, f"{grpo_summary(f)}; cut off by --budget"
    f = _json(path) or {}
    if code != 0 or not f.get("complete"):
        steps = len(f.get("steps", []))
        status = f"timed out: {steps} steps" if code == -1 and steps else _failed(code, text)
        return status, f, grpo_summary(f) if f else ""
    return "ok", f, grpo_summary(f)


def _step_line(step: dict) -> str:
    phases = ", ".join(f"{k} {step[f'{k}_s']:.1f}" for k in ("generate", "reward", "reference", "update")
                       if step.get(f"{k}_s") is not None)
    compiled = f", compiling {step['compiling_s']:.0f} s" if step.get("compiling_s") else ""
    return (f"step {step.get('step')}{' (warm-up)' if step.get('warmup') else ''} {step.get('step_s', 0):.1f} s, "
            f"{step.get('samples_per_s') or 0:,.0f} samples/s ({phases} s{compiled})")


def grpo_summary(f: dict) -> str:
    """A grpo-step stage's table line: the measured figures once complete, else its steps so far; then what it
    compiled (graphs and seconds), the part of a first step the eager figures do not show."""
    steps = f.get("steps") or []
    if f.get("complete"):
        mfu = "n/a" if f.get("mfu") is None else f"{100 * f['mfu']:.1f}%"
        phases = "/".join(f"{f.get(f'{k}_s') or 0:.2f}" for k in ("generate", "reward", "reference", "update"))
        line = (f"{f['samples_per_s']:,.0f} samples/s, {f['generated_tokens_per_s']:,.0f} generated tok/s, "
                f"gen/reward/ref/update {phases} s, MFU {mfu}, {f['peak_memory_gb']:.1f} GB")
    elif steps:
        seconds = ", ".join(f"{x.get('step_s', 0):.0f}" for x in steps)
        line = f"{len(steps)} step{'s' * (len(steps) != 1)} of {seconds} s; last: {_step_line(steps[-1])}"
    else:
        line = "no step ended"
    compiled = f.get("compiled") or []
    if compiled:
        seconds = sum(c.get("seconds") or 0 for c in compiled)
        top = max(compiled, key=lambda c: c.get("seconds") or 0)
        count = sum(not c.get("backward") for c in compiled)  # a backward belongs to its forward's graph
        line += (f"; compiled {count} graph{'s' * (count != 1)} in {seconds:.0f} s "
                 f"(longest {top.get('name')} {top.get('seconds') or 0:.0f} s)")
    if f.get("compiling"):  # cut off while compiling: what it was compiling
        line += f"; was {f['compiling'][:120]}"
    profiled = f.get("profile")
    if profiled and profiled.get("top"):
        idle = profiled.get("idle_share")
        first = profiled["top"][0]
        line += (f"; profiled: {'' if idle is None else f'idle {100 * idle:.0f}%, '}{profiled['syncs_total']} syncs, "
                 f"top {first['name'][:60]} ({first['phase']}, {100 * first['share']:.1f}%)")
    elif profiled and profiled.get("error"):
        line += f"; the profiled step failed: {profiled['error'][:120]}"
    return line


def stage_grpo_step_eager(s: Suite) -> tuple[str, dict, str]:
    """benches/grpo_step.py --no-compile at 124M, 128 prompts x 16: the whole GRPO step eagerly, in its first
    minutes on a fresh machine (samples/s, each phase's seconds, MFU, peak memory), then one step profiled."""
    return _grpo_step(s, "grpo_step_eager", EAGER_STEPS, cap=180, profiled=True)


def stage_grpo_step_u64_eager(s: Suite) -> tuple[str, dict, str]:
    """grpo-step-eager with every completion 64 tokens long: the trl stage's work, both eager."""
    return _grpo_step(s, "grpo_step_u64_eager", [*EAGER_STEPS, "--uniform-length", "4" if s.tiny else "64"], cap=150)


def stage_grpo_step(s: Suite) -> tuple[str, dict, str]:
    """benches/grpo_step.py at 124M, 128 prompts x 16, compiled as train runs it by default (the decode step and the
    draw): samples/s of the whole GRPO step with its rewards, MFU, every graph compiled with its seconds, then one
    step profiled."""
    # Not started with under a minute left, which no compiled first step fits; cut off by the budget, its steps so
    # far are kept.
    return _grpo_step(s, "grpo_step", COMPILED_STEPS, cap=240, need=15 if s.tiny else 60, profiled=True)


def stage_grpo_step_logprobs(s: Suite) -> tuple[str, dict, str]:
    """grpo-step with the log-prob passes compiled too (--compile-logprobs: one block compiled for every layer, and
    the vocabulary passes): beside grpo-step, whether compiling them pays, and how long its first step takes."""
    return _grpo_step(s, "grpo_step_logprobs", [*COMPILED_STEPS, "--compile-logprobs"], cap=240,
                      need=15 if s.tiny else 60)


def stage_grpo_step_u64(s: Suite) -> tuple[str, dict, str]:
    """grpo-step with every completion 64 tokens long: the compiled step at the trl stage's work."""
    return _grpo_step(s, "grpo_step_u64", [*COMPILED_STEPS, "--uniform-length", "4" if s.tiny else "64"], cap=360)


def stage_every_prompt(s: Suite) -> tuple[str, dict, str]:
    """grpo-step-eager with every row's prompt computed (--no-shared-prompt): what computing each prompt once
    gains, both eager in one call."""
    status, f, summary = _grpo_step(s, "grpo_step_every_prompt", [*EAGER_STEPS, "--no-shared-prompt"], cap=180)
    shared = s.results["stages"].get("grpo-step-eager", {}).get("figures", {}).get("samples_per_s")
    if shared and f.get("samples_per_s"):
        summary += f"; each prompt once is {shared / f['samples_per_s']:.2f}x"
    return status, f, summary


def stage_fused_head(s: Suite) -> tuple[str, dict, str]:
    """benches/generate.py --backward: the log-prob pass's forward and backward, fused over the vocabulary against
    checkpointed chunks."""
    path = s.work / "fused_head.json"
    sizes = ["--device", "cpu", "--batch-sizes", "3", "--prompt-len", "3", "5", "--new-tokens", "2", "4",
             "--repeats", "1", "--warmup", "0", "--threads", "1"] if s.tiny else ["--batch-sizes", "64", "256"]
    code, text = s.run(python() + [str(BENCHES / "generate.py"), *sizes, "--backward", "--json", str(path)], cap=180)
    f = _json(path) or {}
    rows = [r for r in f.get("rows", []) if "checkpointed_forward_backward_tokens_per_s" in r]
    if code != 0 or not rows:
        return _failed(code, text), f, ""
    r = rows[-1]
    fused, plain = r["forward_backward_tokens_per_s"], r["checkpointed_forward_backward_tokens_per_s"]
    return "ok", f, (f"{r['task']} batch {r['batch']}: fused {fused:,.0f} tok/s, checkpointed {plain:,.0f} "
                     f"({fused / plain:.2f}x)")


def stage_generate(s: Suite) -> tuple[str, dict, str]:
    """benches/generate.py at batch 64 to 2,048, eager and compiled: generated tokens/s against the decode step's
    memory-bandwidth floor."""
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
    """benches/sampler.py: the sampling draw over the vocabulary, eager against compiled."""
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
    """benches/decode_cache.py: what attending over the whole bucketed KV cache costs a decode step."""
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
    """Compiled decoding at batch 1,024 from fp32 weights under autocast against their bf16 copy, as the trainer
    samples. Under autocast every step casts every weight again; the copy stores the Linear weights in bf16."""
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


#: The rookworld figures the TRL baseline divides, eager first: TRL's trainer runs eagerly, so eager over eager is
#: the comparison of the work itself, on the machine TRL ran on (the same call).
TRL_PEERS = ("grpo-step-u64-eager", "grpo-step-u64")


def stage_trl(s: Suite) -> tuple[str, dict, str]:
    """benches/trl_baseline.py: TRL's GRPOTrainer eagerly at grpo-step-u64-eager's work (128 prompts x 16, 64
    tokens each), and rookworld's samples/s over it."""
    probe = subprocess.run(python() + ["-c", "import trl, datasets"], capture_output=True, text=True, env=s.env)
    if probe.returncode:
        raise Skip("skipped", "trl/datasets do not import (" + (probe.stderr.strip().splitlines() or ["?"])[-1][:120]
                   + "); carry them: benches/gpu_extras.sh")
    path = s.work / "trl.json"
    # Two measured steps, not three: its samples/s is per sample either way, and the call's compiled step after it
    # gets the time. Estimated (not yet timed) at 1-2 minutes on an H100 with its imports.
    sizes = (["--device", "cpu", "--tiny", "--prompts", "2", "--group", "2", "--length", "4", "--steps", "1",
              "--warmup", "1", "--micro-batch-size", "4", "--stockfish-depth", "4"] if s.tiny
             else ["--length", "64", "--steps", "2", "--warmup", "1"])
    code, text = s.run(python() + [str(BENCHES / "trl_baseline.py"), *sizes, "--json", str(path)], cap=180)
    f = _json(path)
    if code != 0 or f is None:
        return _failed(code, text), f or {}, ""
    stages = s.results["stages"]
    f["over_trl"] = {name: stages[name]["figures"]["samples_per_s"] / f["samples_per_s"] for name in TRL_PEERS
                     if stages.get(name, {}).get("status") == "ok"}
    if f["over_trl"]:
        f["rookworld_stage"], f["rookworld_over_trl"] = next(iter(f["over_trl"].items()))
    ratios = ", ".join(f"{x:.1f}x ({name})" for name, x in f["over_trl"].items())
    return "ok", f, f"{f['samples_per_s']:,.1f} samples/s" + (f"; rookworld over it: {ratios}" if ratios else "")


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
    """rookworld sft of a 124M model on packed 1,024-token rows: tokens/s and MFU."""
    data = s.work / "sft_data.jsonl"
    count, depth = ("16", "2") if s.tiny else ("4000", "4")
    code, text = s.run(python() + ["-m", "rookworld", "positions", "--count", count, "--seed", "7", "--annotate",
                                   "--stockfish-depth", depth, "--out", str(data), "--quiet"], cap=90)
    if code != 0:
        return "positions " + _failed(code, text), {}, ""
    return _sft(s, "sft", data, [], steps=30)


def stage_sft_eager(s: Suite) -> tuple[str, dict, str]:
    """sft without torch.compile: what compiling the trunk and the log-softmax gains a training step."""
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


#: The chess-play SFT at scale (issue 57): positions of Stockfish's self-play made on the machine's cores, then SFT
#: from the shipped model in large bf16 batches. Sized for one 480 s call: at depth 6 the 2-core VM made 130
#: positions/s, so 16 cores about 1,000 (not yet timed there: the positions' cap leaves a third to spare).
SCALE_POSITIONS, SCALE_STEPS, SCALE_ROWS = 120_000, 3000, 256
#: --legal-weight of the run: on the CPU it gave +3.8 points of legal best moves over 400 steps, twice the seeds'
#: spread, at 0.009 of held-out NLL (LEARNING.md, "Issue 57").
SCALE_LEGAL_WEIGHT = 1.0
#: --candidate-order of the run (issue 68): M: written best first gave +0.9 points of Stockfish's five and +0.8 of the
#: best move over 400 steps on held-out positions never used for a choice, each beyond both arms' seed spreads, and
#: made the B: move the model's own first M: move 94-99% of the time instead of 68% (LEARNING.md, "Issue 68").
SCALE_CANDIDATE_ORDER = "ranked"
SCALE_FILES = ("config.json", "model.safetensors", "vocab.json", "merges.txt", "metrics.jsonl")


def stage_sft_chess_play(s: Suite) -> tuple[str, dict, str]:
    """The chess-play SFT at scale: self-play positions made on every core, then SFT from models/chess-play-sft in
    bf16 batches of 256 rows, its latest model copied under --out as it saves (a cut-off command still brings one
    back to evaluate)."""
    data, out, keep = s.work / "sft_play.jsonl", s.work / "sft_play", s.out / "sft-chess-play"
    count, depth, steps = ("40", "2", "6") if s.tiny else (str(SCALE_POSITIONS), "6", str(SCALE_STEPS))
    t0 = time.monotonic()
    code, text = s.run(python() + ["-m", "rookworld", "positions", "--selfplay", "--count", count, "--seed", "3",
                                   "--annotate", "--stockfish-depth", depth, "--layout", "compact", "--exclude",
                                   "data/chess-play-held-out.jsonl", "--out", str(data), "--quiet"], cap=200)
    if code != 0:
        return "positions " + _failed(code, text), {}, ""
    made_s = time.monotonic() - t0
    keep.mkdir(exist_ok=True)

    def watch() -> None:  # the latest model, each time it is saved
        for name in SCALE_FILES:
            src = out / name
            if src.is_file() and (not (keep / name).is_file() or src.stat().st_mtime > (keep / name).stat().st_mtime):
                shutil.copy2(src, keep / name)

    rows = ["--rows-per-step", "4", "--micro-batch-size", "2"] if s.tiny else \
        ["--rows-per-step", str(SCALE_ROWS), "--micro-batch-size", str(SCALE_ROWS)]
    code, text = s.run(python() + ["-m", "rookworld", "sft", "--model", "models/chess-play-sft", "--data", str(data),
                                   "--layout", "compact", "--candidate-order", SCALE_CANDIDATE_ORDER, "--loss-on",
                                   "target", "--seq-len", "256", *rows,
                                   "--steps", steps, "--lr", "3e-4", "--warmup-steps", "50", "--legal-weight",
                                   str(SCALE_LEGAL_WEIGHT), "--save-every", "100", "--keep-checkpoints", "1",
                                   "--eval-every", "0", "--output-dir", str(out), "--overwrite", "--device", s.device],
                       cap=420, watch=watch)
    metrics = [r for r in _metrics(out) if "tokens_per_s" in r]
    f = {"positions": int(count), "positions_s": made_s, "steps": len(metrics), "model": str(keep),
         "tokens_per_s": statistics.median(r["tokens_per_s"] for r in metrics[len(metrics) // 3:]) if metrics else None,
         "loss_first": metrics[0]["loss"] if metrics else None, "loss_last": metrics[-1]["loss"] if metrics else None}
    if code != 0 or not metrics:
        return ("partial: " if metrics else "") + _failed(code, text), f, ""
    return "ok", f, (f"{f['positions']:,} positions in {made_s:.0f} s; {f['steps']} steps, {f['tokens_per_s']:,.0f} "
                     f"tokens/s, loss {f['loss_first']:.3f} -> {f['loss_last']:.3f}; the model: {keep}")


def stage_auto_batch(s: Suite) -> tuple[str, dict, str]:
    """rookworld train --auto-batch as users run it (compiled, the default memory target): the size it keeps."""
    model = s.results["stages"].get("sft", {}).get("figures", {}).get("model_dir")
    if not model or not Path(model, "config.json").is_file():
        model = str(model_dir(s))
    out = s.work / "auto_batch"
    code, text = s.run(python() + ["-m", "rookworld", "train", "--model", model, "--output-dir", str(out),
                                   "--overwrite", "--auto-batch", "--prompts-per-step", "2" if s.tiny else "32",
                                   "--auto-batch-max", "4" if s.tiny else "1024", "--steps", "1", "--eval-every",
                                   "0", "--save-every", "0", "--device", s.device], cap=240)
    if code != 0 and not s.device.startswith("cuda") and "needs a CUDA device" in text:
        raise Skip("skipped", "--auto-batch needs CUDA (the command was refused, as it should be)")
    probes = [{"prompts": int(p), "completions": int(c), "result": r}
              for p, c, r in re.findall(r"auto-batch: (\d+) prompts x \d+ = (\d+) completions: (.*)", text)]
    chosen = re.findall(r"auto-batch: training with (\d+) prompts", text)
    f = {"probes": probes, "chosen": int(chosen[0]) if chosen else None}
    if code != 0 or not chosen:
        return _failed(code, text), f, ""
    return "ok", f, f"{f['chosen']} prompts per step ({len(probes)} probes)"


def stage_learning(s: Suite) -> tuple[str, dict, str]:
    """benches/learning.py at 124M: SFT, then GRPO with two seeds, measured on held-out positions."""
    out = s.work / "learning"
    size = ["--smoke"] if s.tiny else [
        # Sized to finish in one call (estimated, not yet timed: about 6 minutes on an H100 with 16 cores).
        "--init", "small", "--layers", "12", "--heads", "12", "--train-positions", "12000", "--eval-positions", "300",
        "--depth", "8", "--sft-steps", "1000", "--rows-per-step", "64", "--sft-lr", "3e-4", "--grpo-steps", "40",
        "--prompts", "64", "--group", "16", "--grpo-lr", "1e-5", "--eval-every", "10", "--seeds", "0", "1"]
    code, text = s.run(python() + [str(BENCHES / "learning.py"), "--out", str(out), "--device", s.device, *size],
                       cap=470)
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
    "env": stage_env, "grpo-step-eager": stage_grpo_step_eager, "grpo-step-u64-eager": stage_grpo_step_u64_eager,
    "trl": stage_trl, "grpo-step": stage_grpo_step, "grpo-step-logprobs": stage_grpo_step_logprobs,
    "cuda-core": stage_cuda_core, "cuda-tests": stage_cuda_tests,
    "train-fp32": stage_train_fp32, "train-compiled": stage_train_compiled, "auto-batch-oom": stage_auto_batch_oom,
    "fused-head": stage_fused_head, "sft": stage_sft, "sft-eager": stage_sft_eager, "generate": stage_generate,
    "every-prompt": stage_every_prompt, "grpo-step-u64": stage_grpo_step_u64, "sampler": stage_sampler,
    "decode-cache": stage_decode_cache, "weights": stage_weights, "auto-batch": stage_auto_batch,
    "learning": stage_learning, "sft-chess-play": stage_sft_chess_play,
}


class Call(NamedTuple):
    """One command of the plan."""

    slot: int  # the 15-minute loan it belongs to: each starts on a fresh machine
    purpose: str
    stages: list[str]
    budget: float  # seconds of stages: --budget's default for this call


#: The plan, for a GPU lent 15 minutes at a time (start-up, every command and idle waits included; at most 10
#: minutes a command). A slot holds a first command of 480 s of stages and a second of 200 s: about 120 s of
#: start-up, 480 + about 30 (install, transfers, the table) = 510, then 200 + 30 = 230, 860 s of the 900. Stages
#: that use another's figures (trl, sft-eager, every-prompt) run in the same call, on the same machine.
CALLS: dict[str, Call] = {
    # Eager first: the eager step and TRL's beside it give the speed figures within minutes, and a profile of where
    # the eager step's time goes. Then the default (decoding compiled), profiled too; then the log-prob passes
    # compiled as well, with the time left: a cut-off one still leaves its steps and graphs in suite.json.
    "1": Call(1, "the GRPO step's speed: the eager step at 124M, the same at TRL's work, TRL's GRPOTrainer beside it "
              "(the ratio), then compiled as train's default (decoding), then with the log-prob passes too; the "
              "eager and default steps each profiled",
              ["grpo-step-eager", "grpo-step-u64-eager", "trl", "grpo-step", "grpo-step-logprobs"], 480),
    "2": Call(1, "with the slot's last minutes: the CUDA tests that matter most", ["cuda-core"], 200),
    "3": Call(2, "every CUDA test: any failure is a bug to fix before a figure counts", ["cuda-tests"], 480),
    "4": Call(2, "fp32 weights and eager decoding in train; the sampling draw, eager against compiled",
              ["train-fp32", "sampler"], 200),
    # train-compiled last: the longest and least known (compiling), so that the other is sure to fit.
    "5": Call(3, "--auto-batch driven into out-of-memory; train as users run it, compiled, with its graphs counted",
              ["auto-batch-oom", "train-compiled"], 480),
    "6": Call(3, "the decode step's cache and the fused vocabulary head", ["decode-cache", "fused-head"], 200),
    "7": Call(4, "SFT at 124M, compiled and eager, and the batch size --auto-batch keeps",
              ["sft", "sft-eager", "auto-batch"], 480),
    "8": Call(4, "what computing each prompt once gains the GRPO step", ["grpo-step-eager", "every-prompt"], 200),
    "9": Call(5, "decoding at batch 64 to 2,048, and sampling from the bf16 copy of the weights",
              ["generate", "weights"], 480),
    # Issue 57: the model comes back under $OUT/sft-chess-play, to evaluate on the CPU (BENCHMARKS.md says how).
    "10": Call(6, "the chess-play SFT at scale: positions made on 16 cores, then SFT from the shipped model",
               ["sft-chess-play"], 480),
}
#: What --call all leaves out: a slot's first command of its own (slot 6), and minutes even at toy sizes.
OWN_CALL = ["learning"]
#: --budget with --stages: a slot's first command.
STAGES_BUDGET = 480


def plan() -> str:
    """The plan as --help prints it: each slot's commands, then one line per stage (its docstring's first sentence)."""
    lines = ["The plan for a GPU lent 15 minutes at a time (start-up included, at most 10 minutes a command, a fresh",
             "machine each time): in each slot, its commands in this order, each writing its results under $OUT",
             "(any folder). Add --pack DIR where the machine has no network; with a GPU of your own, --call all runs",
             "every call at once. Give a lent machine's command a time limit of about its budget plus 40 s (520 s",
             "for a 480 s call, 240 s for a 200 s one), not the most allowed: the suite stops its stages at the",
             "budget, and a command that hangs anyway still leaves the slot time to run the short one again. A",
             "call that leaves stages not run or cut off ends with the command that runs them (slot 5 has room for",
             "one as its second command).", ""]
    own = Call(max(c.slot for c in CALLS.values()) + 1, "what GRPO teaches at 124M (not in --call all)", OWN_CALL,
               STAGES_BUDGET)
    slot = 0
    for name, call in [*CALLS.items(), (None, own)]:
        if call.slot != slot:
            slot = call.slot
            lines.append(f"slot {slot}:" + (" about 2 minutes of start-up, then" if slot == 1 else ""))
        what = f"--call {name}" if name else f"--stages {' '.join(call.stages)}"
        lines.append(f"  python3 benches/gpu_suite.py {what} --out $OUT   ({call.budget:.0f} s of stages)")
        lines.extend(textwrap.wrap(call.purpose, width=116, initial_indent="    ", subsequent_indent="    "))
        for stage in call.stages:
            first = re.split(r"(?<=\.)\s", " ".join((STAGES[stage].__doc__ or "").split()))[0].rstrip(".")
            lines.extend(textwrap.wrap(first, width=116, initial_indent=f"      {stage:<20}",
                                       subsequent_indent=" " * 26, break_on_hyphens=False))
    other = [n for n in STAGES if n != "env" and all(n not in c.stages for c in [*CALLS.values(), own])]
    if other:  # grpo-step-u64: the compiled step's TRL ratio needs trl again in its call
        lines.append(f"in no call, for --stages (with trl after it, for the compiled step's ratio): {', '.join(other)}")
    return "\n".join(lines)


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


def command(args: argparse.Namespace, stages: list[str]) -> str:
    """The command that runs `stages` as this call ran its own."""
    words = ["python3", "benches/gpu_suite.py"]
    if args.pack is not None:
        words += ["--pack", str(args.pack)]
    words += ["--out", "$OUT" if os.environ.get("OUT") == args.out else args.out]
    if args.tiny:
        words += ["--device", args.device, "--tiny"]
    return " ".join(words + ["--stages", *stages])


def table(s: Suite, order: list[str]) -> str:
    lines = [f"{'stage':<20} {'status':<18} {'s':>5}  figures", "-" * 110]
    for name in order:
        r = s.results["stages"].get(name)
        if r is None:
            continue
        status = r["status"] if len(r["status"]) <= 18 else r["status"][:17] + "~"
        lines.append(f"{name:<20} {status:<18} {r['seconds']:>5.0f}  {r['summary'] or r['status']}")
    goals = s.results.get("goals")
    if goals:
        toy = " (toy sizes: not the goals' work)" if s.tiny else ""
        lines.append(f"goals{toy}: " + "; ".join(f"{k} {v}" for k, v in goals.items()))
    left = [n for n in order if unfinished(s.results["stages"].get(n, {}).get("status", ""))]
    if left:
        lines.append(f"not run or cut off for want of time; next call: {command(s.args, left)}")
    return "\n".join(lines)


def verdict(s: Suite) -> tuple[int, str]:
    """The exit status and the last line: 1 if any stage that ran failed."""
    stages = s.results["stages"]
    failed = [n for n, r in stages.items() if not passed(r["status"])]
    if failed:
        return 1, "gpu suite: FAILED: " + "; ".join(f"{n}: {stages[n]['status']}" for n in failed)
    kind = lambda status: "partial" if status.startswith("partial:") else status  # noqa: E731
    counts = {k: sum(kind(r["status"]) == k for r in stages.values()) for k in ("ok", "partial", "skipped", "not run")}
    return 0, "gpu suite: passed (" + ", ".join(f"{n} {k}" for k, n in counts.items() if n) + ")"


def goals(s: Suite) -> dict[str, str]:
    st = {k: v.get("figures", {}) for k, v in s.results["stages"].items()}
    verdict = lambda got, goal, fmt: f"{fmt.format(got)} ({'met' if got >= goal else 'missed'})"  # noqa: E731
    g = {}
    # The goal is the step as train runs it (compiled); the eager figure stands in, named, until that one exists.
    step = next((name for name in ("grpo-step", "grpo-step-eager") if "samples_per_s" in st.get(name, {})), None)
    if step:
        g[f">= {GOAL_SAMPLES_PER_S} samples/s ({step}):"] = verdict(st[step]["samples_per_s"], GOAL_SAMPLES_PER_S,
                                                                    "{:,.0f}")
    rows = [r for r in st.get("generate", {}).get("rows", []) if r.get("batch") == 1024 and
            "generated_tokens_per_s" in r]
    if rows:
        best = max(r["generated_tokens_per_s"] for r in rows)
        g[f">= {GOAL_TOKENS_PER_S_AT_1024:,} tok/s at batch 1024:"] = verdict(best, GOAL_TOKENS_PER_S_AT_1024,
                                                                              "{:,.0f}")
    if "rookworld_over_trl" in st.get("trl", {}):
        g[f">= {GOAL_TRL_RATIO:.0f}x TRL ({st['trl']['rookworld_stage']}):"] = verdict(
            st["trl"]["rookworld_over_trl"], GOAL_TRL_RATIO, "{:.1f}x")
    if st.get("sft", {}).get("mfu") is not None:
        g[f"SFT MFU >= {GOAL_SFT_MFU:.0%}:"] = verdict(st["sft"]["mfu"], GOAL_SFT_MFU, "{:.1%}")
    return g


def stages_of(args: argparse.Namespace) -> list[str]:
    """The stages this command runs, env first, each once (--call all would repeat the ones two calls share)."""
    if args.stages is not None:
        order = args.stages
    else:
        calls = CALLS.values() if args.call == "all" else [CALLS[args.call]]
        order = [stage for call in calls for stage in call.stages]
    return list(dict.fromkeys(["env", *order]))


def run_stage(suite: Suite, name: str) -> None:
    """One stage into suite.json. What a stage's command wrote as it went (progress()) stays when the stage ends
    without figures of its own: a skip, a failure, an error."""
    t0 = suite.stage_started = time.monotonic()
    suite.stage = name
    so_far = lambda: suite.results["stages"].get(name, {}).get("figures", {})  # noqa: E731
    try:
        status, figures, summary = STAGES[name](suite)
    except Skip as why:
        status, figures, summary = why.status, so_far(), why.reason
    except Failed as why:
        status, figures, summary = f"failed: {why}", so_far(), ""
    except Exception as e:  # a broken stage must not cost the stages after it
        status, figures, summary = f"error: {type(e).__name__}: {e}", so_far(), ""
    suite.results["stages"][name] = {"status": status, "seconds": time.monotonic() - t0, "figures": figures,
                                     "summary": summary}
    suite.results["goals"] = goals(suite)
    suite.save()
    print(f"== {name}: {status} in {time.monotonic() - t0:.0f} s{': ' + summary if summary else ''}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__ + "\n" + plan(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--call", choices=[*CALLS, "all"], default="all",
                    help="the plan's call to run (default: all, one after the other)")
    ap.add_argument("--stages", nargs="+", choices=list(STAGES), default=None, metavar="STAGE",
                    help=f"these stages instead of a call, in this order: {', '.join(STAGES)}")
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu_suite_out", help="where suite.json and suite.log "
                    "go (default $OUT)")
    ap.add_argument("--pack", type=Path, default=None, help="a folder made by gpu-pack (and gpu_extras.sh): install "
                    "its wheel, Stockfish and vocabulary first, for a machine without network")
    ap.add_argument("--budget", type=float, default=None, help="seconds for every stage together, the install not "
                    f"counted (default: the call's own, 480 or 200; {STAGES_BUDGET} with --stages; their sum with "
                    "--call all)")
    ap.add_argument("--max-graphs", type=int, default=MAX_GRAPHS,
                    help=f"most graphs train-compiled's run may compile (default {MAX_GRAPHS})")
    ap.add_argument("--device", default=None, help="default: cuda where there is one, else cpu")
    ap.add_argument("--tiny", action="store_true", help="toy sizes (with --device cpu: the CI smoke test)")
    args = ap.parse_args()
    if args.stages is not None and args.call != "all":
        ap.error("give --call or --stages, not both")
    if args.budget is None:
        args.budget = (STAGES_BUDGET if args.stages is not None else
                       sum(c.budget for c in CALLS.values()) if args.call == "all" else CALLS[args.call].budget)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.pack is not None:
        unpack(args.pack)
    suite = Suite(args)
    order = stages_of(args)
    print(f"gpu suite: {' '.join(order)}; budget {args.budget:.0f} s; results in {suite.out}", flush=True)
    for name in order:
        run_stage(suite, name)
    code, last = verdict(suite)
    suite.results["verdict"] = last
    suite.save()
    print("\n" + table(suite, order) + "\n" + last, flush=True)
    shutil.rmtree(suite.work, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
