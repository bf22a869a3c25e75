"""The GRPO objective against values worked out by hand."""

import math

import pytest
import torch

from rookworld.grpo import aggregate, clipped_surrogate, group_advantages, group_has_spread, kl_estimate


def close(a, b, tol=1e-6):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=tol)


def test_advantages_with_each_std_scaling():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.2, 0.2])  # groups of 2: [1, 0], [.5, .5], [.2, .2]
    # Group means 0.5, 0.5, 0.2; group stds (population) 0.5, 0, 0.
    assert close(group_advantages(rewards, 2, "none"), [0.5, -0.5, 0, 0, 0, 0])
    assert close(group_advantages(rewards, 2, "group"), [1.0, -1.0, 0, 0, 0, 0], tol=1e-5)
    batch_std = rewards.std(unbiased=False).item()  # of all six rewards
    assert close(group_advantages(rewards, 2, "batch"), [0.5 / batch_std, -0.5 / batch_std, 0, 0, 0, 0], tol=1e-5)
    # Groups of 3: [1, 0, .5] mean .5, std sqrt(1/6).
    g3 = group_advantages(rewards, 3, "group")
    assert close(g3[:3], [0.5 / math.sqrt(1 / 6), -0.5 / math.sqrt(1 / 6), 0.0], tol=1e-5)


def test_zero_spread_groups_have_zero_advantage_and_are_flagged():
    rewards = torch.tensor([0.3, 0.3, 0.3, 0.3, -0.3, 1.0, 0.2, 0.2])
    for scale in ("group", "batch", "none"):
        adv = group_advantages(rewards, 4, scale)
        assert torch.equal(adv[:4], torch.zeros(4)), scale
        assert torch.isfinite(adv).all()
    assert group_has_spread(rewards, 4).tolist() == [False] * 4 + [True] * 4
    with pytest.raises(ValueError):
        group_advantages(rewards, 3)
    with pytest.raises(ValueError):
        group_advantages(rewards, 4, "median")


def test_kl_estimators():
    logp = torch.tensor([math.log(0.5), math.log(0.2)])
    ref = torch.tensor([math.log(0.25), math.log(0.4)])
    # r = ref - logp = log(0.5), log(2)
    assert close(kl_estimate(logp, ref, "k1"), [math.log(2), -math.log(2)])
    assert close(kl_estimate(logp, ref, "k2"), [0.5 * math.log(2) ** 2] * 2)
    # k3 = e^r - 1 - r: 0.5 - 1 - log 0.5, 2 - 1 - log 2
    assert close(kl_estimate(logp, ref, "k3"), [0.5 - 1 + math.log(2), 1 - math.log(2)])
    assert (kl_estimate(logp, ref, "k3") >= 0).all()
    assert close(kl_estimate(logp, logp, "k3"), [0.0, 0.0])
    with pytest.raises(ValueError):
        kl_estimate(logp, ref, "k4")


def test_clipping_on_both_sides_with_clip_higher():
    old = torch.zeros(1, 4)
    # Ratios 1.5, 0.5, 1.1, 0.9 with advantages +1, +1, -1, -1.
    new = torch.log(torch.tensor([[1.5, 0.5, 1.1, 0.9]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, clipped = clipped_surrogate(new, old, adv, clip_low=0.2, clip_high=0.28)
    # A>0: min(1.5, 1.28) = 1.28 (clipped above); min(0.5, 0.8) = 0.5 (unclipped: pessimistic side).
    # A<0: min(-1.1, -1.1) = -1.1; ratio 0.9 within [0.8, 1.28]: -0.9.
    assert close(loss, [[-1.28, -0.5, 1.1, 0.9]])
    assert clipped.tolist() == [[True, False, False, False]]
    # A<0 with the ratio below 1 - clip_low is clipped from below.
    loss, clipped = clipped_surrogate(torch.log(torch.tensor([[0.5]])), torch.zeros(1, 1), torch.tensor([[-2.0]]))
    assert close(loss, [[1.6]]) and clipped.tolist() == [[True]]
    # Per-sequence advantages broadcast over tokens.
    loss, _ = clipped_surrogate(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([1.0, -2.0]))
    assert close(loss, [[-1.0] * 3, [2.0] * 3])


def test_gradient_pushes_toward_positive_advantage():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = clipped_surrogate(logp, logp.detach(), torch.tensor([1.0]))
    loss.sum().backward()
    assert (logp.grad < 0).all(), "descending the loss must raise the log-probs of a positive-advantage sample"


def test_three_aggregations():
    per_token = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    # token: (1+2+3+4+10+20) / 6
    assert close(aggregate(per_token, mask, "token"), 40 / 6)
    # sequence: mean(2.5, 15)
    assert close(aggregate(per_token, mask, "sequence"), 8.75)
    # constant: 40 / (2 sequences x 8 max tokens)
    assert close(aggregate(per_token, mask, "constant", max_tokens=8), 2.5)
    with pytest.raises(ValueError):
        aggregate(per_token, mask, "constant")
    with pytest.raises(ValueError):
        aggregate(per_token, mask, "mean")


def test_micro_batches_add_up_to_the_minibatch_loss():
    torch.manual_seed(0)
    per_token = torch.randn(6, 5)
    mask = torch.rand(6, 5) > 0.3
    for how in ("token", "sequence", "constant"):
        whole = aggregate(per_token, mask, how, max_tokens=5)
        parts = sum(aggregate(per_token[i : i + 2], mask[i : i + 2], how, max_tokens=5,
                              total_tokens=float(mask.sum()), total_sequences=6.0) for i in range(0, 6, 2))
        assert close(whole, parts), how
