"""A GRPO rollout: G completions per prompt, their rewards (`RolloutReward`) and advantages, and the log-probs
the update needs.

`collect_rollout` is steps 1-3 of a GRPO step: sample, score, then run the frozen reference (and, when the
objective needs it, the sampling policy) over the completions once (`rollout_logprobs`) and form the advantages.
Rows go through a model in micro-batches of similar length (`micro_batches`), here and in the update.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import torch
from torch.profiler import record_function
from torch import nn

from rookworld.chess.rewards import RewardScorer, Scores
from rookworld.grpo.likelihood import EnvTargets, env_targets
from rookworld.grpo.loss import Experience
from rookworld.grpo.models import Models, Sampler
from rookworld.grpo.objective import Objective, Scored
from rookworld.grpo.prompts import Prompt
from rookworld.harness.distributed import Comm
from rookworld.harness.stop import StepAbandoned
from rookworld.net.logprobs import token_logprobs, with_values
from rookworld.net.memo import ProductMemo
from rookworld.net.sampling import GenerationOutput
from rookworld.settings.base import Slice


#: How often a wait on Stockfish looks up from the analyses: for a stop asked for meanwhile.
WAIT_SLICE_S = 0.25
#: How long a stop (Ctrl-C, SIGTERM) lets the engines finish the step's analyses before the step is dropped.
STOP_GRACE_S = 1.0


class RewardFn(Protocol):
    def prefetch(self, prompts: Sequence[Prompt]) -> None: ...

    def __call__(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> Scores: ...


class RolloutReward:
    """A rollout's rewards: Stockfish for P:, the rules for A: (`rookworld.chess.rewards`, the one scorer), over the
    step's `Prompt`s. (Other trainers' reward function is `rookworld.integrations.chess_reward.ChessReward`.)

    With `stopping`, it waits on Stockfish's analyses of a step in short slices: a stop asked for meanwhile drops
    the step (`StepAbandoned`) once the engines have had `STOP_GRACE_S` more, since no weight has changed yet; a
    pool that gave up on its engine ends the wait with its `StockfishError`."""

    def __init__(self, scorer: RewardScorer, stopping: Callable[[], bool] | None = None):
        self.scorer, self.stopping = scorer, stopping

    def prefetch(self, prompts: Sequence[Prompt]) -> None:
        texts = [p.text for p in prompts if p.task == "P" and p.truth is None]
        if texts:
            self.scorer.prefetch(texts)

    def __call__(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> Scores:
        if self.stopping is not None:
            needed = [p.text for p in prompts if p.task == "P" and p.truth is None]
            if needed:
                self._wait(self.scorer.prefetch(needed))  # the step's analyses, queued or cached already
        texts = [p.text for p in prompts]
        truth = [p.truth for p in prompts]
        valid = np.ones(len(prompts), dtype=bool)
        missing = [i for i, p in enumerate(prompts) if p.task == "P" and p.truth is None]
        if missing:
            found, failed = self.scorer.ground_truth_or_failures([texts[i] for i in missing])
            for i, t in zip(missing, found):
                truth[i] = t
            valid[[missing[j] for j in failed]] = False
        rewards = np.zeros(len(prompts))
        well_formed = np.zeros(len(prompts), dtype=bool)
        keep = np.flatnonzero(valid)
        scores = self.scorer.score_batch([texts[i] for i in keep], [completions[i] for i in keep],
                                         ground_truth=[truth[i] for i in keep])
        rewards[keep], well_formed[keep] = scores.rewards, scores.well_formed
        parts = {}  # what the rewards are made of, for the step's metrics (0 in a row left unscored)
        for name, values in scores.parts.items():
            parts[name] = np.zeros(len(prompts), dtype=values.dtype)
            parts[name][keep] = values
        return Scores(rewards=rewards, tasks=np.array([p.task for p in prompts]), well_formed=well_formed,
                      valid=valid, parts=parts)


    def _wait(self, futures: list[Future]) -> None:
        pending, drop_at = set(futures), None
        while pending:
            _, pending = wait(pending, timeout=WAIT_SLICE_S)
            if drop_at is None and self.stopping():
                drop_at = time.monotonic() + STOP_GRACE_S
            if pending and drop_at is not None and time.monotonic() > drop_at:
                raise StepAbandoned
        failure = self.scorer.stockfish.failure
        if failure is not None:
            raise failure


@dataclass(frozen=True)
class MicroBatch:
    """Rows of a rollout that go through the model together, cut to the columns some row of them uses."""

    rows: np.ndarray  # indices into the rollout
    left: int  # leading columns that are padding in every row (prompts are left-padded), skipped
    width: int  # completion columns kept: up to the end of the longest completion among the rows


def micro_batches(rows: np.ndarray, prompt_lens: np.ndarray, completion_lens: np.ndarray, prompt_width: int,
                  size: int, rows_per_prompt: int = 1) -> list[MicroBatch]:
    """Splits `rows` into micro-batches of about `size` rows of similar length, whole groups of `rows_per_prompt`
    consecutive rows each (rows that share a prompt computed once: at least one group a micro-batch).

    Every log-prob pass costs rows x columns of the block it is given, and an A: row (long prompt, long
    completion) is about twice as long as a P: row: padding all of them to the longest would make about 40% of
    the work padding. Sorting by length and cutting each micro-batch to its own columns keeps that near zero.
    Exact: positions come from the attention mask, and the cut columns are padding to every row kept."""
    groups = np.asarray(rows).reshape(-1, rows_per_prompt)
    length = prompt_lens[groups[:, 0]] + completion_lens[groups].max(1)
    order = groups[np.argsort(length, kind="stable")]
    out, per = [], max(1, size // rows_per_prompt)
    for i in range(0, len(order), per):
        chunk = order[i : i + per].reshape(-1)
        out.append(MicroBatch(chunk, prompt_width - int(prompt_lens[chunk].max()),
                              max(1, int(completion_lens[chunk].max()))))
    return out


@dataclass
class Rollout:
    """One step's samples and what the update and the metrics read of them, each worked out once (`Rollout.of`) or
    filled in by the passes `collect_rollout` runs. Rows are completions, G consecutive rows per prompt; token
    tensors are [rows, prompt width + completion width], the prompts left-padded; [n] tensors are on the model's
    device, [n] arrays on the host."""

    prompts: list[Prompt]  # one per group
    group_size: int  # completions per prompt, consecutive rows: the run's --group-size
    completions: list[str]
    scores: Scores  # with `valid` filled in
    ids: torch.Tensor  # [n, P + N]
    mask: torch.Tensor  # [n, P + N] bool
    prompt_width: int  # P
    stopped: torch.Tensor  # [n] bool: the completion ended with EOS, not at --max-new-tokens
    tasks: np.ndarray  # [n] each row's task
    a_rows: torch.Tensor  # [n] bool: the row answers an A: prompt (the metrics' per-task KL and advantages)
    rewards: torch.Tensor  # [n] float64
    valid: torch.Tensor  # [n] bool: the row's prompt had ground truth
    completion_mask: torch.Tensor  # [n, N] bool
    prompt_lens: np.ndarray  # [n] real prompt tokens (on the host, where micro-batches are cut)
    completion_lens: np.ndarray  # [n] completion tokens
    ref_logprobs: torch.Tensor | None = None  # [n, N] (None with the exact KL, which runs the reference in the update)
    old_logprobs: torch.Tensor | None = None  # [n, N] the sampling policy's, when the objective needs them
    old_values: torch.Tensor | None = None  # [n, N] the critic's (GAE)
    loss_mask: torch.Tensor | None = None  # [n, N] bool: the tokens the loss counts
    advantages: torch.Tensor | None = None  # [n, N]
    returns: torch.Tensor | None = None  # [n, N] the critic's targets (GAE)
    kl_scale: torch.Tensor | None = None  # [n, N] each token's multiple of beta (None: 1 everywhere)
    targets: EnvTargets | None = None  # the A: prompts' exact targets, for --a-likelihood-weight (None: no A:)
    info: dict[str, Any] = field(default_factory=dict)  # metrics of the rollout itself (baselines)
    memo: ProductMemo | None = None  # sampling's trunk products, for the update's first pass (None once used)
    times: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, prompts: list[Prompt], group_size: int, completions: list[str], scores: Scores,
           prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, out: GenerationOutput, memo: ProductMemo | None
           ) -> Rollout:
        """The rollout of these samples (`out`, the sampler's; `prompt_ids` and `prompt_mask` [n, P], each prompt's
        repeated for its rows), its per-row values worked out once."""
        ids, mask = torch.cat([prompt_ids, out.tokens], dim=1), torch.cat([prompt_mask, out.mask], dim=1)
        P, device, tasks = prompt_ids.shape[1], ids.device, np.repeat([p.task for p in prompts], group_size)
        completion_mask = mask[:, P:]
        return cls(prompts=prompts, group_size=group_size, completions=completions, scores=scores, ids=ids, mask=mask,
                   prompt_width=P, stopped=out.stopped, tasks=tasks, a_rows=torch.from_numpy(tasks == "A").to(device),
                   rewards=torch.from_numpy(np.asarray(scores.rewards, dtype=np.float64)).to(device),
                   valid=torch.from_numpy(np.asarray(scores.valid, dtype=bool)).to(device),
                   completion_mask=completion_mask, prompt_lens=mask[:, :P].sum(1).cpu().numpy(),
                   completion_lens=completion_mask.sum(1).cpu().numpy(), memo=memo)

    def experience(self, rows: torch.Tensor, width: int, weights: torch.Tensor) -> Experience:
        """What the loss reads of rows `rows`, their first `width` completion columns, flat; `weights` [b, width]:
        each token's weight in its minibatch's loss."""
        flat = lambda x: None if x is None else x[rows, :width].reshape(-1)  # noqa: E731
        return Experience(flat(self.advantages), weights.reshape(-1), flat(self.old_logprobs),
                          flat(self.ref_logprobs), flat(self.kl_scale))

    def micro_batches(self, rows: np.ndarray, size: int, rows_per_prompt: int) -> list[MicroBatch]:
        return micro_batches(rows, self.prompt_lens, self.completion_lens, self.prompt_width, size, rows_per_prompt)


@torch.no_grad()
def rollout_logprobs(models: Models, model: nn.Module, r: Rollout, batches: list[MicroBatch], temperature: float,
                     values: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Completion log-probs [n, N] of every row of `r` under `model` (the reference, or the sampling policy) and,
    with `values`, the value head's values [n, N], without gradients (0 past each micro-batch's width)."""
    P = r.prompt_width
    lp = torch.zeros(r.ids.shape[0], r.ids.shape[1] - P, device=r.ids.device)
    vals = torch.zeros_like(lp) if values else None
    for b in batches:
        rows, cols = torch.from_numpy(b.rows).to(r.ids.device), slice(b.left, P + b.width)
        options = replace(models.options, start=P - b.left, temperature=temperature, entropy=False,
                          keep_hidden=values)
        with models.autocast():
            s = with_values(token_logprobs(model, r.ids[rows, cols], r.mask[rows, cols], options),
                            models.value_head if values else None)
        lp[rows, : b.width] = s.logprobs.float()
        if vals is not None:
            vals[rows, : b.width] = s.values.float()
    return lp, vals


