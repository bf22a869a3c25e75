"""torch.compile's way out (`rookworld.net.compiling`): past the recompile limit decoding falls back to eager instead
of crashing, and a real run's compiled graphs are bounded (counted over 20 steps of the real prompt mix with held-out
evaluations, compiled as on CUDA, with dynamo's eager backend so that counting takes seconds, not inductor's
minutes: the graphs dynamo makes do not depend on the backend)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import io
import os

import pytest
import torch

from conftest import tiny_gpt
from rookworld.net import compile_log, compiling, decoding
from rookworld.net.sampling import SamplingOptions, generate
from rookworld.net.tokenizer import get_tokenizer

# dynamo's recompile limit, by the name this torch gives it
LIMIT = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
FENS = ["3r1r2/ppb4k/8/2R5/5P2/8/1P4PP/2K3R1 w - - 1 27", "8/8/8/8/8/8/8/K6k w - - 0 1",
        "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1", "r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1"]


@pytest.mark.slow
def test_past_the_recompile_limit_decoding_falls_back_to_eager(monkeypatch):
    """Each batch size is a new entry of the compiled decode step; past the limit, fullgraph=True raises an error
    that is not a TorchDynamoException. It is a warning, and eager decoding gives the same tokens."""
    monkeypatch.setattr(compiling, "FALLBACKS", compiling.Fallbacks())
    monkeypatch.setattr(decoding._DECODE_STEP, "by_device", {"cpu": torch.compile(decoding.decode_step, backend="eager",
                                                                                  fullgraph=True, dynamic=False)})
    monkeypatch.setattr(compiling, "RECOMPILE_LIMIT", 2)
    model = tiny_gpt(scale=4.0)
    tok = get_tokenizer()
    warning = pytest.warns(RuntimeWarning, match="decode_step failed on cpu.*runs without compiling")
    with torch._dynamo.config.patch(**{LIMIT: 2}), warning:
        for batch in (1, 2, 3, 4):
            ids, mask = tok.encode_batch([f"P: {f}" for f in FENS[:batch]], bos=True)
            eager = generate(model, ids, mask, SamplingOptions(max_new_tokens=5, compile=False), seed=1)
            compiled = generate(model, ids, mask, SamplingOptions(max_new_tokens=5, compile=True), seed=1)
            assert torch.equal(compiled.tokens, eager.tokens) and torch.equal(compiled.mask, eager.mask)
    assert compiling.has_failed(decoding.decode_step, "cpu")  # (the draw, compiled per batch too, may join it)


@pytest.mark.slow
def test_a_compiled_run_makes_a_bounded_number_of_graphs(monkeypatch, tmp_path):
    """20 steps of GRPO on the built-in 80/20 prompt mix with Stockfish's rewards and a held-out evaluation every 5
    steps, every hot path compiled as a CUDA run compiles it. The bound, from what varies: each function compiles
    with dynamic shapes from its first call, and evaluation's greedy decoding and no-grad passes add their own
    graphs (another grad mode, another model)."""
    from rookworld.grpo.trainer import Trainer
    from rookworld.net.model import GPT, GPTConfig
    from rookworld.settings.config import TrainConfig

    monkeypatch.setattr(compiling, "FALLBACKS", compiling.Fallbacks())
    monkeypatch.setattr(compiling.torch, "compile", functools.partial(torch.compile, backend="eager"))
    monkeypatch.setattr(decoding._DECODE_STEP, "by_device", {})
    torch._dynamo.reset()
    cfg = TrainConfig(steps=20, prompts_per_step=5, group_size=4, max_new_tokens=40, eval_every=5, eval_size=8,
                      stockfish_depth=2, stockfish_workers=1, save_every=0, sample_every=0, warmup_steps=0,
                      device="cpu", output_dir=str(tmp_path), log_every=100).validate()
    torch.manual_seed(0)
    policy = GPT(GPTConfig(block_size=256, n_layer=1, n_head=2, n_embd=32)).eval()
    t = Trainer(cfg, policy=policy, reference=copy.deepcopy(policy), tokenizer=get_tokenizer(),
                stream=open(os.devnull, "w"))
    # A run compiles on CUDA alone; here every switch a CUDA run sets is set by hand.
    t.run.context = dataclasses.replace(t.run.context, compile=True)
    t.models.compile = True
    t.models.options = t.models.policy_pass.options = dataclasses.replace(t.models.options, compile=True)
    t.sampler.options = dataclasses.replace(t.sampler.options, compile=True)
    before = compiling.graphs_compiled()
    try:
        t.train()
    finally:
        t.close()
    graphs = compiling.graphs_compiled() - before
    assert not compiling.FALLBACKS, compiling.FALLBACKS
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list as entries
    from rookworld.net import head, logprobs, sampling
    counts = {f.__name__: len(entries(f.__code__)) for f in (decoding.decode_step, sampling._draw, logprobs._block,
                                                               logprobs._chunk_logprobs, head.vocab_forward,
                                                               head.vocab_backward)}
    print(f"graphs compiled over 20 steps: {graphs}: {counts}")
    assert 0 < graphs <= 40, graphs


def _grpo_step_bench():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("grpo_step_bench", Path(__file__).parents[1] / "benches" / "grpo_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.skipif(tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 11),
                    reason="torch before 2.11 guards each pooled KV cache's static address by its identity: a decode "
                           "graph per cache shape (at most decoding.MAX_CACHED_SHAPES); the GPU machines run 2.11")
def test_a_124m_shaped_step_compiles_at_most_eight_graphs_then_none(monkeypatch, tmp_path):
    """GPT-2 small's shape (12 layers, 12 heads, 768 wide, GPT-2's vocabulary) under every switch a CUDA run sets
    with --compile-logprobs (benches/grpo_step.py --rehearse-cuda: the draw in blocks, `after_prompts`, every hot
    path compiled), at the default 80/20 task mix, so that a step's P:/A: split moves its batches: the first step
    compiles at most 8 graphs (the decode step, the draw, one block for the prompts and one for the
    continuations, each without and with gradients, whatever the depth, and the fused vocabulary pass's forward
    and backward) and steps 2 to 5 none. dynamo's eager backend: its graphs and guards are inductor's."""
    from rookworld.grpo.trainer import Trainer
    from rookworld.net import model as model_module, sampling
    from rookworld.net.model import GPT, GPTConfig
    from rookworld.settings.config import TrainConfig

    bench = _grpo_step_bench()
    monkeypatch.setattr(compiling, "FALLBACKS", compiling.Fallbacks())
    monkeypatch.setattr(compiling.torch, "compile", functools.partial(torch.compile, backend="eager"))
    monkeypatch.setattr(compiling, "DYNAMIC_OPTIONS", {})  # inductor's settings
    for module, names in ((sampling, ["DRAWS"]), (model_module, ["GROUPED_PROMPTS_ON"])):
        for name in names:  # the rehearsal changes copies, which the test's end puts back
            monkeypatch.setattr(module, name, type(getattr(module, name))(getattr(module, name)))
    from rookworld.net import head, logprobs
    for compiled in (decoding._DECODE_STEP, *sampling.COMPILED_DRAWS.values(), logprobs._BLOCK, logprobs._CHUNK,
                     head._FORWARD, head._BACKWARD):
        monkeypatch.setattr(compiled, "by_device", {})
    torch._dynamo.reset()
    # 13 prompts at the default mix: 2 or 3 A: prompts a step (never 1: a batch of one group is a size dynamo
    # specializes, which a 124M run's 128 prompts never meet).
    cfg = TrainConfig(steps=5, prompts_per_step=13, group_size=2, max_new_tokens=6, eval_every=0,
                      stockfish_depth=1, stockfish_workers=1, save_every=0, sample_every=0, warmup_steps=0,
                      micro_batch_size=16, device="cpu", output_dir=str(tmp_path), log_every=100,
                      compile_logprobs=True).validate()
    torch.manual_seed(0)
    policy = GPT(GPTConfig(n_layer=12, n_head=12, n_embd=768)).eval()
    t = Trainer(cfg, policy=policy, reference=copy.deepcopy(policy), tokenizer=get_tokenizer(),
                stream=open(os.devnull, "w"))
    bench.rehearse_cuda(t)
    log, per_step, a_prompts = compile_log.CompileLog(), [], []
    try:
        for step in range(5):
            a_prompts.append(sum(p.task == "A" for p in t.prompts.batch(step)))
            t.train_step()
            per_step.append(log.new())
    finally:
        t.close()
    assert not compiling.FALLBACKS, compiling.FALLBACKS
    print("graphs a step:", [compile_log.summary(g) for g in per_step], "A: prompts a step:", a_prompts)
    assert len(set(a_prompts)) > 1, a_prompts  # the batches did move
    assert 0 < sum(not g.backward for g in per_step[0]) <= 8, compile_log.summary(per_step[0])
    blocks = [g for g in per_step[0] if g.name == "_block"]  # one graph serves all 12 layers
    assert 2 <= len(blocks) <= 4, compile_log.summary(per_step[0])
    assert [len(g) for g in per_step[1:]] == [0, 0, 0, 0], [compile_log.summary(g) for g in per_step[1:]]


def _double_relu(x: torch.Tensor) -> torch.Tensor:
    return (2 * x).relu() + 1


def test_a_compiling_run_says_each_graph_as_it_begins_and_after_its_step(monkeypatch, tmp_path):
    """What a compiling run (`harness.compiles.CompileReport`) tells its user: the graph dynamo begins, in words
    and while it waits, then each step's graphs (name, seconds, why it compiled again) in its log line and its
    metrics row. Compiled here with a static shape, so that a second shape is a recompile with a reason."""
    import io

    from rookworld.harness.compiles import CompileReport
    from rookworld.harness.runlog import Reporting, RunLog

    monkeypatch.setattr(compiling, "FALLBACKS", compiling.Fallbacks())
    monkeypatch.setattr(compiling.torch, "compile", functools.partial(torch.compile, backend="eager"))
    monkeypatch.setattr(compile_log.ANNOUNCER, "descriptions", {})
    compile_log.describe(_double_relu, lambda x: f"the doubling of {x.shape[0]:,} rows")
    stream = io.StringIO()
    report = CompileReport(RunLog(tmp_path, 2, stream=stream, reporting=Reporting(report_to=())), tmp_path, main=True)
    try:
        doubling = compiling.Compiled(_double_relu)
        rows = []
        for step, n in ((1, 1500), (2, 7), (3, 7)):
            out = doubling("cpu", True, torch.randn(n, 3), dynamic=False)
            assert out.shape == (n, 3)
            m = {"step": step}
            report.after_step(m)
            rows.append(m)
    finally:
        compile_log.announce_compiles(None)
    text = stream.getvalue()
    assert "compiling the doubling of 1,500 rows ..." in text and "compiling the doubling of 7 rows ..." in text
    assert "step 1 compiled 1 graph" in text and "step 2 compiled 1 graph" in text and "step 3" not in text
    first, second = rows[0]["compiled"], rows[1]["compiled"]
    assert [g["name"] for g in first + second] == ["_double_relu", "_double_relu"]
    assert first[0]["reason"] is None and all(g["seconds"] >= 0 for g in first + second)
    assert "size mismatch" in second[0]["reason"] and "1500" in second[0]["reason"], second
    assert "compiled" not in rows[2]  # no graph, no key


_CACHE_SCRIPT = """
import sys, torch
from rookworld.harness.compiles import CompileReport
from rookworld.harness.runlog import Reporting, RunLog
out = sys.argv[1]
report = CompileReport(RunLog(out, 1, reporting=Reporting(report_to=())), out, main=True)
if sys.argv[2] in ("load", "untrusted"):
    report.load_cache(trusted=sys.argv[2] == "load")
