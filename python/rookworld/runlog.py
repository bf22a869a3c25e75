"""What a training run tells its user: a line every few steps, metrics.jsonl every step, TensorBoard
when it is installed, sample completions, and warnings when training goes wrong."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, TextIO

from rookworld.progress import Progress, _duration


def _num(v: Any) -> Any:
    """JSON-safe: NaN and infinities become null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class RunLog:
    def __init__(self, output_dir: str | Path, total_steps: int, *, enabled: bool = True, resume_step: int = 0,
                 stream: TextIO | None = None, kl_warn: float = 1.0, clip_warn: float = 0.2):
        self.enabled = enabled
        self.total_steps = total_steps
        self.stream = stream if stream is not None else sys.stderr
        self.kl_warn, self.clip_warn = kl_warn, clip_warn
        self.dir = Path(output_dir)
        self._last_warned: dict[str, int] = {}
        self._writer = None
        # A live bar on a terminal only; logs and pipes get the summary lines alone.
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.bar = Progress(total_steps, "train", "step", stream=self.stream, enabled=False)
        self.bar.done = self.bar.first = resume_step
        if not enabled:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.samples_path = self.dir / "samples.jsonl"
        # A resumed run replays the steps after its checkpoint: drop their old rows.
        for path in (self.metrics_path, self.samples_path):
            if path.exists():
                kept = [line for line in path.read_text().splitlines()
                        if line.strip() and json.loads(line).get("step", 0) <= resume_step]
                path.write_text("".join(line + "\n" for line in kept))
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.dir / "tensorboard"), purge_step=resume_step + 1)
        except Exception:  # tensorboard not installed: metrics.jsonl has everything
            self._writer = None

    def say(self, text: str) -> None:
        if self.enabled:
            clear = "\r\033[K" if self.tty else ""
            self.stream.write(clear + text + "\n")
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
        if not self.enabled:
            return
        with self.metrics_path.open("a") as f:
            f.write(json.dumps({k: _num(v) for k, v in m.items()}) + "\n")
        if self._writer is not None:
            for k, v in m.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and k != "step":
                    self._writer.add_scalar(k, v, m["step"])
        self.bar.done = m["step"]
        if log_line:
            self.say(self.line(m))
        elif self.tty:
            self.stream.write("\r\033[K" + self.bar.line())
            self.stream.flush()
        self.check(m)

    def line(self, m: dict[str, Any]) -> str:
        def f(key: str, fmt: str = "{:.3f}") -> str:
            v = m.get(key)
            return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt.format(v)

        eta = m.get("eta_s")
        parts = [
            f"step {m['step']}/{self.total_steps}",
            f"reward {f('reward/mean')} (best {f('reward/best')})",
            f"P {f('reward/P/mean', '{:.2f}')} A {f('reward/A/mean', '{:.2f}')}",
            f"kl {f('kl/mean')}",
            f"clip {f('clip_fraction', '{:.2f}')}",
            f"{f('time/step', '{:.2f}')} s",
            f"{f('samples_per_s', '{:,.0f}')} samples/s",
        ]
        if eta is not None:
            parts.append(f"eta {_duration(eta)}")
        return " | ".join(parts)

    def check(self, m: dict[str, Any]) -> None:
        step = m["step"]
        kl = m.get("kl/mean")
        if kl is not None and math.isfinite(kl) and kl > self.kl_warn:
            self.warn("kl", step, f"KL to the reference is {kl:.3f} per token (> {self.kl_warn}): the policy is "
                                  "drifting fast; consider a lower --lr or a higher --beta")
        spread = m.get("groups/zero_spread")
        if spread is not None and spread > 0.5:
            self.warn("spread", step, f"{100 * spread:.0f}% of groups have no reward spread and teach nothing; "
                                      "consider a higher --temperature or a larger --group-size")
        clip = m.get("clip_fraction")
        if clip is not None and math.isfinite(clip) and clip > self.clip_warn:
            self.warn("clip", step, f"clip fraction {clip:.2f} (> {self.clip_warn}): updates are too large; "
                                    "consider a lower --lr or fewer --mu epochs")

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        if not self.enabled:
            return
        with self.samples_path.open("a") as f:
            for row in rows:
                f.write(json.dumps({"step": step, **row}) + "\n")

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
        if self._writer is not None:
            self._writer.close()
