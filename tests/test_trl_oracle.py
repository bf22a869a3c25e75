"""TRL as an oracle for the objective (issue 60): on one fixed batch (the same GPT-2 weights, prompts, completions,
advantages and old/reference log-probs), rookworld's objective configured as TRL's gives the loss and the gradient
(w.r.t. every weight) that TRL's own `GRPOTrainer.compute_loss` gives, to 1e-5, for each TRL loss type rookworld
also offers:

    TRL `loss_type`   rookworld
    dapo              --loss-aggregation token   (the token mean over the whole optimizer step)
    bnpo              --loss-aggregation token   (equal only when the step is one micro-batch: see below)
    grpo              --loss-aggregation sequence
    dr_grpo           --loss-aggregation constant, --max-new-tokens = TRL's max_completion_length

each with k3 at beta 0.04, clipping 0.2 / 0.28 (`epsilon`, `epsilon_high`), one update per rollout (`--mu 1`,
`num_iterations=1`: the ratio's denominator is the update's own pass, detached) or a policy that has moved since
the rollout (`--mu 2`, `num_iterations=2`, with the rollout's log-probs as TRL's `old_per_token_logps`).

Both sides run in float64 except TRL's fused lm_head, whose log-probs are float32: the measured differences are
about 1e-7. rookworld's side is its own log-prob pass (`token_logprobs`, the fused vocabulary pass with the loss's
gradients) with `GRPOLoss.of` and `Objective.weights`, as `grpo.update` calls them.

Where the two differ by design, a test below says which and why (docs/training.md, "The same objective as TRL's"):
- TRL 1.16's default `use_bias_correction_kl=True` multiplies k3 by the importance ratio; the oracle sets it False.
- `bnpo` normalises each micro-batch by its own tokens; rookworld (and `dapo`) by the optimizer step's.
- `grpo` counts a row without a completion token in its mean; rookworld's `sequence` does not.
- TRL's entropy bonus is a token mean whatever the loss type; rookworld's is aggregated as the loss is.
- TRL's std of a group's rewards is the sample std (+1e-4), rookworld's the population std (+1e-6): the oracle gives
  both sides the same advantages.
- Past r = 20 rookworld's k3 grows linearly (finite), TRL's exponentially.
- TRL's pass gives GPT-2 no position ids, so a left-padded prompt's tokens sit at positions shifted by the padding:
  the oracle's prompts are all one length.
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass, replace

import pytest
import torch

trl = pytest.importorskip("trl", reason="pip install 'rookworld[trl]'")
transformers = pytest.importorskip("transformers")

from datasets import Dataset  # noqa: E402

from rookworld.grpo.formulas import group_advantages, group_std  # noqa: E402
from rookworld.grpo.loss import Experience, GRPOLoss  # noqa: E402
from rookworld.grpo.objective import Objective, Totals  # noqa: E402
from rookworld.net.logprobs import PassOptions, token_logprobs  # noqa: E402
from rookworld.net.pretrained import save_pretrained  # noqa: E402
from rookworld.settings.config import TrainConfig  # noqa: E402

from conftest import REPO, tiny_gpt  # noqa: E402

# TRL's GRPOConfig passes `gradient_checkpointing` on to transformers, which calls the name deprecated.
pytestmark = pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")

TOL = 1e-5
VOCAB = 4364  # the chess tokenizer's, whose tokenizer TRL's trainer is given (the loss never reads it)
EOS = VOCAB - 1
G = 4  # group size
MAX_LEN = 7  # TRL's max_completion_length, rookworld's --max-new-tokens (dr_grpo's constant)
AGGREGATION = {"dapo": "token", "bnpo": "token", "grpo": "sequence", "dr_grpo": "constant"}
#: Weights that rookworld keeps as [out, in] and GPT-2's Conv1D as [in, out].
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


@dataclass(frozen=True)
class Batch:
    """A rollout as both sides take it: 2 groups of G completions of different lengths, right-padded."""

    prompt_ids: torch.Tensor  # [B, P], one length (see `test_trl_scores_a_left_padded_prompt_at_shifted_positions`)
    completion_ids: torch.Tensor  # [B, N]
    completion_mask: torch.Tensor  # [B, N] 0/1
    advantages: torch.Tensor  # [B] float64
    old: torch.Tensor  # [B, N] the sampling policy's log-probs (the policy has moved since)
    ref: torch.Tensor  # [B, N] the reference's log-probs

    def rows(self, rows) -> Batch:
        return Batch(*(getattr(self, f)[rows] for f in self.__dataclass_fields__))

    @property
    def ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], 1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([torch.ones_like(self.prompt_ids), self.completion_mask], 1)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(rookworld's GPT in float64, the same weights as a transformers checkpoint directory, the tokenizer, the
    batch)."""
    ours = tiny_gpt(seed=3, scale=3.0, vocab_size=VOCAB)  # sharpened: log-probs vary from token to token
    directory = save_pretrained(ours, tmp_path_factory.mktemp("oracle") / "model")
    ours = ours.double().train()  # dropout is 0: train() only says what TRL's trainer says (its "train" mode)
    tokenizer = transformers.GPT2TokenizerFast.from_pretrained(REPO / "models" / "chess-cpu-sft")
    tokenizer.pad_token = tokenizer.eos_token

    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 3, 4, 1, 2, 5, 3, 5])  # halves of 13 and 15 tokens (see the bnpo test)
    B, N, P = len(lengths), int(lengths.max()), 3
    mask = (torch.arange(N)[None, :] < lengths[:, None]).long()
    prompt_ids = torch.randint(0, EOS, (B, P), generator=g)
    completion_ids = torch.randint(0, EOS, (B, N), generator=g) * mask + EOS * (1 - mask)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.9, 0.1, 0.3, 0.35], dtype=torch.float64)
    advantages = group_advantages(rewards, G, std=group_std(rewards, G)).double()
    with torch.no_grad():
        current = token_logprobs(ours, torch.cat([prompt_ids, completion_ids], 1),
                                 torch.cat([torch.ones_like(prompt_ids), mask], 1), PassOptions(start=P)).logprobs

    def near(sd):  # log-probs of other policies near this one, 0 on padding (as a rollout has them)
        return (current + sd * torch.randn(B, N, generator=g, dtype=torch.float64)) * mask

    old = near(0.3)
    # The moved policy's ratios leave both clip ranges where they bind (below with A < 0, above with A > 0), and one
    # with A > 0 lies between the upper bounds 1.2 and 1.28, so that clip-higher changes the gradient.
    for row, col, ratio in ((0, 0, 1.24), (0, 1, 1.5), (1, 0, 0.7)):
        old[row, col] = current[row, col] - math.log(ratio)
    assert advantages[0] > 0 > advantages[1]
    return ours, directory, tokenizer, Batch(prompt_ids, completion_ids, mask, advantages, old=old, ref=near(0.5))