f = torch.compile(lambda x: (x.sin() * 3).cumsum(0), fullgraph=True)
f(torch.randn(64))
m = {"step": 1}
report.after_step(m)
print("hits", torch._dynamo.utils.counters["inductor"]["fxgraph_cache_hit"])
"""


def test_a_run_directory_s_compile_cache_is_read_only_when_the_command_line_trusts_it(tmp_path, monkeypatch):
    """Issue 71: torch's cache artifacts are pickles, and loading them put entries in torch's caches that ran code
    when the graph compiled again. Untrusted (the default), the file is never handed to torch, and the run says so;
    trusted, its bytes are."""
    from rookworld.harness.compiles import CompileReport
    from rookworld.harness.runlog import Reporting, RunLog

    handed = []
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: handed.append(data), raising=False)
    (tmp_path / "compile_cache.bin").write_bytes(b"\x80\x04 a pickle that would run code")
    said = io.StringIO()
    report = CompileReport(RunLog(str(tmp_path), 1, stream=said, reporting=Reporting(report_to=())), tmp_path, True)
    try:
        report.load_cache(trusted=False)
        assert handed == [] and "is not loaded (a pickle, which runs code as it loads)" in said.getvalue()
        assert "--trust-compile-cache" in said.getvalue()
        report.load_cache(trusted=True)
        assert handed == [b"\x80\x04 a pickle that would run code"]
    finally:
        compile_log.announce_compiles(None)


@pytest.mark.slow
def test_the_compile_cache_travels_with_the_run_directory(tmp_path):
    """A compiling run saves torch.compiler's cache artifacts in its run directory after the step that compiled; a
    process that resumes it with --trust-compile-cache loads them and takes its graph from them (without it, it
    compiles anew): each process has an inductor cache directory
    of its own, so a cache hit in the second can only come from the run directory's file. A corrupt file costs a
    warning and a compile."""
    import subprocess
    import sys

    def run(mode: str, cache_dir: str) -> str:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / cache_dir))
        proc = subprocess.run([sys.executable, "-c", _CACHE_SCRIPT, str(tmp_path), mode], capture_output=True,
                              text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout + proc.stderr

    first = run("fresh", "inductor_a")
    cache = tmp_path / "compile_cache.bin"
    assert "hits 0" in first and cache.is_file() and cache.stat().st_size > 0, first[-2000:]
    untrusted = run("untrusted", "inductor_u")  # without --trust-compile-cache: not read, said, compiled anew
    assert "is not loaded (a pickle" in untrusted and "hits 0" in untrusted, untrusted[-2000:]
    second = run("load", "inductor_b")
    assert "loaded the compile cache" in second and "hits 1" in second, second[-2000:]
    cache.write_bytes(b"not a cache")
    third = run("load", "inductor_c")
    assert "was not loaded" in third and "hits 0" in third, third[-2000:]


@pytest.mark.slow
def test_the_default_compiles_decoding_alone(tmp_path):
    """train's default, rehearsed as on CUDA (benches/grpo_step.py --rehearse-cuda, dynamo's eager backend): a step
    compiles the decode step and the draw, and no log-prob pass; with --compile-logprobs, the log-prob passes
    compile too, as one block for every layer and the vocabulary passes."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    def compiled(*extra: str) -> set[str]:
        out = tmp_path / f"step{len(extra)}.json"
        proc = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "benches" / "grpo_step.py"),
                               "--device", "cpu", "--rehearse-cuda", "--compile-backend", "eager", "--tiny",
                               "--dtype", "fp32", "--prompts", "5", "--group", "2", "--p-len", "3", "--a-len", "4",
                               "--warmup", "1", "--steps", "1", "--stockfish-depth", "1", "--json", str(out), *extra],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return {g["name"] for g in json.loads(out.read_text())["compiled"]}

    assert compiled() == {"decode_step", "_draw_in_blocks"}
    assert {"_block", "vocab_forward", "vocab_backward"} <= compiled("--compile-logprobs")
