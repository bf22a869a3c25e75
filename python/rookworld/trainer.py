"""GRPO for RookWorld-LM: sample a group of completions per prompt, score them with verifiable rewards,
and push the policy toward the better ones, with a KL leash to the frozen reference.

One step:
  1. prompts for this step (the next step's P: analyses are already running in Stockfish);
  2. G completions per prompt from the KV-cache sampler, one batch per task;
  3. rewards (Rust scorer), group-relative advantages;
  4. reference (and, when the policy moves within a step, sampling-policy) log-probs, once;
  5. `mu` epochs of minibatch updates with gradient accumulation over micro-batches.

Randomness comes from (seed, step, rank) alone, so a resumed run continues exactly as an unbroken one.
Under torchrun the prompts are sharded over ranks, gradients are averaged by DDP, metrics are reduced,
and only rank 0 writes files.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import random
import resource
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from rookworld import chess, checkpoint
from rookworld.config import ConfigError, TrainConfig
from rookworld.data import Record, assign_moves, read_records
from rookworld import grpo
from rookworld.runlog import RunLog
from rookworld.sampling import PAD_ID, GenerationOutput, generate, release_caches, token_logprobs
from rookworld.tokenizer import Tokenizer, get_tokenizer

#: Seed offset of the held-out evaluation positions, so they never share a stream with training prompts.
EVAL_SEED_OFFSET = 1_000_003


# ----------------------------------------------------------------------------------------------------------
# Prompts and rewards


@dataclass(frozen=True)
class Prompt:
    task: str
    text: str
    #: Stockfish's analysis when the data file already has it: (moves best first, evals in pawns).
    truth: tuple[list[str], list[float]] | None = None


@dataclass(frozen=True)
class RewardResult:
    rewards: np.ndarray  # [N] float
    tasks: np.ndarray  # [N] str
    well_formed: np.ndarray  # [N] bool
    #: [N] bool: False where no ground truth could be had (the sample is left out of the update).
    valid: np.ndarray | None = None


class RewardFn(Protocol):
    def prefetch(self, prompts: Sequence[Prompt]) -> None: ...

    def __call__(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> RewardResult: ...


class ChessReward:
    """The verifiable chess rewards: Stockfish for P:, the rules for A: (`rookworld.rewards`)."""

    def __init__(self, scorer):
        self.scorer = scorer

    def prefetch(self, prompts: Sequence[Prompt]) -> None:
        texts = [p.text for p in prompts if p.task == "P" and p.truth is None]
        if texts:
            self.scorer.prefetch(texts)

    def __call__(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> RewardResult:
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
        tasks = np.array([p.task for p in prompts])
        well_formed = np.zeros(len(prompts), dtype=bool)
        keep = np.flatnonzero(valid)
        batch = self.scorer.score_batch([texts[i] for i in keep], [completions[i] for i in keep],
                                        ground_truth=[truth[i] for i in keep])
        rewards[keep], well_formed[keep] = batch.rewards, batch.well_formed
        return RewardResult(rewards, tasks, well_formed, valid)


def is_env_task(index: int, task_mix: float) -> bool:
    """Whether prompt `index` of the stream is an A: prompt (given positions that can be A:).

    A: prompts come at an exact rate rather than by coin flips: of any n consecutive prompts, the floor or the
    ceiling of n x (1 - task_mix) are A:. Each step (and each rank's share of it) then has an almost fixed
    number of prompts per task, so the sampler's batch shapes per task, which CUDA graphs are captured for,
    take at most two values. Which positions get which task stays random: positions are drawn independently
    of their index, and a data file is reshuffled every pass."""
    share = Fraction(1.0 - task_mix).limit_denominator(1 << 16)
    return (index + 1) * share.numerator // share.denominator > index * share.numerator // share.denominator


class PromptSource:
    """The prompts of each step, a pure function of (seed, step, rank): generated positions by default,
    or the records of a positions file, reshuffled every pass."""

    def __init__(self, cfg: TrainConfig, records: Sequence[Record] | None = None, rank: int = 0, world: int = 1):
        self.cfg, self.rank, self.world = cfg, rank, world
        self.per_rank = cfg.prompts_per_step // world
        self.records = list(records) if records else None
        self._order: list[int] = []
        self._order_epoch = -1

    def _record(self, index: int) -> Record:
        """Record `index` of the stream: pass k over the file is its own seeded permutation."""
        n = len(self.records)
        epoch = index // n
        if self._order_epoch != epoch:
            self._order = list(range(n))
            random.Random(self.cfg.seed * 7919 + epoch).shuffle(self._order)
            self._order_epoch = epoch
        return self.records[self._order[index % n]]

    def batch(self, step: int) -> list[Prompt]:
        cfg = self.cfg
        if cfg.overfit_single_batch:
            step = 0
        start = step * cfg.prompts_per_step + self.rank * self.per_rank
        if self.records is not None:
            records = [self._record(start + i) for i in range(self.per_rank)]
        else:
            records = [Record.from_position(p) for p in chess.generate_positions(
                self.per_rank, cfg.seed, start=start, illegal_share=cfg.illegal_share)]
        prompts = []
        for i, r in enumerate(records):
            if r.move is None or not is_env_task(start + i, cfg.task_mix):
                prompts.append(Prompt("P", r.policy_prompt, r.truth))
            else:
                prompts.append(Prompt("A", r.env_prompt))
        return prompts


# ----------------------------------------------------------------------------------------------------------
# Distributed set-up


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def init_distributed(device_kind: str) -> DistInfo:
    """torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; start the process group (NCCL on CUDA, gloo on CPU)."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return DistInfo()
    world = int(os.environ["WORLD_SIZE"])
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", 0)),
                    int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device_kind == "cuda" else "gloo"
        if device_kind == "cuda":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend=backend)
    return info