#: Each side's results by their settings (the batch's own): tests that ask for the same run share it.
_RUNS: dict[tuple, tuple[float, dict[str, torch.Tensor]]] = {}


def memoised(run):
    def cached(world, *args, batch=None, **settings):
        if batch is not None:
            return run(world, *args, batch=batch, **settings)
        key = (run.__name__, tuple(sorted(settings.items())))
        if key not in _RUNS:
            _RUNS[key] = run(world, *args, **settings)
        return _RUNS[key]

    cached.__name__ = run.__name__
    return cached


@memoised
def trl_loss(world, tmp_path, *, loss_type: str, moved: bool, beta: float = 0.04, entropy_coef: float = 0.0,
             temperature: float = 1.0, bias_correction: bool = False, micro_batches: int = 1, batch=None):
    """TRL's `compute_loss` of the batch (split into `micro_batches` accumulated ones, each its rows in order) and
    the gradient it leaves on every weight: (loss, {name: grad}) in GPT-2's layout."""
    _, directory, tokenizer, whole = world
    whole = batch or whole
    model = transformers.GPT2LMHeadModel.from_pretrained(directory, dtype=torch.float64)
    rows = len(whole.advantages) // micro_batches
    config = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, report_to="none", save_strategy="no",
        gradient_checkpointing=False, per_device_train_batch_size=rows, gradient_accumulation_steps=micro_batches,
        num_generations=G, max_completion_length=MAX_LEN, temperature=temperature, loss_type=loss_type, beta=beta,
        epsilon=0.2, epsilon_high=0.28, num_iterations=2 if moved else 1, entropy_coef=entropy_coef,
        use_bias_correction_kl=bias_correction, seed=0)
    # What must be neutral for the oracle is TRL's default already; said here so that a new default shows up.
    assert config.importance_sampling_level == "token" and config.delta is None and not config.use_vllm
    assert config.top_entropy_quantile == 1.0 and config.off_policy_mask_threshold is None
    assert config.steps_per_generation == micro_batches  # one generation batch: one optimizer step
    trainer = trl.GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                              args=config, train_dataset=Dataset.from_dict({"prompt": ["P: "] * len(whole.advantages)}),
                              processing_class=tokenizer)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = micro_batches  # what Trainer's loop sets before a step
    total = 0.0
    for k in range(micro_batches):
        b = whole.rows(slice(k * rows, (k + 1) * rows))
        inputs = dict(prompt_ids=b.prompt_ids, prompt_mask=torch.ones_like(b.prompt_ids),
                      completion_ids=b.completion_ids, completion_mask=b.completion_mask, advantages=b.advantages,
                      ref_per_token_logps=b.ref,
                      # `dapo`'s count spans the generation batch, every micro-batch of the optimizer step
                      num_items_in_batch=whole.completion_mask.sum().double())
        if moved:
            inputs["old_per_token_logps"] = b.old
        loss = trainer.compute_loss(trainer.model, inputs)
        loss.backward()
        total += float(loss.detach())
    return total, {n: p.grad for n, p in model.named_parameters()}


