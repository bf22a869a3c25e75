"""The GRPO objective against values worked out by hand."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rookworld.net.head import vocab_forward
from rookworld.grpo.formulas import (clipped_surrogate, constant_mean, ema, gae, group_advantages, group_has_spread,
                                  group_std, kl_k1, kl_k2, kl_k3, penalty_to_go, sequence_mean, token_mean, value_loss)


def close(a, b, tol=1e-6):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=tol)


def test_advantages_with_each_std():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.2, 0.2])  # groups of 2: [1, 0], [.5, .5], [.2, .2]
    # Group means 0.5, 0.5, 0.2; group stds (population) 0.5, 0, 0.
    assert close(group_std(rewards, 2), [[0.5], [0.0], [0.0]])
    assert close(group_advantages(rewards, 2), [0.5, -0.5, 0, 0, 0, 0])
    assert close(group_advantages(rewards, 2, std=group_std(rewards, 2)), [1.0, -1.0, 0, 0, 0, 0], tol=1e-5)
    assert close(group_advantages(rewards, 2, std=0.25), [0.5 / 0.250001, -0.5 / 0.250001, 0, 0, 0, 0])
    # Groups of 3: [1, 0, .5] mean .5, std sqrt(1/6).
    g3 = group_advantages(rewards, 3, std=group_std(rewards, 3))
    assert close(g3[:3], [0.5 / math.sqrt(1 / 6), -0.5 / math.sqrt(1 / 6), 0.0], tol=1e-5)


def test_zero_spread_groups_have_zero_advantage_and_are_flagged():
    rewards = torch.tensor([0.3, 0.3, 0.3, 0.3, -0.3, 1.0, 0.2, 0.2])
    for std in (group_std(rewards, 4), 0.5, None):
        adv = group_advantages(rewards, 4, std=std)
        assert torch.equal(adv[:4], torch.zeros(4)), std
        assert torch.isfinite(adv).all()
    assert group_has_spread(rewards, 4).tolist() == [False] * 4 + [True] * 4
    with pytest.raises(ValueError):
        group_advantages(rewards, 3)


def test_k3_keeps_its_gradient_sign_far_past_its_limit():
    """k3 = e^r - 1 - r with r = log ref - log pi has gradient 1 - e^r w.r.t. log pi. Past r = 20 (a token the policy
    made far less likely than the reference) e^r continues as its tangent, so the gradient stays about -e^20
    and raises the token back; a clamp would give +1 and push it further down. Padded positions (r up to 1e4)
    stay finite."""
    ref = torch.zeros(4, dtype=torch.float64)
    logp = torch.tensor([-5.0, -20.0, -25.0, -1e4], dtype=torch.float64, requires_grad=True)
    k3 = kl_k3(logp, ref)
    k3.sum().backward()
    assert torch.isfinite(k3).all() and torch.isfinite(logp.grad).all()
    assert float(logp.grad[0]) == pytest.approx(1 - math.exp(5), rel=1e-12)
    assert float(logp.grad[1]) == pytest.approx(1 - math.exp(20), rel=1e-12)
    for g in logp.grad[2:]:
        assert float(g) == pytest.approx(1 - math.exp(20), rel=1e-12) and float(g) < -4e8
    # The value is continuous at the limit and grows past it.
    assert float(k3[1]) == pytest.approx(math.exp(20) - 1 - 20, rel=1e-12)
    assert float(k3[2]) == pytest.approx(math.exp(20) * 6 - 1 - 25, rel=1e-12)


def test_kl_estimators():
    logp = torch.tensor([math.log(0.5), math.log(0.2)])
    ref = torch.tensor([math.log(0.25), math.log(0.4)])
    # r = ref - logp = log(0.5), log(2)
    assert close(kl_k1(logp, ref), [math.log(2), -math.log(2)])
    assert close(kl_k2(logp, ref), [0.5 * math.log(2) ** 2] * 2)
    # k3 = e^r - 1 - r: 0.5 - 1 - log 0.5, 2 - 1 - log 2
    assert close(kl_k3(logp, ref), [0.5 - 1 + math.log(2), 1 - math.log(2)])
    assert (kl_k3(logp, ref) >= 0).all()
    assert close(kl_k3(logp, logp), [0.0, 0.0])


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
    assert close(token_mean(per_token, mask), 40 / 6)
    # sequence: mean(2.5, 15)
    assert close(sequence_mean(per_token, mask), 8.75)
    # constant: 40 / (2 sequences x 8 max tokens)
    assert close(constant_mean(per_token, mask, 8), 2.5)
    # Their gradients: each token weighs 1/6; a token of row 0 1/8 and of row 1 1/4; every token 1/16. Masked: 0.
    for aggregate, weights in ((token_mean, [[1 / 6] * 4, [1 / 6] * 2 + [0] * 2]),
                               (sequence_mean, [[1 / 8] * 4, [1 / 4] * 2 + [0] * 2]),
                               (lambda x, m: constant_mean(x, m, 8), [[1 / 16] * 4, [1 / 16] * 2 + [0] * 2])):
        x = per_token.clone().requires_grad_(True)
        aggregate(x, mask).backward()
        assert close(x.grad, weights)


def test_sequence_aggregation_counts_only_rows_with_a_usable_token():
    """A row without a counted token (unscored, truncated under --mask-truncated, a group without spread under
    --drop-zero-spread) is no sequence: dividing by it too would shrink the step where token aggregation does not."""
    per_token = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    assert close(sequence_mean(per_token, mask), 8.75)  # mean(2.5, 15), as without the third row
    assert close(sequence_mean(per_token, torch.zeros_like(mask)), 0.0)


def test_micro_batches_add_up_to_the_minibatch_loss():
    torch.manual_seed(0)
    per_token = torch.randn(6, 5)
    mask = torch.rand(6, 5) > 0.3
    whole = token_mean(per_token, mask)
    assert close(whole, sum(token_mean(per_token[i : i + 2], mask[i : i + 2], float(mask.sum()))
                            for i in range(0, 6, 2)))
    whole = sequence_mean(per_token, mask)
    rows = float(mask.any(1).sum())
    assert close(whole, sum(sequence_mean(per_token[i : i + 2], mask[i : i + 2], rows) for i in range(0, 6, 2)))
    whole = constant_mean(per_token, mask, 5)
    assert close(whole, sum(constant_mean(per_token[i : i + 2], mask[i : i + 2], 5, 6.0) for i in range(0, 6, 2)))


# -- groups without spread ------------------------------------------------------------------------------------

def _equal_reward_groups(shaping: str, group_size: int, n_groups: int, rng) -> torch.Tensor:
    """n_groups groups of equal rewards, with values the shaping can give (continuous: anything in [0.2, 1];
    graduated: steps of 0.2; both: -0.3 for a malformed answer), interleaved with groups that do vary."""
    if shaping == "continuous":
        values = rng.uniform(0.2, 1.0, n_groups)
    else:
        values = rng.choice([0.2, 0.4, 0.6, 0.8, 1.0], n_groups)
    values[::7] = -0.3
    groups = [np.full(group_size, v) for v in values]
    for g in range(0, n_groups, 5):  # some groups with spread among them
        groups[g] = rng.choice(values, group_size)
        groups[g][0], groups[g][1] = 0.2, 1.0
    return torch.tensor(np.concatenate(groups))


@pytest.mark.parametrize("group_size", [4, 8, 12, 16])
@pytest.mark.parametrize("shaping", ["continuous", "graduated"])
def test_groups_without_spread_get_exactly_zero_advantage(group_size, shaping):
    rng = np.random.default_rng(group_size)
    rewards64 = _equal_reward_groups(shaping, group_size, 400, rng)
    flat = ~group_has_spread(rewards64, group_size)
    assert 0.5 < flat.float().mean() < 0.9
    for rewards in (rewards64, rewards64.float()):  # the trainer used to hand float32 rewards over
        for scale in ("group", "batch", "none"):
            std = {"group": group_std(rewards, group_size), "batch": float(rewards.double().std(unbiased=False)),
                   "none": None}[scale]
            adv = group_advantages(rewards, group_size, std=std)
            assert (adv[flat] == 0).all(), (scale, rewards.dtype, adv[flat].abs().max())
            # Groups with spread: (r - mean) / std, worked out here in float64.
            groups = rewards.double().view(-1, group_size)
            centred = groups - groups.mean(1, keepdim=True)
            if scale == "group":
                centred = centred / (groups.std(1, unbiased=False, keepdim=True) + 1e-6)
            elif scale == "batch":
                centred = centred / (rewards.double().std(unbiased=False) + 1e-6)
            expected = centred.view(-1)
            torch.testing.assert_close(adv[~flat].double(), expected[~flat], rtol=1e-5, atol=1e-6)


def test_advantages_with_an_ema_baseline_and_a_given_batch_std():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])
    baseline = torch.tensor([0.3, 0.3, 0.6, 0.6])  # e.g. P: rows and A: rows with their tasks' averages
    # An equal group is not zero here: it is compared with the running average, not with itself.
    assert close(group_advantages(rewards, 2, baseline=baseline), [0.7, -0.3, -0.1, -0.1])
    assert close(group_advantages(rewards, 2, baseline=baseline, std=0.5),
                 [0.7 / (0.5 + 1e-6), -0.3 / (0.5 + 1e-6), -0.1 / (0.5 + 1e-6), -0.1 / (0.5 + 1e-6)])
    assert ema(None, 0.4, 0.9) == 0.4
    assert ema(0.4, 1.0, 0.9) == pytest.approx(0.9 * 0.4 + 0.1 * 1.0)


# -- which gradient each KL option gives, exactly, on a small vocabulary ---------------------------------------

V = 5


def _categoricals(seed=0):
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(V, generator=g, dtype=torch.float64).requires_grad_(True)
    ref = torch.randn(V, generator=g, dtype=torch.float64).log_softmax(-1)
    return theta, ref


def _expected_grad(theta, per_sample_loss):
    """grad of E_{y ~ pi}[loss(y)] taken as a sampled loss would be (no gradient through the sampling
    distribution): sum_y pi(y) grad loss(y), exactly, over the whole vocabulary."""
    logp = theta.log_softmax(-1)
    loss = (logp.exp().detach() * per_sample_loss(logp)).sum()
    return torch.autograd.grad(loss, theta)[0]


def _grad(theta, f):
    return torch.autograd.grad(f(theta.log_softmax(-1)), theta)[0]


def test_k2_and_k3_loss_terms_have_the_gradients_of_forward_and_reverse_kl():
    theta, ref = _categoricals()
    forward = lambda logp: (logp.exp() * (logp - ref)).sum()  # KL(pi || ref)  # noqa: E731
    reverse = lambda logp: (ref.exp() * (ref - logp)).sum()  # KL(ref || pi)  # noqa: E731
    refs = ref.expand(V)
    g_k2 = _expected_grad(theta, lambda logp: kl_k2(logp, refs))
    g_k3 = _expected_grad(theta, lambda logp: kl_k3(logp, refs))
    g_k1 = _expected_grad(theta, lambda logp: kl_k1(logp, refs))
    torch.testing.assert_close(g_k2, _grad(theta, forward))
    torch.testing.assert_close(g_k3, _grad(theta, reverse))
    assert not torch.allclose(g_k3, _grad(theta, forward), atol=1e-3)  # the two directions do differ here
    # k1 as a loss term does nothing in expectation: why it goes into the advantages instead.
    torch.testing.assert_close(g_k1, torch.zeros(V, dtype=torch.float64))
    # Each estimator's value is unbiased for KL(pi || ref) (k1, k3) or close to it (k2).
    logp = theta.log_softmax(-1).detach()
    for estimate in (kl_k1, kl_k3):
        assert float((logp.exp() * estimate(logp, refs)).sum()) == pytest.approx(float(forward(logp)))


def test_the_vocabulary_pass_kl_values_and_gradients_for_each_weighting():
    """The exact KL of `vocab_forward` (the one definition the log-prob passes share), its logits theta (an
    identity head), against the sums written out in float64."""
    theta, ref = _categoricals(1)
    p, q = theta.softmax(-1), ref.exp()
    forward = sum(p[i] * torch.log(p[i] / q[i]) for i in range(V))  # KL(policy || reference)
    reverse = sum(q[i] * torch.log(q[i] / p[i]) for i in range(V))  # KL(reference || policy)
    head = torch.eye(V, dtype=torch.float64)
    target = torch.zeros(1, dtype=torch.long)

    # Forward, reverse, symmetric (their mean), and an uneven mix.
    for weights in ((1.0, 0.0), (0.0, 1.0), (0.5, 0.5), (0.25, 2.0)):
        _, _, got, _ = vocab_forward(theta[None], target, head, 1.0, False, ref[None], head, weights)
        want = weights[0] * forward + weights[1] * reverse
        assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-12)
        torch.testing.assert_close(torch.autograd.grad(got.sum(), theta)[0],
                                   torch.autograd.grad(want, theta, retain_graph=True)[0])


def test_k1_in_the_advantages_gives_the_gradient_of_the_sequence_kl():
    """Two-token sequences over a 3-token vocabulary, the second token's distribution depending on the first:
    the exact expected policy gradient with advantages -beta x the k1 return-to-go (`penalty_to_go`) equals
    -beta x grad KL(pi || ref) of whole sequences. Without the return-to-go (k1 of the token alone) it does not."""
    g = torch.Generator().manual_seed(3)
    v, beta = 3, 0.7
    t1 = torch.randn(v, generator=g, dtype=torch.float64).requires_grad_(True)
    t2 = torch.randn(v, v, generator=g, dtype=torch.float64).requires_grad_(True)
    r1 = torch.randn(v, generator=g, dtype=torch.float64).log_softmax(-1)
    r2 = torch.randn(v, v, generator=g, dtype=torch.float64).log_softmax(-1)

    def expected_surrogate(to_go: bool):
        lp1, lp2 = t1.log_softmax(-1), t2.log_softmax(-1)
        total = 0.0
        for a in range(v):
            for b in range(v):
                logp = torch.stack([lp1[a], lp2[a, b]])[None]  # [1 sequence, 2 tokens]
                ref = torch.stack([r1[a], r2[a, b]])[None]
                mask = torch.ones(1, 2, dtype=torch.bool)
                k1 = kl_k1(logp.detach(), ref)
                adv = -beta * (penalty_to_go(k1, mask) if to_go else k1)
                loss, _ = clipped_surrogate(logp, logp.detach(), adv)
                total = total + (lp1[a] + lp2[a, b]).exp().detach() * loss.sum()
        return torch.autograd.grad(total, (t1, t2))

    lp1, lp2 = t1.log_softmax(-1), t2.log_softmax(-1)
    seq_kl = sum((lp1[a] + lp2[a, b]).exp() * (lp1[a] + lp2[a, b] - r1[a] - r2[a, b])
                 for a in range(v) for b in range(v))
    want = torch.autograd.grad(beta * seq_kl, (t1, t2))
    for got, w in zip(expected_surrogate(True), want):
        torch.testing.assert_close(got, w)
    assert not torch.allclose(expected_surrogate(False)[0], want[0], atol=1e-4)


def test_penalty_to_go_by_hand():
    penalty = torch.tensor([[1.0, 2.0, 3.0, 9.0], [0.5, -1.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    assert close(penalty_to_go(penalty, mask), [[6.0, 5.0, 3.0, 0.0], [-0.5, -1.0, 0.0, 0.0]])


# -- GAE and the value loss ------------------------------------------------------------------------------------

def test_gae_by_hand():
    gamma, lam = 0.9, 0.8
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.5, 0.0, 0.0]])  # the reward comes with the last token
    values = torch.tensor([[0.5, 0.6, 0.7, 9.0], [0.2, 0.1, 9.0, 9.0]])  # 9: off the mask, must not matter
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    adv, ret = gae(rewards, values, mask, gamma, lam)
    # Row 0: delta = (0 + .9*.6 - .5, 0 + .9*.7 - .6, 1 + 0 - .7) = (.04, .03, .3)
    d = [0.04, 0.03, 0.3]
    a2 = d[2]
    a1 = d[1] + gamma * lam * a2
    a0 = d[0] + gamma * lam * a1
    # Row 1: delta = (0 + .9*.1 - .2, .5 - .1) = (-.11, .4)
    b1 = 0.4
    b0 = -0.11 + gamma * lam * b1
    assert close(adv, [[a0, a1, a2, 0.0], [b0, b1, 0.0, 0.0]])
    assert close(ret, [[a0 + 0.5, a1 + 0.6, a2 + 0.7, 0.0], [b0 + 0.2, b1 + 0.1, 0.0, 0.0]])
    # gamma = lam = 1 and V = 0: every token's advantage is the return, the final reward.
    adv, _ = gae(rewards, torch.zeros_like(values), mask, 1.0, 1.0)
    assert close(adv, [[1.0, 1.0, 1.0, 0.0], [0.5, 0.5, 0.0, 0.0]])


def test_clipped_value_loss_values_and_gradients():
    old = torch.tensor([0.0, 0.0, 0.0, 0.0])
    ret = torch.tensor([1.0, 1.0, -1.0, 0.1])
    v = torch.tensor([0.5, 0.1, 0.5, 0.3], requires_grad=True)
    loss = value_loss(v, old, ret, clip=0.2)
    # 0: unclipped (.5-1)^2=.25, clipped (.2-1)^2=.64 -> .64/2, and no gradient (the clipped branch won)
    # 1: within the clip range: (.1-1)^2 = .81 both -> .405
    # 2: (.5+1)^2 = 2.25 vs (.2+1)^2 = 1.44 -> 1.125, gradient of the unclipped branch: v - ret = 1.5
    # 3: (.3-.1)^2 = .04 vs (.2-.1)^2 = .01 -> .02, gradient .2
    assert close(loss, [0.32, 0.405, 1.125, 0.02])
    loss.sum().backward()
    assert close(v.grad, [0.0, -0.9, 1.5, 0.2])


def test_explained_variance_of_the_critic_by_hand():
    from rookworld.harness.distributed import Comm, DistInfo
    from rookworld.grpo.metrics import value_metrics

    comm = Comm(DistInfo(), torch.device("cpu"))
    returns = torch.tensor([[1.0, 2.0, 7.0], [3.0, 4.0, -5.0]])
    values = torch.tensor([[1.0, 2.0, 9.0], [2.0, 5.0, 9.0]])  # 9 and the third column: off the mask
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    m = value_metrics(comm, values, returns, mask)
    # R = 1, 2, 3, 4: mean 2.5, Var 1.25. R - V = 0, 0, 1, -1: mean 0, Var 0.5. 1 - 0.5 / 1.25 = 0.6.
    assert m["value/explained_variance"] == pytest.approx(0.6, abs=1e-12)
    assert m["value/mean"] == pytest.approx(2.5, abs=1e-12)  # (1 + 2 + 2 + 5) / 4
    assert value_metrics(comm, returns, returns, mask)["value/explained_variance"] == pytest.approx(1.0)
    const = value_metrics(comm, torch.full_like(values, 2.5), returns, mask)["value/explained_variance"]
    assert const == pytest.approx(0.0, abs=1e-12)  # a constant critic explains nothing
    assert value_metrics(comm, values, torch.ones_like(returns), mask)["value/explained_variance"] is None


def test_gae_advantages_take_the_k1_penalty_as_a_per_token_reward():
    """--advantage gae --kl-estimator k1: the reward at the last token, minus beta x k1 at every token, through
    GAE (PPO-RLHF), worked out by hand."""
    from rookworld.settings.config import TrainConfig
    from rookworld.harness.distributed import Comm, DistInfo
    from rookworld.grpo.objective import Objective

    gamma, lam, beta = 0.9, 0.5, 0.1
    cfg = TrainConfig(advantage="gae", kl_estimator="k1", gamma=gamma, gae_lambda=lam, std_scaling="none",
                      beta=beta, group_size=2).validate()
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    old_lp = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.2, 0.0]])
    ref_lp = torch.tensor([[-1.5, -1.0, -0.5], [-1.0, -0.7, 0.0]])
    values = torch.tensor([[0.2, 0.4, 0.6], [0.1, 0.3, 5.0]])
    rewards = torch.tensor([1.0, -0.5], dtype=torch.float64)
    scored = SimpleNamespace(rewards=rewards, valid=torch.ones(2, dtype=torch.bool), tasks=np.array(["P", "P"]),
                             completion_mask=mask, loss_mask=mask, ref_logprobs=ref_lp, old_logprobs=old_lp,
                             old_values=values, kl_scale=None)
    adv, ret, _ = Objective(cfg).advantages(scored, Comm(DistInfo(), torch.device("cpu")))
    # k1 = old - ref: row 0 (0.5, -1.0, 0.0), row 1 (-0.5, 0.5). Per-token rewards r = -beta k1 (+ the reward last):
    r0 = [-0.05, 0.1, 1.0]
    r1 = [0.05, -0.05 - 0.5]
    # delta_t = r_t + gamma V_{t+1} - V_t (V = 0 after the last token); A_t = delta_t + gamma lam A_{t+1}
    d0 = [r0[0] + gamma * 0.4 - 0.2, r0[1] + gamma * 0.6 - 0.4, r0[2] - 0.6]
    a0_2 = d0[2]
    a0_1 = d0[1] + gamma * lam * a0_2
    a0_0 = d0[0] + gamma * lam * a0_1
    d1 = [r1[0] + gamma * 0.3 - 0.1, r1[1] - 0.3]
    a1_1 = d1[1]
    a1_0 = d1[0] + gamma * lam * a1_1
    assert torch.allclose(adv, torch.tensor([[a0_0, a0_1, a0_2], [a1_0, a1_1, 0.0]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[a0_0 + 0.2, a0_1 + 0.4, a0_2 + 0.6], [a1_0 + 0.1, a1_1 + 0.3, 0.0]]),
                          atol=1e-6)


def test_each_tasks_mean_advantage_size_is_over_its_own_usable_tokens():
    """`advantage/abs/P` and `advantage/abs/A`: the mean |advantage| of each task's usable tokens, computed by hand
    in float64 on a rollout of two P: groups and one A: group whose rows have different lengths."""
    from rookworld.grpo.metrics import advantage_metrics
    from rookworld.harness.distributed import Comm, DistInfo

    g = torch.Generator().manual_seed(3)
    advantages = torch.randn(6, 5, generator=g, dtype=torch.float64)
    loss_mask = torch.rand(6, 5, generator=g) < 0.7
    loss_mask[5] = False  # a row with no usable token counts in neither
    env = torch.tensor([False, False, True, True, False, False])
    rollout = SimpleNamespace(advantages=advantages, loss_mask=loss_mask, a_rows=env)
    got = advantage_metrics(Comm(DistInfo(), torch.device("cpu")), rollout)
    for task, rows in (("P", [0, 1, 4, 5]), ("A", [2, 3])):
        values = [abs(float(advantages[i, j])) for i in rows for j in range(5) if loss_mask[i, j]]
        assert got[f"advantage/abs/{task}"] == pytest.approx(sum(values) / len(values), rel=1e-12)
    assert advantage_metrics(Comm(DistInfo(), torch.device("cpu")), SimpleNamespace(advantages=None)) == {}
