"""The log-prob pass's two economies against the plain computation, in float64 on the CPU: each group's prompt
computed once (in sampling and in the log-prob pass), and the fused pass over the vocabulary that makes a loss's
gradients in its forward; and the head's float32 logits under bf16 autocast."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import generate_with, tiny_gpt
from rookworld.net import compiling, head, logprobs
from rookworld.net.head import TokenTerms
from rookworld.net.logprobs import PassOptions, token_logprobs, with_values
from rookworld.net.head import head_logits
from rookworld.net.tokenizer import chess_tokenizer, get_tokenizer
from rookworld.net.value import ValueHead

# Real prompts of both tasks, of different lengths (left-padded together).
PROMPTS = [
    "P: 3r1r2/ppb4k/8/2R5/5P2/8/1P4PP/2K3R1 w - - 1 27",
    "A: r1bqkbnr/pp1ppppp/2n5/2p5/4P3/2N3P1/PPPP1P1P/R1BQKBNR b KQkq - 0 3+f7f6+e2e4 c7c5 b1c3 b8c6 g2g3 f7f6+",
    "P: 8/8/8/8/8/8/8/K6k w - - 0 1",
]
G = 3


def _groups(seed: int = 0, width: int = 7, tokenizer=None):
    """G completions of each prompt, right-padded to `width`, of random lengths (one of them empty): the rows of a
    rollout, (ids, mask, prompt width)."""
    tokenizer = tokenizer or get_tokenizer()
    ids, mask = tokenizer.encode_batch(PROMPTS, bos=True)
    ids, mask = ids.repeat_interleave(G, 0), mask.repeat_interleave(G, 0)
    g = torch.Generator().manual_seed(seed)
    n = len(ids)
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    lengths[4] = 0
    completion = torch.randint(0, min(50000, tokenizer.eos_id), (n, width), generator=g)
    cmask = torch.arange(width)[None] < lengths[:, None]
    return torch.cat([ids, completion], 1), torch.cat([mask, cmask], 1), ids.shape[1]


def _models(vocab_size: int = 50257):
    policy = tiny_gpt(seed=2, scale=3.0, vocab_size=vocab_size).double()
    reference = tiny_gpt(seed=3, scale=3.0, vocab_size=vocab_size).double().requires_grad_(False)
    head = ValueHead(64).double()
    with torch.no_grad():
        head.proj.weight.copy_(torch.linspace(-1, 1, 64))
    return policy, reference, head


def _grads(*modules) -> dict[str, torch.Tensor]:
    out = {}
    for i, m in enumerate(modules):
        for name, p in m.named_parameters():
            if p.grad is not None:
                out[f"{i}.{name}"] = p.grad.clone()
                p.grad = None
    return out


@pytest.mark.parametrize("kl_weights", [(1.0, 0.0), (0.0, 1.0), (0.5, 0.5)])
def test_each_prompt_once_gives_every_output_and_gradient_of_the_full_pass(kl_weights):
    """Groups of 3 completions of P: and A: prompts of different widths (left padding), one completion empty: the
    log-probs, entropy, exact KL, values and every parameter's gradient equal those of the pass that computes every
    row's prompt, within 1e-10."""
    policy, reference, head = _models()
    ids, mask, P = _groups()
    cmask = mask[:, P:]
    coef = torch.randn(4, *cmask.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    results = []
    for group_size in (1, G):
        options = PassOptions(start=P, temperature=0.8, entropy=True, kl_weights=kl_weights,
                              rows_per_prompt=group_size, chunk_size=5, keep_hidden=True)
        s = with_values(token_logprobs(policy, ids, mask, options, reference=reference), head)
        parts = (s.logprobs, s.entropy, s.kl, s.values)
        (sum((c * x * cmask).sum() for c, x in zip(coef, parts))).backward()
        results.append(([x.detach() * cmask for x in parts], _grads(policy, head)))
    (full, g_full), (shared, g_shared) = results
    for a, b in zip(full, shared):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-10)
    assert g_full.keys() == g_shared.keys() and len(g_full) == len(list(policy.parameters())) + 2
    for k in g_full:
        assert g_full[k].abs().sum() > 0, k
        torch.testing.assert_close(g_shared[k], g_full[k], rtol=0, atol=1e-10, msg=k)


def _surrogate(advantages, old, weights):
    """A GRPO-like loss of each position: a clipped ratio, an entropy bonus and a KL penalty, weighted."""

    def loss(lp, entropy, kl, at):
        ratio = torch.exp(lp - old.reshape(-1)[at])
        adv = advantages.reshape(-1)[at]
        per = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.28) * adv) - 0.01 * entropy + 0.1 * kl
        return TokenTerms(per * weights.reshape(-1)[at], {"ratio": ratio})

    return loss


@pytest.mark.parametrize("group_size, temperature, kl_weights, vocab_size", [
    (1, 1.0, (1.0, 0.0), 50257), (G, 0.7, (0.0, 1.0), 50257), (G, 1.3, (0.5, 0.5), 50257), (G, 1.3, (0.5, 0.5), 4364)])
