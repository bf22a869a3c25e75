"""The vocabulary pass's hand-derived backward (`rookworld.net.head`) against autograd, in float64: for a loss
sum(a * log p_y + b * H + c * KL) of random weights a, b, c, the gradient it gives w.r.t. the logits, carried
through the head to the hidden states and the weight, equals autograd's through `vocab_forward`."""

from __future__ import annotations

import pytest
import torch

from rookworld.net.head import Derivatives, vocab_backward, vocab_forward


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("kl_weights", [None, (1.0, 0.0), (0.0, 1.0), (0.5, 0.5)])
def test_the_backward_by_hand_is_autograds(temperature, with_entropy, kl_weights):
    g = torch.Generator().manual_seed(7)
    rows, width, vocab = 6, 5, 40
    hidden = (torch.randn(rows, width, generator=g, dtype=torch.float64) * 2).requires_grad_()
    weight = (torch.randn(vocab, width, generator=g, dtype=torch.float64)).requires_grad_()
    ref_hidden = torch.randn(rows, width, generator=g, dtype=torch.float64) if kl_weights else None
    ref_weight = torch.randn(vocab, width, generator=g, dtype=torch.float64) if kl_weights else None
    targets = torch.randint(0, vocab, (rows,), generator=g)
    a, b, c = (torch.randn(rows, generator=g, dtype=torch.float64) for _ in range(3))

    lp, entropy, kl, state = vocab_forward(hidden, targets, weight, temperature, with_entropy, ref_hidden, ref_weight,
                                           kl_weights or (1.0, 0.0))
    loss = (a * lp).sum()
    if with_entropy:
        loss = loss + (b * entropy).sum()
    if kl_weights:
        loss = loss + (c * kl).sum()
    loss.backward()

    grads = Derivatives(a, b if with_entropy else None, c if kl_weights else None)
    dz = vocab_backward(targets, temperature, kl_weights or (1.0, 0.0), _detached(state), grads)
    assert dz.shape == (rows, vocab)
    torch.testing.assert_close(dz @ weight.detach(), hidden.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dz.t() @ hidden.detach(), weight.grad, rtol=1e-10, atol=1e-12)
    assert hidden.grad.abs().sum() > 0


def test_a_loss_of_the_log_prob_alone_is_the_softmax_gradient():
    """By hand, for one position: d log p_y / dz = e_y - p, and the temperature divides it."""
    z = torch.tensor([[1.0, 2.0, 0.5]], dtype=torch.float64)
    weight = torch.eye(3, dtype=torch.float64)
    _, _, _, state = vocab_forward(z, torch.tensor([1]), weight, 2.0, False, None, None, (1.0, 0.0))
    p = torch.softmax(z / 2.0, -1)
    dz = vocab_backward(torch.tensor([1]), 2.0, (1.0, 0.0), state, Derivatives(torch.ones(1, dtype=torch.float64),
                                                                                None, None))
    torch.testing.assert_close(dz, (torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64) - p) / 2.0)


def _detached(state):
    return type(state)(*(None if x is None else x.detach() for x in state))
