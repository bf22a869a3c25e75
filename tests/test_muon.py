"""Muon (`rookworld.net.muon`) against float64 computed another way: the Newton-Schulz iteration as the polynomial it
applies to each singular value (through numpy's SVD), a step by hand, the AdamW groups against torch's own AdamW;
and which parameters `--optimizer muon` gives Muon."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rookworld.harness.optimizer import optimizer_for
from rookworld.net.memory import fresh_gpt
from rookworld.net.model import GPTConfig
from rookworld.net.muon import NS_COEFFICIENTS, NS_STEPS, RMS_MATCH, Muon, orthogonalised
from rookworld.settings.config import SFTConfig


def by_svd(g: np.ndarray) -> np.ndarray:
    """U p(p(p(p(p(S / |G|_F))))) V^T in float64, p(s) = a s + b s^3 + c s^5."""
    u, s, vt = np.linalg.svd(g, full_matrices=False)
    a, b, c = NS_COEFFICIENTS
    s = s / np.linalg.norm(g)
    for _ in range(NS_STEPS):
        s = a * s + b * s**3 + c * s**5
    return u @ np.diag(s) @ vt


@pytest.mark.parametrize("shape", [(6, 6), (12, 5), (5, 12)])
def test_newton_schulz_applies_its_polynomial_to_every_singular_value(shape):
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=torch.float64)
    x = orthogonalised(g)
    assert x.dtype == torch.float64 and x.shape == g.shape
    np.testing.assert_allclose(x.numpy(), by_svd(g.numpy()), atol=2e-5)


def test_a_well_conditioned_matrix_comes_out_near_orthogonal():
    q, _ = torch.linalg.qr(torch.randn(8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    g = q @ torch.diag(torch.linspace(0.5, 2.0, 8, dtype=torch.float64)) @ q.T
    s = torch.linalg.svdvals(orthogonalised(g))
    assert s.min() > 0.65 and s.max() < 1.25, s


def test_two_muon_steps_by_hand_in_float64():
    """Nesterov momentum 0.95 from zero, orthogonalised, times 0.2 sqrt(max(rows, columns)), decoupled decay."""
    gen = torch.Generator().manual_seed(3)
    w0 = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    grads = [torch.randn(3, 4, generator=gen, dtype=torch.float64) for _ in range(2)]
    lr, wd, beta = 0.1, 0.5, 0.95
    w = torch.nn.Parameter(w0.clone())
    opt = Muon([{"params": [w], "use_muon": True}], lr=lr, momentum=beta, weight_decay=wd)
    expected, buf = w0.numpy().copy(), np.zeros((3, 4))
    for g in grads:
        w.grad = g.clone()
        opt.step()
        buf = beta * buf + (1 - beta) * g.numpy()
        nesterov = (1 - beta) * g.numpy() + beta * buf
        expected = expected * (1 - lr * wd) - lr * RMS_MATCH * 2.0 * by_svd(nesterov)
        np.testing.assert_allclose(w.detach().numpy(), expected, atol=1e-5)
        np.testing.assert_allclose(w.grad.numpy(), g.numpy())  # the gradient is read, not changed


def test_its_adamw_groups_step_as_torch_adamw():
    gen = torch.Generator().manual_seed(4)
    start = [torch.randn(5, dtype=torch.float64, generator=gen), torch.randn(2, 3, dtype=torch.float64, generator=gen)]
    ours = [torch.nn.Parameter(t.clone()) for t in start]
    theirs = [torch.nn.Parameter(t.clone()) for t in start]
    a = Muon([{"params": ours[:1], "weight_decay": 0.0}, {"params": ours[1:], "weight_decay": 0.1}], lr=0.01)
    b = torch.optim.AdamW([{"params": theirs[:1], "weight_decay": 0.0}, {"params": theirs[1:], "weight_decay": 0.1}],
                          lr=0.01, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    for _ in range(4):
        grads = [torch.randn(t.shape, dtype=torch.float64, generator=gen) for t in start]
        for p, q, g in zip(ours, theirs, grads):
            p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)


def test_muon_takes_the_blocks_matrices_and_adamw_the_embeddings_biases_and_norms():
    model = fresh_gpt(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=64, block_size=16), torch.device("cpu"))
    names = {id(p): n for n, p in model.named_parameters()}
    opt = optimizer_for(model, SFTConfig(init="tiny", data=[], optimizer="muon", weight_decay=0.1))
    assert isinstance(opt, Muon)
    muon = {names[id(p)] for g in opt.param_groups if g["use_muon"] for p in g["params"]}
    adamw = {names[id(p)] for g in opt.param_groups if not g["use_muon"] for p in g["params"]}
    assert muon == {f"transformer.h.{i}.{m}.weight" for i in range(2)
                    for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
    assert adamw == set(names.values()) - muon and "transformer.wte.weight" in adamw  # the tied head with it
    assert isinstance(optimizer_for(model, SFTConfig(init="tiny", data=[])), torch.optim.AdamW)
    with pytest.raises(ValueError, match="matrices only"):
        Muon([{"params": [model.transformer.h[0].ln_1.weight], "use_muon": True}], lr=0.1)
