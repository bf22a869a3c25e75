"""Batched generation (KV cache, stopping, sampler correctness) and the chunked log-prob pass."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
import torch

from conftest import constant_gpt, generate_with, tiny_gpt
from rookworld.net import compiling, decoding, logprobs, sampling
from rookworld.net.logprobs import PassOptions, token_logprobs, with_values
from rookworld.net.head import head_logits
from rookworld.net.precision import autocast_copy
from rookworld.net.sampling import SamplingOptions, generate, sample_next

EOS = 50256
V = 50257


def _prompts(B: int = 4, T: int = 12, seed: int = 0, eos: int = EOS) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, eos, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    for row in range(1, B):
        pad = (3 * row) % (T - 2)
        mask[row, :pad] = False
        ids[row, :pad] = eos
    return ids, mask


def _reference_greedy(model, ids: torch.Tensor, n: int) -> list[int]:
    """Greedy decoding of one unpadded prompt, recomputing the whole sequence each step."""
    seq = ids.clone()
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(seq[None])[0, -1].argmax())
            out.append(nxt)
            seq = torch.cat([seq, torch.tensor([nxt])])
    return out


def _recomputed_generate(model, ids, mask, n: int, seed: int, temperature: float = 1.0, top_k=None, top_p=None,
                         dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
    """`generate` without a KV cache (and without stopping): the whole sequence through the model at every step,
    each token drawn by `sample_next` with a generator seeded as `generate` seeds its own. (tokens, log-probs)."""
    g = torch.Generator().manual_seed(seed)
    tokens, logps = [], []
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        for _ in range(n):
            logits = head_logits(model.trunk(ids, mask)[:, -1], model.lm_head.weight)
            token, logp = sample_next(logits, temperature, top_k, top_p, g)
            tokens.append(token)
            logps.append(logp)
            ids, mask = torch.cat([ids, token[:, None]], 1), torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    return torch.stack(tokens, 1), torch.stack(logps, 1)


def _completion_logprobs(model, ids, mask, out, **kwargs) -> torch.Tensor:
    """The log-prob pass over prompts + generated completions: log-probs of the generated tokens [B, N] (at
    temperature 1 unless told), 0 off their mask."""
    full_ids, full_mask = torch.cat([ids, out.tokens], 1), torch.cat([mask, out.mask], 1)
    with torch.no_grad():
        options = PassOptions(start=ids.shape[1], **kwargs)
        return token_logprobs(model, full_ids, full_mask, options).logprobs * out.mask


def _peaked_logits() -> torch.Tensor:
    """Next-token logits with probabilities 0.4, 0.3, 0.2, 0.1 on tokens 11, 22, 33, 44 (others ~0)."""
    logits = torch.full((V,), -40.0)
    for token, p in zip((11, 22, 33, 44), (0.4, 0.3, 0.2, 0.1)):
        logits[token] = math.log(p)
    return logits


def test_kv_cache_matches_full_recomputation(tiny_model):
    ids, mask = _prompts()
    cached = generate(tiny_model, ids, mask, SamplingOptions(max_new_tokens=24, stop_at_eos=False), seed=7)
    tokens, logps = _recomputed_generate(tiny_model, ids, mask, 24, seed=7)
    assert torch.equal(cached.tokens, tokens)
    assert torch.allclose(cached.logprobs, logps, atol=1e-4)
    # At temperature 1 the sampling log-probs are the policy's own, which the log-prob pass recomputes.
    assert torch.allclose(cached.logprobs, _completion_logprobs(tiny_model, ids, mask, cached), atol=1e-4)
    assert len(set(cached.tokens.flatten().tolist())) > 20  # really sampled, not a constant

    # Top-p cuts at a threshold of cumulated mass, where float32's 1e-6 differences between the cache's attention
    # and the recomputed one can flip a token: in float64 the two paths agree draw for draw.
    model64 = tiny_model.double()
    for top_k, top_p in [(50, None), (None, 0.9)]:
        kw = dict(temperature=0.8, top_k=top_k, top_p=top_p)
        a = generate_with(model64, ids, mask, max_new_tokens=24, seed=7, stop_at_eos=False, **kw)
        tokens, logps = _recomputed_generate(model64, ids, mask, 24, seed=7, **kw)
        assert torch.equal(a.tokens, tokens) and torch.allclose(a.logprobs.double(), logps, atol=1e-6)


def test_groups_whose_rows_are_done_leave_the_batch_and_no_draw_changes(tiny_model):
    """Eager decoding keeps each prompt once for its rows and drops a group when all its rows are done. In float64,
    rows of 3 prompts x 2 with limits 2, 5 and 9 draw exactly the tokens of a full recomputation of every row
    (which keeps all rows to the end), up to their limits; and after a drop the decoder's logits are the kept
    rows' logits of a decoder that dropped nothing."""
    model = tiny_model.double()
    ids, mask = _prompts(B=3, T=10, seed=2)
    limits = torch.tensor([2, 2, 5, 5, 9, 9])
    out = generate(model, ids, mask, SamplingOptions(max_new_tokens=limits, stop_at_eos=False), seed=11,
                   rows_per_prompt=2)
    tokens, logps = _recomputed_generate(model, ids.repeat_interleave(2, 0), mask.repeat_interleave(2, 0), 9, seed=11)
    assert out.lengths.tolist() == limits.tolist()
    for row, n in enumerate(limits.tolist()):
        assert out.tokens[row, :n].tolist() == tokens[row, :n].tolist()
        torch.testing.assert_close(out.logprobs[row, :n], logps[row, :n].float(), rtol=0, atol=1e-6)

    with torch.no_grad():
        whole, dropping = (decoding.Decoder(model, 6, 10 + 4, None, False) for _ in range(2))
        for d in (whole, dropping):
            d.prefill(ids, mask, rows_per_prompt=2)
        step = torch.arange(6) + 7
        whole.step(step), dropping.step(step)
        kept = dropping.drop_done(torch.tensor([False, False, True, True, True, False]))  # group 1 is done
        assert kept.tolist() == [True, True, False, False, True, True]
        torch.testing.assert_close(dropping.step(step[kept]), whole.step(step)[kept], rtol=0, atol=1e-10)
        assert dropping.drop_done(torch.zeros(4, dtype=torch.bool)) is None