def seed_of(*parts: int) -> int:
    return random.Random(":".join(map(str, parts))).getrandbits(63)


@dataclass(frozen=True)
class RolloutParts:
    """What a rollout is made with besides its prompts and the run's ranks: the objective (which passes it runs),
    the networks, the sampler, the reward, the tokenizer and the log (for a step's warnings)."""

    objective: Objective
    models: Models
    sampler: Sampler
    reward_fn: RewardFn
    tokenizer: Any
    log: Any


@dataclass(frozen=True)
class RolloutSettings(Slice):
    """The settings a rollout reads (`RolloutSettings.of(cfg)` from a `TrainConfig`)."""

    group_size: int
    seed: int
    micro_batch_size: int
    temperature: float


def collect_rollout(settings: RolloutSettings, parts: RolloutParts, comm: Comm, prompts: list[Prompt], step: int
                    ) -> Rollout:
    objective, models, sampler, tokenizer = parts.objective, parts.models, parts.sampler, parts.tokenizer
    G, device = settings.group_size, models.device
    objective.begin_step(step)
    t0 = time.perf_counter()
    # Each phase a range of its own in a profile (torch.profiler): what a kernel's time is spent on.
    with record_function("rookworld.generate"):  # 1. Sample G completions per prompt.
        ids, pmask = tokenizer.encode_batch([p.text for p in prompts], bos=True, device=device)
        generator = torch.Generator(device=device).manual_seed(seed_of(settings.seed, step, comm.info.rank))
        out, memo = sampler(ids, pmask, np.array([p.task for p in prompts]), G, generator)
        ids, pmask = ids.repeat_interleave(G, 0), pmask.repeat_interleave(G, 0)
        _sync(device)
    t_gen = time.perf_counter()

    with record_function("rookworld.reward"):  # 2. Rewards.
        completions = tokenizer.decode_batch(out.tokens, out.mask)
        scores = parts.reward_fn([p for p in prompts for _ in range(G)], completions)
        valid = np.ones(len(completions), dtype=bool) if scores.valid is None else np.asarray(scores.valid, bool)
        if not valid.all():
            parts.log.warn("unscored", step + 1, f"{int((~valid).sum()) // G} prompt(s) could not be scored "
                                                 "(Stockfish failed after retries) and were left out of this step")
        r = Rollout.of(prompts, G, completions, dataclasses.replace(scores, valid=valid), ids, pmask, out, memo)
    t_reward = time.perf_counter()

    # 3. The reference's (and the sampling policy's) log-probs, once per rollout; then the advantages.
    with record_function("rookworld.reference"):
        batches = r.micro_batches(np.arange(len(completions)), settings.micro_batch_size, models.rows_per_prompt)
        if objective.passes.reference:
            r.ref_logprobs, _ = rollout_logprobs(models, models.reference, r, batches, settings.temperature)
        if objective.passes.sampler:
            r.old_logprobs, r.old_values = rollout_logprobs(models, models.policy, r, batches, settings.temperature,
                                                            values=objective.critic)
        if objective.a_likelihood_weight > 0:
            r.targets = env_targets(prompts, tokenizer, objective.settings.max_new_tokens, device)
        with torch.no_grad():
            r.loss_mask = objective.loss_mask(r.completion_mask, r.valid, r.stopped, r.rewards)
            r.kl_scale = objective.kl_scale(r.tasks, r.completion_mask.shape[1], device)
            scored = Scored(r.rewards, r.valid, r.tasks, r.completion_mask, r.loss_mask, r.ref_logprobs,
                            r.old_logprobs, r.old_values, r.kl_scale)
            r.advantages, r.returns, r.info = objective.advantages(scored, comm)
        _sync(device)
    r.times = {"generate": t_gen - t0, "reward": t_reward - t_gen, "reference": time.perf_counter() - t_reward}
    return r


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
