"""GRPO for RookWorld-LM: sample a group of completions per prompt, score them with verifiable rewards,
and push the policy toward the better ones, with a KL leash to the frozen reference.

One step, `Trainer.train_step`:
  1-3. `collect_rollout`: G completions per prompt (one sampling batch per task), rewards (Stockfish for P:,
       analysed ahead while a GPU samples, on the CPU while torch waits; the rules for A:), the reference's (and, where the objective needs
       them, the sampling policy's) log-probs, once, and the advantages;
  4.   `update`: `mu` epochs of minibatch optimizer steps with gradient accumulation over micro-batches;
  5.   metrics, reduced over ranks; then the step counter, the best reward and beta move on.
What the loss is made of is the `Objective`'s to decide; the run around the steps (device, DDP, checkpoints,
resume, signals, logging, evaluation) is `Run`'s.

Randomness comes from (seed, step, rank) alone, so a resumed run continues exactly as an unbroken one.
Under torchrun the prompts are sharded over ranks, gradients are averaged by DDP, metrics are reduced,
and only rank 0 writes files.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import record_function
from torch import nn

from rookworld.chess.data import Record, assign_moves, finished_message, playable, position_key, read_records
from rookworld.chess.rewards import RewardScorer, analysis_width
from rookworld.chess.stockfish import Role, StockfishError, pool_for
from rookworld.grpo.auto_batch import BatchSearch
from rookworld.grpo.metrics import step_metrics, warn_about
from rookworld.grpo.models import Models, Placement, Sampler
from rookworld.grpo.objective import Objective
from rookworld.grpo.prompts import PromptSource
from rookworld.grpo.rollout import (RewardFn, Rollout, RolloutParts, RolloutReward, RolloutSettings,
                                    collect_rollout)
from rookworld.grpo.update import UpdateSettings, update
from rookworld.harness import checkpoint
from rookworld.harness.distributed import Comm
from rookworld.harness.run import Run
from rookworld.harness.stop import StepAbandoned
from rookworld.harness.runlog import eval_command, fmt
from rookworld.lm.bestmove import heldout_records
from rookworld.lm.suites import training_metrics
from rookworld.net.logprobs import PassOptions
from rookworld.net.pretrained import check_model, from_pretrained, model_directory
from rookworld.net.tokenizer import Tokenizer
from rookworld.net.value import VALUE_HEAD_NAME, ValueHead
from rookworld.settings.config import ConfigError, TrainConfig


def summary(m: dict[str, Any]) -> list[str]:
    """The summary line of a GRPO step, after "step N/M": each task's reward and its chess in the step's samples."""
    tasks = [f"P: reward {fmt(m, 'reward/P/mean', '{:.2f}')}"
             + (f", legal best move {fmt(m, 'legal_best_move/P', '{:.0%}')}" if "legal_best_move/P" in m else ""),
             f"A: reward {fmt(m, 'reward/A/mean', '{:.2f}')}"
             + (f", next state exact {fmt(m, 'next_state_exact/A', '{:.0%}')}" if "next_state_exact/A" in m else "")]
    # The KL in two significant digits: its first steps' 2e-05 read "0.000", as a KL switched off.
    return [f"reward {fmt(m, 'reward/mean')} (best {fmt(m, 'reward/best')})", *tasks,
            f"kl {fmt(m, 'kl/mean', '{:.2g}')}",
            f"clip {fmt(m, 'clip_fraction', '{:.2f}')}", f"{fmt(m, 'time/step', '{:.2f}')} s",
            f"{fmt(m, 'samples_per_s', '{:,.0f}')} samples/s"]


def held_out_keys(cfg: TrainConfig) -> frozenset[str]:
    """The positions training is evaluated on, which it never trains on: all of --eval-data (`rookworld eval --data`
    takes the whole file), or the generated held-out positions of the run's evaluation."""
    records = (read_records(cfg.eval_data)[0] if cfg.eval_data else
               heldout_records(cfg.eval_size, cfg.seed, None, cfg.illegal_share))
    return frozenset(position_key(r.fen) for r in records)


