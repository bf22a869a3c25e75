"""The GRPO objective inside the trainer: what a step computes under DDP, when it must not step, what each
KL option does to the policy, the EMA baseline, and the GAE critic, on tiny models with real prompts."""

from __future__ import annotations

import copy
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rookworld.settings.config import ConfigError, TrainConfig
from rookworld.net.tokenizer import get_tokenizer
from rookworld.grpo.objective import Objective
from rookworld.grpo.prompts import Prompt
from rookworld.chess.rewards import Scores
from rookworld.grpo.trainer import Trainer
from rookworld.harness.distributed import Comm, DistInfo
from rookworld.grpo.loss import Experience, GRPOLoss


def token_loss(objective, lp, entropy=None, kl=None, *, advantages, old_logprobs=None, ref_logprobs=None,
               kl_scale=None):
    """Each token's loss at weight 1, its clipped flags and its KL (None where not measured), shaped as `lp`: the
    step's `GRPOLoss` as the log-prob pass calls it, on every position of the rows flattened."""
    flat = lambda x: None if x is None else x.reshape(-1)  # noqa: E731
    experience = Experience(flat(advantages), torch.ones(lp.numel(), dtype=lp.dtype), flat(old_logprobs),
                            flat(ref_logprobs), flat(kl_scale))
    terms = GRPOLoss.of(objective, experience)(flat(lp), flat(entropy), flat(kl), torch.arange(lp.numel()))
    kl = terms.metrics.get("kl")
    return terms.loss.view(lp.shape), terms.metrics["clipped"].view(lp.shape), None if kl is None else kl.view(lp.shape)

from conftest import constant_gpt, tiny_gpt, torchrun
from test_trainer import FixedPrompts, Lines, metrics, run_cli, train_args

HERE = Path(__file__).resolve().parent


def _quiet():
    return open(os.devnull, "w")


def small_config(tmp_path, **kw) -> TrainConfig:
    # float32 pinned: the tests compare numbers, which --dtype auto would make bf16 on a CPU with AMX.
    base = dict(steps=4, prompts_per_step=2, group_size=4, max_new_tokens=4, warmup_steps=0, eval_every=0,
                save_every=0, sample_every=0, output_dir=str(tmp_path), compile=False, log_every=100, beta=0.0,
                dtype="fp32")
    base.update(kw)
    return TrainConfig(**base).validate()


class Scripted:
    """Rewards given per step: `table[step]` is the reward of each completion of that step, in order."""

    def __init__(self, table, valid=None):
        self.table, self.valid, self.step = table, valid, 0

    def prefetch(self, prompts):
        pass

    def __call__(self, prompts, completions):
        r = np.asarray(self.table[min(self.step, len(self.table) - 1)], dtype=float)
        valid = None if self.valid is None else np.asarray(self.valid, dtype=bool)
        self.step += 1
        return Scores(r, np.array([p.task for p in prompts]), np.ones(len(r), dtype=bool), valid)


# -- DDP: the same batch on 1 and on 2 ranks gives the same gradient --------------------------------------------

