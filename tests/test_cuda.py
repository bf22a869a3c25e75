"""What only a GPU shows: compiled decoding replayed as CUDA graphs, bf16 autocast, and the whole `rookworld train`
and `rookworld sft` on CUDA with --auto-batch. Skipped without CUDA; `pytest -m cuda` runs just these, and
benches/gpu_suite.py runs them first on a lent GPU.

Compiled and eager bf16 decoding round differently (inductor fuses what eager rounds in between), and a random
model's top two logits are often closer than that rounding, so their greedy tokens may part. The tests therefore
check each decoding along its own path against an fp32 recomputation of the same sequence: every greedy token is
the fp32 argmax up to bf16 rounding, every sampling log-prob the fp32 one. Decoding against a wrong cache or
position fails both by whole nats (measured on the CPU: a mean shortfall of 2.8 against 0.0005 in bf16)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch._dynamo.utils import counters

from conftest import constant_gpt, generate_with, rookworld_process
from test_trainer import metrics
from rookworld.net import compiling, logprobs
from rookworld.net.head import TokenTerms
from rookworld.net.logprobs import PassOptions, token_logprobs
from rookworld.net.model import GPT, GPTConfig
from rookworld.net.device import peak_tflops
from rookworld.net.precision import autocast_copy, refresh_copy
from rookworld.net.sampling import SamplingOptions, generate

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

EOS = 50256
V = 50257
CUDA = torch.device("cuda")
# What bf16 rounding may cost a greedy token against the fp32 argmax, at most and on average (measured on the CPU
# for the model below under bf16 autocast: 0.06 and 0.0005).
SHORTFALL_MAX, SHORTFALL_MEAN = 0.3, 0.01


def _model(n_layer: int = 2, scale: float = 4.0, seed: int = 0) -> GPT:
    """A random GPT with sharpened weights (GPT-2's init gives near-uniform next-token distributions), fp32 on
    the GPU as the trainer's policy is: decoding runs under bf16 autocast with a bf16 KV cache."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=256, n_layer=n_layer, n_head=4, n_embd=256))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln_" not in name:
                p.mul_(scale)
    return model.to(CUDA).eval()


def _prompts(batch: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts: row r has r % (width // 2) pads."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, EOS, (batch, width), generator=g)
    mask = torch.ones(batch, width, dtype=torch.bool)
    for row in range(batch):
        pad = row % (width // 2)
        mask[row, :pad] = False
        ids[row, :pad] = EOS
    return ids.to(CUDA), mask.to(CUDA)


def _fp32_logits_along(model: GPT, ids, mask, out) -> torch.Tensor:
    """fp32 next-token logits before each generated token [B, N, V], recomputed without a cache."""
    P = ids.shape[1]
    with torch.no_grad():
        hidden = model.trunk(torch.cat([ids, out.tokens], 1), torch.cat([mask, out.mask], 1))[:, P - 1 : -1]
        return torch.stack([model.lm_head(h).float() for h in hidden])


def _assert_greedy_in_fp32_up_to_bf16(model, ids, mask, out) -> None:
    logits = _fp32_logits_along(model, ids, mask, out)
    shortfall = logits.max(-1).values - logits.gather(-1, out.tokens[..., None]).squeeze(-1)
    assert shortfall.max() < SHORTFALL_MAX and shortfall.mean() < SHORTFALL_MEAN, (
        f"greedy tokens fall short of the fp32 argmax by up to {shortfall.max():.3f}, {shortfall.mean():.4f} on "
        "average")


@pytest.mark.parametrize("batch", [8, 96])
@pytest.mark.parametrize("new_tokens", [20, 120])  # KV caches of 64 and 192 positions after bucketing
def test_compiled_decode_equals_eager_in_bf16_across_graph_replays(batch, new_tokens):
    model = _model()
    counters.clear()
    compared = 0  # sampled tokens past the first that compiled and eager drew after the same context
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a compiler fallback warns: it must not happen here
        for seed in (1, 2):  # the second call replays the captured graph on new prompts and a reused cache
            ids, mask = _prompts(batch, 30, seed)
            kw = dict(max_new_tokens=new_tokens, temperature=0.0, stop_at_eos=False)
            eager = generate_with(model, ids, mask, compile=False, **kw)
            compiled = generate_with(model, ids, mask, compile=True, **kw)
            for out in (eager, compiled):
                _assert_greedy_in_fp32_up_to_bf16(model, ids, mask, out)
            assert (eager.tokens == compiled.tokens).all(1).any(), "some rows must decode identically"
            # Sampled at temperature 1 with the same uniforms, the log-probs are the policy's own. Even this
            # model's next-token distributions are wide (about 10 nats), so bf16 rounding parts most rows within
            # a few draws (measured on the CPU: after 1 to 4 tokens); up to where a row parts, each token was drawn
            # after the same context by both, and must have the same log-prob.
            kw = dict(max_new_tokens=new_tokens, seed=seed, stop_at_eos=False)
            eager = generate_with(model, ids, mask, compile=False, **kw)
            compiled = generate_with(model, ids, mask, compile=True, **kw)
            same = (eager.tokens == compiled.tokens).long().cumprod(1).bool()  # the common prefix of each row
            assert same[:, 0].all(), "the first draw (from the prompts' logits) must be the same in every row"
            gap = (eager.logprobs - compiled.logprobs)[same].abs().max()
            assert gap < 0.1, f"log-probs of tokens drawn after the same context differ by {gap:.3f}"
            compared += int(same[:, 1:].sum())
    assert compared > 0, "no row's second draw agreed: the compiled decode step's log-probs were never compared"
    assert not compiling.FALLBACKS, compiling.FALLBACKS
    assert counters["stats"]["unique_graphs"] >= 1, "the decode step was not compiled"
    assert counters["inductor"]["cudagraph_skips"] == 0, "the compiled decode step did not run as a CUDA graph"


def test_the_autocast_copy_decodes_as_the_fp32_policy_and_its_graphs_follow_a_refresh():
    """The trainer samples from `autocast_copy(policy)`. Eager, it repeats the fp32 policy under autocast bit for
    bit. Compiled, its greedy tokens are the fp32 argmax up to bf16 rounding, and after the policy's weights change
    and the copy is refreshed in place, the replayed CUDA graph decodes with the new weights."""
    model = _model(seed=4)
    copy = autocast_copy(model, torch.bfloat16)
    kw = dict(max_new_tokens=40, temperature=0.0, stop_at_eos=False, dtype=torch.bfloat16)
    ids, mask = _prompts(32, 30, seed=1)
    fp32, stored = (generate_with(m, ids, mask, compile=False, **kw) for m in (model, copy))
    assert torch.equal(fp32.tokens, stored.tokens)
    # Sampled at temperature 1, the log-probs (the policy's own) are the same bits too.
    sampled = dict(kw, temperature=1.0, seed=7)
    fp32, stored = (generate_with(m, ids, mask, compile=False, **sampled) for m in (model, copy))
    assert torch.equal(fp32.tokens, stored.tokens) and torch.equal(fp32.logprobs, stored.logprobs)
    counters.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for step in range(2):
            if step:  # an update: a stale graph or copy would now fall short of the argmax by whole nats
                with torch.no_grad():
                    for name, p in model.named_parameters():
                        if "ln_" not in name:
                            p.add_(0.5 * p.std() * torch.randn_like(p))
                refresh_copy(copy, model)
            ids, mask = _prompts(32, 30, seed=2 + step)
            _assert_greedy_in_fp32_up_to_bf16(model, ids, mask, generate_with(copy, ids, mask, compile=True, **kw))
    assert not compiling.FALLBACKS, compiling.FALLBACKS
    assert counters["inductor"]["cudagraph_skips"] == 0, "the compiled decode step did not run as a CUDA graph"


def test_compiled_sampling_draws_from_the_fp32_distribution_and_repeats_with_its_seed():
    model = _model(seed=3)
    ids, mask = _prompts(64, 24, seed=5)
    kw = dict(max_new_tokens=32, seed=11, stop_at_eos=False, temperature=0.8)
    compiled = generate_with(model, ids, mask, compile=True, **kw)
    logits = _fp32_logits_along(model, ids, mask, compiled) / 0.8
    fp32 = logits.log_softmax(-1).gather(-1, compiled.tokens[..., None]).squeeze(-1)
    error = (compiled.logprobs - fp32).abs()
    # On the CPU in bf16: 0.05 at most, 0.009 on average; a wrong context: 1.0 on average.
    assert error.max() < 0.25 and error.mean() < 0.03, (error.max(), error.mean())
    again = generate_with(model, ids, mask, compile=True, **kw)
    assert torch.equal(again.tokens, compiled.tokens), "seeded compiled sampling must repeat exactly"


def test_generate_stops_rows_at_eos_at_different_steps_on_cuda():
    logits = torch.zeros(V)
    logits[EOS] = math.log(0.3 * (V - 1) / 0.7)  # P(EOS) = 0.3 at every step, whatever the input
    model = constant_gpt(logits).to(CUDA)
    ids, mask = _prompts(64, 6, seed=0)
    kw = dict(max_new_tokens=100, seed=0)
    out = generate_with(model, ids, mask, compile=True, **kw)
    first_eos = []
    for row in range(64):
        tokens, m = out.tokens[row].tolist(), out.mask[row].tolist()
        assert EOS in tokens, "P(no EOS in 100 steps) is 1e-15"
        e = tokens.index(EOS)
        first_eos.append(e)
        assert out.stopped[row] and out.lengths[row] == e + 1
        assert all(m[: e + 1]) and not any(m[e + 1 :]) and all(t == EOS for t in tokens[e + 1 :])  # PAD_ID = EOS
        assert (out.logprobs[row, e + 1 :] == 0).all()
    assert len(set(first_eos)) > 4, "rows must stop at different steps"
    assert out.tokens.shape[1] == int(out.lengths.max()) < 100, "decoding must end once every row is done"
    eager = generate_with(model, ids, mask, compile=False, **kw)
    assert torch.equal(eager.tokens, out.tokens) and torch.equal(eager.mask, out.mask)


@pytest.mark.parametrize("compile", [False, True])
def test_token_logprobs_under_bf16_autocast_track_float64(compile):
    """Log-probs, entropies and gradients under bf16 autocast, against the same model on the CPU in float64 (its
    log-softmax in fp32, as token_logprobs always computes it). Tolerances: relative error 1e-2 for values (bf16
    operands land between 1e-3 and 1e-2) and 0.1 nats at any token; 3e-2 for gradients."""
    model = _model(n_layer=4, scale=2.0, seed=7).train()
    ids, mask = _prompts(8, 120, seed=9)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        s = token_logprobs(model, ids, mask, PassOptions(start=60, chunk_size=300, compile=compile, entropy=True))
    (s.logprobs.sum() + s.entropy.sum()).backward()
    ref_model = _model(n_layer=4, scale=2.0, seed=7).train().cpu().double()
    r = token_logprobs(ref_model, ids.cpu(), mask.cpu(), PassOptions(start=60, entropy=True))
    (r.logprobs.sum() + r.entropy.sum()).backward()
    assert s.logprobs.dtype == s.entropy.dtype == torch.float32
    if compile:  # the trunk and the chunks' log-softmax both ran compiled, not eagerly after a failure
        assert "cuda" in logprobs._BLOCK.by_device and "cuda" in logprobs._CHUNK.by_device
        assert not compiling.FALLBACKS, compiling.FALLBACKS
    for got, want in ((s.logprobs, r.logprobs), (s.entropy, r.entropy)):
        got, want = got.detach().cpu().double(), want.detach().double()
        assert torch.isfinite(got).all()
        assert (got - want).norm() / want.norm() < 1e-2
        assert (got - want).abs().max() < 0.1
    for name in ("transformer.wte.weight", "transformer.h.0.attn.c_attn.weight", "transformer.h.3.mlp.c_proj.weight"):
        got = dict(model.named_parameters())[name].grad.cpu().double()
        want = dict(ref_model.named_parameters())[name].grad
        rel = float((got - want).norm() / want.norm())
        assert rel < 3e-2, f"{name}: gradient relative error {rel:.3g}"


@pytest.mark.parametrize("compile", [False, True])
def test_each_prompt_once_and_the_fused_pass_under_bf16_track_float64(compile):
    """Groups of 4 completions sharing a prompt, a loss of each position's log-prob and entropy made in one pass
    over the vocabulary (its gradients in the forward, the head's matmuls bf16 with float32 outputs), under bf16
    autocast: the loss, the log-probs and the gradients against the plain pass in float64 on the CPU."""
    model = _model(n_layer=4, scale=2.0, seed=7).train()
    ids, mask = _prompts(4, 60, seed=9)
    completions = torch.randint(0, EOS, (16, 40), device=CUDA)
    ids = torch.cat([ids.repeat_interleave(4, 0), completions], 1)
    mask = torch.cat([mask.repeat_interleave(4, 0), torch.ones_like(completions, dtype=torch.bool)], 1)
    weights = torch.linspace(0.5, 1.5, 16 * 40, device=CUDA).view(16, 40) / 640

    def loss(lp, entropy, kl, at):
        return TokenTerms(-(lp + 0.1 * entropy) * weights.reshape(-1)[at.to(weights.device)])

    with torch.autocast("cuda", dtype=torch.bfloat16):
        options = PassOptions(start=60, compile=compile, entropy=True, rows_per_prompt=4)
        s = token_logprobs(model, ids, mask, options, loss=loss)
    s.loss.backward()
    ref_model = _model(n_layer=4, scale=2.0, seed=7).train().cpu().double()
    r = token_logprobs(ref_model, ids.cpu(), mask.cpu(), PassOptions(start=60, entropy=True))
    w = weights.cpu().double()
    want = -((r.logprobs + 0.1 * r.entropy) * w).sum()
    want.backward()
    assert abs(float(s.loss.detach()) - float(want.detach())) < 1e-2 * abs(float(want.detach()))
    got = s.logprobs.cpu().double()
    assert (got - r.logprobs.detach()).norm() / r.logprobs.norm() < 1e-2
    for name in ("transformer.wte.weight", "transformer.h.0.attn.c_attn.weight", "transformer.h.3.mlp.c_proj.weight"):
        g = dict(model.named_parameters())[name].grad.cpu().double()
        ref = dict(ref_model.named_parameters())[name].grad
        rel = float((g - ref).norm() / ref.norm())
        assert rel < 3e-2, f"{name}: gradient relative error {rel:.3g}"


def test_compiled_decoding_from_prompts_computed_once_stays_greedy_in_fp32():
    """`rows_per_prompt`: the prompt's keys and values copied into the graph's cache in place, then the same
    replayed decode step: every greedy token of every copy is the fp32 argmax along its own path."""
    model = _model()
    ids, mask = _prompts(8, 24, seed=3)
    options = SamplingOptions(max_new_tokens=30, temperature=0.0, stop_at_eos=False, compile=True)
    out = generate(model, ids, mask, options, rows_per_prompt=3)
    assert out.tokens.shape == (24, 30)
    _assert_greedy_in_fp32_up_to_bf16(model, ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0), out)


def run_cli(args):
    """A real `rookworld` process, not conftest.cli: each CUDA run starts with its own CUDA context, allocator and
    compiled graphs, as a user's does (the peak memory --auto-batch measures is then the run's own)."""
    return rookworld_process(*args)


def test_train_three_steps_on_cuda_and_the_checkpoint_reloads(tiny_dir, tmp_path):
    """The trainer's defaults on CUDA: bf16 autocast, compiled decoding and log-prob passes, fused AdamW, real
    Stockfish."""
    out = tmp_path / "run"
    proc = run_cli(["train", "--model", str(tiny_dir), "--output-dir", str(out), "--device", "cuda", "--steps", "3",
                    "--prompts-per-step", "8", "--group-size", "4", "--max-new-tokens", "24", "--stockfish-depth",
                    "4", "--save-every", "3", "--eval-every", "3", "--eval-size", "8", "--entropy-coef", "0.01",
                    "--lr", "1e-3", "--seed", "3"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert compiling.FELL_BACK not in proc.stderr and "Traceback" not in proc.stderr
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # step 0: the evaluation before any update
    assert "eval/P/legal_best_move" in rows[0] and "reward/mean" not in rows[0]
    rows = rows[1:]
    for r in rows:
        assert math.isfinite(r["loss"]) and r["samples_per_s"] > 0 and r["peak_memory_gb"] > 0
    assert "eval/P/best_move_accuracy" in rows[-1] and "eval/A/next_state_exact" in rows[-1]
    # What compiled is said while it waits and after its step, and kept in that step's row (issue 56).
    compiled = [g for r in metrics(out) for g in r.get("compiled", [])]
    assert compiled and all(g["name"] and g["seconds"] >= 0 for g in compiled), compiled
    assert "compiling the decode step for " in proc.stderr and " compiled " in proc.stderr
    assert (out / "compile_cache.bin").is_file()
    ckpt = out / "checkpoints" / "step-000003"
    transformers = pytest.importorskip("transformers")
    from rookworld.net.pretrained import from_pretrained

    ours, hf = from_pretrained(ckpt), transformers.GPT2LMHeadModel.from_pretrained(ckpt).eval()
    ids = torch.randint(0, EOS, (2, 20))
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, ours(ids), atol=1e-4)
    start = from_pretrained(tiny_dir).state_dict()
    assert any(not torch.equal(start[k], v) for k, v in ours.state_dict().items()), "the weights must have moved"


def test_train_compiles_decoding_alone_by_default_on_cuda(tiny_dir, tmp_path):
    """train's default on CUDA: the run's graphs are the decode step's and the draw's, no log-prob pass's; with
    --compile-logprobs one block serves every layer (its graphs are `_block`'s, the trunk's own never)."""
    def names(*extra: str) -> set[str]:
        out = tmp_path / f"run{len(extra)}"
        proc = run_cli(["train", "--model", str(tiny_dir), "--output-dir", str(out), "--device", "cuda", "--steps",
                        "2", "--prompts-per-step", "8", "--group-size", "4", "--max-new-tokens", "16",
                        "--stockfish-depth", "4", "--save-every", "0", "--eval-every", "0", *extra])
        assert proc.returncode == 0, proc.stderr[-3000:]
        return {g["name"] for r in metrics(out) for g in r.get("compiled", [])}

    assert names() == {"decode_step", "_draw_in_blocks"}
    assert {"_block", "vocab_forward"} <= names("--compile-logprobs") <= {"decode_step", "_draw_in_blocks", "_block",
                                                                          "_block backward", "vocab_forward",
                                                                          "vocab_backward"}


def test_auto_batch_chooses_a_size_on_cuda(tiny_dir, tmp_path):
    out = tmp_path / "auto"
    proc = run_cli(["train", "--model", str(tiny_dir), "--output-dir", str(out), "--device", "cuda", "--steps", "1",
                    "--auto-batch", "--prompts-per-step", "2", "--auto-batch-max", "16", "--group-size", "4",
                    "--max-new-tokens", "16", "--stockfish-depth", "4", "--eval-every", "0", "--save-every", "0",
                    "--no-compile"])  # the search is under test here; compiling each probe's shapes would only cost time
    assert proc.returncode == 0, proc.stderr[-3000:]
    chosen = [line for line in proc.stderr.splitlines() if "auto-batch: training with" in line]
    assert len(chosen) == 1, proc.stderr[-3000:]
    # A 2-layer model fits far more than 16 prompts x 4 on any GPU: the search must double up to its cap.
    assert int(chosen[0].split("training with ")[1].split()[0]) == 16
    for p in (2, 4, 8, 16):
        assert f"auto-batch: {p} prompts x 4 = {4 * p} completions: peak" in proc.stderr
    assert [r["step"] for r in metrics(out)] == [1]


def test_sft_on_cuda_reports_mfu_and_writes_a_model(tmp_path):
    data = tmp_path / "train.jsonl"
    proc = run_cli(["positions", "--count", "24", "--seed", "4", "--out", str(data), "--annotate",
                    "--stockfish-depth", "4", "--quiet"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "sft"
    proc = run_cli(["sft", "--init", "tiny", "--data", str(data), "--output-dir", str(out), "--device", "cuda",
                    "--steps", "3", "--rows-per-step", "8", "--micro-batch-size", "4", "--eval-every", "0",
                    "--save-every", "3", "--warmup-steps", "0", "--lr", "1e-3"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert compiling.FELL_BACK not in proc.stderr
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) and r["tokens_per_s"] > 0 for r in rows)
    # MFU where the card's peak is known, else left out rather than wrong
    known = peak_tflops(torch.cuda.get_device_name()) is not None
    assert all((0 < r["mfu"] < 1) if known else "mfu" not in r for r in rows)
    assert rows[-1]["loss"] < rows[0]["loss"], "three steps at the default lr must lower the loss on the same data"
    from rookworld.net.pretrained import from_pretrained

    assert from_pretrained(out).config.n_layer == 2
