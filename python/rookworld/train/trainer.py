"""GRPO for RookWorld-LM: sample a group of completions per prompt, score them with verifiable rewards,
and push the policy toward the better ones, with a KL leash to the frozen reference.

One step, `Trainer.train_step`:
  1-3. `collect_rollout`: G completions per prompt (one sampling batch per task), rewards (Stockfish for P:,
       analysed ahead while the GPU samples; the rules for A:), advantages, and the reference's (and, when the
       policy moves within a step, the sampling policy's) log-probs, once;
  4.   `update`: `mu` epochs of minibatch optimizer steps with gradient accumulation over micro-batches;
  5.   metrics, reduced over ranks.
The run around the steps (device, DDP, checkpoints, resume, signals, logging, evaluation) is `Run`'s.

Randomness comes from (seed, step, rank) alone, so a resumed run continues exactly as an unbroken one.
Under torchrun the prompts are sharded over ranks, gradients are averaged by DDP, metrics are reduced,
and only rank 0 writes files.
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rookworld.data import assign_moves, finished_message, playable, read_records
from rookworld.policy.decoding import release_caches
from rookworld.policy.tokenizer import Tokenizer
from rookworld.train.config import ConfigError, TrainConfig
from rookworld.train.metrics import peak_memory_gb, reward_metrics, sampling_metrics, update_metrics
from rookworld.train.models import Models
from rookworld.train.prompts import PromptSource
from rookworld.train.rollout import ChessReward, RewardFn, Rollout, collect_rollout
from rookworld.train.run import Run
from rookworld.train.runlog import fmt
from rookworld.train.update import update

def summary(m: dict[str, Any]) -> list[str]:
    """The summary line of a GRPO step, after "step N/M"."""
    return [f"reward {fmt(m, 'reward/mean')} (best {fmt(m, 'reward/best')})",
            f"P {fmt(m, 'reward/P/mean', '{:.2f}')} A {fmt(m, 'reward/A/mean', '{:.2f}')}", f"kl {fmt(m, 'kl/mean')}",
            f"clip {fmt(m, 'clip_fraction', '{:.2f}')}", f"{fmt(m, 'time/step', '{:.2f}')} s",
            f"{fmt(m, 'samples_per_s', '{:,.0f}')} samples/s"]


class Trainer:
    def __init__(self, cfg: TrainConfig, *, policy: nn.Module | None = None, reference: nn.Module | None = None,
                 tokenizer: Tokenizer | None = None, reward_fn: RewardFn | None = None,
                 prompt_source: PromptSource | None = None, stream=None,
                 completion_lengths: dict[str, int] | None = None):
        """``completion_lengths`` ({task: n}) makes every completion exactly n tokens, EOS or not: for
        benchmarks, which must measure the same work whatever the (random) weights write."""
        self.cfg = cfg
        self.completion_lengths = completion_lengths
        cuda = cfg.device.startswith("cuda") or (cfg.device == "auto" and torch.cuda.is_available())
        if cfg.auto_batch and not cuda:
            raise ConfigError("--auto-batch measures GPU memory: it needs a CUDA device")
        records, finished = None, []
        if cfg.data and prompt_source is None:  # a bad line is reported before any model is loaded
            records, finished = playable(read_records(cfg.data)[0])
            if not records:
                raise ConfigError(f"--data {cfg.data}: no position with a legal move")
            records = assign_moves(records, cfg.seed)
        self.run = run = Run(cfg, command="train", policy=policy, tokenizer=tokenizer, stream=stream, summary=summary)
        if finished:
            run.log.say(f"warning: --data {cfg.data}: {finished_message(finished, len(records) + len(finished))}")
        world = run.dist.world
        if cfg.prompts_per_step % world:
            raise ConfigError(f"--prompts-per-step ({cfg.prompts_per_step}) must divide over {world} ranks")
        if (cfg.prompts_per_step // world * cfg.group_size) % cfg.minibatches:
            raise ConfigError(f"each rank's {cfg.prompts_per_step // world * cfg.group_size} completions must split "
                              f"into --minibatches ({cfg.minibatches})")
        if reference is None and cfg.beta > 0:
            from rookworld.policy.model import from_pretrained

            reference = from_pretrained(cfg.model, revision=cfg.revision, device=run.device)
        if reference is not None:
            reference = reference.to(run.device).eval().requires_grad_(False)
        value_head = None
        if cfg.advantage == "gae":
            from rookworld.policy.value import ValueHead

            value_head = ValueHead(run.policy.config.n_embd).to(run.device)
        self.models = Models(run.policy, reference, value_head, run.device, run.amp_dtype, run.compile,
                             run.dist.enabled, run.autocast)
        extra = [{"params": list(value_head.parameters()), "weight_decay": 0.0, "lr": cfg.value_lr}] if value_head \
            else []
        state = run.build_optimizer(extra)
        self.beta = state.get("beta", cfg.beta)
        self.best_reward = state.get("best_reward", -math.inf)
        #: --baseline ema: each task's moving average reward, by task name.
        self.baselines: dict[str, float] = dict(state.get("baselines", {}))
        if value_head is not None and run.resume_from is not None:
            from rookworld.policy.value import VALUE_HEAD_NAME
            from rookworld.train import checkpoint

            checkpoint.load_module(run.resume_from, VALUE_HEAD_NAME, value_head)

        self.pool = None
        if reward_fn is None:
            reward_fn = self._chess_reward()
        self.reward_fn = reward_fn
        self.prompts = prompt_source or PromptSource(cfg, records, run.dist.rank, world)
        source = cfg.data or "generated positions"
        run.log.say(f"prompts: {cfg.prompts_per_step} x group {cfg.group_size} per step, {100 * cfg.task_mix:.0f}% "
                    f"P: / {100 * (1 - cfg.task_mix):.0f}% A:, from {source}")
        self._eval_records = None
        self._last_rollout: Rollout | None = None

    def _chess_reward(self) -> ChessReward:
        from rookworld.rewards import RewardScorer
        from rookworld.stockfish import StockfishPool

        cfg, run = self.cfg, self.run
        workers = cfg.stockfish_workers or max(1, ((os.cpu_count() or 2) - 1) // run.dist.local_world)
        run.cpu_threads_beside(workers)
        self.pool = StockfishPool(path=cfg.stockfish_path, workers=workers, depth=cfg.stockfish_depth,
                                  cache_path=cfg.stockfish_cache)
        run.log.say(f"rewards: Stockfish {self.pool.path} (depth {cfg.stockfish_depth}, {workers} worker"
                    f"{'s' if workers > 1 else ''}) for P:, the rules for A:; {cfg.reward_shaping} shaping")
        return ChessReward(RewardScorer(self.pool, shaping=cfg.reward_shaping))

    # The run's pieces, under the names the rest of the package and the tests use.
    @property
    def policy(self) -> nn.Module:
        return self.run.policy

    @property
    def reference(self) -> nn.Module | None:
        return self.models.reference

    @property
    def value_head(self) -> nn.Module | None:
        return self.models.value_head

    @property
    def tokenizer(self) -> Tokenizer:
        return self.run.tokenizer

    @property
    def step(self) -> int:
        return self.run.step

    @property
    def interrupted(self) -> bool:
        return self.run.interrupted

    @property
    def log(self):
        return self.run.log

    def _beta_now(self) -> float:
        if self.cfg.beta_warmup_steps:
            return self.beta * min(1.0, (self.step + 1) / self.cfg.beta_warmup_steps)
        return self.beta

    # -- one GRPO step ------------------------------------------------------------------------------------

    def train_step(self) -> dict[str, Any]:
        cfg, run, step = self.cfg, self.run, self.run.step
        t0 = time.perf_counter()
        if run.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(run.device)
        prompts = self.prompts.batch(step)
        if step + 1 < cfg.steps:
            self.reward_fn.prefetch(self.prompts.batch(step + 1))  # Stockfish works while the GPU samples

        rollout = collect_rollout(cfg, self.models, run.comm, self.tokenizer, self.reward_fn, prompts, step=step,
                                  beta=self._beta_now(), baselines=self.baselines, log=run.log,
                                  completion_lengths=self.completion_lengths)
        t_update = time.perf_counter()
        sums = update(cfg, self.models, run.optimizer, run.comm, rollout, step)
        lr = run.optimizer.param_groups[0]["lr"]
        run.scheduler.step()
        if run.device.type == "cuda":
            torch.cuda.synchronize(run.device)
        t_end = time.perf_counter()
        if sums.skipped:
            run.log.warn("skipped", step + 1, f"{sums.skipped} of {cfg.mu * cfg.minibatches} minibatch(es) had no "
                                              "usable token (no reward spread, truncated or unscored): no optimizer "
                                              "step for them")
        m = self._metrics(rollout, sums, lr, t_end - t0, t_end - t_update)
        self._last_rollout = rollout
        return m

    def _metrics(self, rollout: Rollout, sums, lr: float, step_time: float, update_time: float) -> dict[str, Any]:
        """The step's metrics; also advances the step counter and the adaptive beta."""
        cfg, run = self.cfg, self.run
        m: dict[str, Any] = {"step": run.step + 1}
        m.update(reward_metrics(run.comm, rollout))
        m.update(update_metrics(run.comm, rollout, sums, measured_kl=self.models.reference is not None))
        sampled = sampling_metrics(cfg, run.comm, rollout)
        samples, tokens = sampled.pop("samples"), sampled.pop("generated_tokens")
        m.update(sampled)
        m.update(rollout.info)
        run.step += 1
        if m["reward/mean"] is not None:
            self.best_reward = max(self.best_reward, m["reward/mean"])
        if cfg.kl_target is not None and m["kl/mean"] is not None:  # no KL measured: no evidence to move beta on
            # Proportional control (Ziegler et al.): beta grows when KL overshoots the target, shrinks below it.
            error = max(-0.2, min(0.2, m["kl/mean"] / cfg.kl_target - 1.0))
            self.beta = max(1e-6, self.beta * (1.0 + error / cfg.kl_horizon))
        m.update({"reward/best": self.best_reward, "lr": lr, "beta": rollout.beta, "samples_per_s": samples / step_time,
                  "tokens_per_s": tokens / step_time, "time/step": step_time, "time/update": update_time,
                  **{f"time/{k}": v for k, v in rollout.times.items()}, "peak_memory_gb": peak_memory_gb(run.device)})
        self._warn_about(m)
        return m

    def _warn_about(self, m: dict[str, Any]) -> None:
        cfg, log, step = self.cfg, self.run.log, m["step"]
        kl, spread, clip = m.get("kl/mean"), m.get("groups/zero_spread"), m.get("clip_fraction")
        if kl is not None and math.isfinite(kl) and kl > cfg.kl_warn:
            log.warn("kl", step, f"KL to the reference is {kl:.3f} per token (> {cfg.kl_warn}): the policy is "
                                 "drifting fast; consider a lower --lr or a higher --beta")
        if spread is not None and spread > 0.5:
            log.warn("spread", step, f"{100 * spread:.0f}% of groups have no reward spread and teach nothing; "
                                     "consider a higher --temperature or a larger --group-size")
        if clip is not None and math.isfinite(clip) and clip > cfg.clip_warn:
            log.warn("clip", step, f"clip fraction {clip:.2f} (> {cfg.clip_warn}): updates are too large; "
                                   "consider a lower --lr or fewer --mu epochs")

    # -- automatic batch size -----------------------------------------------------------------------------

    def auto_batch(self, memory_fraction: Callable[[], float] | None = None) -> int:
        """Runs real steps at doubling prompts-per-step and keeps the largest whose peak memory stays under
        `memory_target`; the policy, optimizer and counters are restored after each probe.

        `memory_fraction` reads the peak memory share of the last step (default: CUDA's peak allocation over
        the device's memory); tests pass their own to exercise the search on the CPU."""
        cfg, run = self.cfg, self.run
        if memory_fraction is None:
            if run.device.type != "cuda":
                raise ConfigError("--auto-batch measures GPU memory: it needs a CUDA device")
            total = torch.cuda.get_device_properties(run.device).total_memory
            memory_fraction = lambda: torch.cuda.max_memory_allocated(run.device) / total  # noqa: E731
        if not isinstance(self.prompts, PromptSource):
            raise ConfigError("--auto-batch works with the built-in prompt source")
        snapshot = {
            "trained": {k: v.detach().clone() for k, v in self.models.trained.state_dict().items()},
            "optimizer": copy.deepcopy(run.optimizer.state_dict()),
            "scheduler": run.scheduler.state_dict(),
            "counters": (run.step, self.beta, self.best_reward, dict(self.baselines)),
        }

        def restore() -> None:
            self.models.trained.load_state_dict(snapshot["trained"])
            run.optimizer.load_state_dict(snapshot["optimizer"])
            run.scheduler.load_state_dict(snapshot["scheduler"])
            run.step, self.beta, self.best_reward, baselines = snapshot["counters"]
            self.baselines = dict(baselines)

        world, G = run.dist.world, cfg.group_size
        start = cfg.prompts_per_step
        chosen, p = None, start
        run.log.say(f"auto-batch: probing prompts-per-step from {start} (x {G} completions), memory target "
                    f"{100 * cfg.memory_target:.0f}%")
        while p <= cfg.auto_batch_max:
            if (p // world * G) % cfg.minibatches:
                p *= 2
                continue
            cfg.prompts_per_step, self.prompts.per_rank = p, p // world
            self._free_caches()
            try:
                m = self.train_step()
                used, seconds = memory_fraction(), m["time/step"]
            except torch.cuda.OutOfMemoryError:
                used, seconds = math.inf, math.nan
            finally:
                restore()
            fits = not run.comm.any(used > cfg.memory_target)
            shown = "out of memory" if math.isinf(used) else f"peak {100 * used:.0f}% of memory, {seconds:.2f} s/step"
            run.log.say(f"auto-batch: {p} prompts x {G} = {p * G} completions: {shown}"
                        f"{'' if fits else ' (over the target)'}")
            if not fits:
                break
            chosen, p = p, p * 2
        if chosen is None:
            raise ConfigError(f"--auto-batch: even {start} prompts per step exceed --memory-target "
                              f"{cfg.memory_target}; lower --prompts-per-step, --group-size or --micro-batch-size")
        cfg.prompts_per_step, self.prompts.per_rank = chosen, chosen // world
        self._free_caches()
        run.log.say(f"auto-batch: training with {chosen} prompts per step ({chosen * G} completions)")
        return chosen

    def _free_caches(self) -> None:
        if self.run.device.type == "cuda":
            release_caches()
            torch.cuda.empty_cache()

    # -- evaluation, samples, checkpoints, the loop -------------------------------------------------------

    def evaluate(self) -> dict[str, Any]:
        from rookworld.evaluate import evaluate, heldout_records

        scorer = getattr(self.reward_fn, "scorer", None)
        if scorer is None:
            return {}
        cfg = self.cfg
        if self._eval_records is None:
            self._eval_records = heldout_records(cfg.eval_size, cfg.seed, cfg.eval_data, cfg.illegal_share,
                                                 warn=lambda text: self.run.log.say(f"warning: --eval-data {text}"))
        result = evaluate(self.policy, self.tokenizer, self._eval_records, scorer, batch_size=cfg.micro_batch_size,
                          max_new_tokens=cfg.max_new_tokens, compile=self.run.compile)
        return {f"eval/{task}/{k}": v for task in ("P", "A") for k, v in result.get(task, {}).items()}

    def write_samples(self, k: int = 8) -> None:
        r, G = self._last_rollout, self.cfg.group_size
        n = len(r.completions)
        rows = [{"task": str(r.scored.tasks[i]), "prompt": r.prompts[i // G].text, "completion": r.completions[i],
                 "reward": float(r.scored.rewards[i])} for i in range(0, n, max(G, n // k or 1))[:k]]
        self.run.log.samples(self.step, rows)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of GRPO beside the run's own state."""
        return {"beta": self.beta, "best_reward": self.best_reward, "baselines": dict(self.baselines)}

    def modules(self) -> dict[str, nn.Module]:
        from rookworld.policy.value import VALUE_HEAD_NAME

        return {VALUE_HEAD_NAME: self.value_head} if self.value_head is not None else {}

    def save(self):
        return self.run.save(self.state(), self.modules())

    def train(self) -> dict[str, Any]:
        cfg, run = self.cfg, self.run
        if cfg.auto_batch:
            if run.resume_from is not None:
                run.log.say(f"auto-batch: keeping the resumed run's {cfg.prompts_per_step} prompts per step")
            elif run.step < cfg.steps:
                self.auto_batch()
        return run.loop(self.train_step, state=self.state, modules=self.modules, evaluate=self.evaluate,
                        samples=self.write_samples, sample_every=cfg.sample_every)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        self.run.comm.close()