@pytest.mark.slow
def test_the_gradient_of_a_step_does_not_depend_on_the_number_of_ranks(tmp_path):
    """Token aggregation is the global token mean and `--std-scaling batch` uses every rank's rewards, so two gloo
    ranks holding very different numbers of tokens (3-token P: completions on one, 9-token A: on the other) give
    the gradient one process gives for the whole batch; so do sequence and constant aggregation, the EMA
    baseline with k1 in the advantages, GAE's whitening with the exact KL, and the A: targets' likelihood (taken on
    one rank only, outside DDP's wrapper)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    one = subprocess.run([sys.executable, str(HERE / "ddp_step.py"), str(tmp_path / "one")], capture_output=True,
                         text=True, env=env, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    two = torchrun(HERE / "ddp_step.py", tmp_path / "two")
    assert two.returncode == 0, two.stderr[-3000:]
    cases = sorted(p.stem for p in (tmp_path / "one").glob("*.pt"))
    assert len(cases) == 5
    for case in cases:
        a, b = torch.load(tmp_path / "one" / f"{case}.pt"), torch.load(tmp_path / "two" / f"{case}.pt")
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].abs().sum() > 0, (case, k)
            # float32 sums in another order: compared at the tensor's own scale
            assert float((b[k] - a[k]).abs().max()) < 1e-4 * float(a[k].abs().max()), (case, k)
        ma, mb = (json.loads((tmp_path / d / f"{case}.json").read_text()) for d in ("one", "two"))
        for key in ("loss", "kl/mean", "entropy", "reward/mean", "clip_fraction", "value/explained_variance", "nll/A"):
            if ma.get(key) is not None:
                assert mb[key] == pytest.approx(ma[key], rel=1e-5, abs=1e-7), (case, key)


# -- settings that cannot work are refused before any work -------------------------------------------------------

@pytest.mark.parametrize("settings, message", [
    (dict(temperature=0.0), "--temperature must be > 0"),
    (dict(kl_target=0.05, beta=0.0), "--kl-target adapts --beta"),
    (dict(kl_target=0.05, beta_warmup_steps=10), "--kl-target and --beta-warmup-steps"),
    (dict(kl_direction="reverse"), "--kl-direction applies to --kl-estimator full"),
    (dict(baseline="ema", std_scaling="group"), "use batch or none with --baseline ema"),
    (dict(advantage="gae", std_scaling="group"), "no meaning for per-token GAE"),
    (dict(advantage="gae", baseline="ema"), "has its own baseline"),
    (dict(gamma=0.9), "--gamma applies to --advantage gae"),
    (dict(vf_coef=0.5), "--vf-coef applies to --advantage gae"),
    (dict(ema_decay=0.5), "--ema-decay applies to --baseline ema"),
    (dict(advantage="gae", gae_lambda=1.5), "--gae-lambda must lie in [0, 1]"),
    (dict(baseline="ema", ema_decay=1.0), "--ema-decay must lie in [0, 1)"),
    (dict(kl_estimator="k4"), "--kl-estimator must be one of"),
])
def test_settings_that_cannot_work_are_one_clear_error(settings, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainConfig(**settings).validate()


def test_auto_std_scaling_follows_the_baseline():
    from rookworld.grpo.objective import std_scaling

    assert std_scaling(TrainConfig()) == "group"
    assert std_scaling(TrainConfig(baseline="ema").validate()) == "batch"
    assert std_scaling(TrainConfig(advantage="gae").validate()) == "batch"
    assert std_scaling(TrainConfig(advantage="gae", std_scaling="none").validate()) == "none"


def test_temperature_zero_is_refused_on_the_command_line(tiny_dir, tmp_path):
    proc = run_cli(train_args(tiny_dir, tmp_path / "x", "--steps", "1", "--temperature", "0"))
    assert proc.returncode == 2 and "--temperature must be > 0" in proc.stderr and "Traceback" not in proc.stderr


# -- a minibatch without usable tokens -----------------------------------------------------------------------------

def test_a_minibatch_without_usable_tokens_takes_no_optimizer_step_and_leaves_beta(tmp_path):
    """Step 1 has reward spread, step 2 none (and --drop-zero-spread): AdamW's momentum from step 1 must not move
    the weights in step 2, and the adaptive beta must not read step 2's missing KL as 0."""
    cfg = small_config(tmp_path, drop_zero_spread=True, beta=0.1, kl_target=0.01, lr=1e-2)
    spread, flat = [0.0, 1.0, 0.5, 0.2] * 2, [0.4] * 8
    lines = Lines()
    policy = tiny_gpt(seed=1, scale=3.0)
    t = Trainer(cfg, policy=policy, reference=copy.deepcopy(policy).requires_grad_(False),
                tokenizer=get_tokenizer(), reward_fn=Scripted([spread, flat]), prompts=FixedPrompts("P: x", 2),
                stream=lines)
    first = t.train_step()
    assert first["updates/skipped"] == 0 and first["kl/mean"] is not None
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    beta = t.objective.beta
    second = t.train_step()
    assert second["updates/skipped"] == 1
    assert second["kl/mean"] is None and second["loss"] is None and second["grad_norm"] is None
    assert t.objective.beta == beta, "no KL was measured: beta must stay"
    for k, v in policy.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} moved in a step without usable tokens"
    assert "had no usable token" in str(lines)
    assert second["groups/zero_spread"] == 1.0 and first["groups/zero_spread"] == 0.0


