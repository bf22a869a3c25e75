"""What a training run tells its user: a header, a line every few steps, an evaluation line, metrics.jsonl
every step, sample completions, and warnings; and what it reports to (`--report-to`): TensorBoard event files
when it is installed, Weights & Biases."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shlex
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from rookworld.io.files import atomic_write, kind, lines_within
from rookworld.io.progress import Progress, _duration
from rookworld.io.quote import for_terminal
from rookworld.lm.suites import OUTCOMES_KEY
from rookworld.harness.heldout import HELD_OUT_FILE, change_line
from rookworld.harness.rundir import RunDirectoryLock, json_row, mark, metric_rows
from rookworld.settings import presets
from rookworld.settings.commands import EvalSettings
from rookworld.settings.config import ConfigError
from rookworld.settings.groups import parse_suites
from rookworld.harness.trackers import Reporting, TensorBoardSink, WandbSink, scalars

#: The parts of a command's summary line after "step N/M", from the step's metrics.
Summary = Callable[[dict[str, Any]], list[str]]


def _num(v: Any) -> Any:
    """JSON-safe: NaN and infinities become null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def fmt(m: dict[str, Any], key: str, fmt: str = "{:.3f}") -> str:
    """A metric for a summary line: '-' when it is missing or not finite."""
    v = m.get(key)
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt.format(v)


#: Each task's figures on an evaluation line, the chess first (what the README's tables lead with), then the
#: format validity and the reward.
EVAL_FIGURES = {"P": [("legal_best_move", "legal best move"), ("top5_accuracy", "best move in top 5"),
                      ("best_move_accuracy", "best move")],
                "A": [("next_state_exact", "next state exact")]}


def eval_figures(m: dict[str, Any]) -> list[str]:
    """The headline evaluation figures per task: its chess, then format validity and reward."""
    parts = []
    for task, figures in EVAL_FIGURES.items():
        if f"eval/{task}/mean_reward" in m:
            chess = ", ".join(f"{label} {fmt(m, f'eval/{task}/{key}', '{:.1%}')}" for key, label in figures)
            parts.append(f"{task}: {chess} (format {fmt(m, f'eval/{task}/format_valid', '{:.0%}')}, reward "
                         f"{fmt(m, f'eval/{task}/mean_reward')})")
    for key, label, form in (("eval/mate-in-one/mate_rate", "mate-in-one", "{:.0%}"),
                             ("eval/selfplay/greedy/legal_half_moves", "selfplay", "{:.1f} legal half-moves"),
                             ("eval/vs-stockfish/score", "vs Stockfish", "{:.0%}")):
        if key in m:
            parts.append(f"{label} {fmt(m, key, form)}")
    if "eval/loss" in m:
        parts.append(f"loss {fmt(m, 'eval/loss', '{:.4f}')}")
    return parts


def first_eval(rows: list[dict[str, Any]], before: int) -> dict[str, Any] | None:
    """The run's first evaluation before step `before`; None if none."""
    return next((row for row in rows if isinstance(row.get("step"), int) and row["step"] < before
                 and any(k.startswith("eval/") for k in row)), None)


def eval_peaks(rows: list[dict[str, Any]]) -> list[str]:
    """Where each headline held-out figure was at its best over a run's evaluations (the earliest step of a tie;
    a step logged twice, before and after a resume, by its last row): where the curve stopped paying. None for two
    evaluations or fewer, which the first and last say whole."""
    evals = {row["step"]: row for row in rows
             if isinstance(row.get("step"), int) and any(k.startswith("eval/") for k in row)}
    if len(evals) < 3:
        return []
    wanted = [(f"eval/{task}/{key}", f"{task}: {label}", max, "{:.1%}")
              for task, figures in EVAL_FIGURES.items() for key, label in figures]
    parts = []
    for key, label, best, form in [*wanted, ("eval/loss", "loss", min, "{:.4f}")]:
        found = sorted((step, v) for step, row in evals.items()
                       if isinstance(v := row.get(key), (int, float)) and math.isfinite(v))
        if found:
            step, value = best(found, key=lambda f: f[1])  # the first of equals: sorted by step
            parts.append(f"{label} {form.format(value)} at step {step}")
    return parts