@memoised
def rookworld_loss(world, *, aggregation: str, moved: bool, beta: float = 0.04, kl_estimator: str = "k3",
                   clip_low: float = 0.2, clip_high: float = 0.28, entropy_coef: float = 0.0,
                   temperature: float = 1.0, micro_batches: int = 1, batch=None):
    """rookworld's loss of the batch as `grpo.update` makes it (one minibatch, `Totals` over all of it, accumulated
    over `micro_batches`), and its gradient on every weight in GPT-2's layout."""
    gpt, _, _, whole = world
    whole = batch or whole
    gpt = copy.deepcopy(gpt)
    cfg = TrainConfig(beta=beta, kl_estimator=kl_estimator, clip_low=clip_low, clip_high=clip_high,
                      loss_aggregation=aggregation, mu=2 if moved else 1, max_new_tokens=MAX_LEN, group_size=G,
                      entropy_coef=entropy_coef, temperature=temperature).validate()
    objective = Objective(cfg, reference_given=True)
    objective.begin_step(0)
    assert objective.passes.several_updates == moved and objective.kl_in_loss
    usable = whole.completion_mask.bool()
    totals = Totals(float(usable.sum()), float(usable.any(1).sum()), float(len(usable)))
    P, rows = whole.prompt_ids.shape[1], len(usable) // micro_batches
    options = PassOptions(start=P, temperature=temperature, entropy=entropy_coef > 0)
    total = 0.0
    for k in range(micro_batches):
        b = whole.rows(slice(k * rows, (k + 1) * rows))
        m = b.completion_mask.bool()
        experience = Experience((b.advantages[:, None] * b.completion_mask).reshape(-1),
                                objective.weights(m, totals).reshape(-1), b.old.reshape(-1), b.ref.reshape(-1))
        out = token_logprobs(gpt, b.ids, b.attention_mask, options, wanted=m,
                             loss=GRPOLoss.of(objective, experience))
        out.loss.backward()
        total += float(out.loss.detach())
    return total, {n: p.grad.t() if n.endswith(CONV1D) else p.grad for n, p in gpt.named_parameters()}