def test_zero_spread_counts_only_groups_that_were_scored(tmp_path):
    cfg = small_config(tmp_path, steps=1, prompts_per_step=3)
    # Group 0 was not scored (its rewards are placeholders, all 0), group 1 has spread, group 2 has none.
    rewards = [0.0] * 4 + [0.1, 0.9, 0.5, 0.5] + [0.7] * 4
    valid = [False] * 4 + [True] * 8
    t = Trainer(cfg, policy=tiny_gpt(seed=1), tokenizer=get_tokenizer(), reward_fn=Scripted([rewards], valid),
                prompts=FixedPrompts("P: x", 3), stream=Lines())
    m = t.train_step()
    assert m["groups/zero_spread"] == 0.5 and m["unscored"] == pytest.approx(1 / 3)


def test_sequence_aggregation_is_not_diluted_by_groups_the_loss_leaves_out(tmp_path):
    """Two groups, one without reward spread under --drop-zero-spread, give the gradient of the other group alone
    (top-k 1 makes the completions the same in both runs); dividing by every row halved it."""

    def grads(n_prompts, table):
        cfg = small_config(tmp_path / str(n_prompts), steps=1, prompts_per_step=n_prompts, top_k=1, lr=1e-2,
                           loss_aggregation="sequence", drop_zero_spread=True, max_grad_norm=0.0)
        t = Trainer(cfg, policy=tiny_gpt(seed=1, scale=3.0), tokenizer=get_tokenizer(), reward_fn=Scripted([table]),
                    prompts=FixedPrompts("P: x", n_prompts), stream=_quiet())
        t.train_step()
        return {k: p.grad.clone() for k, p in t.run.policy.named_parameters()}

    spread, flat = [0.0, 1.0, 0.5, 0.2], [0.4] * 4
    both, alone = grads(2, spread + flat), grads(1, spread)
    assert alone["transformer.wte.weight"].abs().sum() > 0
    for k in alone:
        torch.testing.assert_close(both[k], alone[k], msg=k)


def test_the_ratio_is_to_the_same_pass_unless_the_policy_moves_within_a_step():
    """With --mu 1 and one minibatch the policy does not move between the rollout and the update, so the ratio's
    denominator is the update's own pass, detached: another pass's rounding (a GPU's; exaggerated here) must not
    read as a ratio away from 1. With --mu 2 it is the rollout's pass."""
    from rookworld.grpo.objective import Objective

    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    rollout_pass = lp.detach() + torch.tensor([[0.3, -0.4, 0.25]])
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    for mu in (1, 2):
        # k1 makes the rollout run the sampling policy's pass even with --mu 1.
        objective = Objective(TrainConfig(mu=mu, kl_estimator="k1", beta=0.1).validate())
        assert objective.passes.sampler and objective.passes.several_updates == (mu > 1)
        per_token, clipped, _ = token_loss(objective, lp, torch.zeros_like(lp), None, advantages=adv,
                                                     old_logprobs=rollout_pass, ref_logprobs=None)
        grad = torch.autograd.grad(per_token.sum(), lp)[0]
        if mu == 1:
            assert not clipped.any()
            torch.testing.assert_close(grad, -adv)  # the on-policy gradient: -A d log pi
        else:
            assert clipped.any()
            assert not torch.allclose(grad, -adv)


def test_kl_statistics_cover_every_epoch(tmp_path):
    """The reference is a copy of the policy, so epoch 0 sees KL exactly 0 and only the second epoch, after an
    update, sees any: the 95th percentile must come from the same tokens as the mean."""
    cfg = small_config(tmp_path, steps=1, mu=2, beta=0.1, lr=5e-2, kl_estimator="k2")
    policy = tiny_gpt(seed=1, scale=3.0)
    t = Trainer(cfg, policy=policy, reference=copy.deepcopy(policy).requires_grad_(False), tokenizer=get_tokenizer(),
                reward_fn=Scripted([[0.0, 1.0, 0.5, 0.2] * 2]), prompts=FixedPrompts("P: x", 2), stream=Lines())
    m = t.train_step()
    assert m["kl/mean"] > 0 and m["kl/p95"] > 0


# -- what each KL option does ------------------------------------------------------------------------------------

def _on_six_tokens(probs):
    """A GPT that writes one of six tokens, with these probabilities, at every position (`constant_gpt`): small
    enough a support that a few dozen samples estimate a KL well."""
    logits = torch.full((50257,), -30.0)
    for token, p in zip((11, 22, 33, 44, 55, 66), probs):
        logits[token] = math.log(p)
    return constant_gpt(logits)


@pytest.mark.parametrize("estimator, direction", [("k1", "forward"), ("k2", "forward"), ("k3", "forward"),
                                                  ("full", "forward"), ("full", "reverse"), ("full", "symmetric")])