def test_the_fused_pass_gives_the_loss_and_gradients_of_autograd(group_size, temperature, kl_weights, vocab_size):
    """A loss of each position's log-prob, entropy and exact KL: its value and the gradient of every parameter,
    made in the forward of the fused pass (no logits kept, none recomputed), equal autograd's through the plain pass
    (chunks checkpointed), in float64, with some positions not wanted; with GPT-2's vocabulary and the chess one."""
    policy, reference, _ = _models(vocab_size)
    ids, mask, P = _groups(seed=4, tokenizer=chess_tokenizer() if vocab_size != 50257 else None)
    g = torch.Generator().manual_seed(2)
    shape = mask[:, P:].shape
    wanted = mask[:, P:] & (torch.rand(shape, generator=g) < 0.8)
    advantages = torch.randn(shape, generator=g, dtype=torch.float64)
    old = -3 - torch.rand(shape, generator=g, dtype=torch.float64)
    weights = torch.rand(shape, generator=g, dtype=torch.float64) * wanted
    loss = _surrogate(advantages, old, weights)
    options = PassOptions(start=P, temperature=temperature, entropy=True, kl_weights=kl_weights,
                          rows_per_prompt=group_size, chunk_size=4)
    kw = dict(reference=reference, wanted=wanted)

    plain = token_logprobs(policy, ids, mask, options, **kw)
    positions = wanted.reshape(-1).nonzero().squeeze(1)
    flat = lambda x: x.reshape(-1)[positions]  # noqa: E731
    want = loss(flat(plain.logprobs), flat(plain.entropy), flat(plain.kl), positions).loss.sum()
    want.backward()
    expected = _grads(policy)

    fused = token_logprobs(policy, ids, mask, options, loss=loss, **kw)
    assert fused.logprobs.grad_fn is None  # the statistics come back detached
    for a, b in ((fused.logprobs, plain.logprobs), (fused.entropy, plain.entropy), (fused.kl, plain.kl)):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=1e-10)
    torch.testing.assert_close(fused.loss, want.detach(), rtol=0, atol=1e-12)
    # The loss's metrics come from the same pass, at the wanted positions (0 elsewhere).
    ratio = torch.exp(plain.logprobs.detach() - old) * wanted
    torch.testing.assert_close(fused.metrics["ratio"], ratio, rtol=0, atol=1e-12)
    (2.0 * fused.loss).backward()  # the upstream gradient scales the one made in the forward
    got = _grads(policy)
    assert got.keys() == expected.keys()
    for k in expected:
        assert expected[k].abs().sum() > 0, k
        torch.testing.assert_close(got[k], 2.0 * expected[k], rtol=0, atol=1e-10, msg=k)
    with pytest.raises(RuntimeError, match="gives its gradients once"):  # they were scaled in place, and handed on
        fused.loss.backward()


def test_the_fused_pass_with_nothing_wanted_is_a_zero_loss_that_still_backpropagates():
    policy, _, _ = _models()
    ids, mask, P = _groups()
    wanted = torch.zeros_like(mask[:, P:])
    s = token_logprobs(policy, ids, mask, PassOptions(start=P), wanted=wanted,
                       loss=lambda lp, e, kl, at: TokenTerms(-lp))
    assert float(s.loss.detach()) == 0.0 and not s.logprobs.any()
    s.loss.backward()
    assert all(p.grad is None or not p.grad.any() for p in policy.parameters())


def test_sampling_computes_each_prompt_once_and_draws_the_same_tokens():
    """`rows_per_prompt`: G completions of each prompt from one prefill whose keys and values are copied to the
    G rows: the tokens and sampling log-probs of G copies of every prompt, under the same seed."""
    policy = tiny_gpt(seed=5, scale=4.0).double()
    ids, mask = get_tokenizer().encode_batch(PROMPTS, bos=True)
    kw = dict(max_new_tokens=10, temperature=1.0, seed=3, stop_at_eos=False)
    repeated = generate_with(policy, ids.repeat_interleave(G, 0), mask.repeat_interleave(G, 0), **kw)
    once = generate_with(policy, ids, mask, rows_per_prompt=G, **kw)
    assert torch.equal(once.tokens, repeated.tokens)
    torch.testing.assert_close(once.logprobs, repeated.logprobs, rtol=0, atol=1e-10)
    assert len({tuple(t) for t in once.tokens.tolist()}) > len(PROMPTS)  # the copies drew different tokens


def test_under_bf16_autocast_the_head_sums_in_float32():
    """Logits of -50 to -100, as GPT-2's: under CPU bf16 autocast the log-probs of the pass and of the decode step
    keep the inputs' bf16 rounding only (their products summed in float32), against float64; rounding the logits
    to bf16 as autocast's matmul does would cost about 10x more."""
    torch.manual_seed(0)
    hidden = torch.randn(64, 256, dtype=torch.float64) + 1.0
    weight = torch.randn(1000, 256, dtype=torch.float64) * 0.25 - 0.3  # logits around -77, spread about 5
    exact = (hidden @ weight.t()).log_softmax(-1)
    assert -100 < float((hidden @ weight.t()).mean()) < -50
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = head_logits(hidden.float(), weight.float())
        rounded = torch.nn.functional.linear(hidden.float(), weight.float())
    assert ours.dtype == torch.float32 and rounded.dtype == torch.bfloat16
    err_ours = (ours.double().log_softmax(-1) - exact).abs().mean()
    err_rounded = (rounded.double().log_softmax(-1) - exact).abs().mean()
    assert err_ours < 0.02 and err_rounded > 5 * err_ours, (float(err_ours), float(err_rounded))
    assert math.isfinite(float(err_ours))