def eval_command(model: str | Path, config: dict[str, Any] | None) -> str:
    """The `rookworld eval` of a run's model on the positions of the run's own evaluations (the first --eval-size
    of --eval-data, or as many generated), with their Stockfish depth, completion length and suites where they are
    not eval's defaults: its figures are the run's closing ones."""
    parts = ["rookworld eval --model", shlex.quote(str(model))]
    if not config:
        return " ".join(parts)
    defaults = {f.name: f.default for f in dataclasses.fields(EvalSettings)}
    if config.get("eval_data") and _positions_file(config["eval_data"]):
        parts += ["--data", shlex.quote(str(config["eval_data"]))]
    if config.get("eval_size") is not None:  # eval alone would take the whole file
        parts += ["--eval-size", str(config["eval_size"])]
    # The seed draws the generated positions and the A: moves of positions that have none.
    for key in ("seed", "stockfish_depth", "stockfish_nodes", "max_new_tokens"):
        if config.get(key, defaults[key]) != defaults[key]:
            parts += [f"--{key.replace('_', '-')}", str(config[key])]
    suites = config.get("eval_suites", defaults["suite"])
    if suites != defaults["suite"]:
        with contextlib.suppress(ValueError):  # each suite once (a setting of 50,000 repeats was printed back whole)
            parts += ["--suite", ",".join(parse_suites(str(suites)))]
        if any(name in suites for name in ("selfplay", "vs-stockfish")) and config.get("eval_games") is not None:
            parts += ["--games", str(config["eval_games"])]
    return " ".join(parts)


def _positions(m: dict[str, Any]) -> str:
    """How many held-out positions an evaluation's figures are of, as the closing lines say it."""
    n = max((m[key] for key in ("eval/P/n", "eval/A/n") if isinstance(m.get(key), int)), default=None)
    return "" if n is None else f" ({n} positions)"


def _positions_file(path: str) -> bool:
    """Whether `path` is a positions file eval reads again: a regular file (a pipe was read once), and not RookWorld
    text (P:/A: samples), which sft evaluates on and eval does not read."""
    if not os.path.isfile(path):
        return False
    try:
        with open(path, errors="replace") as f:
            first = next((line for line in f if line.strip()), "")
    except OSError:
        return False
    return not first.lstrip().startswith(("P: ", "A: "))