def test_each_kl_option_pulls_the_policy_toward_the_reference(tmp_path, estimator, direction):
    """Rewards without spread leave the KL term as the only signal: every option must shrink the KL to the
    reference. (k1 as the loss term it used to be has zero gradient in expectation: the same run then drifts
    from 0.97 to 1.1.)"""
    cfg = small_config(tmp_path, steps=8, prompts_per_step=4, group_size=16, max_new_tokens=2, beta=1.0, lr=1e-2,
                       kl_estimator=estimator, kl_direction=direction, std_scaling="none")
    policy = _on_six_tokens([0.6, 0.2, 0.1, 0.05, 0.03, 0.02])
    reference = _on_six_tokens([0.1, 0.1, 0.2, 0.2, 0.2, 0.2]).requires_grad_(False)
    t = Trainer(cfg, policy=policy, reference=reference, tokenizer=get_tokenizer(),
                reward_fn=Scripted([[0.5] * 64]), prompts=FixedPrompts("P: x", 4), stream=_quiet())

    def exact_kl():  # KL(policy || reference) of the (position-independent) next-token distribution
        ids = torch.tensor([[50256, 47, 25]])
        with torch.no_grad():
            lp, lq = policy(ids)[0, -1].log_softmax(-1), reference(ids)[0, -1].log_softmax(-1)
        return float((lp.exp() * (lp - lq)).sum())

    start = exact_kl()
    assert start == pytest.approx(0.97, abs=0.01)
    for _ in range(cfg.steps):
        t.train_step()
    assert exact_kl() < 0.5 * start, (estimator, start, exact_kl())


# -- the EMA baseline -----------------------------------------------------------------------------------------------

def test_ema_baseline_by_hand_and_across_resume(tmp_path):
    table = [[0.2, 0.4, 0.6, 0.8] * 2, [1.0, 1.0, 1.0, 1.0] * 2, [0.0, 0.5, 0.5, 0.5] * 2]
    cfg = small_config(tmp_path, steps=3, baseline="ema", ema_decay=0.75, std_scaling="none")
    t = Trainer(cfg, policy=tiny_gpt(seed=1), tokenizer=get_tokenizer(), reward_fn=Scripted(table),
                prompts=FixedPrompts("P: x", 2), stream=_quiet())
    rows = [t.train_step() for _ in range(3)]
    means = [np.mean(r) for r in table]
    assert [r["reward/mean"] for r in rows] == pytest.approx(means)
    # Step 1 has only its own mean; later steps the average of the steps before them, never their own.
    assert rows[0]["baseline/other"] == pytest.approx(means[0])
    assert rows[1]["baseline/other"] == pytest.approx(means[0])
    assert rows[2]["baseline/other"] == pytest.approx(0.75 * means[0] + 0.25 * means[1])
    # An all-equal group (step 2: every reward 1.0) above the average gets a positive advantage.
    assert t.objective.baselines["other"] == pytest.approx(0.75 * (0.75 * means[0] + 0.25 * means[1]) + 0.25 * means[2])


# -- GAE: a critic beside the policy ---------------------------------------------------------------------------