def difference(a, b) -> tuple[float, float]:
    """(|loss difference|, largest |gradient difference| over every weight)."""
    (la, ga), (lb, gb) = a, b
    assert ga.keys() == gb.keys()
    return abs(la - lb), max(float((ga[k] - gb[k]).abs().max()) for k in ga)


def assert_same(trl_side, ours) -> None:
    loss, grad = difference(trl_side, ours)
    assert loss < TOL and grad < TOL, (loss, grad)
    assert max(float(g.abs().max()) for g in ours[1].values()) > 100 * TOL, "a gradient to compare"


@pytest.mark.parametrize("moved", [False, True], ids=["one-update-per-rollout", "policy-moved"])
@pytest.mark.parametrize("loss_type", ["dapo", "bnpo", "grpo", "dr_grpo"])
def test_rookworld_gives_trl_s_loss_and_gradient(world, tmp_path, loss_type, moved):
    trl_side = trl_loss(world, tmp_path, loss_type=loss_type, moved=moved)
    assert_same(trl_side, rookworld_loss(world, aggregation=AGGREGATION[loss_type], moved=moved))


def test_temperature_and_the_entropy_bonus_match_under_token_aggregation(world, tmp_path):
    """Log-probs (and the entropy) at TRL's `temperature` are rookworld's at --temperature; TRL's entropy bonus,
    a token mean, is rookworld's --entropy-coef under token aggregation."""
    trl_side = trl_loss(world, tmp_path, loss_type="dapo", moved=True, temperature=0.7, entropy_coef=0.01)
    assert_same(trl_side, rookworld_loss(world, aggregation="token", moved=True, temperature=0.7,
                                         entropy_coef=0.01))


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo", "bnpo"])
def test_an_optimizer_step_of_two_micro_batches(world, tmp_path, loss_type):
    """Gradient accumulation over two micro-batches of 13 and 15 tokens. dapo, grpo and dr_grpo still give
    rookworld's loss. bnpo differs by design: it divides each micro-batch by its own tokens (and by the number of
    micro-batches), where rookworld's token aggregation, like dapo, divides every token by the step's count, so
    that how a step is split into micro-batches (or ranks) never changes its gradient."""
    trl_side = trl_loss(world, tmp_path, loss_type=loss_type, moved=True, micro_batches=2)
    ours = rookworld_loss(world, aggregation=AGGREGATION[loss_type], moved=True, micro_batches=2)
    if loss_type != "bnpo":
        assert_same(trl_side, ours)
        return
    loss, grad = difference(trl_side, ours)
    assert loss > 100 * TOL and grad > 100 * TOL
    # ... and bnpo is rookworld's token aggregation done separately on each micro-batch, halved.
    _, _, _, batch = world
    halves = [rookworld_loss(world, aggregation="token", moved=True, batch=batch.rows(rows))
              for rows in (slice(0, 4), slice(4, 8))]
    summed = (sum(h[0] for h in halves) / 2, {k: sum(h[1][k] for h in halves) / 2 for k in halves[0][1]})
    assert_same(trl_side, summed)