class RunLog:
    def __init__(self, output_dir: str | Path, total_steps: int, *, enabled: bool = True, stream: TextIO | None = None,
                 summary: Summary | None = None, reporting: Reporting = Reporting()):
        self.enabled = enabled
        self.total_steps = total_steps
        self.stream = stream if stream is not None else sys.stderr
        self.summary = summary
        self.dir = Path(output_dir)
        self._last_warned: dict[str, int] = {}
        report_to = reporting.report_to
        self.report_to = tuple(report_to.split(",") if isinstance(report_to, str) else report_to)
        self.wandb_project = reporting.wandb_project
        self.config = reporting.config
        self.command = reporting.command
        self.sinks: list[TensorBoardSink | WandbSink] = []
        self._locks: list = []  # of an output directory made again (`_remake`)
        self._lost = False
        self._t0: float | None = None
        self._logged = 0  # the last step whose row is written
        self._evaluation = (0.0, 0)  # the last held-out evaluation's seconds, and one every how many steps
        # A live bar on a terminal only; logs and pipes get the summary lines alone.
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.bar = Progress(total_steps, "train", "step", stream=self.stream, enabled=False)

    def start(self, resume_step: int = 0) -> None:
        """Opens the files; a resumed run replays the steps after its checkpoint, so their old rows go."""
        self.bar.done = self.bar.first = self._logged = resume_step
        if not self.enabled:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.samples_path = self.dir / "samples.jsonl"
        self.held_out_path = self.dir / HELD_OUT_FILE
        for path in (self.metrics_path, self.samples_path, self.held_out_path):
            if os.path.lexists(path):
                self._keep_rows(path, resume_step)
        # W&B first: it is the one that can fail (no login), and then no event files are left open.
        if "wandb" in self.report_to:
            self.sinks.append(WandbSink(self.dir, self.wandb_project, self.config, self.command))
        if "tensorboard" in self.report_to:
            try:
                self.sinks.append(TensorBoardSink(self.dir, resume_step))
            except ImportError:
                self.say("TensorBoard is not installed: no event files (metrics.jsonl has every figure; "
                         "pip install tensorboard for them)")

    def _keep_rows(self, path: Path, resume_step: int) -> None:
        """The rows of steps up to `resume_step`, written back whole (a crash while writing loses none)."""
        mode = path.lstat().st_mode
        if not stat.S_ISREG(mode):  # a symlink's file is not the run's to rewrite; a FIFO would block the read
            raise ConfigError(f"{path} is {'a symlink' if stat.S_ISLNK(mode) else kind(mode)}, not the file a run "
                              f"writes: remove it, or give another --output-dir")
        kept, torn = [], 0
        with path.open(errors="replace") as f:
            for line in lines_within(f):
                row = json_row(line)
                if row is None:  # a line cut short (a full disk, a kill mid-write), or past any row's length
                    torn += bool(line is None or line.strip())
                    continue
                step = row.get("step", 0)
                if isinstance(step, (int, float)) and step <= resume_step:  # a step that is not a number: not kept
                    kept.append(line)
        if torn:
            self.say(f"warning: {path}: dropped {torn} line{'s' if torn > 1 else ''} that "
                     f"{'were' if torn > 1 else 'was'} cut short")
        with atomic_write(path) as f:
            f.write("".join(line + "\n" for line in kept))

    def _append(self, path: Path, text: str) -> None:
        """`text` at the end of the run's file `path`. An output directory deleted (or moved) under the run is
        made again, and the run goes on: stopping would lose the weights of every step since the last checkpoint,
        which went with the directory, where going on saves them at the next one."""
        if self._lost:
            return
        try:
            with path.open("a") as f:
                f.write(text)
            return
        except (FileNotFoundError, NotADirectoryError):
            if self.dir.is_dir():
                raise
        if self._remake():
            with path.open("a") as f:
                f.write(text)

    def _remake(self) -> bool:
        step = self._logged
        try:
            self._locks.append(RunDirectoryLock(self.dir, self.command))
        except ConfigError as e:  # a file in its place, another run in it: the next save says it in one line
            self._lost = True
            self._drop_event_files()
            self.say(f"warning: the output directory {self.dir} disappeared after step {step}, and cannot be made "
                     f"again: {e}")
            return False
        if self.command is not None:
            mark(self.dir, self.command)
        if self._drop_event_files():
            self.sinks.append(TensorBoardSink(self.dir, step))
        self.say(f"warning: the output directory {self.dir} disappeared after step {step}: made it again, and the "
                 f"run goes on; what it held is gone (metrics before this step, checkpoints), and the next "
                 f"checkpoint saves this run's weights (Ctrl-C saves one now)")
        return True

    def _drop_event_files(self) -> bool:
        """Closes the TensorBoard sink, whose file went with the directory; whether there was one."""
        dropped = [sink for sink in self.sinks if isinstance(sink, TensorBoardSink)]
        self.sinks = [sink for sink in self.sinks if sink not in dropped]
        for sink in dropped:
            try:
                sink.close()
            except OSError:  # its last events had nowhere to go
                pass
        return bool(dropped)

    def begin_steps(self) -> None:
        """The run's clock starts here, after models and engines are up; the rate and the ETA start at the end of
        its first step, which pays for compiling and warming up (`Progress`)."""
        self._t0 = time.perf_counter()
        self.bar.start = time.monotonic()

    def eta(self, step: int) -> float | None:
        """Seconds left once `step` is done, at the rate measured since the end of this run's first step (which
        pays for compiling and warming up), and each held-out evaluation to come as long as the last one took:
        None until there is a rate."""
        self.bar.update(step - self.bar.done)
        left = self.bar.eta()
        seconds, every = self._evaluation
        total = self.total_steps
        # One every `every` steps, and one at the last step when it is not one of those.
        evaluations = total // every - step // every + bool(total % every and step < total) if every else 0
        return None if left is None else left + evaluations * seconds

    def evaluated(self, seconds: float, every: int) -> None:
        """A held-out evaluation (one every `every` steps) took `seconds`: left out of the steps' rate and elapsed
        time, and counted into the time left once for each evaluation to come."""
        self.bar.pause(seconds)
        self._evaluation = (seconds, every)

    def say(self, text: str) -> None:
        if self.enabled:
            clear = "\r\033[K" if self.tty else ""
            self.stream.write(clear + for_terminal(text) + "\n")  # a warning may quote a data line
            if self.tty and self.bar.done:
                self.stream.write(self.bar.line())
            self.stream.flush()

    def warn(self, kind: str, step: int, text: str, every: int = 10) -> None:
        """A warning, at most once every `every` steps per kind."""
        last = self._last_warned.get(kind)
        if last is None or step - last >= every:
            self._last_warned[kind] = step
            self.say(f"warning: step {step}: {text}")

    def step(self, m: dict[str, Any], log_line: bool) -> None:
        """A step's row (or step 0's evaluation)."""
        if not self.enabled:
            return
        self.bar.update(m["step"] - self.bar.done)
        self._append(self.metrics_path, json.dumps({k: _num(v) for k, v in m.items()}) + "\n")
        self._logged = m["step"]
        if self.sinks:
            values = scalars(m)
            for sink in self.sinks:
                sink.scalars(m["step"], values)
        if log_line:
            self.say(self.line(m))
        elif self.tty:
            self.stream.write("\r\033[K" + self.bar.line())
            self.stream.flush()

    def line(self, m: dict[str, Any]) -> str:
        parts = [f"step {m['step']}/{self.total_steps}", *(self.summary(m) if self.summary else [])]
        if m.get("eta_s") is not None:
            parts.append(f"eta {_duration(m['eta_s'])}")
        return " | ".join(parts)

    def status(self, text: str) -> None:
        """On a terminal, `text` in place of the progress bar until the next line (a pipe gets nothing)."""
        if self.tty:
            self.stream.write("\r\033[K" + text)
            self.stream.flush()

    def eval_line(self, step: int, m: dict[str, Any], seconds: float, every: int) -> None:
        """A held-out evaluation's line (one every `every` steps: its time goes into the time left, `evaluated`),
        and its outcome per position (`OUTCOMES_KEY`, taken out of `m`) into held-out.jsonl."""
        outcomes = m.pop(OUTCOMES_KEY, None)
        if self.enabled and outcomes:
            self._append(self.held_out_path, json.dumps({"step": step, **outcomes}) + "\n")
        self.evaluated(seconds, every)
        self.say(" | ".join([f"eval at step {step}", *eval_figures(m), f"{seconds:.1f} s"]))

    def finish(self, command: str, step: int, last_eval: dict[str, Any] | None) -> None:
        """The closing lines: what was done, the held-out figures where the run started and where it ended, where
        the model is and what to do next."""
        took = f" in {_duration(time.perf_counter() - self._t0)}" if self._t0 is not None else ""
        self.say(f"rookworld {command}: done, step {step}/{self.total_steps}{took}")
        if last_eval:
            rows = self._metric_rows()
            first = first_eval(rows, last_eval["step"])
            width = len(str(last_eval["step"]))
            for m in (first, last_eval) if first else (last_eval,):
                self.say(" | ".join([f"held-out at step {m['step']:>{width}}{_positions(m)}", *eval_figures(m)]))
            if first and (change := change_line(self.held_out_path, first["step"], last_eval["step"], EVAL_FIGURES)):
                self.say(change)
            if peaks := eval_peaks(rows):  # beside the first and last evaluations, where each figure peaked
                self.say("held-out peaks: " + ", ".join(peaks))
        self.say(f"model: {self.dir} (step {step}; its checkpoints in {self.dir / 'checkpoints'})")
        self.say(f"evaluate it on its held-out positions: {eval_command(self.dir, self.config)}")
        if command == "sft":
            after = presets.grpo_after(self.dir)
            self.say("train it with GRPO: "
                     + (after or f"rookworld train --model {self.dir} --output-dir {self.dir}-grpo"))
        self.say(f"curves: rookworld plot {self.dir}")

    def _metric_rows(self) -> list[dict[str, Any]]:
        """metrics.jsonl's rows (a resumed run's too); none when the log never opened one."""
        try:
            return metric_rows(self.metrics_path)
        except (OSError, AttributeError):  # no file (yet), or the log never opened one
            return []

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        if not self.enabled:
            return
        self._append(self.samples_path, "".join(json.dumps({"step": step, **row}) + "\n" for row in rows))
        for sink in self.sinks:
            sink.samples(step, rows)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close()
        for lock in self._locks:
            lock.release()