def test_gae_critic_learns_the_value_of_each_prompt(tmp_path):
    """Two prompts, one always rewarded 0.9, the other 0.1: the value head must learn to tell them apart
    (explained variance from 0 at the start, with a zero head, to most of the variance)."""

    class PerPrompt:
        def prefetch(self, prompts):
            pass

        def __call__(self, prompts, completions):
            r = np.array([0.9 if "white" in p.text else 0.1 for p in prompts])
            r = r + np.tile([0.0, 0.01, 0.02, 0.03], len(r) // 4)  # a little spread within each group
            return Scores(r, np.array(["P"] * len(r)), np.ones(len(r), dtype=bool))

    class TwoPrompts:
        def batch(self, step):
            return [Prompt("P", "P: white to move"), Prompt("P", "P: black to move")]

    cfg = small_config(tmp_path, steps=30, advantage="gae", value_lr=1e-2, vf_coef=1.0, lr=1e-4, max_new_tokens=3)
    t = Trainer(cfg, policy=tiny_gpt(seed=1, scale=2.0), tokenizer=get_tokenizer(), reward_fn=PerPrompt(),
                prompts=TwoPrompts(), stream=_quiet())
    rows = [t.train_step() for _ in range(cfg.steps)]
    assert rows[0]["value/explained_variance"] == pytest.approx(0.0, abs=1e-9)  # V = 0: nothing explained
    assert rows[0]["value/mean"] == 0.0
    ev = [r["value/explained_variance"] for r in rows]
    assert np.mean(ev[-5:]) > 0.35 and np.mean(ev[:5]) < 0.1, ev
    assert np.mean([r["value/loss"] for r in rows[-5:]]) < 0.5 * rows[0]["value/loss"]


@pytest.mark.slow
@pytest.mark.parametrize("extra", [
    ["--advantage", "gae", "--kl-estimator", "full", "--value-lr", "1e-2"],
    ["--baseline", "ema", "--kl-estimator", "k1"],
], ids=["gae-full-kl", "ema-k1"])
def test_options_survive_resume_exactly_and_checkpoints_stay_plain_gpt2(tiny_dir, tmp_path, extra):
    common = ["--save-every", "2", "--lr", "1e-3", "--entropy-coef", "0.01", "--mu", "2", *extra]
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    proc = run_cli(train_args(tiny_dir, straight, "--steps", "4", *common))
    assert proc.returncode == 0, proc.stderr
    assert run_cli(train_args(tiny_dir, broken, "--steps", "2", *common)).returncode == 0
    second = run_cli(["train", "--resume", str(broken), "--steps", "4"])
    assert second.returncode == 0, second.stderr
    from rookworld.harness.checkpoint import resolve_checkpoint
    from rookworld.net.pretrained import from_pretrained

    a, b = resolve_checkpoint(straight), resolve_checkpoint(broken)
    wa, wb = from_pretrained(a).state_dict(), from_pretrained(b).state_dict()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    ra, rb = metrics(straight), metrics(broken)
    assert [r["reward/mean"] for r in ra] == [r["reward/mean"] for r in rb]
    if "gae" in extra:
        from safetensors.torch import load_file

        ha, hb = load_file(str(a / "value_head.safetensors")), load_file(str(b / "value_head.safetensors"))
        assert ha.keys() == {"proj.weight", "proj.bias"} and float(ha["proj.weight"].abs().sum()) > 0
        for k in ha:
            assert torch.equal(ha[k], hb[k]), k
        assert all(r["value/loss"] is not None and "value/explained_variance" in r for r in ra)
        transformers = pytest.importorskip("transformers")
        transformers.GPT2LMHeadModel.from_pretrained(a)  # the value head is not in the GPT-2 checkpoint
    else:
        assert [r["baseline/P"] for r in ra] == [r["baseline/P"] for r in rb]
        assert all(r["baseline/P"] is not None for r in ra)


def test_the_objective_owns_each_steps_beta_through_warm_up():
    """beta ramps over --beta-warmup-steps; the step's beta weighs the loss's KL term (k3, checked by hand in
    float64, value and gradient) and is what the metrics report, with no beta passed around."""
    cfg = TrainConfig(beta=0.1, beta_warmup_steps=4, kl_estimator="k3").validate()
    objective = Objective(cfg)
    seen = []
    for step in range(6):
        objective.begin_step(step)
        seen.append(objective.step_beta)
    assert seen == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1, 0.1])
    objective.begin_step(1)
    lp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -0.5]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, 0.5]], dtype=torch.float64)
    per_token, _, kl = token_loss(objective, lp, None, None, advantages=adv, old_logprobs=None, ref_logprobs=ref)
    d = (ref - lp).detach()
    k3 = torch.exp(d) - d - 1.0
    # mu 1: the ratio is 1 and its gradient is the advantage's; k3's gradient in lp is 1 - exp(ref - lp).
    assert torch.allclose(per_token.detach(), -adv + 0.05 * k3, atol=1e-12)
    grad = torch.autograd.grad(per_token.sum(), lp)[0]
    assert torch.allclose(grad, -adv + 0.05 * (1.0 - torch.exp(d)), atol=1e-12)


# -- the KL weight of A: completions ----------------------------------------------------------------------------

CPU = Comm(DistInfo(), torch.device("cpu"))