def test_greedy_is_deterministic_and_matches_reference(tiny_model):
    ids, mask = _prompts()
    a = generate(tiny_model, ids, mask, SamplingOptions(max_new_tokens=16, temperature=0.0, stop_at_eos=False))
    b = generate(tiny_model, ids, mask, SamplingOptions(max_new_tokens=16, temperature=0.0, stop_at_eos=False))
    assert torch.equal(a.tokens, b.tokens)
    assert (a.logprobs == 0).all()  # a point mass
    for row in range(ids.shape[0]):
        assert a.tokens[row].tolist() == _reference_greedy(tiny_model, ids[row, mask[row]], 16)


def test_left_padding_does_not_change_completions(tiny_model):
    ids, mask = _prompts(B=4, T=14, seed=3)
    batch = generate(tiny_model, ids, mask, SamplingOptions(max_new_tokens=12, temperature=0.0))
    for row in range(4):
        alone = generate(tiny_model, ids[row : row + 1, mask[row]], None,
                         SamplingOptions(max_new_tokens=12, temperature=0.0))
        n = int(alone.lengths[0])
        assert batch.tokens[row, :n].tolist() == alone.tokens[0, :n].tolist()
    # Sampled at temperature 1 (log-probs: the policy's own), the same prompts under 5 more pads each, row 0's
    # none among them, draw the same tokens with the same log-probs: the same uniforms meet the same logits.
    wider_ids = torch.cat([torch.full((4, 5), EOS), ids], 1)
    wider_mask = torch.cat([torch.zeros(4, 5, dtype=torch.bool), mask], 1)
    a = generate(tiny_model, ids, mask, SamplingOptions(max_new_tokens=12, stop_at_eos=False), seed=4)
    b = generate(tiny_model, wider_ids, wider_mask, SamplingOptions(max_new_tokens=12, stop_at_eos=False), seed=4)
    assert torch.equal(a.tokens, b.tokens) and torch.allclose(a.logprobs, b.logprobs, atol=1e-4)


@pytest.mark.parametrize("vocab_size", [V, 4364])  # GPT-2's vocabulary, the chess one (EOS its last id)
def test_stops_at_eos_and_pads_after_it(vocab_size):
    EOS = vocab_size - 1
    logits = torch.zeros(vocab_size)
    logits[EOS] = math.log(0.3 * (vocab_size - 1) / 0.7)  # P(EOS) = 0.3 at every step
    model = constant_gpt(logits)
    ids, mask = _prompts(B=64, T=5, eos=EOS)
    out = generate(model, ids, mask, SamplingOptions(max_new_tokens=20, eos_id=EOS), seed=0)
    first_eos = []
    for row in range(64):
        tokens, m = out.tokens[row].tolist(), out.mask[row].tolist()
        if EOS in tokens:
            e = tokens.index(EOS)
            first_eos.append(e)
            assert out.stopped[row] and out.lengths[row] == e + 1
            assert all(m[: e + 1]) and not any(m[e + 1 :])
            assert all(t == EOS for t in tokens[e + 1 :])  # PAD_ID (= EOS) after the end, not further draws
            assert (out.logprobs[row, e + 1 :] == 0).all()
            assert out.logprobs[row, e].item() == pytest.approx(math.log(0.3), abs=1e-4)
        else:
            assert not out.stopped[row] and out.lengths[row] == 20 and all(m)
    assert len(first_eos) > 50 and len(set(first_eos)) > 4  # rows stop at different steps
    assert out.tokens.shape[1] == int(out.lengths.max())

    ignore = generate(model, ids, mask, SamplingOptions(max_new_tokens=20, stop_at_eos=False), seed=0)
    assert (ignore.lengths == 20).all() and ignore.mask.all() and not ignore.stopped.any()
    assert (ignore.tokens == EOS).sum() > 100  # EOS kept coming, generation went on


def test_max_new_tokens_per_row_and_early_exit():
    model = constant_gpt(torch.zeros(V))  # uniform: EOS is rare
    ids, mask = _prompts(B=3, T=6)
    out = generate(model, ids, mask, SamplingOptions(max_new_tokens=torch.tensor([2, 7, 4]), stop_at_eos=False), seed=1)
    assert out.lengths.tolist() == [2, 7, 4]
    assert out.tokens.shape == (3, 7)
    assert out.mask.sum(1).tolist() == [2, 7, 4]
    assert (out.tokens[0, 2:] == EOS).all()

    eos_only = torch.full((V,), -30.0)
    eos_only[EOS] = 0.0
    out = generate(constant_gpt(eos_only), ids, mask, SamplingOptions(max_new_tokens=50), seed=1)
    assert out.tokens.shape == (3, 1) and out.stopped.all()  # everyone done after one step: loop ended

    with pytest.raises(ValueError, match="context"):
        generate(model, ids, mask, SamplingOptions(max_new_tokens=200))


def test_seeded_sampling_is_reproducible(tiny_model):
    ids, mask = _prompts()
    a = generate(tiny_model, ids, mask, SamplingOptions(max_new_tokens=10), seed=123)
    b = generate(tiny_model, ids, mask, SamplingOptions(max_new_tokens=10), seed=123)
    c = generate(tiny_model, ids, mask, SamplingOptions(max_new_tokens=10), seed=124)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.tokens, c.tokens)
    d = generate(tiny_model, ids, mask, SamplingOptions(max_new_tokens=10),
                 generator=torch.Generator().manual_seed(123))
    assert torch.equal(a.tokens, d.tokens)