def reference_fingerprint(cfg: TrainConfig) -> str | None:
    """The fingerprint of the reference a run loads (--model), saved with each checkpoint. A resumed run keeps
    the reference it started from: another model (a --model given with --resume, a saved setting edited, the
    directory trained over since) would become its reference without a word, its KL measured from weights the
    run never started at. A checkpoint from before fingerprints is checked by the model's name."""
    directory = model_directory(cfg.model, cfg.revision)
    check_model(directory)  # a weights file that does not fit its config is refused before it is hashed whole
    found = checkpoint.fingerprint(directory)
    if not cfg.resume:
        return found
    resume_from = checkpoint.resolve_checkpoint(cfg.resume)
    saved = checkpoint.saved_fingerprints(resume_from)
    if "reference" in saved:
        if saved["reference"] in (None, found):  # none before (beta 0), or the same weights
            return found
        differs = "its weights are not those the run started from"
    else:
        started = checkpoint.load_config(resume_from)
        if not started.get("beta") or started.get("model") in (None, cfg.model):
            return found
        differs = f"the run started from {started['model']}"
    raise ConfigError(f"--resume {cfg.resume}: the KL reference {cfg.model} is not the run's ({differs}), and a "
                      f"resumed run keeps its reference: resume without --model, or with the model the run "
                      f"started from; or start a new run from this one's model: rookworld train --model "
                      f"{cfg.output_dir} --output-dir NEW_DIR")


@dataclass(frozen=True)
class TrainingData:
    """What a run trains on, read and checked before any model loads: --data's playable positions (None: generated
    ones), the finished games left out of it, and the held-out positions training never sees."""

    records: list[Record] | None
    finished: list[Record]
    held_out: frozenset[str]
    files: str

    @property
    def count(self) -> int:
        return len(self.records or []) + len(self.finished)


def check_auto_batch(cfg: TrainConfig) -> None:
    if cfg.auto_batch and not (cfg.device.startswith("cuda") or (cfg.device == "auto" and torch.cuda.is_available())):
        raise ConfigError("--auto-batch measures GPU memory: it needs a CUDA device")


def training_data(cfg: TrainConfig) -> TrainingData:
    """--data read and checked against --eval-data. A file of one's own is checked against --eval-data only: the
    generated evaluation set holds the common openings, which a small file may be made of."""
    records, finished, files = None, [], ", ".join(cfg.data)
    if cfg.data:
        records, finished = playable([r for path in cfg.data for r in read_records(path)[0]])
        if not records:
            raise ConfigError(f"--data {files}: no position with a legal move")
        records = assign_moves(records, cfg.seed)
    held_out = held_out_keys(cfg) if cfg.eval_data or records is None else frozenset()
    if records is not None and held_out and all(position_key(r.fen) in held_out for r in records):
        raise ConfigError(f"--data {files}: every position is among the held-out ones of --eval-data "
                          f"{cfg.eval_data}: train on other positions, or hold out others")
    return TrainingData(records, finished, held_out, files)