class _Scores(nn.Module):
    """`token_logprobs` (and the value head, if any) behind a forward(), so DDP's hooks see every parameter
    the update uses. The frozen reference comes as an argument: it is not trained, so DDP must not own it."""

    def __init__(self, model: nn.Module, value_head: nn.Module | None = None, compile: bool = False):
        super().__init__()
        self.model, self.value_head, self.compile = model, value_head, compile

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, start: int, temperature: float,
                reference: nn.Module | None = None, kl_direction: str = "forward"):
        s = token_logprobs(self.model, ids, mask, start=start, temperature=temperature, return_entropy=True,
                           compile=self.compile, reference=reference, kl_direction=kl_direction,
                           value_head=self.value_head)
        return s.logprobs, s.entropy, s.kl, s.values


# ----------------------------------------------------------------------------------------------------------
# The trainer


@dataclass(frozen=True)
class MicroBatch:
    """Rows of a rollout that go through the model together, cut to the columns some row of them uses."""

    rows: np.ndarray  # indices into the rollout
    left: int  # leading columns that are padding in every row (prompts are left-padded), skipped
    width: int  # completion columns kept: up to the end of the longest completion among the rows


@dataclass
class _UpdateSums:
    """What the update adds up for the step's metrics (device scalars until the one sync at the end)."""

    sums: dict[str, torch.Tensor]
    kl_parts: list[tuple[torch.Tensor, torch.Tensor]]  # (KL, usable-token mask) of every micro-batch, every epoch
    grad_norms: list[torch.Tensor]
    slots: int  # token slots the update's passes computed, padding included
    real: int  # of which real tokens
    skipped: int  # minibatches without a usable token: no optimizer step
    done: int  # optimizer steps taken


def micro_batches(rows: np.ndarray, prompt_lens: np.ndarray, completion_lens: np.ndarray, prompt_width: int,
                  size: int) -> list[MicroBatch]:
    """Splits `rows` into micro-batches of at most `size` rows of similar length.

    Every log-prob pass costs rows x columns of the block it is given, and an A: row (long prompt, long
    completion) is about twice as long as a P: row: padding all of them to the longest would make about 40% of
    the work padding. Sorting by length and cutting each micro-batch to its own columns keeps that near zero.
    Exact: positions come from the attention mask, and the cut columns are padding to every row kept."""
    rows = np.asarray(rows)
    order = rows[np.argsort(prompt_lens[rows] + completion_lens[rows], kind="stable")]
    out = []
    for i in range(0, len(order), size):
        chunk = order[i : i + size]
        out.append(MicroBatch(chunk, prompt_width - int(prompt_lens[chunk].max()),
                              max(1, int(completion_lens[chunk].max()))))
    return out


def _seed_of(*parts: int) -> int:
    return random.Random(":".join(map(str, parts))).getrandbits(63)


def _pct(x: np.ndarray, q: float) -> float | None:
    return float(np.percentile(x, q)) if len(x) else None