def test_sampler_draws_from_the_right_distribution():
    small = _peaked_logits()[:64].expand(20000, 64)  # the sampler does not care about the vocabulary size
    g = torch.Generator().manual_seed(5)
    for temperature in (1.0, 0.5):
        tokens, _ = sample_next(small, temperature=temperature, generator=g)
        p = torch.tensor([0.4, 0.3, 0.2, 0.1]) ** (1 / temperature)
        p = p / p.sum()
        freq = torch.stack([(tokens == t).float().mean() for t in (11, 22, 33, 44)])
        assert (freq - p).abs().max() < 0.015, (temperature, freq, p)

    model = constant_gpt(_peaked_logits())
    for temperature in (1.0, 0.5):
        prompts = torch.full((512, 1), 7)
        out = generate(model, prompts, None, SamplingOptions(max_new_tokens=2, temperature=temperature), seed=5)
        policy_logprobs = _completion_logprobs(model, prompts, torch.ones_like(prompts, dtype=torch.bool), out)
        tokens = out.tokens
        assert set(tokens.flatten().tolist()) == {11, 22, 33, 44}
        p = torch.tensor([0.4, 0.3, 0.2, 0.1]) ** (1 / temperature)
        p = p / p.sum()
        # Sampling log-probs are those of the tempered distribution; policy log-probs those at temperature 1.
        for t, pt, p1 in zip((11, 22, 33, 44), p, (0.4, 0.3, 0.2, 0.1)):
            sel = tokens == t
            assert torch.allclose(out.logprobs[sel], pt.log(), atol=1e-4)
            assert torch.allclose(policy_logprobs[sel], torch.tensor(math.log(p1)), atol=1e-4)


def _chi_square(counts: torch.Tensor, p: torch.Tensor) -> float:
    """Pearson's statistic of `counts` against probabilities `p` (float64)."""
    expected = p * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.slow
