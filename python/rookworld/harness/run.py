"""What every training command shares: device and dtype, DDP, the policy and its tokenizer, the optimizer and
its schedule, checkpoints and resume, Ctrl-C and SIGTERM, the run log, and the loop that calls a command's step,
evaluation and samples. `rookworld train` (GRPO) and `rookworld sft` each plug their step into `Run.loop`.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rookworld.harness import checkpoint
from rookworld.harness.compiles import CompileReport
from rookworld.harness.distributed import Comm, DistInfo, init_distributed
from rookworld.harness.rundir import RunDirectoryLock, prepare_output_dir
from rookworld.harness.runlog import Reporting, RunLog, Summary
from rookworld.harness.stop import Doing, EvaluationStopped, StepAbandoned, Stop
from rookworld.net.device import BF16_FLAGS, cpu_bf16, keep_freed_memory, resolve_device
from rookworld.net.muon import Muon
from rookworld.net.pretrained import from_pretrained, model_directory, save_pretrained
from rookworld.net.tokenizer import get_tokenizer
from rookworld.settings.config import RunConfig
from rookworld.settings.presets import schedule_warnings


def lr_factor(step: int, cfg: RunConfig) -> float:
    """Linear warm-up to the peak; then cosine decay to min_lr_ratio x peak at the last step, or with
    cooldown_steps the peak held until a linear cooldown to min_lr_ratio x peak over the last cooldown_steps (warm-up,
    stable, decay: a longer run shares every rate of a shorter one's stable phase)."""
    if step < cfg.warmup_steps:
        return (step + 1) / (cfg.warmup_steps + 1)
    if cfg.cooldown_steps:
        into = step - (cfg.steps - cfg.cooldown_steps) + 1  # steps into the cooldown, this one included
        return 1.0 - (1.0 - cfg.min_lr_ratio) * min(1.0, max(0.0, into / cfg.cooldown_steps))
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class Diverged(RuntimeError):
    """The loss or the gradients stopped being finite. The step that found it was not applied, so the weights and
    the last checkpoint are still good."""


def step_if_finite(optimizer: torch.optim.Optimizer, grad_norm: torch.Tensor, loss: float | torch.Tensor = 0.0
                   ) -> None:
    """`optimizer.step()`, unless the gradients or the loss are NaN or infinite: one such step makes every weight
    NaN (and AdamW's moments with them), and the run would go on reporting `loss: null`. (One device sync per
    optimizer step, which a GRPO step takes a handful of.)"""
    if not (math.isfinite(float(grad_norm)) and math.isfinite(float(loss))):
        raise Diverged(f"the {'gradients are' if not math.isfinite(float(grad_norm)) else 'loss is'} not finite "
                       f"(grad norm {float(grad_norm):g}, loss {float(loss):g})")
    optimizer.step()


def compute_dtype(dtype: str, kind: str) -> tuple[bool, str]:
    """Whether a run on a `kind` device computes under bf16 autocast, and why, for the run's header (empty when
    --dtype said so). --dtype auto takes bf16 where the hardware multiplies bf16 several times faster than float32:
    on CUDA, and on a CPU with AMX (`cpu_bf16`). AVX-512 BF16 only doubles the products' rate, which a step turned
    into 0.9-1.3x by command and shape (BENCHMARKS.md, issues 44 and 68: SFT 1.00x on the chess-cpu shape, 1.28x
    on the chess-play shape, 1.22x on GPT-2 small; GRPO 0.8-0.9x on GPT-2 small, whose update cannot reuse
    sampling's products under autocast), so there and elsewhere it keeps float32, which is also what reproduces
    the shipped models bit for bit; --dtype bf16 takes the gain where there is one."""
    if dtype != "auto":
        return dtype == "bf16", ""
    if kind == "cuda":
        return True, ": --dtype auto on CUDA"
    flag = cpu_bf16() if kind == "cpu" else None
    if flag == "amx_bf16":
        return True, ": --dtype auto and the CPU has AMX (amx_bf16)"
    if flag is not None:
        return False, f": --dtype auto; the CPU's {flag} measured 0.9-1.3x fp32 by shape, --dtype bf16 takes it"
    if kind == "cpu":
        return False, f": --dtype auto and the CPU has no {' or '.join(BF16_FLAGS)}"
    return False, f": --dtype auto on {kind}"


def complete_message(command: str, cfg: RunConfig, step: int) -> str:
    return (f"the run is complete: step {step} of --steps {cfg.steps}; to train longer, rookworld {command} "
            f"--resume {cfg.output_dir} --steps N with N > {step}")


@dataclass(frozen=True)
class Context:
    """Where a command runs, settled when it starts and the same to its end (`start`): its ranks and the
    collectives between them, its device, how it computes (the autocast dtype, what compiles), the checkpoint it
    resumes, the model directory it loads, and its output directory's lock, log and compile report."""

    dist: DistInfo
    comm: Comm
    device: torch.device
    amp_dtype: torch.dtype | None
    compile: bool  # decoding (the decode step and the draw)
    compile_logprobs: bool  # the log-prob passes
    resume_from: Path | None
    model_dir: Path | None  # None when the command brought its own policy
    log: RunLog
    lock: RunDirectoryLock | None
    compiles: CompileReport | None  # what compiling costs, said where the user sees it; None when nothing compiles

    @property
    def cores(self) -> int:
        """This rank's share of the machine's cores."""
        return cores_of(self.dist)


def cores_of(dist: DistInfo) -> int:
    return max(1, (os.cpu_count() or 1) // dist.local_world)


def start(cfg: RunConfig, command: str, *, loads_model: bool, stream=None, summary: Summary | None = None) -> Context:
    """A command started: its ranks, device and precision placed, the checkpoint it resumes and the model it loads
    found, its output directory locked and made ready, its log opened, and its header said. Everything a user can
    get wrong is checked before the slow parts (models, engines) and before the header: a model that cannot be
    found (a typo, a hub out of reach) is one line and no run directory."""
    kind = resolve_device(cfg.device).type
    dist = init_distributed(kind)
    cfg.check_world(dist.world)
    device = resolve_device(cfg.device, dist.local_rank)
    use_every_core(device, dist)
    if kind == "cuda":
        # TF32 for the float32 products (fp32 runs, the optimizer's): the API every torch since 1.12 has, which
        # newer ones map to their own fp32_precision settings.
        torch.set_float32_matmul_precision("high")
    bf16, why = compute_dtype(cfg.dtype, kind)
    torch.manual_seed(cfg.seed)
    resume_from = checkpoint.resolve_checkpoint(cfg.resume) if cfg.resume else None
    if resume_from is not None:
        checkpoint.check_weights(resume_from)
    model_dir = None
    if loads_model:
        model_dir = model_directory(resume_from or cfg.model, revision=None if resume_from else cfg.revision)
    lock, log = _open_output_dir(cfg, command, resume_from, dist.main, stream, summary)
    compile = cfg.compile and kind == "cuda"
    compiles = CompileReport(log, cfg.output_dir, dist.main) if compile else None
    if compiles is not None and resume_from is not None:
        compiles.load_cache()
    ranks = f", {dist.world} ranks" if dist.enabled else ""
    steps = f"{cfg.steps} step{'s' if cfg.steps != 1 else ''}"
    log.say(f"rookworld {command}: {steps} into {cfg.output_dir} on {device} "
            f"({'bf16 autocast' if bf16 else 'fp32'}{why}{', compiled' if compile else ''}{ranks})")
    return Context(dist, Comm(dist, device), device, torch.bfloat16 if bf16 else None, compile,
                   compile and cfg.compile_logprobs, resume_from, model_dir, log, lock, compiles)


def _open_output_dir(cfg: RunConfig, command: str, resume_from: Path | None, main: bool, stream,
                     summary: Summary | None) -> tuple[RunDirectoryLock | None, RunLog]:
    """The output directory locked and made ready (a resumed run's kept), what a cut-short save left removed,
    and the run's log opened there."""
    lock = RunDirectoryLock(Path(cfg.output_dir), command) if main else None
    try:
        prepare_output_dir(cfg, resume_from, main, command)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    leftovers = checkpoint.remove_leftovers(cfg.output_dir) if main else []
    reporting = Reporting(cfg.reporters, cfg.wandb_project, cfg.to_dict(), command)
    log = RunLog(cfg.output_dir, cfg.steps, enabled=main, stream=stream, summary=summary, reporting=reporting)
    if leftovers:
        log.say(f"removed what a save cut short left: {', '.join(p.name for p in leftovers)}")
    return lock, log


def use_every_core(device: torch.device, dist: DistInfo) -> None:
    """On the CPU, torch takes every core of this rank's share for every phase (an explicit OMP_NUM_THREADS
    is obeyed). Nothing else computes while it does: Stockfish analyses while torch waits (the reward phase,
    an evaluation's scoring), so no core is kept for it; kept, it idled through generation and the update
    for the second or so an engine works in a step. Freed memory is kept for reuse (`keep_freed_memory`)."""
    if device.type != "cpu":
        return
    keep_freed_memory()
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(cores_of(dist))


def optimizer_for(policy: nn.Module, cfg: RunConfig, extra_groups: Sequence[dict] = ()) -> torch.optim.Optimizer:
    """AdamW over the policy and `extra_groups`, weight decay on the matrices; or with --optimizer muon, `Muon` over
    the blocks' matrices (not the embeddings: a row is looked up, not multiplied) and AdamW over the rest."""
    embeddings = {id(m.weight) for m in policy.modules() if isinstance(m, nn.Embedding)}
    decay = [p for p in policy.parameters() if p.dim() >= 2]
    no_decay = [p for p in policy.parameters() if p.dim() < 2]
    if cfg.optimizer == "muon":
        matrices = [p for p in decay if id(p) not in embeddings]
        groups = [{"params": matrices, "weight_decay": cfg.weight_decay, "use_muon": True},
                  {"params": [p for p in decay if id(p) in embeddings], "weight_decay": cfg.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}, *extra_groups]
        return Muon(groups, lr=cfg.lr, betas=(0.9, 0.95))
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0},
              *extra_groups]
    # Fused on the CPU too: one pass over each parameter's state, where foreach made a temporary per term
    # (GPT-2 small: 0.06 s a step against 0.6 s here).
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=next(policy.parameters()).device.type in ("cuda", "cpu"))