class Trainer:
    """`rookworld train`. Each piece defaults to what the config says; a library user may bring their own policy,
    frozen reference, tokenizer, reward function (`RewardFn`) or prompt source (anything with `batch(step)`).
    `engine_failure` is why Stockfish could not score, once it could not: the run stops with it, its last step
    saved."""

    engine_failure: StockfishError | None

    def __init__(self, cfg: TrainConfig, *, policy: nn.Module | None = None, reference: nn.Module | None = None,
                 tokenizer: Tokenizer | None = None, reward_fn: RewardFn | None = None, prompts=None, stream=None,
                 process_settings: bool = False):
        self.cfg = cfg
        check_auto_batch(cfg)
        data = training_data(cfg) if prompts is None else None  # a bad line is reported before any model is loaded
        self.objective = Objective(cfg, reference_given=reference is not None)
        self.rollout_settings, self.update_settings = RolloutSettings.of(cfg), UpdateSettings.of(cfg)
        # Before the run starts: a resumed run whose reference is not its own is one line, and no header.
        fingerprint = reference_fingerprint(cfg) if reference is None and self.objective.measures_kl else None
        self.run = Run(cfg, command="train", policy=policy, tokenizer=tokenizer, stream=stream, summary=summary,
                       process_settings=process_settings)
        self.run.fingerprints["reference"] = fingerprint
        self.pool, self._eval_records, self._last_rollout, self.engine_failure = None, None, None, None
        try:  # a start that fails (an engine that is not there) leaves no engine running, no log open, nothing locked
            self._build(reference, reward_fn, prompts, data)
        except BaseException:
            if self.pool is not None:
                self.pool.close()
            self.run.close()
            raise

    def _build(self, reference: nn.Module | None, reward_fn: RewardFn | None, prompts, data: TrainingData | None):
        """The networks, the sampler, the optimizer (a resumed run's state restored), the rewards and the prompts."""
        cfg, run = self.cfg, self.run
        if data is not None and data.finished:
            run.log.say(f"warning: --data {data.files}: {finished_message(data.finished, data.count)}")
        self.models = self._models(reference)
        self.sampler = Sampler(self.models, cfg, run.tokenizer.eos_id)
        head = self.models.value_head
        state = run.build_optimizer([{"params": list(head.parameters()), "weight_decay": 0.0, "lr": cfg.value_lr}]
                                    if head is not None else [])
        self.load_state(state)
        self.reward_fn = reward_fn if reward_fn is not None else self._rollout_reward()
        self.prompts = prompts if prompts is not None else self._prompt_source(data)

    def _prompt_source(self, data: TrainingData) -> PromptSource:
        cfg, run = self.cfg, self.run
        prompts = PromptSource(cfg, data.records, run.dist.rank, run.dist.world, data.held_out)
        left_out = f" less {prompts.left_out} held out" if prompts.left_out else ""
        apart = f", none of the {len(data.held_out)} held-out positions" if data.held_out else ""
        run.log.say(f"prompts: {cfg.prompts_per_step} x group {cfg.group_size} per step, "
                    f"{100 * cfg.task_mix:.0f}% P: / {100 * (1 - cfg.task_mix):.0f}% A:, from "
                    f"{data.files or 'generated positions'}{left_out}{apart}")
        return prompts

    def _models(self, reference: nn.Module | None) -> Models:
        """The policy (the run's), the frozen reference (loaded when the objective measures a KL and none was
        given) and the critic's value head (GAE), each on the run's device."""
        cfg, run = self.cfg, self.run
        if reference is None and self.objective.measures_kl:
            reference = from_pretrained(cfg.model, revision=cfg.revision, device=run.device)
        if reference is not None:
            reference = reference.to(run.device).eval().requires_grad_(False)
        value_head = None
        if self.objective.critic:
            value_head = ValueHead(run.policy.config.n_embd).to(run.device)
            if run.resume_from is not None:
                checkpoint.load_module(run.resume_from, VALUE_HEAD_NAME, value_head)
        placement = Placement(run.device, run.context.amp_dtype, run.context.compile, run.dist.enabled, run.autocast)
        options = PassOptions(temperature=cfg.temperature, entropy=True, compile=run.context.compile_logprobs,
                              kl_weights=self.objective.kl_weights,
                              rows_per_prompt=cfg.group_size if cfg.shared_prompt else 1)
        return Models(run.policy, reference, value_head, placement, options)

    def _rollout_reward(self) -> RolloutReward:
        cfg, run = self.cfg, self.run
        self.pool = pool_for(Role.REWARDS, cores=run.context.cores, beside_gpu=run.device.type == "cuda",
                             path=cfg.stockfish_path, workers=cfg.stockfish_workers, depth=cfg.stockfish_depth,
                             cache_path=cfg.stockfish_cache, multipv=analysis_width(cfg.p_reward))
        workers = self.pool.workers
        graded = "every legal move by the pawns it loses" if cfg.p_reward == "cp-loss" else "Stockfish's five by rank"
        run.log.say(f"rewards: Stockfish {self.pool.path} (depth {cfg.stockfish_depth}, {workers} worker"
                    f"{'s' if workers > 1 else ''}) for P: ({graded}), the rules for A:; {cfg.reward_shaping} shaping")
        scorer = RewardScorer(self.pool, shaping=cfg.reward_shaping, p_reward=cfg.p_reward)
        return RolloutReward(scorer, self._stopping)

    def _stopping(self) -> bool:
        """Whether a stop was asked for that this rank may act on alone: under torchrun every rank must drop a step or
        none, so there the step ends as the run's stop says."""
        return self.run.stop.requested and not self.run.dist.enabled

    # -- one GRPO step ------------------------------------------------------------------------------------

    def train_step(self) -> dict[str, Any]:
        m, self._last_rollout = self.step_with(self.run.comm, self.models, self.prompts)
        return m

    def step_with(self, comm: Comm, models: Models, source) -> tuple[dict[str, Any], Rollout]:
        """One GRPO step with these collectives, networks and prompts (the run's, or a trial's own): its metrics
        and its rollout."""
        cfg, run, step = self.cfg, self.run, self.run.step
        t0 = time.perf_counter()
        if run.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(run.device)
        prompts = source.batch(step)
        try:
            if self.pool is not None and self.pool.failure is not None:  # given up on during an evaluation
                raise self.pool.failure
            if step + 1 < cfg.steps and run.device.type == "cuda":
                self.reward_fn.prefetch(source.batch(step + 1))  # Stockfish works while the GPU samples
            parts = RolloutParts(self.objective, models, self.sampler, self.reward_fn, run.tokenizer, run.log)
            rollout = collect_rollout(self.rollout_settings, parts, comm, prompts, step)
        except StockfishError as e:  # no weight has changed: the step is dropped, the one before saved
            self.engine_failure = e
            raise StepAbandoned from None
        t_update = time.perf_counter()
        with run.writing():  # from the first weight changed to the step's end, a step is done whole
            with record_function("rookworld.update"):  # the update's range in a profile, as the rollout's phases
                sums = update(self.update_settings, self.objective, models, run.optimizer, comm, rollout, step)
                lr = run.optimizer.param_groups[0]["lr"]
                run.scheduler.step()
                if run.device.type == "cuda":
                    torch.cuda.synchronize(run.device)
            t_end = time.perf_counter()
            if sums.skipped:
                run.log.warn("skipped", step + 1, f"{sums.skipped} of {cfg.mu * cfg.minibatches} minibatch(es) had "
                                                  "no usable token (no reward spread, truncated or unscored): no "
                                                  "optimizer step for them")
            m = {"step": step + 1, "lr": lr, **step_metrics(comm, rollout, sums, self.objective,
                                                             step_time=t_end - t0, update_time=t_end - t_update)}
            # What the step moves on: the counter, the best reward and (toward --kl-target) beta.
            run.step += 1
            if m["reward/mean"] is not None:
                self.best_reward = max(self.best_reward, m["reward/mean"])
            m["reward/best"] = self.best_reward
            self.objective.observe_kl(m["kl/mean"])
        warn_about(m, cfg, run.log)
        return m, rollout

    # -- evaluation, samples, checkpoints, the loop -------------------------------------------------------

    def evaluate(self) -> dict[str, Any]:
        scorer = getattr(self.reward_fn, "scorer", None)
        if scorer is None:
            return {}
        cfg = self.cfg
        if self._eval_records is None:
            self._eval_records = heldout_records(cfg.eval_size, cfg.seed, cfg.eval_data, cfg.illegal_share,
                                                 warn=lambda text: self.run.log.say(f"warning: --eval-data {text}"))
        try:
            return training_metrics(self.run.policy, self.run.tokenizer, cfg, self._eval_records, scorer,
                                    compile=self.run.context.compile)
        except StockfishError as e:  # the step it follows stands and is saved; an engine given up on stops the run
            self.run.log.say(f"warning: the evaluation at step {self.run.step} is left out: {e}")
            return {}

    def write_samples(self, k: int = 8) -> None:
        r = self._last_rollout
        n, G = len(r.completions), r.group_size
        rows = [{"task": str(r.scores.tasks[i]), "prompt": r.prompts[i // G].text, "completion": r.completions[i],
                 "reward": float(r.scores.rewards[i])} for i in range(0, n, max(G, n // k or 1))[:k]]
        self.run.log.samples(self.run.step, rows)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of GRPO beside the run's own state."""
        return {**self.objective.state(), "best_reward": self.best_reward}

    def load_state(self, state: dict[str, Any]) -> None:
        """`state()` back (a resumed run's, or what a trial step of --auto-batch found)."""
        self.objective.load_state(state)
        self.best_reward = state.get("best_reward", -math.inf)

    def auto_batch(self) -> int:
        """--auto-batch: the prompts per step the search chooses (`BatchSearch`), the run's from now on."""
        chosen = BatchSearch(self).largest()
        # The one setting the search decides: the run's checkpoints save it, and a resumed run keeps it.
        self.cfg = self.run.decided(prompts_per_step=chosen)
        self.prompts = self.prompts.resized(chosen)
        self.run.log.say(f"auto-batch: training with {chosen} prompts per step ({chosen * self.cfg.group_size} "
                         "completions)")
        return chosen

    def modules(self) -> dict[str, nn.Module]:
        value_head = self.models.value_head
        return {VALUE_HEAD_NAME: value_head} if value_head is not None else {}

    def train(self) -> dict[str, Any]:
        """The run: GRPO steps to --steps, each logged, and evaluated, sampled and saved when due; a stop asked for
        ends it after the step in progress, saved. `StockfishError` when Stockfish stopped scoring, saying which
        step is saved and how to go on. Returns the last step's metrics."""
        cfg, run, last = self.cfg, self.run, {}
        try:
            self._auto_batch_if_asked()
            if not run.begin():
                return {}
            with run.looping():
                last_eval = run.first_evaluation(self.evaluate)
                while run.step < cfg.steps and not run.interrupted:
                    m = run.step_or_keep(self.train_step, self.state, self.modules)
                    if m is None:
                        break
                    if run.due(cfg.eval_every) and run.evaluate(self.evaluate, m):
                        last_eval = m
                    run.record(m)
                    if run.due(cfg.sample_every) and run.dist.main:
                        self.write_samples()
                    if cfg.save_every and run.step % cfg.save_every == 0:
                        run.save(self.state(), self.modules())
                    last = m
                    if run.stop_asked():
                        break
                run.finish(self.state(), self.modules(), last_eval)
        except StepAbandoned:  # a trial step of --auto-batch, before the loop
            if self.engine_failure is None:
                raise
        failure = self.engine_failure or (self.pool.failure if self.pool is not None else None)
        if failure is not None:
            raise StockfishError(f"{failure}; {self._kept()}") from None
        return last

    def _auto_batch_if_asked(self) -> None:
        if not self.cfg.auto_batch:
            return
        if self.run.resume_from is not None:
            self.run.log.say(f"auto-batch: keeping the resumed run's {self.cfg.prompts_per_step} prompts per step")
        elif self.run.step < self.cfg.steps:
            self.auto_batch()

    def _kept(self) -> str:
        """What a run stopped by its engine keeps, and the command that goes on from it."""
        run, out = self.run, self.cfg.output_dir
        if run.step == 0:
            return "no step was done: start again once Stockfish answers"
        if run.step >= self.cfg.steps:
            return (f"its {run.step} steps are saved, its last evaluation left out: "
                    f"{eval_command(out, self.cfg.to_dict())} makes it once Stockfish answers")
        return f"step {run.step} is saved: continue with rookworld train --resume {out} once Stockfish answers"

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close(cancel_pending=True)  # analyses prefetched for a step that will not run
            self.pool = None
        self.models.close()
        self.run.comm.close()
        self.run.close()  # the output directory is free for the next run, in this process too