def test_a_completions_kl_weight_by_hand():
    """--a-beta-scale s: an A: token's KL term weighs beta x s, a P: token's beta (k3 in the loss, checked by hand
    in float64, value and gradient); the KL reported stays unweighted; k1's per-token penalty in the advantages is
    weighed the same way; s = 1 asks for no per-token scale at all."""
    cfg = TrainConfig(beta=0.1, a_beta_scale=3.0, kl_estimator="k3").validate()
    objective = Objective(cfg)
    objective.begin_step(0)
    scale = objective.kl_scale(np.array(["P", "A"]), 3, torch.device("cpu")).double()
    assert scale.tolist() == [[1.0] * 3, [3.0] * 3]
    lp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.5]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-0.4, -2.0, -1.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, 0.5], [-0.5, 0.25, 2.0]], dtype=torch.float64)
    per_token, _, kl = token_loss(objective, lp, None, None, advantages=adv, old_logprobs=None, ref_logprobs=ref,
                                            kl_scale=scale)
    d = (ref - lp).detach()
    k3 = torch.exp(d) - d - 1.0
    weight = torch.tensor([[0.1], [0.3]], dtype=torch.float64)
    assert torch.allclose(per_token.detach(), -adv + weight * k3, atol=1e-12)
    assert torch.allclose(kl.double(), k3, atol=1e-6), "the KL reported is the KL, not its weight"
    grad = torch.autograd.grad(per_token.sum(), lp)[0]
    assert torch.allclose(grad, -adv + weight * (1.0 - torch.exp(d)), atol=1e-12)

    k1 = Objective(TrainConfig(beta=0.1, a_beta_scale=3.0, kl_estimator="k1", std_scaling="none",
                               group_size=2).validate())
    k1.begin_step(0)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5], dtype=torch.float64)
    cm = torch.ones(4, 2, dtype=torch.bool)
    tasks = np.array(["P", "P", "A", "A"])
    old = torch.tensor([[-1.0, -2.0], [-0.5, -0.5], [-1.0, -1.5], [-2.0, -0.1]], dtype=torch.float64)
    reference = torch.tensor([[-1.5, -1.0], [-0.5, -0.7], [-1.2, -1.0], [-1.0, -0.3]], dtype=torch.float64)
    scored = SimpleNamespace(rewards=rewards, valid=torch.ones(4, dtype=torch.bool), tasks=tasks, completion_mask=cm,
                             loss_mask=cm, ref_logprobs=reference, old_logprobs=old, old_values=None,
                             kl_scale=k1.kl_scale(tasks, 2, torch.device("cpu")))
    got, _, _ = k1.advantages(scored, CPU)
    plain, _, _ = Objective(TrainConfig(beta=0.0, std_scaling="none", group_size=2).validate()).advantages(
        SimpleNamespace(**{**vars(scored), "ref_logprobs": None, "old_logprobs": None, "kl_scale": None}), CPU)
    penalty = torch.tensor([[0.1], [0.1], [0.3], [0.3]], dtype=torch.float64) * (old - reference)
    to_go = penalty.flip(1).cumsum(1).flip(1)  # each token's penalty from there to the end
    assert torch.allclose(got.double(), plain.double() - to_go, atol=1e-6)
    assert Objective(TrainConfig(beta=0.1).validate()).kl_scale(tasks, 2, torch.device("cpu")) is None


class TaskPrompts:
    def __init__(self, tasks):
        self.tasks = tasks

    def batch(self, step):
        return [Prompt(t, f"{t}: 8/8/8/8/8/8/8/K6k w - - 0 1") for t in self.tasks]


@pytest.mark.parametrize("scale", [0.0, 1.0])
def test_a_completions_without_kl_weight_feel_no_pull_to_the_reference(tmp_path, scale):
    """Rewards without spread leave the KL term as the only signal: with --a-beta-scale 0 a step of A: prompts
    alone has no gradient at all; at 1 the same step has one."""
    cfg = small_config(tmp_path, steps=1, prompts_per_step=2, group_size=4, max_new_tokens=2, beta=1.0, lr=1e-2,
                       kl_estimator="k3", std_scaling="none", a_beta_scale=scale)
    policy = _on_six_tokens([0.6, 0.2, 0.1, 0.05, 0.03, 0.02])
    reference = _on_six_tokens([0.1, 0.1, 0.2, 0.2, 0.2, 0.2]).requires_grad_(False)
    t = Trainer(cfg, policy=policy, reference=reference, tokenizer=get_tokenizer(),
                reward_fn=Scripted([[0.5] * 8]), prompts=TaskPrompts(["A", "A"]), stream=_quiet())
    m = t.train_step()
    assert m["kl/mean"] > 0.1, "the KL is measured whatever its weight"
    assert (m["grad_norm"] == 0.0) == (scale == 0.0), m["grad_norm"]


