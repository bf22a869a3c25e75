"""torch.compile's way out (`rookworld.net.compiling`): past the recompile limit decoding falls back to eager instead
of crashing, and a real run's compiled graphs are bounded (counted over 20 steps of the real prompt mix with held-out
evaluations, compiled as on CUDA, with dynamo's eager backend so that counting takes seconds, not inductor's
minutes: the graphs dynamo makes do not depend on the backend)."""

from __future__ import annotations

import copy
import functools
import os

import pytest
import torch

from conftest import tiny_gpt
from rookworld.net import compiling, decoding
from rookworld.net.sampling import generate
from rookworld.net.tokenizer import get_tokenizer

# dynamo's recompile limit, by the name this torch gives it
LIMIT = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
FENS = ["3r1r2/ppb4k/8/2R5/5P2/8/1P4PP/2K3R1 w - - 1 27", "8/8/8/8/8/8/8/K6k w - - 0 1",
        "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1", "r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1"]


def test_past_the_recompile_limit_decoding_falls_back_to_eager(monkeypatch):
    """Each batch size is a new entry of the compiled decode step; past the limit, fullgraph=True raises an error
    that is not a TorchDynamoException. It is a warning, and eager decoding gives the same tokens."""
    monkeypatch.setattr(compiling, "failed", {})
    monkeypatch.setattr(decoding, "_compiled_steps", {"cpu": torch.compile(decoding.decode_step, backend="eager",
                                                                           fullgraph=True, dynamic=False)})
    monkeypatch.setattr(compiling, "RECOMPILE_LIMIT", 2)
    model = tiny_gpt(scale=4.0)
    tok = get_tokenizer()
    warning = pytest.warns(RuntimeWarning, match="decode_step failed on cpu.*runs without compiling")
    with torch._dynamo.config.patch(**{LIMIT: 2}), warning:
        for batch in (1, 2, 3, 4):
            ids, mask = tok.encode_batch([f"P: {f}" for f in FENS[:batch]], bos=True)
            eager = generate(model, ids, mask, max_new_tokens=5, seed=1, compile=False)
            compiled = generate(model, ids, mask, max_new_tokens=5, seed=1, compile=True)
            assert torch.equal(compiled.tokens, eager.tokens) and torch.equal(compiled.mask, eager.mask)
    assert compiling.has_failed(decoding.decode_step, "cpu")  # (the draw, compiled per batch too, may join it)


@pytest.mark.slow
def test_a_compiled_run_makes_a_bounded_number_of_graphs(monkeypatch, tmp_path):
    """20 steps of GRPO on the built-in 80/20 prompt mix with Stockfish's rewards and a held-out evaluation every 5
    steps, every hot path compiled as a CUDA run compiles it. The bound, from what varies: the decode step compiles
    once for each (batch size, cache length bucket) of each task, and evaluation's; the draw and the log-prob passes
    go dynamic at their second shape."""
    from rookworld.grpo.trainer import Trainer
    from rookworld.net.model import GPT, GPTConfig
    from rookworld.settings.config import TrainConfig

    monkeypatch.setattr(compiling, "failed", {})
    monkeypatch.setattr(compiling.torch, "compile", functools.partial(torch.compile, backend="eager"))
    monkeypatch.setattr(decoding, "_compiled_steps", {})
    torch._dynamo.reset()
    cfg = TrainConfig(steps=20, prompts_per_step=5, group_size=4, max_new_tokens=40, eval_every=5, eval_size=8,
                      stockfish_depth=2, stockfish_workers=1, save_every=0, sample_every=0, warmup_steps=0,
                      device="cpu", output_dir=str(tmp_path), log_every=100).validate()
    torch.manual_seed(0)
    policy = GPT(GPTConfig(block_size=256, n_layer=1, n_head=2, n_embd=32)).eval()
    t = Trainer(cfg, policy=policy, reference=copy.deepcopy(policy), tokenizer=get_tokenizer(),
                stream=open(os.devnull, "w"))
    # A run compiles on CUDA alone; here every switch a CUDA run sets is set by hand.
    t.run.compile = t.models.compile = t.models.logprobs.compile = True
    t.sampler.settings["compile"] = True
    before = compiling.graphs_compiled()
    try:
        t.train()
    finally:
        t.close()
    graphs = compiling.graphs_compiled() - before
    assert not compiling.failed, compiling.failed
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list as entries
    from rookworld.net import logprobs, sampling
    counts = {f.__name__: len(entries(f.__code__)) for f in (decoding.decode_step, sampling._draw, logprobs._states,
                                                               logprobs._chunk_logprobs, logprobs._vocab_forward,
                                                               logprobs._vocab_backward)}
    print(f"graphs compiled over 20 steps: {graphs}: {counts}")
    assert 0 < graphs <= 40, graphs