def _mean(x: np.ndarray) -> float | None:
    return float(np.mean(x)) if len(x) else None


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to the peak, then cosine decay to min_lr_ratio x peak at the last step."""
    if step < cfg.warmup_steps:
        return (step + 1) / (cfg.warmup_steps + 1)
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class Trainer:
    def __init__(self, cfg: TrainConfig, *, policy: nn.Module | None = None, reference: nn.Module | None = None,
                 tokenizer: Tokenizer | None = None, reward_fn: RewardFn | None = None,
                 prompt_source: PromptSource | None = None, stream=None,
                 completion_lengths: dict[str, int] | None = None):
        """``completion_lengths`` ({task: n}) makes every completion exactly n tokens, EOS or not: for
        benchmarks, which must measure the same work whatever the (random) weights write."""
        self.cfg = cfg
        self.completion_lengths = completion_lengths
        kind = "cuda" if (cfg.device.startswith("cuda") or (cfg.device == "auto" and torch.cuda.is_available())) \
            else "cpu"
        self.dist = init_distributed(kind)
        if cfg.prompts_per_step % self.dist.world:
            raise ConfigError(f"--prompts-per-step ({cfg.prompts_per_step}) must divide over {self.dist.world} ranks")
        local_samples = cfg.prompts_per_step // self.dist.world * cfg.group_size
        if local_samples % cfg.minibatches:
            raise ConfigError(f"each rank's {local_samples} completions must split into --minibatches "
                              f"({cfg.minibatches})")
        if cfg.auto_batch and kind != "cuda":
            raise ConfigError("--auto-batch measures GPU memory: it needs a CUDA device")
        if kind == "cuda":
            self.device = torch.device(f"cuda:{self.dist.local_rank}" if cfg.device in ("auto", "cuda")
                                       else cfg.device)
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            # Each (batch, cache length) of the compiled decode step is one dynamo entry; --auto-batch probes and
            # evaluation add shapes, and past the default limit of 8 decoding would quietly fall back to eager.
            import torch._dynamo as dynamo  # (a bare `import torch._dynamo` would make `torch` local here)

            for name in ("recompile_limit", "cache_size_limit"):
                if hasattr(dynamo.config, name):
                    setattr(dynamo.config, name, max(64, getattr(dynamo.config, name)))
        else:
            self.device = torch.device("cpu")
        bf16 = cfg.dtype == "bf16" or (cfg.dtype == "auto" and kind == "cuda")
        self.amp_dtype = torch.bfloat16 if bf16 else None
        torch.manual_seed(cfg.seed)

        # Everything a user can get wrong is checked before the slow parts (models, engines) start.
        self.records = None
        if cfg.data and prompt_source is None:
            records, _ = read_records(cfg.data)
            self.records = assign_moves(records, cfg.seed)
        self.resume_from = checkpoint.resolve_checkpoint(cfg.resume) if cfg.resume else None
        self.tokenizer = tokenizer or get_tokenizer()
        from rookworld.model import from_pretrained

        if policy is None:
            policy = from_pretrained(self.resume_from or cfg.model, revision=None if self.resume_from else cfg.revision,
                                     device=self.device)
        self.policy = policy.to(self.device).eval()  # eval(): dropout stays off during RL
        if reference is None and cfg.beta > 0:
            reference = from_pretrained(cfg.model, revision=cfg.revision, device=self.device)
        self.reference = reference.to(self.device).eval().requires_grad_(False) if reference is not None else None

        self.compile = cfg.compile and kind == "cuda"
        self.value_head = None
        if cfg.advantage == "gae":
            from rookworld.value import ValueHead

            torch.manual_seed(cfg.seed)
            self.value_head = ValueHead(self.policy.config.n_embd).to(self.device)
        self.scores = _Scores(self.policy, self.value_head, self.compile)
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.scores = DDP(self.scores, device_ids=[self.device.index] if kind == "cuda" else None)

        decay = [p for p in self.policy.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.policy.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        if self.value_head is not None:
            groups.append({"params": list(self.value_head.parameters()), "weight_decay": 0.0, "lr": cfg.value_lr})
        self.optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=kind == "cuda")
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, cfg))

        self.step = 0
        self.beta = cfg.beta
        self.best_reward = -math.inf
        #: --baseline ema: each task's moving average reward, by task name.
        self.baselines: dict[str, float] = {}
        if self.resume_from is not None:
            state = checkpoint.load_state(self.resume_from)
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.step, self.beta, self.best_reward = state["step"], state["beta"], state["best_reward"]
            self.baselines = dict(state.get("baselines", {}))
            if self.value_head is not None:
                from rookworld.value import VALUE_HEAD_NAME

                checkpoint.load_module(self.resume_from, VALUE_HEAD_NAME, self.value_head)
            checkpoint.set_rng_state(state["rng"])

        self.pool = None
        if reward_fn is None:
            from rookworld.rewards import RewardScorer
            from rookworld.stockfish import StockfishPool

            workers = cfg.stockfish_workers or max(1, ((os.cpu_count() or 2) - 1) // self.dist.local_world)
            if self.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
                # On the CPU, torch's threads and the engines share the cores; oversubscribed OpenMP threads
                # spin against busy engines and run an order of magnitude slower.
                cores = max(1, (os.cpu_count() or 1) // self.dist.local_world)
                torch.set_num_threads(max(1, cores - workers))
            self.pool = StockfishPool(path=cfg.stockfish_path, workers=workers, depth=cfg.stockfish_depth,
                                      cache_path=cfg.stockfish_cache)
            reward_fn = ChessReward(RewardScorer(self.pool, shaping=cfg.reward_shaping))
        self.reward_fn = reward_fn
        if prompt_source is None:
            prompt_source = PromptSource(cfg, self.records, self.dist.rank, self.dist.world)
        self.prompts = prompt_source
        self.log = RunLog(cfg.output_dir, cfg.steps, enabled=self.dist.main, resume_step=self.step, stream=stream,
                          kl_warn=cfg.kl_warn, clip_warn=cfg.clip_warn)
        self._stop_requested = False
        #: Set when a run stopped early on Ctrl-C or SIGTERM (after saving).
        self.interrupted = False
        self._eval_records: list[Record] | None = None

    # -- helpers ------------------------------------------------------------------------------------------

    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _sample(self, ids: torch.Tensor, pmask: torch.Tensor, prompt_lens: np.ndarray, tasks: np.ndarray,
                generator: torch.Generator) -> GenerationOutput:
        """Completions for left-padded prompts [n, P] (real lengths `prompt_lens`), one `generate` call per task.

        A: prompts are about twice as wide as P: prompts and their completions about twice as long, and a batch
        decodes until its longest row is done: sampled together, every P: row would ride along for the A: rows'
        extra steps, in a KV cache sized for them. Apart, each task's batch stops and sizes its cache on its own.
        """
        cfg, n, P = self.cfg, ids.shape[0], ids.shape[1]
        fixed = self.completion_lengths is not None
        parts = []
        for task in dict.fromkeys(tasks):  # first-seen order: fixed for a step, so seeded runs repeat exactly
            rows = np.flatnonzero(tasks == task)
            index, left = torch.from_numpy(rows).to(self.device), P - int(prompt_lens[rows].max())
            limit = self.completion_lengths.get(task, cfg.max_new_tokens) if fixed else cfg.max_new_tokens
            with torch.no_grad():
                parts.append((index, generate(
                    self.policy, ids[index, left:], pmask[index, left:], max_new_tokens=limit, stop_at_eos=not fixed,
                    temperature=cfg.temperature, top_k=cfg.top_k or None, top_p=cfg.top_p if cfg.top_p < 1.0 else None,
                    generator=generator, compile=self.compile, dtype=self.amp_dtype)))
        width = max((o.tokens.shape[1] for _, o in parts), default=0)
        tokens = torch.full((n, width), PAD_ID, dtype=torch.long, device=self.device)
        mask = torch.zeros((n, width), dtype=torch.bool, device=self.device)
        logprobs = torch.zeros((n, width), device=self.device)
        lengths = torch.zeros(n, dtype=torch.long, device=self.device)
        stopped = torch.zeros(n, dtype=torch.bool, device=self.device)
        for index, o in parts:
            w = o.tokens.shape[1]
            tokens[index, :w], mask[index, :w], logprobs[index, :w] = o.tokens, o.mask, o.logprobs
            lengths[index], stopped[index] = o.lengths, o.stopped
        return GenerationOutput(tokens, mask, logprobs, None, lengths, stopped)

    def _unwrapped_scores(self) -> _Scores:
        return getattr(self.scores, "module", self.scores)

    def _rollout_scores(self, model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, prompt_width: int,
                        batches: list[MicroBatch], values: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Completion log-probs [n, N] of every row under `model` and, with `values`, the value head's values
        [n, N], without gradients (0 past each micro-batch's width)."""
        lp = torch.zeros(ids.shape[0], ids.shape[1] - prompt_width, device=ids.device)
        vals = torch.zeros_like(lp) if values else None
        for b in batches:
            rows, cols = torch.from_numpy(b.rows).to(ids.device), slice(b.left, prompt_width + b.width)
            with self._autocast():
                s = token_logprobs(model, ids[rows, cols], mask[rows, cols], start=prompt_width - b.left,
                                   temperature=self.cfg.temperature, compile=self.compile,
                                   value_head=self.value_head if values else None)
            lp[rows, : b.width] = s.logprobs.float()
            if vals is not None:
                vals[rows, : b.width] = s.values.float()
        return lp, vals

    def _beta_now(self) -> float:
        if self.cfg.beta_warmup_steps:
            return self.beta * min(1.0, (self.step + 1) / self.cfg.beta_warmup_steps)
        return self.beta

    def _all_mean(self, values: list[float]) -> list[float]:
        if not self.dist.enabled:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return (t / self.dist.world).tolist()

    def _all_sum(self, values: list[float]) -> list[float]:
        if not self.dist.enabled:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def _gather(self, x: torch.Tensor) -> torch.Tensor:
        if not self.dist.enabled:
            return x
        parts = [torch.empty_like(x) for _ in range(self.dist.world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    def _moments(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
        """(count, mean, population variance) of x where mask holds, over all ranks (float64)."""
        v = x[mask.bool()].double()
        n, s, ss = self._all_sum([float(v.numel()), float(v.sum()), float((v * v).sum())])
        if n == 0:
            return 0.0, 0.0, 0.0
        mean = s / n
        return n, mean, max(ss / n - mean * mean, 0.0)

    # -- one GRPO step ------------------------------------------------------------------------------------

    def _completion_advantages(self, rewards: torch.Tensor, valid: torch.Tensor, tasks: np.ndarray
                               ) -> tuple[torch.Tensor, dict[str, Any]]:
        """GRPO's per-completion advantages [n] (the batch std and the EMA baselines span all ranks)."""
        cfg, scale = self.cfg, self.cfg.advantage_scaling
        batch_std = math.sqrt(self._moments(rewards, valid)[2]) if scale == "batch" else None
        if cfg.baseline == "group":
            return grpo.group_advantages(rewards, cfg.group_size, scale, batch_std=batch_std), {}
        keys = np.array([t if t in ("P", "A") else "other" for t in tasks])
        baseline = torch.zeros_like(rewards, dtype=torch.float64)
        info = {}
        for key in ("P", "A", "other"):
            rows = torch.from_numpy(keys == key).to(self.device) & valid
            n, total = self._all_sum([float(rows.sum()), float(rewards[rows].double().sum())])
            if n == 0:
                continue
            # The baseline is the average of earlier steps (a first step has only its own mean), so it does not
            # depend on this step's samples; this step's mean updates it afterwards.
            value = self.baselines.get(key, total / n)
            baseline[rows] = value
            info[f"baseline/{key}"] = value
            self.baselines[key] = grpo.ema(self.baselines.get(key), total / n, cfg.ema_decay)
        return grpo.group_advantages(rewards, cfg.group_size, scale, baseline=baseline, batch_std=batch_std), info

    def _token_advantages(self, advantages: torch.Tensor | None, rewards: torch.Tensor, out: GenerationOutput,
                          loss_mask: torch.Tensor, beta: float, ref_lp: torch.Tensor | None,
                          old_lp: torch.Tensor | None, old_values: torch.Tensor | None
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token advantages [n, N] and, for GAE, the value targets.

        k1's KL is a per-token reward -beta k1 (the sampling policy's log-probs against the reference's): its
        return-to-go is subtracted from GRPO's advantages, or enters GAE with the task reward (PPO-RLHF)."""
        cfg, cm = self.cfg, out.mask.float()
        penalty = None
        if cfg.kl_estimator == "k1" and beta > 0 and ref_lp is not None:
            penalty = beta * grpo.kl_estimate(old_lp, ref_lp, "k1") * cm
        if cfg.advantage == "grpo":
            per_token = advantages[:, None] * cm
            return (per_token if penalty is None else per_token - grpo.penalty_to_go(penalty, cm)), None
        token_rewards = torch.zeros_like(cm)
        lengths = out.lengths.clamp(min=1)
        token_rewards[torch.arange(len(lengths), device=self.device), lengths - 1] = rewards.float()
        if penalty is not None:
            token_rewards = token_rewards - penalty
        per_token, returns = grpo.gae(token_rewards * cm, old_values, cm, cfg.gamma, cfg.gae_lambda)
        if cfg.advantage_scaling == "batch":  # PPO's whitening, over every rank's tokens
            _, mean, var = self._moments(per_token, loss_mask)
            per_token = (per_token - mean) / (math.sqrt(var) + 1e-6) * cm
        return per_token, returns

    def train_step(self) -> dict[str, Any]:
        cfg, step, G = self.cfg, self.step, self.cfg.group_size
        t_start = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

        prompts = self.prompts.batch(step)
        if step + 1 < cfg.steps:
            self.reward_fn.prefetch(self.prompts.batch(step + 1))  # Stockfish works while the GPU samples

        # 1. Sample G completions per prompt.
        ids, pmask = self.tokenizer.encode_batch([p.text for p in prompts], bos=True, device=self.device)
        ids, pmask = ids.repeat_interleave(G, 0), pmask.repeat_interleave(G, 0)
        gen = torch.Generator(device=self.device).manual_seed(_seed_of(cfg.seed, step, self.dist.rank))
        prompt_lens = pmask.sum(1).cpu().numpy()
        tasks = np.repeat([p.task for p in prompts], G)
        out = self._sample(ids, pmask, prompt_lens, tasks, gen)
        self._sync()
        t_gen = time.perf_counter()

        # 2. Rewards and advantages.
        completions = self.tokenizer.decode_batch(out.tokens, out.mask)
        expanded = [p for p in prompts for _ in range(G)]
        scored = self.reward_fn(expanded, completions)
        rewards = torch.tensor(np.asarray(scored.rewards, dtype=np.float64), device=self.device)
        valid_np = np.ones(len(completions), dtype=bool) if scored.valid is None else np.asarray(scored.valid, bool)
        valid = torch.from_numpy(valid_np).to(self.device)
        spread = grpo.group_has_spread(rewards, G)
        loss_mask = out.mask & valid.unsqueeze(1)  # a group without ground truth: no loss
        if not valid_np.all():
            self.log.warn("unscored", step + 1, f"{int((~valid_np).sum()) // G} prompt(s) could not be scored "
                                                "(Stockfish failed after retries) and were left out of this step")
        if cfg.mask_truncated:
            loss_mask &= out.stopped.unsqueeze(1)
        if cfg.drop_zero_spread:
            loss_mask &= spread.unsqueeze(1)
        advantages, extra = (self._completion_advantages(rewards, valid, tasks) if cfg.advantage == "grpo"
                             else (None, {}))
        t_reward = time.perf_counter()

        # 3. Reference and sampling-policy log-probs (and values), once per rollout.
        full_ids = torch.cat([ids, out.tokens], dim=1)
        full_mask = torch.cat([pmask, out.mask], dim=1)
        P = ids.shape[1]
        completion_lens = out.lengths.cpu().numpy()
        split = lambda rows: micro_batches(rows, prompt_lens, completion_lens, P, cfg.micro_batch_size)  # noqa: E731
        rollout_batches = split(np.arange(full_ids.shape[0]))
        beta = self._beta_now()
        full_kl = cfg.kl_estimator == "full" and self.reference is not None
        with torch.no_grad():
            ref_lp = (self._rollout_scores(self.reference, full_ids, full_mask, P, rollout_batches)[0]
                      if self.reference is not None and not full_kl else None)
            k1_penalty = cfg.kl_estimator == "k1" and beta > 0 and ref_lp is not None
            old_lp = old_values = None
            if cfg.mu > 1 or cfg.minibatches > 1 or k1_penalty or self.value_head is not None:
                old_lp, old_values = self._rollout_scores(self.policy, full_ids, full_mask, P, rollout_batches,
                                                          values=self.value_head is not None)
            token_adv, returns = self._token_advantages(advantages, rewards, out, loss_mask, beta, ref_lp, old_lp,
                                                        old_values)
        self._sync()
        t_ref = time.perf_counter()

        # 4. Updates.
        n = full_ids.shape[0]
        # Running sums stay on the device: a host sync per micro-batch would stall the GPU between them.
        zero = lambda: torch.zeros((), dtype=torch.float64, device=self.device)  # noqa: E731
        sums = {k: zero() for k in ("kl", "clipped", "entropy", "tokens", "loss", "value_loss")}
        slots = real = skipped = 0
        kl_parts: list[tuple[torch.Tensor, torch.Tensor]] = []
        grad_norms = []
        for epoch in range(cfg.mu):
            order = torch.randperm(n, generator=torch.Generator().manual_seed(_seed_of(cfg.seed, step, epoch)))
            for mb in order.chunk(cfg.minibatches):
                # The token mean is over every rank's tokens: DDP averages the ranks' gradients, so each rank
                # divides its sum by the global count over the number of ranks.
                mb_tokens = self._all_sum([float(loss_mask[mb.to(self.device)].sum())])[0]
                if mb_tokens == 0:  # nothing to learn from: no step, or AdamW's momentum would move the weights
                    skipped += 1
                    continue
                self.optimizer.zero_grad(set_to_none=True)
                # Gradients add up over micro-batches, so their order and make-up within the minibatch are free.
                micro = split(mb.numpy())
                for j, b in enumerate(micro):
                    sync = j == len(micro) - 1
                    ctx = self.scores.no_sync() if self.dist.enabled and not sync else contextlib.nullcontext()
                    mi, W = torch.from_numpy(b.rows).to(self.device), b.width
                    cols = slice(b.left, P + W)
                    with ctx:
                        with self._autocast():
                            lp, entropy, kl, values = self.scores(
                                full_ids[mi, cols], full_mask[mi, cols], P - b.left, cfg.temperature,
                                self.reference if full_kl else None, cfg.kl_direction)
                        lp, entropy = lp.float(), entropy.float()
                        m = loss_mask[mi, :W]
                        old = old_lp[mi, :W] if old_lp is not None else lp.detach()
                        per_token, clipped = grpo.clipped_surrogate(lp, old, token_adv[mi, :W], cfg.clip_low,
                                                                    cfg.clip_high)
                        if ref_lp is not None:
                            kl = grpo.kl_estimate(lp, ref_lp[mi, :W], cfg.kl_estimator)
                        if kl is not None:
                            kl = kl.float()
                            if beta > 0 and cfg.kl_estimator != "k1":  # k1 is in the advantages already
                                per_token = per_token + beta * kl
                        if cfg.entropy_coef > 0:
                            per_token = per_token - cfg.entropy_coef * entropy
                        if values is not None:
                            v_loss = grpo.value_loss(values.float(), old_values[mi, :W], returns[mi, :W],
                                                     cfg.value_clip)
                            per_token = per_token + cfg.vf_coef * v_loss
                        loss = grpo.aggregate(per_token, m, cfg.loss_aggregation, max_tokens=cfg.max_new_tokens,
                                              total_tokens=mb_tokens / self.dist.world,
                                              total_sequences=float(len(mb)))
                        loss.backward()
                    with torch.no_grad():
                        mf = m.float()
                        sums["loss"] += loss.detach()
                        sums["tokens"] += mf.sum()
                        sums["clipped"] += (clipped.float() * mf).sum()
                        sums["entropy"] += (entropy * mf).sum()
                        if kl is not None:
                            sums["kl"] += (kl * mf).sum()
                            kl_parts.append((kl.detach(), m))
                        if values is not None:
                            sums["value_loss"] += (v_loss.detach() * mf).sum()
                    slots += len(b.rows) * (P - b.left + W)
                    real += int(prompt_lens[b.rows].sum() + completion_lens[b.rows].sum())
                params = [q for g in self.optimizer.param_groups for q in g["params"] if q.grad is not None]
                norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf)
                grad_norms.append(norm.detach())
                self.optimizer.step()
        lr = self.optimizer.param_groups[0]["lr"]
        self.scheduler.step()
        self._sync()
        t_end = time.perf_counter()
        if skipped:
            self.log.warn("skipped", step + 1, f"{skipped} of {cfg.mu * cfg.minibatches} minibatch(es) had no "
                                               "usable token (no reward spread, truncated or unscored): no "
                                               "optimizer step for them")

        update = _UpdateSums(sums, kl_parts, grad_norms, slots, real, skipped, cfg.mu * cfg.minibatches - skipped)
        m = self._step_metrics(out, scored, valid_np, spread, update, beta, lr, t_start, t_gen, t_reward, t_ref, t_end)
        m.update(extra)
        if returns is not None:
            cm = loss_mask.bool()
            _, _, var_ret = self._moments(returns, cm)
            _, _, var_res = self._moments(returns - old_values, cm)
            m["value/explained_variance"] = 1.0 - var_res / var_ret if var_ret > 0 else None
            m["value/mean"] = self._moments(old_values, cm)[1]
        self._last_rollout = (prompts, completions, scored)
        return m

    def _step_metrics(self, out: GenerationOutput, scored: RewardResult, valid: np.ndarray, spread: torch.Tensor,
                      update: "_UpdateSums", beta: float, lr: float, t_start: float, t_gen: float, t_reward: float,
                      t_ref: float, t_end: float) -> dict[str, Any]:
        """The step's metrics, reduced over ranks; also advances the step counter and the adaptive beta."""
        cfg, G = self.cfg, self.cfg.group_size
        all_rewards = self._gather(torch.tensor(np.asarray(scored.rewards, dtype=np.float64),
                                                device=self.device)).cpu().numpy()
        # Unscored samples (code 3) count in no task's statistics.
        task_codes = torch.as_tensor([{"P": 1, "A": 0}.get(str(t), 2) if ok else 3
                                      for t, ok in zip(scored.tasks, valid)], device=self.device)
        all_tasks = self._gather(task_codes).cpu().numpy()
        well = self._gather(torch.tensor(np.asarray(scored.well_formed), device=self.device)).cpu().numpy()
        all_rewards_scored = all_rewards[all_tasks != 3]
        totals = dict(zip(update.sums, torch.stack(list(update.sums.values())).tolist()))  # one host sync
        kl_sum, clipped, ent, tokens, v_loss, slots, real = self._all_sum(
            [totals["kl"], totals["clipped"], totals["entropy"], totals["tokens"], totals["value_loss"],
             float(update.slots), float(update.real)])
        scored_groups = valid[::G]
        flat_groups = (~spread.cpu().numpy()[::G]) & scored_groups
        gen_tokens, truncated, zero_spread, n_groups = self._all_sum(
            [float(out.mask.sum()), float((~out.stopped).sum()), float(flat_groups.sum()),
             float(scored_groups.sum())])
        measured_kl = tokens > 0 and (self.reference is not None)
        kl_all = torch.cat([kl[m] for kl, m in update.kl_parts]).float().cpu() if update.kl_parts else torch.zeros(0)
        if not measured_kl:
            kl_p95 = None
        elif self.dist.enabled:
            # p95 over each rank's tokens, averaged: exact gathering would move every token's KL.
            kl_p95 = self._all_mean([float(torch.quantile(kl_all, 0.95)) if kl_all.numel() else 0.0])[0]
        else:
            kl_p95 = float(torch.quantile(kl_all, 0.95))
        kl_mean = kl_sum / tokens if measured_kl else None
        if update.done:
            grad_norm = self._all_mean([float(torch.stack(update.grad_norms).float().mean())])[0]
            loss = self._all_mean([totals["loss"]])[0] / update.done
        else:
            grad_norm = loss = None
        n_total = len(all_rewards)
        step_time = t_end - t_start

        self.step += 1
        reward_mean = float(all_rewards_scored.mean()) if len(all_rewards_scored) else math.nan
        if not math.isnan(reward_mean):
            self.best_reward = max(self.best_reward, reward_mean)
        if cfg.kl_target is not None and kl_mean is not None:  # no KL measured: no evidence to move beta on
            # Proportional control (Ziegler et al.): beta grows when KL overshoots the target, shrinks below it.
            error = max(-0.2, min(0.2, kl_mean / cfg.kl_target - 1.0))
            self.beta = max(1e-6, self.beta * (1.0 + error / cfg.kl_horizon))

        m: dict[str, Any] = {"step": self.step, "reward/mean": reward_mean, "reward/best": self.best_reward,
                             "reward/std": float(all_rewards_scored.std()) if len(all_rewards_scored) else None,
                             "unscored": float((all_tasks == 3).mean())}
        for code, name in ((1, "P"), (0, "A")):
            r = all_rewards[all_tasks == code]
            m[f"reward/{name}/mean"] = _mean(r)
            for q in (10, 50, 90):
                m[f"reward/{name}/p{q}"] = _pct(r, q)
            m[f"format_valid/{name}"] = _mean(well[all_tasks == code])
            m[f"share/{name}"] = float((all_tasks == code).mean())
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) / 2**30
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
        m.update({
            "kl/mean": kl_mean, "kl/p95": kl_p95, "clip_fraction": clipped / max(tokens, 1.0),
            "entropy": ent / max(tokens, 1.0), "loss": loss, "grad_norm": grad_norm, "lr": lr, "beta": beta,
            "updates/skipped": update.skipped,
            "completion_len": gen_tokens / n_total, "truncated": truncated / n_total,
            # Among the groups that were scored: an unscored group has no rewards to spread.
            "groups/zero_spread": zero_spread / n_groups if n_groups else None,
            # Share of the update's token slots that were padding (see `micro_batches`).
            "padding": 1.0 - real / max(slots, 1.0),
            "samples_per_s": n_total / step_time, "tokens_per_s": gen_tokens / step_time,
            "time/step": step_time, "time/generate": t_gen - t_start, "time/reward": t_reward - t_gen,
            "time/reference": t_ref - t_reward, "time/update": t_end - t_ref, "peak_memory_gb": peak,
        })
        if self.value_head is not None:
            m["value/loss"] = v_loss / tokens if tokens else None
        return m

    # -- automatic batch size -----------------------------------------------------------------------------

    def auto_batch(self, memory_fraction: Callable[[], float] | None = None) -> int:
        """Runs real steps at doubling prompts-per-step and keeps the largest whose peak memory stays under
        `memory_target`; the policy, optimizer and counters are restored after each probe.

        `memory_fraction` reads the peak memory share of the last step (default: CUDA's peak allocation over
        the device's memory); tests pass their own to exercise the search on the CPU."""
        cfg = self.cfg
        if memory_fraction is None:
            if self.device.type != "cuda":
                raise ConfigError("--auto-batch measures GPU memory: it needs a CUDA device")
            total = torch.cuda.get_device_properties(self.device).total_memory
            memory_fraction = lambda: torch.cuda.max_memory_allocated(self.device) / total  # noqa: E731
        if not isinstance(self.prompts, PromptSource):
            raise ConfigError("--auto-batch works with the built-in prompt source")
        snapshot = {
            "scores": {k: v.detach().clone() for k, v in self._unwrapped_scores().state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "scheduler": self.scheduler.state_dict(),
            "counters": (self.step, self.beta, self.best_reward, dict(self.baselines)),
        }

        def restore() -> None:
            self._unwrapped_scores().load_state_dict(snapshot["scores"])
            self.optimizer.load_state_dict(snapshot["optimizer"])
            self.scheduler.load_state_dict(snapshot["scheduler"])
            self.step, self.beta, self.best_reward, self.baselines = snapshot["counters"]

        world, G = self.dist.world, cfg.group_size
        start = cfg.prompts_per_step
        chosen, p = None, start
        self.log.say(f"auto-batch: probing prompts-per-step from {start} (x {G} completions), memory target "
                     f"{100 * cfg.memory_target:.0f}%")
        while p <= cfg.auto_batch_max:
            if (p // world * G) % cfg.minibatches:
                p *= 2
                continue
            cfg.prompts_per_step, self.prompts.per_rank = p, p // world
            if self.device.type == "cuda":
                release_caches(self.policy)
                torch.cuda.empty_cache()
            try:
                m = self.train_step()
                used, seconds = memory_fraction(), m["time/step"]
            except torch.cuda.OutOfMemoryError:
                used, seconds = math.inf, math.nan
            finally:
                restore()
            fits = self._all_sum([0.0 if used <= cfg.memory_target else 1.0])[0] == 0
            shown = "out of memory" if math.isinf(used) else f"peak {100 * used:.0f}% of memory, {seconds:.2f} s/step"
            self.log.say(f"auto-batch: {p} prompts x {G} = {p * G} completions: {shown}"
                         f"{'' if fits else ' (over the target)'}")
            if not fits:
                break
            chosen, p = p, p * 2
        if chosen is None:
            raise ConfigError(f"--auto-batch: even {start} prompts per step exceed --memory-target "
                              f"{cfg.memory_target}; lower --prompts-per-step, --group-size or --micro-batch-size")
        cfg.prompts_per_step, self.prompts.per_rank = chosen, chosen // world
        if self.device.type == "cuda":
            release_caches(self.policy)
            torch.cuda.empty_cache()
        self.log.say(f"auto-batch: training with {chosen} prompts per step ({chosen * G} completions)")
        return chosen

    # -- evaluation, checkpoints, the loop ----------------------------------------------------------------

    def evaluate(self) -> dict[str, Any]:
        from rookworld.evaluate import evaluate

        if self._eval_records is None:
            if self.cfg.eval_data:
                records, _ = read_records(self.cfg.eval_data)
            else:
                records = [Record.from_position(p) for p in chess.generate_positions(
                    self.cfg.eval_size, self.cfg.seed + EVAL_SEED_OFFSET, illegal_share=self.cfg.illegal_share)]
            self._eval_records = assign_moves(records[: self.cfg.eval_size], self.cfg.seed)
        scorer = getattr(self.reward_fn, "scorer", None)
        if scorer is None:
            return {}
        result = evaluate(self.policy, self.tokenizer, self._eval_records, scorer,
                          batch_size=self.cfg.micro_batch_size, max_new_tokens=self.cfg.max_new_tokens,
                          compile=self.compile)
        return {f"eval/{task}/{k}": v for task in ("P", "A") for k, v in result.get(task, {}).items()}

    def save(self) -> Path | None:
        if not self.dist.main:
            return None
        state = {"step": self.step, "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "beta": self.beta, "best_reward": self.best_reward, "baselines": dict(self.baselines),
                 "rng": checkpoint.rng_state(), "world_size": self.dist.world}
        modules = {}
        if self.value_head is not None:
            from rookworld.value import VALUE_HEAD_NAME

            modules[VALUE_HEAD_NAME] = self.value_head
        path = checkpoint.save_checkpoint(self.cfg.output_dir, self.step, self.policy, state, self.cfg.to_dict(),
                                          self.cfg.keep_checkpoints, modules)
        self.log.say(f"saved checkpoint {path}")
        return path

    def _request_stop(self, signum, frame) -> None:
        if self._stop_requested:  # second Ctrl-C: stop now, without saving
            raise KeyboardInterrupt
        self._stop_requested = True
        self.log.say("stopping after this step and saving a checkpoint (Ctrl-C again to abort without saving)")

    def _agree_to_stop(self) -> bool:
        flag = self._all_sum([1.0 if self._stop_requested else 0.0])[0]
        return flag > 0

    def _write_samples(self, k: int = 8) -> None:
        prompts, completions, scored = self._last_rollout
        G = self.cfg.group_size
        rows = []
        for i in range(0, len(completions), max(G, len(completions) // k or 1))[:k]:
            rows.append({"task": str(scored.tasks[i]), "prompt": prompts[i // G].text, "completion": completions[i],
                         "reward": float(scored.rewards[i])})
        self.log.samples(self.step, rows)

    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        previous = {}
        if threading.current_thread() is threading.main_thread():  # signals reach only the main thread
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self._request_stop)
        if self.resume_from is not None:
            self.log.say(f"resumed from {self.resume_from} at step {self.step}")
            if cfg.auto_batch:
                self.log.say(f"auto-batch: keeping the resumed run's {cfg.prompts_per_step} prompts per step")
        elif cfg.auto_batch:
            self.auto_batch()
        last: dict[str, Any] = {}
        saved_at = self.step
        t0, first_step = time.perf_counter(), self.step
        try:
            while self.step < cfg.steps:
                m = self.train_step()
                if cfg.eval_every and self.step % cfg.eval_every == 0:
                    if self.dist.main:
                        m.update(self.evaluate())
                    if self.dist.enabled:
                        dist.barrier()
                done = self.step - first_step
                m["eta_s"] = (time.perf_counter() - t0) / done * (cfg.steps - self.step)
                self.log.step(m, log_line=self.step % cfg.log_every == 0 or self.step == cfg.steps)
                if cfg.sample_every and self.step % cfg.sample_every == 0 and self.dist.main:
                    self._write_samples()
                last = m
                if cfg.save_every and self.step % cfg.save_every == 0:
                    self.save()
                    saved_at = self.step
                if self._agree_to_stop():
                    self.interrupted = self.step < cfg.steps
                    break
            if saved_at != self.step:
                self.save()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.log.close()
        return last

    def close(self) -> None:
        digest_dir = os.environ.get("ROOKWORLD_TEST_PARAM_DIGEST")
        if digest_dir:  # lets the torchrun test compare every rank's parameters
            import hashlib

            h = hashlib.sha256()
            for name, p in sorted(self.policy.state_dict().items()):
                h.update(name.encode())
                h.update(p.detach().float().cpu().numpy().tobytes())
            Path(digest_dir).mkdir(parents=True, exist_ok=True)
            (Path(digest_dir) / f"rank{self.dist.rank}.txt").write_text(h.hexdigest())
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.dist.enabled and dist.is_initialized():
            dist.destroy_process_group()