def test_each_part_of_a_step_holds_a_frozen_slice_of_the_settings_it_reads():
    """The objective, the rollout and the update read their own settings, as given when they were made: the
    command's settings changed afterwards (auto-batch sets --prompts-per-step) reach none of them, and a slice
    cannot be changed in place."""
    import dataclasses

    from rookworld.grpo.rollout import RolloutSettings
    from rookworld.grpo.update import UpdateSettings
    from rookworld.grpo.objective import ObjectiveSettings

    cfg = TrainConfig(group_size=4, beta=0.1, a_beta_scale=4.0, mu=2, seed=7).validate()
    objective = Objective(cfg)
    parts = {ObjectiveSettings: objective.settings, RolloutSettings: RolloutSettings.of(cfg),
             UpdateSettings: UpdateSettings.of(cfg)}
    declared = {f.name for f in dataclasses.fields(TrainConfig)}
    for kind, part in parts.items():
        assert type(part) is kind
        names = [f.name for f in dataclasses.fields(part)]
        assert set(names) <= declared and "prompts_per_step" not in names
        assert all(getattr(part, n) == getattr(cfg, n) for n in names)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(part, names[0], 0)
    cfg.group_size = 8
    assert objective.settings.group_size == 4 and objective.settings.a_beta_scale == 4.0 and parts[UpdateSettings].mu == 2


# -- --a-likelihood-weight: the rules' A: targets beside the GRPO loss ------------------------------------------

A_PROMPTS = [  # short enough that prompt and whole target fit the tiny model's 128 positions
    Prompt("P", "P: 3r1r2/ppb4k/8/2R5/5P2/8/1P4PP/2K3R1 w - - 1 27"),
    Prompt("A", "A: 7k/8/1p6/3r2R1/p1B1P3/1PP5/5KPP/7R w - - 0 32+c4d3+a5a4 c4d3+"),
    Prompt("A", "A: 8/8/4k3/8/2K5/8/3P4/8 w - - 0 50+d2d4+c3c4 d2d4+"),
]


class Listed:
    def __init__(self, prompts):
        self.prompts = prompts

    def batch(self, step):
        return list(self.prompts)


def _target_nll(model, prompts, max_new_tokens):
    """The A: prompts' targets' mean NLL per token, in float64, apart from the trainer: each prompt's own row
    (EOS, prompt, target, EOS; no padding), a plain forward and log_softmax, the target cut as completions are."""
    from rookworld.chess.rules import env_targets

    tok, total, count = get_tokenizer(), 0.0, 0
    for p in (p for p in prompts if p.task == "A"):
        prompt = [tok.eos_id, *tok.encode(p.text)]
        target = [*tok.encode(env_targets([p.text])[0]), tok.eos_id][:max_new_tokens]
        logp = torch.log_softmax(model(torch.tensor([prompt + target]))[0].double(), -1)
        for i, t in enumerate(target):
            total = total - logp[len(prompt) - 1 + i, t]
        count += len(target)
    return total / count


@pytest.mark.parametrize("max_new_tokens", [6, 48])
def test_a_likelihood_term_by_hand_in_float64(tmp_path, max_new_tokens):
    """--a-likelihood-weight w: with rewards that do not spread and no KL, the step's whole loss is w x the mean NLL
    per token of the A: prompts' exact targets (the rules' next state, then EOS; cut at --max-new-tokens as a
    completion is): its gradient is that NLL's, computed apart in float64 on each prompt alone (so the padding of
    the trainer's batch must not show); the P: prompt adds nothing; `nll/A` reports the NLL."""
    weight = 0.7
    cfg = small_config(tmp_path, steps=1, prompts_per_step=3, group_size=2, max_new_tokens=max_new_tokens,
                       std_scaling="none", a_likelihood_weight=weight, max_grad_norm=0.0, lr=1e-3, micro_batch_size=1)
    policy = tiny_gpt(seed=4, scale=2.0)
    twin = copy.deepcopy(policy).double()
    t = Trainer(cfg, policy=policy, tokenizer=get_tokenizer(), reward_fn=Scripted([[0.5] * 6]),
                prompts=Listed(A_PROMPTS), stream=_quiet())
    m = t.train_step()
    nll = _target_nll(twin, A_PROMPTS, max_new_tokens)
    assert m["nll/A"] == pytest.approx(float(nll.detach()), rel=1e-5)
    expected = torch.autograd.grad(weight * nll, list(twin.parameters()))
    for (name, p), g in zip(policy.named_parameters(), expected):
        assert p.grad is not None, name
        # float32 sums in another order: compared at the tensor's own scale
        assert float((p.grad.double() - g).abs().max()) <= 1e-5 * float(g.abs().max()), name