@pytest.mark.parametrize("change", [dict(beta=0.05), dict(clip_low=0.1), dict(clip_high=0.2),
                                    dict(kl_estimator="k2"), dict(aggregation="sequence")],
                         ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_the_oracle_tells_a_setting_that_is_not_trl_s(world, tmp_path, change):
    """Any one of rookworld's settings away from TRL's moves both the loss and the gradient by more than ten times
    the tolerance (by 3e-4 to 0.2): the comparison above can fail."""
    trl_side = trl_loss(world, tmp_path, loss_type="dapo", moved=True)
    settings = dict(aggregation="token", moved=True) | change
    assert min(difference(trl_side, rookworld_loss(world, **settings))) > 10 * TOL


def test_trl_s_default_kl_is_importance_weighted(world, tmp_path):
    """By design, not matched: TRL 1.16's default `use_bias_correction_kl=True` adds beta x k3 x rho with rho the
    importance ratio. Its value, at rho = 1 (one update per rollout), is rookworld's k3; its gradient adds
    k3 x grad log pi, which makes it, token by token, rookworld's k2's: -(log pi_ref - log pi) grad log pi, whose
    expectation is the gradient of KL(pi || pi_ref), where rookworld's k3 follows KL(pi_ref || pi)
    (docs/training.md, "The KL leash"). Once the policy has moved, rho != 1 weighs it, and neither matches."""
    default = trl_loss(world, tmp_path, loss_type="dapo", moved=False, bias_correction=True)
    k3 = rookworld_loss(world, aggregation="token", moved=False)
    k2 = rookworld_loss(world, aggregation="token", moved=False, kl_estimator="k2")
    assert abs(default[0] - k3[0]) < TOL and difference(default, k3)[1] > 100 * TOL
    assert difference(default, k2)[1] < TOL and abs(default[0] - k2[0]) > 10 * TOL
    moved = trl_loss(world, tmp_path, loss_type="dapo", moved=True, bias_correction=True)
    for estimator in ("k2", "k3"):
        ours = rookworld_loss(world, aggregation="token", moved=True, kl_estimator=estimator)
        assert max(difference(moved, ours)) > 100 * TOL


def test_grpo_counts_a_row_without_tokens_where_rookworld_does_not(world, tmp_path):
    """By design: a row with no usable token (rookworld: unscored, or left out by --mask-truncated or
    --drop-zero-spread; TRL: mask_truncated_completions) is no sequence to rookworld's `sequence` aggregation, where
    TRL's grpo counts it in the mean of the sequences' means, shrinking every other row's weight. Dropping a row
    scales TRL's loss by (rows counted) / (rows) against rookworld's."""
    _, _, _, batch = world
    mask = batch.completion_mask.clone()
    mask[3] = 0
    dropped = replace(batch, completion_mask=mask)
    trl_side = trl_loss(world, tmp_path, loss_type="grpo", moved=True, batch=dropped)
    ours = rookworld_loss(world, aggregation="sequence", moved=True, batch=dropped)
    assert max(difference(trl_side, ours)) > 100 * TOL
    scaled = (ours[0] * 7 / 8, {k: g * 7 / 8 for k, g in ours[1].items()})
    assert_same(trl_side, scaled)


def test_trl_s_entropy_bonus_is_a_token_mean_whatever_the_loss_type(world, tmp_path):
    """By design: TRL's entropy bonus is the token mean of the entropy for every loss type; rookworld's
    --entropy-coef joins each token's loss and is aggregated with it (a mean of the sequences' means under
    `sequence`). What the bonus adds to TRL's grpo loss is what it adds to rookworld's under token aggregation,
    not under sequence aggregation."""

    def bonus(run, **settings):  # what --entropy-coef 0.5 adds: (loss, gradient)
        (with_it, g), (without, g0) = run(entropy_coef=0.5, **settings), run(**settings)
        return with_it - without, {k: g[k] - g0[k] for k in g}

    theirs = bonus(functools.partial(trl_loss, world, tmp_path, loss_type="grpo", moved=True))
    token, sequence = (bonus(functools.partial(rookworld_loss, world, aggregation=how, moved=True))
                       for how in ("token", "sequence"))
    assert_same(theirs, token)
    assert max(difference(theirs, sequence)) > 100 * TOL


def test_past_r_20_rookworld_s_k3_grows_linearly(world, tmp_path):
    """By design: past r = log pi_ref - log pi = 20, rookworld's k3 continues e^r as its tangent, so that a token
    the policy made e^20 times less likely than the reference costs a large finite amount, never inf; TRL's k3 is
    e^r - 1 - r throughout. With one such token (r = 25) the losses differ by exactly beta x (e^25 - e^20 (1 + 5))
    over the batch's tokens."""
    gpt, _, _, batch = world
    with torch.no_grad():
        current = token_logprobs(gpt, batch.ids, batch.attention_mask,
                                 PassOptions(start=batch.prompt_ids.shape[1])).logprobs
    ref = batch.ref.clone()
    ref[0, 2] = current[0, 2] + 25.0
    far = replace(batch, ref=ref)
    theirs = trl_loss(world, tmp_path, loss_type="dapo", moved=False, batch=far)
    ours = rookworld_loss(world, aggregation="token", moved=False, batch=far)
    tokens = float(batch.completion_mask.sum())
    gap = 0.04 * (math.exp(25.0) - math.exp(20.0) * 6.0) / tokens
    assert theirs[0] - ours[0] == pytest.approx(gap, rel=1e-6)


def test_advantages_are_given_not_derived(world):
    """By design, and why the oracle hands both sides the same advantages: TRL scales a group's rewards by their
    sample std + 1e-4, rookworld (`--std-scaling group`) by their population std + 1e-6, so that a group's
    advantages have unit (population) variance whatever --group-size. TRL's are rookworld's times about
    sqrt((G - 1) / G)."""
    from trl.trainer.utils import nanstd

    rewards = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.9, 0.1, 0.3, 0.35], dtype=torch.float64)
    grouped = rewards.view(-1, G)
    trl_style = ((grouped - grouped.mean(1, keepdim=True)) / (nanstd(grouped, dim=1)[:, None] + 1e-4)).view(-1)
    ours = group_advantages(rewards, G, std=group_std(rewards, G)).double()
    assert torch.allclose(trl_style, ours * math.sqrt((G - 1) / G), atol=1e-3)
    assert not torch.allclose(trl_style, ours, atol=1e-2)


