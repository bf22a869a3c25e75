"""The product memo (`rookworld.net.memo`): the update's first pass takes the trunk's products that eager sampling
made, and gets the gradients of the pass that makes them, on any CPU model: float32 through oneDNN, float32 on a
torch without oneDNN's op, float64 (which oneDNN does not take). Only a CPU model without dropout takes a memo."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_gpt
from rookworld.net import model as onednn  # the oneDNN products are model.py's
from rookworld.net.head import TokenTerms
from rookworld.net.logprobs import PassOptions, token_logprobs
from rookworld.net.memo import ProductMemo, Replay
from rookworld.net.model import GPT, GPTConfig
from rookworld.net.sampling import SamplingOptions, generate
from rookworld.net.tokenizer import get_tokenizer

PROMPTS = [
    "P: 3r1r2/ppb4k/8/2R5/5P2/8/1P4PP/2K3R1 w - - 1 27",
    "A: r1bqkbnr/pp1ppppp/2n5/2p5/4P3/2N3P1/PPPP1P1P/R1BQKBNR b KQkq - 0 3+f7f6+e2e4 c7c5 b1c3 b8c6 g2g3 f7f6+",
    "P: 8/8/8/8/8/8/8/K6k w - - 0 1",
]
G, NEW = 3, 6


def _loss(advantages: torch.Tensor):
    def loss(lp, entropy, kl, at):
        return TokenTerms(-(lp * advantages.reshape(-1)[at]) - 0.01 * entropy)
    return loss


def _pass(model, ids, mask, P, replay=None):
    """The loss's value and every parameter's gradient, through the fused pass over shared prompts."""
    g = torch.Generator().manual_seed(5)
    advantages = torch.randn(mask[:, P:].shape, generator=g, dtype=torch.float64).to(model.dtype)
    out = token_logprobs(model, ids, mask, PassOptions(start=P, rows_per_prompt=G, entropy=True), wanted=mask[:, P:],
                         loss=_loss(advantages), replay=replay)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return out.loss.detach(), grads


@pytest.mark.parametrize("dtype, with_onednn", [(torch.float32, True), (torch.float32, False), (torch.float64, True)])
def test_replayed_products_give_the_gradients_of_products_made_again(monkeypatch, dtype, with_onednn):
    monkeypatch.setattr(onednn, "AVAILABLE", with_onednn and onednn.AVAILABLE)
    model = tiny_gpt(seed=1, scale=4.0).to(dtype)
    ids, mask = get_tokenizer().encode_batch(PROMPTS, bos=True)
    memo = ProductMemo(rows=len(PROMPTS) * G, new_tokens=NEW, rows_per_prompt=G, prompt_left=0)
    out = generate(model, ids, mask, SamplingOptions(max_new_tokens=NEW), rows_per_prompt=G, seed=3, memo=memo)
    assert len(memo.prompts) == 4 * 2 and len(memo.completions) == 4 * 2  # every Linear of both blocks
    assert not any(hasattr(m, "memo") for m in model.modules())  # given to each pass, never set on a module
    P = ids.shape[1]
    full = torch.cat([ids.repeat_interleave(G, 0), out.tokens], 1)
    full_mask = torch.cat([mask.repeat_interleave(G, 0), out.mask], 1)
    made = _pass(model, full, full_mask, P)
    replay = Replay(memo, torch.arange(len(full)), 0, out.tokens.shape[1])
    replayed = _pass(model, full, full_mask, P, replay)
    # Decoding made each product a token at a time, the pass made them over the whole sequence: in float32 the sums
    # round apart by a few units in the last place of a tensor's largest entries (more on some CPUs' kernels than
    # others), so the absolute tolerance scales with each gradient's size. In float64 they agree to 1e-10.
    def tol(x: torch.Tensor) -> dict:
        if dtype == torch.float64:
            return dict(rtol=1e-10, atol=1e-12)
        return dict(rtol=1e-4, atol=1e-6 * max(1.0, float(x.abs().max())))

    torch.testing.assert_close(replayed[0], made[0], **tol(made[0]))
    for name, grad in made[1].items():
        torch.testing.assert_close(replayed[1][name], grad, **tol(grad), msg=name)
    # The replay took the memo's products: products of the wrong prompts give another loss.
    for key, kept in memo.prompts.items():
        memo.prompts[key] = kept.roll(1, 0)
    assert not torch.allclose(_pass(model, full, full_mask, P, replay)[0], made[0], rtol=1e-3)


def test_only_a_cpu_model_without_dropout_takes_a_memo():
    memo = ProductMemo(rows=3, new_tokens=2, rows_per_prompt=3, prompt_left=0)
    with torch.device("meta"):  # a model on another device than the CPU
        elsewhere = GPT(GPTConfig(block_size=32, vocab_size=64, n_layer=1, n_head=1, n_embd=8))
    dropping = GPT(GPTConfig(block_size=32, vocab_size=64, n_layer=1, n_head=1, n_embd=8, dropout=0.1))
    for model in (elsewhere, dropping):
        assert not ProductMemo.fits(model)
        with pytest.raises(ValueError, match="CPU models without dropout"):
            memo.recording(model, ("prompt",))
        with pytest.raises(ValueError, match="CPU models without dropout"):
            Replay(memo, torch.arange(3), 0, 2).phase(model, "prompt")