@pytest.mark.slow
def test_the_compiled_fused_pass_and_shared_trunk_give_what_eager_gives(monkeypatch):
    """compile=True: the trunks of the shared prompt and its completions, and the passes over the vocabulary on
    each side of the loss, compiled (on the CUDA machine, where it pays), give eager's loss, log-probs and
    gradients."""
    monkeypatch.setattr(compiling, "FALLBACKS", compiling.Fallbacks())
    policy = tiny_gpt(seed=2, scale=3.0)
    reference = tiny_gpt(seed=3, scale=3.0).requires_grad_(False)
    ids, mask, P = _groups(seed=6)
    g = torch.Generator().manual_seed(3)
    shape = mask[:, P:].shape
    loss = _surrogate(torch.randn(shape, generator=g), -3 - torch.rand(shape, generator=g),
                      torch.rand(shape, generator=g) * mask[:, P:])
    got = []
    for compile in (False, True):
        options = PassOptions(start=P, temperature=0.9, entropy=True, kl_weights=(0.5, 0.5), rows_per_prompt=G,
                              compile=compile)
        s = token_logprobs(policy, ids, mask, options, reference=reference, wanted=mask[:, P:], loss=loss)
        s.loss.backward()
        got.append((s.loss.detach(), s.logprobs, s.entropy, s.kl, _grads(policy)))
    assert all("cpu" in c.by_device for c in (logprobs._BLOCK, head._FORWARD, head._BACKWARD)) \
        and not compiling.FALLBACKS, compiling.FALLBACKS
    (eager, compiled) = got
    for a, b in zip(eager[:4], compiled[:4]):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    for k in eager[4]:
        torch.testing.assert_close(compiled[4][k], eager[4][k], rtol=1e-3, atol=1e-6, msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("grouped", [True, False], ids=["grouped-prompts", "after-prompts"])
def test_the_compiled_block_under_bf16_gives_eager_s_loss_within_bf16_s_rounding(monkeypatch, grouped):
    """--compile-logprobs under bf16 autocast, with the CPU's attention to shared prompts (`grouped_prompts`) and a
    GPU's (`after_prompts`): one block compiled for both layers gives eager's loss and gradients as closely as bf16
    allows, its distance to eager within a few times eager's own distance to the float64 pass."""
    import copy

    from rookworld.net import model as model_module

    monkeypatch.setattr(compiling, "FALLBACKS", compiling.Fallbacks())
    monkeypatch.setattr(model_module, "GROUPED_PROMPTS_ON", frozenset({"cpu"} if grouped else ()))
    monkeypatch.setattr(logprobs._BLOCK, "by_device", {})
    torch._dynamo.reset()  # the graphs counted below are this test's
    policy = tiny_gpt(seed=2, scale=3.0)
    reference = tiny_gpt(seed=3, scale=3.0).requires_grad_(False)
    ids, mask, P = _groups(seed=6, width=9)
    g = torch.Generator().manual_seed(3)
    shape = mask[:, P:].shape
    advantages, old = torch.randn(shape, generator=g, dtype=torch.float64), -3 - torch.rand(shape, generator=g)
    weights = torch.rand(shape, generator=g, dtype=torch.float64) * mask[:, P:]

    def run(model, ref, dtype, compile):
        options = PassOptions(start=P, temperature=0.9, entropy=True, kl_weights=(1.0, 0.0), rows_per_prompt=G,
                              compile=compile)
        loss = _surrogate(advantages.to(dtype), old.to(dtype), weights.to(dtype))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype != torch.float64):
            s = token_logprobs(model, ids, mask, options, reference=ref, wanted=mask[:, P:], loss=loss)
        s.loss.backward()
        grads = _grads(model)
        return s.loss.detach().double(), torch.cat([grads[k].double().flatten() for k in sorted(grads)])

    exact = run(copy.deepcopy(policy).double(), copy.deepcopy(reference).double(), torch.float64, False)
    eager = run(policy, reference, torch.float32, False)
    compiled = run(policy, reference, torch.float32, True)
    assert "cpu" in logprobs._BLOCK.by_device and not compiling.FALLBACKS, compiling.FALLBACKS
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list as entries
    assert len(entries(logprobs._block.__code__)) <= 4  # prompts and continuations, each grad mode: not per layer
    bf16_error = abs(float(eager[0] - exact[0]))
    assert abs(float(compiled[0] - eager[0])) <= 4 * bf16_error + 1e-6, (compiled[0], eager[0], exact[0])
    norm = exact[1].norm()
    assert (compiled[1] - eager[1]).norm() / norm <= 4 * (eager[1] - exact[1]).norm() / norm + 1e-4