def test_a_likelihood_term_teaches_the_rules_next_state(tmp_path):
    """A few steps of the term alone (rewards without spread) lower the A: targets' NLL: it pulls toward the rules'
    answer, step after step; at weight 0 the same steps leave it where it was."""
    def nll_after(weight):
        cfg = small_config(tmp_path / str(weight), steps=6, prompts_per_step=3, group_size=2, max_new_tokens=8,
                           std_scaling="none", a_likelihood_weight=weight, lr=3e-3)
        policy = tiny_gpt(seed=5, scale=2.0)
        t = Trainer(cfg, policy=policy, tokenizer=get_tokenizer(), reward_fn=Scripted([[0.5] * 6]),
                    prompts=Listed(A_PROMPTS), stream=_quiet())
        before = float(_target_nll(copy.deepcopy(policy).double(), A_PROMPTS, 8).detach())
        for _ in range(cfg.steps):
            t.train_step()
        return before, float(_target_nll(copy.deepcopy(policy).double(), A_PROMPTS, 8).detach())

    before, after = nll_after(1.0)
    assert after < before - 0.5, (before, after)
    before, after = nll_after(0.0)
    assert after == pytest.approx(before, abs=1e-9)


def test_a_likelihood_weight_needs_a_prompts():
    with pytest.raises(ConfigError, match="--a-likelihood-weight .* --task-mix below 1"):
        TrainConfig(a_likelihood_weight=1.0, task_mix=1.0).validate()
    with pytest.raises(ConfigError, match="--a-likelihood-weight"):
        TrainConfig(a_likelihood_weight=-1.0).validate()


def test_a_advantage_scale_by_hand():
    """--a-advantage-scale s: an A: completion's advantage is s times what GRPO gives it (its group's mean and std
    as ever), a P: completion's unchanged, in float64 by hand; s = 0 leaves A:'s tokens no push from the rewards,
    so an A:-only step without KL and likelihood has no gradient (below)."""
    rewards = torch.tensor([1.0, 0.0, 0.9, 0.3], dtype=torch.float64)
    tasks = np.array(["P", "P", "A", "A"])
    cm = torch.ones(4, 3, dtype=torch.bool)
    scored = SimpleNamespace(rewards=rewards, valid=torch.ones(4, dtype=torch.bool), tasks=tasks, completion_mask=cm,
                             loss_mask=cm, ref_logprobs=None, old_logprobs=None, old_values=None, kl_scale=None)
    cfg = TrainConfig(beta=0.0, group_size=2, a_advantage_scale=0.25).validate()
    got, _, _ = Objective(cfg).advantages(scored, CPU)
    # group std: (1 - 0) / 2 = 0.5 and (0.9 - 0.3) / 2 = 0.3; centred: +-0.5 and +-0.3
    expected = torch.tensor([0.5 / (0.5 + 1e-6), -0.5 / (0.5 + 1e-6), 0.25 * 0.3 / (0.3 + 1e-6),
                             -0.25 * 0.3 / (0.3 + 1e-6)], dtype=torch.float64)
    assert torch.allclose(got.double(), expected[:, None].expand(4, 3), atol=1e-12)


@pytest.mark.parametrize("scale", [0.0, 1.0])
def test_a_advantage_scale_zero_leaves_a_tokens_no_push_from_the_rewards(tmp_path, scale):
    cfg = small_config(tmp_path, steps=1, prompts_per_step=2, group_size=4, max_new_tokens=2, lr=1e-2,
                       a_advantage_scale=scale)
    t = Trainer(cfg, policy=tiny_gpt(seed=1, scale=2.0), tokenizer=get_tokenizer(),
                reward_fn=Scripted([[0.1, 0.9, 0.4, 0.6, 1.0, 0.0, 0.5, 0.2]]), prompts=TaskPrompts(["A", "A"]),
                stream=_quiet())
    m = t.train_step()
    assert (m["grad_norm"] == 0.0) == (scale == 0.0), m["grad_norm"]


def test_a_advantage_scale_applies_to_grpo_advantages_only():
    with pytest.raises(ConfigError, match="--a-advantage-scale applies to --advantage grpo"):
        TrainConfig(a_advantage_scale=0.5, advantage="gae", std_scaling="batch").validate()