def saved_optimizer(state: dict[str, Any]) -> str | None:
    """The --optimizer a saved trainer state was made by (None: a state of no known shape, left to `_restore`)."""
    groups = state.get("optimizer", {}).get("param_groups") if isinstance(state.get("optimizer"), dict) else None
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        return None
    return "muon" if any(g.get("use_muon") for g in groups) else "adamw"


class Run:
    """A training command's run: its `Context`, its policy and tokenizer, and what moves as it trains (the step,
    the optimizer and its schedule, a stop asked for); `loop` calls the command's step until the end."""

    def __init__(self, cfg: RunConfig, *, command: str, policy: nn.Module | None = None, tokenizer=None,
                 stream=None, summary: Summary | None = None, label: str | None = None):
        """``label`` names a `policy` given fresh, for the header. Every checkpoint also writes the model into the
        output directory itself, which then loads as a model (``--model``, ``rookworld eval``, transformers)."""
        self.cfg, self.command = cfg, command
        self.context = context = start(cfg, command, loads_model=policy is None, stream=stream, summary=summary)
        #: The fingerprints of what the run started from besides its policy (GRPO's reference), saved with each
        #: checkpoint.
        self.fingerprints: dict[str, str | None] = {}
        self._closed = False
        source = context.resume_from or cfg.model or label
        if policy is None:
            policy = from_pretrained(context.model_dir, device=self.device, training=True)
        self.policy = policy.to(self.device).eval()  # eval(): dropout stays off
        # The vocabulary of the model's own directory when it has one (a download, a checkpoint of ours).
        self.tokenizer = tokenizer or get_tokenizer(context.model_dir)
        n_params = sum(p.numel() for p in self.policy.parameters())
        self.log.say(f"model: {source} ({n_params / 1e6:.1f}M parameters)")
        if self.resume_from is None:
            for text in schedule_warnings(command, cfg.lr, cfg.warmup_steps, cfg.steps, n_params):
                self.log.say(f"warning: {text}")
        self.step = 0
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler = None
        self.interrupted = False  # set when a run stopped early on Ctrl-C or SIGTERM (after saving)
        self.stop = Stop(self.log.say, lambda: self.step, alone=not self.dist.enabled)

    # What the run's context settled, read as the run's own (and, as the context's, never changed).
    dist = property(lambda self: self.context.dist)
    comm = property(lambda self: self.context.comm)
    device = property(lambda self: self.context.device)
    amp_dtype = property(lambda self: self.context.amp_dtype)
    compile = property(lambda self: self.context.compile)
    compile_logprobs = property(lambda self: self.context.compile_logprobs)
    resume_from = property(lambda self: self.context.resume_from)
    log = property(lambda self: self.context.log)
    compiles = property(lambda self: self.context.compiles)
    cores = property(lambda self: self.context.cores)

    def build_optimizer(self, extra_groups: Sequence[dict] = ()) -> dict[str, Any]:
        """--optimizer over the policy and `extra_groups` (`optimizer_for`) and its schedule (`lr_factor`); on resume,
        their saved state and the RNG. Returns the command's own saved state (empty for a new run)."""
        cfg = self.cfg
        self.optimizer = optimizer_for(self.policy, cfg, extra_groups)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, cfg))
        state: dict[str, Any] = {}
        if self.resume_from is not None:
            state = checkpoint.load_state(self.resume_from)
            saved = saved_optimizer(state)
            if saved not in (None, cfg.optimizer):
                raise checkpoint.CheckpointError(
                    f"cannot resume from {self.resume_from} with --optimizer {cfg.optimizer}: it was trained with "
                    f"--optimizer {saved}, whose state the other cannot take; resume with --optimizer {saved}, or "
                    f"train its model as a new run with --model {self.resume_from} --output-dir NEW_DIR")
            try:
                self._restore(state)
            except (KeyError, TypeError, ValueError, RuntimeError) as e:  # not a state saved for these weights
                why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                raise checkpoint.CheckpointError(
                    f"cannot resume from {self.resume_from}: its {checkpoint.STATE_FILE} does not fit its model "
                    f"({why}); resume from another checkpoint of the run, or train its model as a new run with "
                    f"--model {self.resume_from} --output-dir NEW_DIR") from None
        self.log.start(self.step)
        return state

    def _restore(self, state: dict[str, Any]) -> None:
        """The optimizer, the schedule, the step and the generators of a resumed run from its saved state."""
        cfg = self.cfg
        checkpoint.load_optimizer_state(self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        # The saved lr belongs to the saved schedule; a resume with more --steps has a longer one, whose lr
        # must hold from the first resumed step (the same value when --steps is unchanged).
        for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs, strict=True):
            group["lr"] = base * lr_factor(self.scheduler.last_epoch, cfg)
        step = state["step"]
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"its step is {step!r}")
        self.step = step
        checkpoint.set_rng_state(state["rng"])

    def save(self, state: dict[str, Any], modules: dict[str, nn.Module] | None = None,
             rng: dict[str, Any] | None = None) -> Path | None:
        """A checkpoint of step `self.step`; `rng` is the generators' state when that step ended, where they have
        moved on since (a step begun and abandoned)."""
        if not self.dist.main:
            return None
        full = {"step": self.step, "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "rng": rng or checkpoint.rng_state(), "world_size": self.dist.world, **state}
        with self.applying():  # a Ctrl-C during the save lets it finish; the save is atomic against harder stops
            try:
                saved = checkpoint.Saved(self.policy, full, self.cfg.to_dict(), modules or {}, self.tokenizer,
                                         self.fingerprints, self.command)
                path = checkpoint.save_checkpoint(self.cfg.output_dir, self.step, saved, self.cfg.keep_checkpoints)
                save_pretrained(self.policy, self.cfg.output_dir)
                self.tokenizer.save_pretrained(self.cfg.output_dir)
            except (OSError, RuntimeError) as e:
                raise checkpoint.save_failure(self.cfg.output_dir, self.step, e, self.checkpoint_bytes()) from None
        self.log.say(f"saved checkpoint {path}")
        return path

    def checkpoint_bytes(self) -> int:
        """About what a save writes: the weights in the checkpoint and again in the output directory, and AdamW's
        two moments (fp32, as the weights)."""
        return 4 * sum(p.numel() * p.element_size() for p in self.policy.parameters())

    def autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def applying(self):
        """The weights (or a checkpoint) are being written: a second Ctrl-C lets this finish, a third aborts."""
        return self.stop.during(Doing.APPLYING)

    def loop(self, step: Callable[[], dict[str, Any]], *, state: Callable[[], dict[str, Any]],
             modules: Callable[[], dict[str, nn.Module]] = dict, evaluate: Callable[[], dict[str, Any]] | None = None,
             samples: Callable[[], None] | None = None, sample_every: int = 0) -> dict[str, Any]:
        """Calls `step` (which advances `self.step` and returns its metrics) until `cfg.steps`, with periodic
        evaluation (rank 0; the first at step 0, before any update), samples, checkpoints, and a checkpoint on
        Ctrl-C/SIGTERM or at the end."""
        cfg = self.cfg
        if not self._ready_to_loop():
            return {}
        last: dict[str, Any] = {}
        saved_at = self.step
        try:
            with self._stops_on_signals():
                self.log.begin_steps()
                last_eval = self._first_evaluation(evaluate)
                while self.step < cfg.steps and not self.interrupted:
                    # What a checkpoint of the last step holds that the next one changes before its weights (the
                    # generators, the EMA baselines): kept, so that an abandoned step leaves no trace.
                    before = checkpoint.rng_state(), state()
                    try:
                        m = step()
                    except StepAbandoned:
                        self.log.say(f"step {self.step + 1} dropped before it changed a weight; saving step "
                                     f"{self.step}")
                        self.interrupted = True
                        if saved_at != self.step:
                            self.save(before[1], modules(), rng=before[0])
                            saved_at = self.step
                        break
                    if self._after_step(m, evaluate, samples if sample_every else None, sample_every):
                        last_eval = m
                    last = m
                    if cfg.save_every and self.step % cfg.save_every == 0:
                        self.save(state(), modules())
                        saved_at = self.step
                    if self.comm.any(self.stop.requested):
                        self.interrupted = self.step < cfg.steps
                        break
                if saved_at != self.step:
                    self.save(state(), modules())
                if not self.interrupted:
                    self.log.finish(self.command, self.step, last_eval)
        finally:
            self.close()
        return last

    def _ready_to_loop(self) -> bool:
        """Whether the loop has steps to run (else the run is closed, said complete), with room for a checkpoint."""
        if self.resume_from is not None:
            self.log.say(f"resumed from {self.resume_from} at step {self.step}")
        if self.step >= self.cfg.steps:
            self.log.say(complete_message(self.command, self.cfg, self.step))
            self.close()
            return False
        if self.dist.main:
            checkpoint.check_room(self.cfg.output_dir, self.checkpoint_bytes())
        return True

    @contextlib.contextmanager
    def _stops_on_signals(self):
        """Ctrl-C and SIGTERM go to `self.stop` while the loop runs; the handlers before it come back after."""
        previous = {}
        if threading.current_thread() is threading.main_thread():  # signals reach only the main thread
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self.stop)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _first_evaluation(self, evaluate: Callable[[], dict[str, Any]] | None) -> dict[str, Any] | None:
        """Where the run starts, before any update: every curve (metrics.jsonl, TensorBoard, plot) begins at step
        0, and the closing lines compare the end with it. A resumed run has its row already."""
        if evaluate is None or not self.cfg.eval_every or self.step != 0:
            return None
        m, last_eval = {"step": 0}, None
        if self._evaluated(evaluate, m):
            self._report_compiles(m)
            self.log.step(m, log_line=False)
            last_eval = m
        self.interrupted = self.comm.any(self.stop.requested)
        return last_eval

    def _after_step(self, m: dict[str, Any], evaluate: Callable[[], dict[str, Any]] | None,
                    samples: Callable[[], None] | None, sample_every: int) -> bool:
        """A step's evaluation (when due), row, line and samples; whether it was evaluated."""
        cfg, final = self.cfg, self.step == self.cfg.steps
        evaluated = evaluate is not None and cfg.eval_every and self.step % cfg.eval_every == 0 \
            and self._evaluated(evaluate, m)
        m["eta_s"] = self.log.eta(self.step)
        self._report_compiles(m)
        self.log.step(m, log_line=self.step % cfg.log_every == 0 or final)
        # The last step's samples too, so that a run shorter than --sample-every still shows some.
        if samples is not None and (self.step % sample_every == 0 or final) and self.dist.main:
            samples()
        return bool(evaluated)

    def _report_compiles(self, m: dict[str, Any]) -> None:
        if self.compiles is not None:
            self.compiles.after_step(m)

    def _evaluated(self, evaluate: Callable[[], dict[str, Any]], m: dict[str, Any]) -> bool:
        """The held-out evaluation into `m`, timed, and its line; False when Ctrl-C stopped it."""
        t0 = time.perf_counter()
        evaluated = self._evaluate(evaluate, m)
        self.comm.barrier()
        if evaluated:
            m["time/eval"] = time.perf_counter() - t0
            self.log.eval_line(self.step, m, m["time/eval"])
        return evaluated

    def _evaluate(self, evaluate: Callable[[], dict[str, Any]], m: dict[str, Any]) -> bool:
        """The held-out evaluation into `m` (rank 0); False when Ctrl-C stopped it."""
        if not self.dist.main:
            return True
        self.log.status(f"step {self.step}/{self.cfg.steps} | evaluating on held-out positions ...")
        try:
            with self.stop.during(Doing.EVALUATING):
                m.update(evaluate())
            return True
        except EvaluationStopped:
            saving = f"saving step {self.step}" if self.step else "no step was done, so nothing is saved"
            self.log.say(f"evaluation at step {self.step} stopped (its partial figures are dropped); {saving}")
            return False

    def close(self) -> None:
        """The run log closed and the output directory free for the next run (a process's exit frees it too)."""
        if self._closed:
            return
        self._closed = True
        self.log.close()
        if self.context.lock is not None:
            self.context.lock.release()
