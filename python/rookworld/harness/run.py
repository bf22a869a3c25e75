"""What every training command's loop calls on: a `Run` holds the policy and its tokenizer, the optimizer and its
schedule, and the step; it saves and resumes them, runs a step so that a stop leaves no half of it, evaluates, logs
and says when something is due. The loop itself is the command's (`Trainer.train`, `SFTTrainer.train`), top to
bottom in one screen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from torch import nn

from rookworld.harness import checkpoint
from rookworld.harness.context import start
from rookworld.harness.optimizer import Diverged, check_saved_optimizer, lr_factor, optimizer_for
from rookworld.harness.runlog import Summary
from rookworld.harness.stop import Doing, EvaluationStopped, StepAbandoned, Stop
from rookworld.io.errors import RookworldError
from rookworld.net.pretrained import from_pretrained, save_pretrained
from rookworld.net.tokenizer import get_tokenizer
from rookworld.settings.config import RunConfig
from rookworld.settings.presets import schedule_warnings


def complete_message(command: str, cfg: RunConfig, step: int) -> str:
    return (f"the run is complete: step {step} of --steps {cfg.steps}; to train longer, rookworld {command} "
            f"--resume {cfg.output_dir} --steps N with N > {step}")


def last_checkpoint(output_dir: str | Path) -> Path | None:
    saved = checkpoint.list_checkpoints(output_dir)
    return saved[-1] if saved else None


def resume_command(command: str, output_dir: str | Path) -> str:
    return f"rookworld {command} --resume {output_dir}"


def hint(command: str, output_dir: str | Path, saved: str, unsaved: str) -> str:
    """What to do next: `saved` with the run's last checkpoint ({name}, {path}) and the command that resumes from
    it ({resume}), or `unsaved` when the run has no checkpoint."""
    last = last_checkpoint(output_dir)
    return saved.format(name=last.name, path=last, resume=resume_command(command, output_dir)) if last else unsaved


def room_needed(cfg: RunConfig, step: int, policy: nn.Module) -> tuple[int, int]:
    """What the run's saves still need on its disk at their fullest (`checkpoint.room_needed`): one save every
    --save-every steps to --steps (and the last), beside the checkpoints and model already there."""
    left = cfg.steps - step
    saves = -(-left // cfg.save_every) if cfg.save_every else 1
    kept = min(len(checkpoint.list_checkpoints(cfg.output_dir)), cfg.keep_checkpoints)
    model_there = (Path(cfg.output_dir) / "model.safetensors").is_file()
    stages = checkpoint.kept_stages(step, cfg.steps, cfg.keep_every)
    return checkpoint.room_needed(weights_bytes(policy), saves, kept, cfg.keep_checkpoints, model_there, stages)


class Aborted(RookworldError):
    """A third Ctrl-C or SIGTERM: the run stopped at once, the step in progress not saved."""


def weights_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


class Run:
    """A training command's run: its `Context`, its policy and tokenizer, and what moves as it trains (the step,
    the optimizer and its schedule, a stop asked for); the command's loop calls its services (`step_or_keep`, `due`,
    `record`, `save`, `stop_asked`, `finish`)."""

    def __init__(self, cfg: RunConfig, *, command: str, policy: nn.Module | None = None, tokenizer=None,
                 stream=None, summary: Summary | None = None, label: str | None = None,
                 process_settings: bool = False):
        """``label`` names a `policy` given fresh, for the header. Every checkpoint also writes the model into the
        output directory itself, which then loads as a model (``--model``, ``rookworld eval``, transformers)."""
        self.cfg, self.command = cfg, command
        self.context = context = start(cfg, command, loads_model=policy is None, stream=stream, summary=summary,
                                       process_settings=process_settings)
        # What the context settled that the trainers read at every step, as plain fields (never changed).
        self.dist, self.comm, self.device, self.log = context.dist, context.comm, context.device, context.log
        self.resume_from = context.resume_from
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
        self.saved_at: int | None = None  # the step the run's last checkpoint holds (where it began, at `begin`)
        self.stop = Stop(self.log.say, lambda: self.step, alone=not self.dist.enabled)

    def build_optimizer(self, extra_groups: Sequence[dict] = ()) -> dict[str, Any]:
        """--optimizer over the policy and `extra_groups` (`optimizer_for`) and its schedule (`lr_factor`); on resume,
        their saved state and the RNG. Returns the command's own saved state (empty for a new run)."""
        cfg = self.cfg
        self.optimizer = optimizer_for(self.policy, cfg, extra_groups)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, cfg))
        state: dict[str, Any] = {}
        if self.resume_from is not None:
            state = checkpoint.load_state(self.resume_from)
            check_saved_optimizer(state, cfg.optimizer, self.resume_from)
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
        if self.context.process_settings:  # the generators are the process's: set only when it was asked to
            checkpoint.set_rng_state(state["rng"])

    def save(self, state: dict[str, Any], modules: dict[str, nn.Module] | None = None,
             rng: dict[str, Any] | None = None) -> Path | None:
        """A checkpoint of step `self.step`; `rng` is the generators' state when that step ended, where they have
        moved on since (a step begun and abandoned)."""
        if not self.dist.main:
            return None
        full = {"step": self.step, "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "rng": rng or checkpoint.rng_state(), "world_size": self.dist.world, **state}
        with self.writing():  # a Ctrl-C during the save lets it finish; the save is atomic against harder stops
            try:
                saved = checkpoint.Saved(self.policy, full, self.cfg.to_dict(), modules or {}, self.tokenizer,
                                         self.fingerprints, self.command)
                path = checkpoint.save_checkpoint(self.cfg.output_dir, self.step, saved, self.cfg.keep_checkpoints,
                                                   self.cfg.keep_every)
                save_pretrained(self.policy, self.cfg.output_dir)
                self.tokenizer.save_pretrained(self.cfg.output_dir)
            except (OSError, RuntimeError, SafetensorError) as e:  # safetensors' full disk is none of the others
                # about what a save writes: the weights here and in the output directory, and AdamW's two moments
                failure = checkpoint.save_failure(self.cfg.output_dir, self.step, e, 4 * weights_bytes(self.policy))
                raise checkpoint.SaveFailed(failure.message, self._room_hint()) from None
        self.log.say(f"saved checkpoint {path}")
        self.saved_at = self.step
        return path

    def autocast(self):
        dtype = self.context.amp_dtype
        return contextlib.nullcontext() if dtype is None else torch.autocast(self.device.type, dtype=dtype)

    def decided(self, **settings: Any) -> RunConfig:
        """Settings the run decides as it starts (--auto-batch's prompts per step): its settings from now on, saved
        with every checkpoint, so that a resumed run keeps them. Returned for the command's own copy."""
        self.cfg = dataclasses.replace(self.cfg, **settings)
        return self.cfg

    def writing(self):
        """The weights (or a checkpoint) are being written: a second Ctrl-C lets this finish, a third aborts."""
        return self.stop.during(Doing.WRITING)

    # -- what the loop calls --------------------------------------------------------------------------------------

    def begin(self) -> bool:
        """Whether the run has steps to do (else it is closed and said complete), with room for its checkpoints."""
        self.saved_at = self.step
        if self.resume_from is not None:
            self.log.say(f"resumed from {self.resume_from} at step {self.step}")
        if self.step >= self.cfg.steps:
            self.log.say(complete_message(self.command, self.cfg, self.step))
            self.close()
            return False
        if self.dist.main:
            try:
                checkpoint.check_room(self.cfg.output_dir, room_needed(self.cfg, self.step, self.policy))
            except checkpoint.SaveFailed as e:
                raise checkpoint.SaveFailed(e.message, self._room_hint()) from None
        return True

    @contextlib.contextmanager
    def looping(self):
        """The loop's frame: Ctrl-C and SIGTERM go to `self.stop` while it runs (a third one, which stops at once,
        comes out as `Aborted`), and the run is closed after it, however it ended."""
        try:
            with contextlib.closing(self), self.stop.receiving():
                yield
        except KeyboardInterrupt as e:
            if isinstance(e, (StepAbandoned, EvaluationStopped)):
                raise
            raise Aborted(f"aborted at step {self.step} without saving", self._hint(
                "its last checkpoint is {name}: continue with {resume}", "it saved no checkpoint")) from None

    def first_evaluation(self, evaluate: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        """Where the run starts, before any update: every curve (metrics.jsonl, TensorBoard, plot) begins at step
        0, and the closing lines compare the end with it. A resumed run has its row already."""
        self.log.begin_steps()
        if not self.cfg.eval_every or self.step != 0:
            return None
        m, last_eval = {"step": 0}, None
        if self.evaluate(evaluate, m):
            self._report_compiles(m)
            self.log.step(m, log_line=False)
            last_eval = m
        self.interrupted = self.comm.any(self.stop.requested)
        return last_eval

    def step_or_keep(self, step: Callable[[], dict[str, Any]], state: Callable[[], dict[str, Any]],
                     modules: Callable[[], dict[str, nn.Module]]) -> dict[str, Any] | None:
        """`step()`'s metrics; None when a stop dropped it before it changed a weight (`StepAbandoned`), the step
        before then saved as it ended: the generators and `state()` (the EMA baselines) as they were before it."""
        before = checkpoint.rng_state(), state()
        try:
            return step()
        except Diverged as e:
            raise Diverged(f"stopped at step {self.step + 1}: {e.message}; nothing was saved after it", self._hint(
                "its last checkpoint, {path}, is from before: continue from it with a lower --lr, {resume} --lr X",
                "it saved no checkpoint: start again with a lower --lr (--overwrite)")) from None
        except StepAbandoned:
            self.log.say(f"step {self.step + 1} dropped before it changed a weight; saving step {self.step}")
            self.interrupted = True
            if self.saved_at != self.step:
                self.save(before[1], modules(), rng=before[0])
            return None

    def due(self, every: int) -> bool:
        """Whether something done every `every` steps (0: never) is due after this step; the last step's always is."""
        return bool(every) and (self.step % every == 0 or self.step == self.cfg.steps)

    def record(self, m: dict[str, Any]) -> None:
        """A step's row in metrics.jsonl and the trackers, and its line every --log-every steps (and the last)."""
        m["eta_s"] = self.log.eta(self.step)
        self._report_compiles(m)
        self.log.step(m, log_line=self.due(self.cfg.log_every))

    def stop_asked(self) -> bool:
        """Whether any rank was asked to stop (the step just done is then saved by `finish`)."""
        if not self.comm.any(self.stop.requested):
            return False
        self.interrupted = self.step < self.cfg.steps
        return True

    def finish(self, state: dict[str, Any], modules: dict[str, nn.Module], last_eval: dict[str, Any] | None) -> None:
        """The last step saved (unless it is already), and a run that went to its end said done."""
        if self.saved_at != self.step:
            self.save(state, modules)
        if not self.interrupted:
            self.log.finish(self.command, self.step, last_eval)

    def _hint(self, saved: str, unsaved: str) -> str:
        return hint(self.command, self.cfg.output_dir, saved, unsaved)

    def _room_hint(self) -> str:
        return self._hint("its last checkpoint, {name}, is intact: once there is room, continue with {resume}",
                          "it saved no checkpoint before: start again once there is room")

    def _report_compiles(self, m: dict[str, Any]) -> None:
        if self.context.compiles is not None:
            self.context.compiles.after_step(m)

    def evaluate(self, evaluate: Callable[[], dict[str, Any]], m: dict[str, Any]) -> bool:
        """The held-out evaluation into `m`, timed, and its line; False when Ctrl-C stopped it."""
        t0 = time.perf_counter()
        evaluated = self._evaluate(evaluate, m)
        self.comm.barrier()
        if evaluated:
            m["time/eval"] = time.perf_counter() - t0
            self.log.eval_line(self.step, m, m["time/eval"], self.cfg.eval_every)
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
