"""Ctrl-C and SIGTERM during a training run: one small object that counts them and knows what the run is doing,
so that each signal does the least harm. The run's loop asks one question of it: `stop.requested`."""

from __future__ import annotations

import contextlib
import enum
import signal
import threading
from collections.abc import Callable, Iterator


class EvaluationStopped(KeyboardInterrupt):
    """Ctrl-C during a held-out evaluation: its partial figures are not training state, so it stops at once."""


class StepAbandoned(KeyboardInterrupt):
    """A second Ctrl-C before the step in progress changed any weight: the step is dropped, the last one kept."""


class Doing(enum.Enum):
    STEPPING = "stepping"      # sampling, scoring, the loss: nothing written yet
    EVALUATING = "evaluating"  # a held-out evaluation: its figures can be dropped
    WRITING = "writing"        # the weights or a checkpoint are being written: stopping now leaves them half done


class Stop:
    """The signals a run got, and what it is doing. The first stops a held-out evaluation at once, or else lets the
    step end; either way that step is saved. A second drops the step in progress if it has not changed a weight yet
    (never under torchrun, where every rank must drop a step or none), or else lets it end. A third aborts without
    saving. `say` tells the user; `steps` is the number of steps done."""

    def __init__(self, say: Callable[[str], None], steps: Callable[[], int], *, alone: bool):
        self.say, self.steps, self.alone = say, steps, alone
        self.signals = 0
        self.terminated = False  # one of them was SIGTERM: the command ends as a terminated one (143)
        self.doing = Doing.STEPPING

    @property
    def requested(self) -> bool:
        return self.signals > 0

    @contextlib.contextmanager
    def during(self, doing: Doing) -> Iterator[None]:
        before, self.doing = self.doing, doing
        try:
            yield
        finally:
            self.doing = before

    @contextlib.contextmanager
    def receiving(self) -> Iterator[None]:
        """Ctrl-C and SIGTERM come here while it lasts (the run's loop); the handlers before it come back after."""
        previous = {}
        if threading.current_thread() is threading.main_thread():  # signals reach only the main thread
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def __call__(self, signum, frame) -> None:
        """The signal handler."""
        self.signals += 1
        self.terminated = self.terminated or signum == signal.SIGTERM
        done, again = self.steps(), "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
        if self.signals == 1:
            if self.doing is Doing.EVALUATING:
                raise EvaluationStopped
            self.say(f"stopping after step {done + 1} and saving it ({again} again to stop at once, keeping "
                     f"step {done})")
        elif self.signals == 2 and self.doing is not Doing.WRITING and self.alone:
            raise StepAbandoned
        elif self.signals == 2:
            self.say(f"the weights are being written: step {done + 1} ends and is saved first ({again} again "
                     f"to abort without saving)")
        else:
            raise KeyboardInterrupt