def test_trl_scores_a_left_padded_prompt_at_shifted_positions(world, tmp_path):
    """Why the oracle's prompts are all one length: TRL's pass gives GPT-2 no position ids, so with a left-padded
    prompt every token sits as many positions later as the row has padding, and its log-probs change; rookworld
    counts positions from a row's first real token, so padding changes nothing. (A difference of the log-prob
    pass, not of the objective.)"""
    gpt, directory, tokenizer, batch = world
    b = batch.rows(slice(0, 1))
    padded_ids = torch.cat([torch.full((1, 2), EOS), b.ids], 1)
    padded_mask = torch.cat([torch.zeros(1, 2, dtype=torch.long), b.attention_mask], 1)
    cm = b.completion_mask.bool()
    P = b.prompt_ids.shape[1]
    with torch.no_grad():
        ours = [token_logprobs(gpt, ids, mask, PassOptions(start=start)).logprobs[cm]
                for ids, mask, start in ((b.ids, b.attention_mask, P), (padded_ids, padded_mask, P + 2))]
        model = transformers.GPT2LMHeadModel.from_pretrained(directory, dtype=torch.float64)
        config = trl.GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, report_to="none",
                                save_strategy="no", per_device_train_batch_size=G, num_generations=G)
        trainer = trl.GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                                  args=config, train_dataset=Dataset.from_dict({"prompt": ["P: "] * G}),
                                  processing_class=tokenizer)
        N = b.completion_ids.shape[1]
        theirs = [trainer._get_per_token_logps_and_entropies(model, ids, mask, N)[0][cm].double()
                  for ids, mask in ((b.ids, b.attention_mask), (padded_ids, padded_mask))]
    assert torch.allclose(ours[0], ours[1], atol=1e-9)
    assert torch.allclose(theirs[0], ours[0], atol=1e-5)  # unpadded, the two passes agree
    assert (theirs[1] - theirs[0]).abs().max() > 1e-2