def test_the_draw_passes_a_chi_square_test_down_to_tokens_far_below_the_winner():
    """100,000 draws against the distribution, by Pearson's chi-square in float64: the winner, four tokens from 10%
    to 0.1% of it, and 25,000 tail tokens each 8e-9 of it (2e-4 of the mass together: about 20 draws). 5 degrees
    of freedom: below 20.5 with probability 0.999 when the draw is exact. The Gumbel race with float32 uniforms
    (E = -log U never below 6e-8) drew none of them on this seed, a statistic of 25."""
    tail_tokens, rows = 25_000, 100_000
    ratios = torch.tensor([1.0, 0.1, 0.02, 0.005, 0.001] + [8e-9] * tail_tokens, dtype=torch.float64)
    p = ratios / ratios.sum()
    bins = torch.cat([p[:5], p[5:].sum().reshape(1)])
    g = torch.Generator().manual_seed(11)
    counts = torch.zeros(6, dtype=torch.float64)
    for _ in range(rows // 500):
        tokens, _ = sample_next(ratios.log().float().expand(500, -1), generator=g)
        counts += torch.bincount(tokens.clamp(max=5), minlength=6).double()
    assert bins[5] * rows > 15 and counts[5] > 0
    assert _chi_square(counts, bins) < 20.5, (counts.tolist(), (bins * rows).tolist())


@pytest.mark.parametrize("kw", [{"temperature": 0.7}, {"temperature": 1.3, "top_k": 4}, {"top_p": 0.9},
                                {"temperature": 0.5, "top_k": 5, "top_p": 0.99}])
def test_the_draw_passes_a_chi_square_test_with_temperature_top_k_and_top_p(kw):
    """50,000 draws from six tokens against the tempered, restricted distribution computed by hand in float64
    (top-k keeps the k likeliest, top-p the shortest prefix whose mass reaches p): 5 degrees of freedom, below
    20.5 with probability 0.999; a token outside the support is never drawn."""
    probs = torch.tensor([0.35, 0.25, 0.2, 0.1, 0.07, 0.03], dtype=torch.float64)
    weights = probs ** (1 / kw.get("temperature", 1.0))
    keep = torch.ones(6, dtype=torch.bool)
    if "top_k" in kw:
        keep[kw["top_k"]:] = False
    if "top_p" in kw:
        q = weights * keep / (weights * keep).sum()
        keep &= (q.cumsum(0) - q) < kw["top_p"]
    p = weights * keep / (weights * keep).sum()
    tokens, _ = sample_next(probs.log().float().expand(50_000, -1), generator=torch.Generator().manual_seed(3), **kw)
    counts = torch.bincount(tokens, minlength=6).double()
    assert counts[~keep].sum() == 0
    assert _chi_square(counts[keep], p[keep]) < 20.5, (kw, counts.tolist(), (p * 50_000).tolist())


@pytest.mark.parametrize("draw", ["_draw", "_draw_in_blocks"])
def test_each_token_holds_a_step_of_the_uniform_as_wide_as_its_probability(draw):
    """The draw inverts the float64 running sum: a uniform just inside a token's step [F(i-1), F(i)) draws it,
    even for a token of 1e-12 of the winner's probability, and a token of probability 0 (removed by top-p) holds
    no step at all."""
    ratios = torch.tensor([1.0, 1e-12, 0.5, 0.0, 1e-9, 0.25], dtype=torch.float64)
    logits = ratios.log().float()
    cdf = (logits - logits.max()).exp().double().cumsum(0)
    cdf = cdf / cdf[-1]
    lows = torch.cat([torch.zeros(1, dtype=torch.float64), cdf[:-1]])
    for i, (low, high) in enumerate(zip(lows.tolist(), cdf.tolist())):
        if high == low:
            continue
        inside = torch.tensor([[low + (high - low) * f] for f in (1e-3, 0.5, 0.999)], dtype=torch.float64)
        choice, _ = getattr(sampling, draw)(logits.expand(3, -1), inside)
        assert choice.squeeze(1).tolist() == [i] * 3, (i, low, high)
    steps = (cdf - lows).tolist()
    assert steps[3] == 0.0 and steps[1] == pytest.approx(1e-12 / 1.75, rel=1e-3)


@pytest.mark.parametrize("K", [6, 256, 257, 50257])
def test_the_running_sum_in_blocks_follows_the_sequential_one(K):
    """The draw on CUDA sums in blocks of SCAN_BLOCK columns (a long scan fails to compile there): put together, the two
    levels agree with numpy's sequential float64 sum to 1e-13 of the total (50,257 terms added in another order),
    never decrease, and stay flat across every weight of 0; padding holds the total."""
    g = torch.Generator().manual_seed(K)
    weights = torch.rand(4, K, generator=g) ** 8
    weights[:, 1::5] = 0
    inside, ends = sampling._running_sums(weights)
    blocks = ends.shape[1]
    assert inside.shape == (4, blocks, sampling.SCAN_BLOCK)
    assert 0 <= blocks * sampling.SCAN_BLOCK - K < sampling.SCAN_BLOCK
    assert torch.equal(ends[:, 0], inside[:, 0, -1])
    whole = (inside + torch.cat([torch.zeros(4, 1, dtype=torch.float64), ends[:, :-1]], 1)[..., None]).view(4, -1)
    want = np.cumsum(weights.double().numpy(), axis=1)
    assert np.abs(whole[:, :K].numpy() - want).max() <= 1e-13 * want[:, -1].max()
    steps = whole[:, 1:] - whole[:, :-1]
    assert (steps >= 0).all() and (steps[:, : K - 1][weights[:, 1:] == 0] == 0).all()
    assert (whole[:, K:] == ends[:, -1:]).all() and torch.equal(whole[:, K - 1], ends[:, -1])


@pytest.mark.slow
@pytest.mark.parametrize("kw", [{}, {"temperature": 0.7}, {"top_k": 50, "top_p": 0.9}, {"top_p": 0.95}])
def test_the_draw_in_blocks_is_the_whole_row_draw(kw, monkeypatch):
    """CUDA's draw (`_draw_in_blocks`) against the CPU's (`_draw`) on the same uniforms: the same tokens, 4,096
    rows of logits spread as a trained model's are (e^6 between neighbours' standard deviations), and the same
    log-probs to float32's rounding."""
    logits = torch.randn(4096, V, generator=torch.Generator().manual_seed(5)) * 6
    whole = sample_next(logits, generator=torch.Generator().manual_seed(6), **kw)
    monkeypatch.setattr(sampling, "DRAWS", {**sampling.DRAWS, "cpu": sampling._draw_in_blocks})
    blocks = sample_next(logits, generator=torch.Generator().manual_seed(6), **kw)
    assert torch.equal(whole[0], blocks[0]), kw
    torch.testing.assert_close(blocks[1], whole[1], rtol=0, atol=1e-5)


def test_a_step_that_rounding_gives_a_removed_token_draws_the_likeliest_instead(monkeypatch):
    """A parallel scan (compiled, on CUDA) may round the sums before and after a weight of 0 apart, giving a token
    top-p removed (log-prob -inf) a step one unit in the last place wide. A uniform inside that step draws the
    likeliest token instead. The step is put in by hand, wider than rounding makes it so that a uniform lands in
    it: a sequential sum has none."""
    logits = torch.tensor([[0.5, 2.0, float("-inf"), 1.0]])
    honest = sampling._running_sums

    def rounded(weights):
        inside, ends = honest(weights)
        inside[:, 0, 2:] += 1e-9
        return inside, inside[..., -1].cumsum(-1)

    monkeypatch.setattr(sampling, "_running_sums", rounded)
    inside, ends = rounded((logits - logits.max()).exp())
    inside_step = (inside[:, 0, 1:2] + inside[:, 0, 2:3]) / 2 / ends  # a uniform inside the removed token's step
    assert inside[0, 0, 1] < inside_step * ends[0, -1] < inside[0, 0, 2]
    choice, logp = sampling._draw(logits, inside_step)
    assert choice.item() == 1 and logp.item() == pytest.approx(2.0 - math.log(sum(math.exp(x) for x in (.5, 2, 1))))


def test_the_draw_is_reproducible_under_a_seed_and_one_uniform_a_row():
    """The same generator seed gives the same tokens; the generator advances by one float64 a row, not a token."""
    logits = torch.randn(8, V, generator=torch.Generator().manual_seed(3)) * 2
    first = sample_next(logits, generator=torch.Generator().manual_seed(4))
    again = sample_next(logits, generator=torch.Generator().manual_seed(4))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    g = torch.Generator().manual_seed(4)
    sample_next(logits, generator=g)
    after = torch.rand(1, generator=g, dtype=torch.float64)
    h = torch.Generator().manual_seed(4)
    torch.rand((8, 1), generator=h, dtype=torch.float64)
    assert torch.equal(after, torch.rand(1, generator=h, dtype=torch.float64))


@pytest.mark.slow
@pytest.mark.parametrize("in_blocks", [False, True])
def test_the_compiled_draw_is_the_eager_one(monkeypatch, in_blocks):
    """sample_next(compile=True) fuses the draw; given the same uniforms it picks the same tokens, with the same
    log-probs, with and without top-k / top-p, and it follows the right distribution. Also CUDA's draw in blocks,
    compiled here on the CPU."""
    monkeypatch.setattr(compiling, "FALLBACKS", compiling.Fallbacks())
    draw = sampling.COMPILED_DRAWS[sampling._draw_in_blocks if in_blocks else sampling._draw]
    monkeypatch.setattr(draw, "by_device", {})
    if in_blocks:
        monkeypatch.setattr(sampling, "DRAWS", {**sampling.DRAWS, "cpu": sampling._draw_in_blocks})
    logits = torch.randn(64, V, generator=torch.Generator().manual_seed(2)) * 3
    for kw in ({}, {"temperature": 0.7}, {"top_k": 50, "top_p": 0.9}):
        eager = sample_next(logits, generator=torch.Generator().manual_seed(9), **kw)
        compiled = sample_next(logits, generator=torch.Generator().manual_seed(9), compile=True, **kw)
        assert torch.equal(eager[0], compiled[0]), kw
        torch.testing.assert_close(compiled[1], eager[1], rtol=0, atol=1e-4)
    assert "cpu" in draw.by_device and not compiling.FALLBACKS
    small = _peaked_logits()[:64].expand(20000, 64)
    tokens, logp = sample_next(small, generator=torch.Generator().manual_seed(5), compile=True)
    freq = torch.stack([(tokens == t).float().mean() for t in (11, 22, 33, 44)])
    assert (freq - torch.tensor([0.4, 0.3, 0.2, 0.1])).abs().max() < 0.015
    assert torch.allclose(logp[tokens == 22], torch.tensor(math.log(0.3)), atol=1e-4)


def test_top_k_and_top_p_restrict_the_support():
    logits = _peaked_logits()[:100].expand(3000, 100)  # the sampler does not care about the vocabulary size
    g = torch.Generator().manual_seed(0)

    tokens, logp = sample_next(logits, top_k=2, generator=g)
    assert set(tokens.tolist()) == {11, 22}
    for t, p in ((11, 0.4 / 0.7), (22, 0.3 / 0.7)):
        assert torch.allclose(logp[tokens == t], torch.tensor(math.log(p)), atol=1e-5)

    tokens, logp = sample_next(logits, top_p=0.75, generator=g)  # 0.4 + 0.3 < 0.75: token 33 is needed too
    assert set(tokens.tolist()) == {11, 22, 33}
    assert torch.allclose(logp[tokens == 33], torch.tensor(math.log(0.2 / 0.9)), atol=1e-5)

    tokens, _ = sample_next(logits, top_p=0.65, generator=g)
    assert set(tokens.tolist()) == {11, 22}
    tokens, _ = sample_next(logits, top_p=0.3, generator=g)  # the top token always survives
    assert set(tokens.tolist()) == {11}
    tokens, _ = sample_next(logits, top_k=3, top_p=0.65, generator=g)
    assert set(tokens.tolist()) == {11, 22}
    tokens, logp = sample_next(logits, temperature=0.0)
    assert set(tokens.tolist()) == {11} and (logp == 0).all()

    model = constant_gpt(_peaked_logits())
    out = generate(model, torch.full((64, 2), 7), None, SamplingOptions(max_new_tokens=3, top_k=3, top_p=0.65), seed=2)
    assert set(out.tokens.flatten().tolist()) == {11, 22}
    out = generate(model, torch.full((64, 2), 7), None, SamplingOptions(max_new_tokens=3, top_p=0.75), seed=2)
    assert set(out.tokens.flatten().tolist()) == {11, 22, 33}
    with pytest.raises(ValueError, match="top_p"):
        generate(model, torch.full((2, 2), 7), None, SamplingOptions(max_new_tokens=3, top_p=0.0))


def test_bf16_autocast_decoding_tracks_fp32(tiny_model):
    """The GPU default (fp32 weights, bf16 autocast, bf16 KV cache), exercised on CPU."""
    ids, mask = _prompts(seed=5)
    kw = dict(max_new_tokens=10, temperature=0.0, stop_at_eos=False)
    fp32 = generate_with(tiny_model, ids, mask, **kw)
    bf16 = generate_with(tiny_model, ids, mask, dtype=torch.bfloat16, **kw)
    bf16_recomputed, _ = _recomputed_generate(tiny_model, ids, mask, 10, seed=0, temperature=0.0,
                                              dtype=torch.bfloat16)
    assert (bf16.tokens == fp32.tokens).float().mean() > 0.9
    assert (bf16.tokens == bf16_recomputed).float().mean() > 0.9
    # Sampled at temperature 1, the log-probs the bf16 decoder gives its draws are the fp32 policy's own.
    sampled = generate(tiny_model, ids, mask, SamplingOptions(max_new_tokens=10, stop_at_eos=False,
                                                              dtype=torch.bfloat16), seed=5)
    assert sampled.logprobs.dtype == torch.float32 and torch.isfinite(sampled.logprobs).all()
    assert (sampled.logprobs - _completion_logprobs(tiny_model, ids, mask, sampled)).abs().max() < 0.1


def test_sampling_from_the_autocast_copy_repeats_the_fp32_model_exactly(tiny_model):
    """The trainer samples from `autocast_copy(policy)`: the same tokens and log-probs as the fp32 policy under
    bf16 autocast, draw for draw (eager; compiled graphs may fuse the fp32 path's casts differently)."""
    copy = autocast_copy(tiny_model, torch.bfloat16)
    ids, mask = _prompts(B=6, seed=8)
    kw = dict(max_new_tokens=12, temperature=1.0, seed=5, stop_at_eos=False, dtype=torch.bfloat16)
    expected, got = generate_with(tiny_model, ids, mask, **kw), generate_with(copy, ids, mask, **kw)
    assert torch.equal(got.tokens, expected.tokens)
    assert torch.equal(got.logprobs, expected.logprobs)  # at temperature 1: the policy's own log-probs
    # The reference's log-prob pass reads its autocast copy too.
    full_ids, full_mask = torch.cat([ids, got.tokens], 1), torch.cat([mask, got.mask], 1)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = (token_logprobs(m, full_ids, full_mask, PassOptions(start=ids.shape[1], entropy=True))
                for m in (tiny_model, copy))
    assert torch.equal(a.logprobs, b.logprobs) and torch.equal(a.entropy, b.entropy)


def test_generate_leaves_training_mode_alone_and_samples_without_dropout():
    model = tiny_gpt(scale=4.0)
    model.config.dropout = 0.5
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.5
    model.train()
    ids, mask = _prompts()
    a = generate(model, ids, mask, SamplingOptions(max_new_tokens=8, temperature=0.0))
    b = generate(model, ids, mask, SamplingOptions(max_new_tokens=8, temperature=0.0))
    assert model.training
    assert torch.equal(a.tokens, b.tokens)


def _naive_logprobs(model, ids, mask, start, temperature=1.0):
    logits = model(ids, mask)[:, start - 1 : -1].float() / temperature
    logp = logits.log_softmax(-1)
    token_logp = logp.gather(-1, ids[:, start:, None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return token_logp, entropy


@pytest.fixture
def rows_seen(monkeypatch):
    """The rows of every lm_head chunk of `token_logprobs`, in order."""
    seen = []
    original = logprobs._chunk_logprobs

    def spy(hidden, *args):
        seen.append(hidden.shape[0])
        return original(hidden, *args)

    monkeypatch.setattr(logprobs._CHUNK, "fn", spy)
    return seen


def test_chunked_logprobs_equal_unchunked_with_gradients(rows_seen):
    ids, mask = _prompts(B=3, T=20, seed=9)
    start = 12
    model_a, model_b = tiny_gpt(seed=4, scale=3.0), tiny_gpt(seed=4, scale=3.0)

    s = token_logprobs(model_a, ids, mask, PassOptions(start=start, chunk_size=5, temperature=0.9, entropy=True))
    assert s.logprobs.shape == s.entropy.shape == (3, 8)
    assert max(rows_seen) <= 5 and sum(rows_seen) == 24  # really chunked

    ref_logp, ref_entropy = _naive_logprobs(model_b, ids, mask, start, temperature=0.9)
    assert torch.allclose(s.logprobs, ref_logp, atol=1e-5)
    assert torch.allclose(s.entropy, ref_entropy, atol=1e-4)

    weights = torch.linspace(0.5, 1.5, 24).view(3, 8)
    ((s.logprobs * weights).sum() + 0.1 * s.entropy.sum()).backward()
    ((ref_logp * weights).sum() + 0.1 * ref_entropy.sum()).backward()
    # Checkpointed: backward recomputed each chunk's logits instead of keeping all of them from the forward.
    assert max(rows_seen) <= 5 and sum(rows_seen) == 48
    for (name, pa), (_, pb) in zip(model_a.named_parameters(), model_b.named_parameters()):
        assert pa.grad is not None and pa.grad.abs().sum() > 0, name
        assert torch.allclose(pa.grad, pb.grad, atol=1e-4, rtol=1e-3), name

    with torch.no_grad():
        plain = token_logprobs(model_a, ids, mask, PassOptions(start=start, chunk_size=7, temperature=0.9))
    assert plain.entropy is None and torch.allclose(plain.logprobs, ref_logp, atol=1e-5)


# KL(policy || reference), KL(reference || policy) and their mean ("forward", "reverse", "symmetric").
@pytest.mark.parametrize("kl_weights", [(1.0, 0.0), (0.0, 1.0), (0.5, 0.5)])
def test_exact_kl_to_a_reference_and_values_in_the_chunked_pass(kl_weights):
    """`--kl-estimator full`: the KL over the whole vocabulary, made chunk by chunk beside the policy's
    log-probs, equals a direct computation from both models' full logits, in value and gradient; the value
    head reads the hidden state that predicts each token."""
    from rookworld.net.value import ValueHead

    ids, mask = _prompts(B=3, T=16, seed=2)
    start, temperature = 9, 0.8
    model_a, model_b = tiny_gpt(seed=4, scale=3.0), tiny_gpt(seed=4, scale=3.0)
    reference = tiny_gpt(seed=6, scale=3.0).requires_grad_(False)
    head_a, head_b = ValueHead(64), ValueHead(64)
    with torch.no_grad():
        for head in (head_a, head_b):
            head.proj.weight.copy_(torch.linspace(-1, 1, 64))
            head.proj.bias.fill_(0.3)

    options = PassOptions(start=start, chunk_size=4, temperature=temperature, kl_weights=kl_weights, keep_hidden=True)
    s = with_values(token_logprobs(model_a, ids, mask, options, reference=reference), head_a)
    logp = (model_b(ids, mask)[:, start - 1 : -1].float() / temperature).log_softmax(-1)
    with torch.no_grad():
        ref = (reference(ids, mask)[:, start - 1 : -1].float() / temperature).log_softmax(-1)
    forward = (logp.exp() * (logp - ref)).sum(-1)
    reverse = (ref.exp() * (ref - logp)).sum(-1)
    want = kl_weights[0] * forward + kl_weights[1] * reverse
    values = head_b(model_b.trunk(ids, mask)[:, start - 1 : -1])
    torch.testing.assert_close(s.kl, want, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(s.values, values, rtol=1e-4, atol=1e-6)
    assert (s.kl > 0).all()

    weights = torch.linspace(0.5, 1.5, s.kl.numel()).view_as(s.kl)
    ((s.kl * weights).sum() + s.values.sum()).backward()
    ((want * weights).sum() + values.sum()).backward()
    for (name, pa), (_, pb) in zip(model_a.named_parameters(), model_b.named_parameters()):
        assert pa.grad is not None and pa.grad.abs().sum() > 0, name
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-3, atol=1e-5, msg=name)
    torch.testing.assert_close(head_a.proj.weight.grad, head_b.proj.weight.grad, rtol=1e-4, atol=1e-5)
    assert all(p.grad is None for p in reference.parameters())


def test_wanting_only_some_positions_runs_the_lm_head_on_those_alone(rows_seen):
    """`wanted`: the chosen positions get exactly the full pass's log-prob, entropy and exact KL, in value and
    gradient (against the naive full-logits computation in float64; the chunked pass's logits are float32); the
    rest read 0 and the lm_head never sees them."""
    ids, mask = _prompts(B=3, T=16, seed=5)
    start, temperature = 7, 0.8
    model_a, model_b = (tiny_gpt(seed=4, scale=3.0).double() for _ in range(2))
    reference = tiny_gpt(seed=6, scale=3.0).double().requires_grad_(False)
    wanted = torch.rand(3, 9, generator=torch.Generator().manual_seed(1)) < 0.4
    wanted[1] = False  # a row with nothing wanted
    options = PassOptions(start=start, chunk_size=4, temperature=temperature, entropy=True)
    s = token_logprobs(model_a, ids, mask, options, reference=reference, wanted=wanted)
    assert sum(rows_seen) == int(wanted.sum())

    logp = (model_b(ids, mask)[:, start - 1 : -1] / temperature).log_softmax(-1)
    with torch.no_grad():
        ref = (reference(ids, mask)[:, start - 1 : -1] / temperature).log_softmax(-1)
    want = {"logprobs": logp.gather(-1, ids[:, start:, None]).squeeze(-1),
            "entropy": -(logp.exp() * logp).sum(-1), "kl": (logp.exp() * (logp - ref)).sum(-1)}
    for name, w in want.items():
        got = getattr(s, name)
        torch.testing.assert_close(got.double(), torch.where(wanted, w, torch.zeros_like(w)), rtol=1e-5, atol=1e-6,
                                   msg=name)
    weights = torch.linspace(0.5, 1.5, 27, dtype=torch.float64).view(3, 9) * wanted
    loss_a = sum((getattr(s, k) * weights).sum() * c for k, c in (("logprobs", 1.0), ("entropy", 0.3), ("kl", 2.0)))
    loss_b = sum((want[k] * weights).sum() * c for k, c in (("logprobs", 1.0), ("entropy", 0.3), ("kl", 2.0)))
    loss_a.backward()
    loss_b.backward()
    for (name, pa), (_, pb) in zip(model_a.named_parameters(), model_b.named_parameters()):
        assert pa.grad is not None and pa.grad.abs().sum() > 0, name
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-6, msg=name)

    none = token_logprobs(model_a, ids, mask, PassOptions(start=start), wanted=torch.zeros(3, 9, dtype=torch.bool))
    assert (none.logprobs == 0).all()
    none.logprobs.sum().backward()  # a micro-batch with nothing counted still backpropagates (zeros)
    with pytest.raises(ValueError, match="wanted must have shape"):
        token_logprobs(model_a, ids, mask, PassOptions(start=start), wanted=wanted[:, :5])


def test_the_logprob_pass_over_generated_completions_reproduces_the_sampling_logprobs(tiny_model):
    """At the sampling temperature (no top-k/top-p) the log-prob pass gives each generated token the log-prob it
    was drawn with, chunked or not; at temperature 1 that is the policy's own."""
    ids, mask = _prompts(B=4, T=10, seed=11)
    for temperature, chunk_size in ((1.0, 16), (1.3, 1024)):
        out = generate(tiny_model, ids, mask, SamplingOptions(max_new_tokens=12, temperature=temperature), seed=3)
        recomputed = _completion_logprobs(tiny_model, ids, mask, out, temperature=temperature, chunk_size=chunk_size)
        assert torch.allclose(recomputed[out.mask], out.logprobs[out.mask], atol=1e-4)


@pytest.mark.slow
def test_compiled_decode_matches_eager():
    model = tiny_gpt(scale=4.0)
    ids, mask = _prompts()
    eager = generate(model, ids, mask, SamplingOptions(max_new_tokens=20, compile=False), seed=1)
    for _ in range(2):  # the second call reuses the pooled cache and the compiled step
        compiled = generate(model, ids, mask, SamplingOptions(max_new_tokens=20, compile=True), seed=1)
        assert torch.equal(compiled.tokens, eager.tokens)
        assert torch.allclose(compiled.logprobs, eager.logprobs, atol=1e-4)
    # Compiling raised dynamo's limit itself: eval, play, uci and the Python API decode many shapes too.
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    assert getattr(torch._dynamo.config, limit) >= compiling.RECOMPILE_LIMIT


def test_a_compiler_failure_falls_back_to_eager_decoding(monkeypatch):
    """A broken compiler backend (here: one that raises, as a missing toolchain would) costs speed, not the run."""
    def broken_backend(graph_module, example_inputs):
        raise RuntimeError("no C++ compiler found")

    model = tiny_gpt(scale=4.0)
    ids, mask = _prompts()
    eager = generate(model, ids, mask, SamplingOptions(max_new_tokens=12, compile=False), seed=1)
    monkeypatch.setattr(compiling, "FALLBACKS", compiling.Fallbacks())
    monkeypatch.setattr(decoding._DECODE_STEP, "by_device",
                        {"cpu": torch.compile(decoding.decode_step, backend=broken_backend, fullgraph=True)})
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler found.*runs without compiling"):
        fallen_back = generate(model, ids, mask, SamplingOptions(max_new_tokens=12, compile=True), seed=1)
    assert torch.equal(fallen_back.tokens, eager.tokens) and torch.equal(fallen_back.mask, eager.mask)
    assert torch.allclose(fallen_back.logprobs, eager.logprobs)
    assert compiling.has_failed(decoding.decode_step, "cpu") and len(compiling.FALLBACKS) == 1
    # The record names the line that raised: a bare AssertionError deep in the compiler says nothing else.
    line = broken_backend.__code__.co_firstlineno + 1
    assert compiling.FALLBACKS.why(decoding.decode_step, "cpu").endswith(f"test_sampling.py:{line}")
    # Later calls do not try again (and do not warn again).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = generate(model, ids, mask, SamplingOptions(max_new_tokens=12, compile=True), seed=1)
    assert torch.equal(again.tokens, eager.tokens)


def test_a_compiler_failure_in_the_logprob_trunk_falls_back_to_eager(monkeypatch):
    """The log-prob pass compiles the trunk first: if that fails, the trunk runs eagerly, with gradients, after a
    warning, and gives eager's values; the other compiled functions stay compiled."""
    def broken_backend(graph_module, example_inputs):
        raise RuntimeError("no C++ compiler found")

    model = tiny_gpt(scale=3.0)
    ids, mask = _prompts(B=3, T=12, seed=8)
    eager = token_logprobs(model, ids, mask, PassOptions(start=5))
    eager.logprobs.sum().backward()
    grad = model.transformer.h[0].attn.c_attn.weight.grad.clone()
    model.zero_grad(set_to_none=True)
    monkeypatch.setattr(compiling, "FALLBACKS", compiling.Fallbacks())
    monkeypatch.setattr(logprobs._BLOCK, "by_device",
                        {"cpu": torch.compile(logprobs._block, backend=broken_backend, fullgraph=True)})
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler found"):
        # With the entropy: a vocabulary pass worth compiling (`_VocabPass._fuses`), which must stay compiled.
        fallen_back = token_logprobs(model, ids, mask, PassOptions(start=5, compile=True, entropy=True))
    fallen_back.logprobs.sum().backward()
    # Only the trunk fell back: the vocabulary pass stayed compiled, so the values are eager's to its rounding.
    torch.testing.assert_close(fallen_back.logprobs, eager.logprobs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.transformer.h[0].attn.c_attn.weight.grad, grad, rtol=1e-4, atol=1e-6)
    assert compiling.has_failed(logprobs._block, "cpu") and len(compiling.FALLBACKS) == 1
    assert "cpu" in logprobs._CHUNK.by_device


@pytest.mark.slow
def test_compiled_logprobs_match_eager_with_gradients(monkeypatch):
    monkeypatch.setattr(compiling, "FALLBACKS", compiling.Fallbacks())
    model = tiny_gpt(scale=3.0)
    reference = tiny_gpt(seed=5, scale=3.0).requires_grad_(False)  # with the exact KL in the same pass
    ids, mask = _prompts(B=5, T=14, seed=4)
    # The KL weights are Python floats that dynamo specialises on: each pair is a graph of its own, and the
    # (0.5, 0.5) pair comes back after the others to reuse its graph with another chunk size.
    runs = [(False, 7, (0.5, 0.5)), (True, 7, (0.5, 0.5)), (False, 7, (1.0, 0.0)), (True, 7, (1.0, 0.0)),
            (False, 7, (0.0, 1.0)), (True, 7, (0.0, 1.0)), (True, 11, (0.5, 0.5))]
    results = []
    for compile, chunk, kl_weights in runs:
        model.zero_grad(set_to_none=True)
        options = PassOptions(start=6, chunk_size=chunk, temperature=0.9, entropy=True, compile=compile,
                              kl_weights=kl_weights)
        s = token_logprobs(model, ids, mask, options, reference=reference)
        (s.logprobs.sum() + 0.1 * s.entropy.sum() + s.kl.sum()).backward()
        results.append((s.logprobs.detach(), s.entropy.detach(), s.kl.detach(), model.lm_head.weight.grad.clone(),
                        model.transformer.h[0].attn.c_attn.weight.grad.clone()))
    assert "cpu" in logprobs._CHUNK.by_device and not compiling.FALLBACKS
    for eager, compiled in ((0, 1), (2, 3), (4, 5), (0, 6)):
        for a, b in zip(results[eager], results[compiled]):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    # A graph that kept another pair's weights would fail above: the directions differ by far more than rtol.
    assert (results[2][2] - results[4][2]).abs().max() > 1e-4
    # The trunk's blocks are compiled too. Other shapes (the second new one makes dynamo build a dynamic-shape graph) and
    # no mask at all (SFT's packed rows, plain causal attention) give eager's values and gradients.
    assert "cpu" in logprobs._BLOCK.by_device
    for rows, cols, with_mask in ((3, 2, True), (5, 4, False), (4, 1, True)):
        got = []
        for compile in (False, True):
            model.zero_grad(set_to_none=True)
            s = token_logprobs(model, ids[:rows, cols:], mask[:rows, cols:] if with_mask else None,
                               PassOptions(start=3, compile=compile))
            s.logprobs.sum().backward()
            got.append((s.logprobs.detach(), model.transformer.h[-1].mlp.c_fc.weight.grad.clone(),
                        model.transformer.wpe.weight.grad.clone()))
        for a, b in zip(*got):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    assert not compiling.FALLBACKS


def test_a_prompt_longer_than_the_context_is_told_to_shorten_not_to_ask_for_negative_tokens():
    """A 1 MB A: move had "give --max-new-tokens -1999021 or less" advised (issue 71): where the prompt alone fills
    the context, no --max-new-tokens helps, and the message says so; where it does not, the advice is the room."""
    from rookworld.net.limits import ContextTooLong

    model = tiny_gpt()
    block = model.config.block_size
    for prompt, said in ((block + 5, "the prompt alone fills it"), (block - 3, "give --max-new-tokens 3 or less")):
        ids = torch.zeros(1, prompt, dtype=torch.long)
        with pytest.raises(ContextTooLong, match=said) as e:
            generate(model, ids, None, SamplingOptions(max_new_tokens=8, temperature=1.0, eos_id=0), seed=0)
        assert not re.search(r"-\d", str(e.value)), e.value  # no negative number of tokens advised
