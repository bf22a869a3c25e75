"""--auto-batch: real GRPO steps at doubling prompts per step, each on this rank alone and undone after, keeping the
largest whose peak GPU memory stays under --memory-target on every rank."""

from __future__ import annotations

import copy
import dataclasses
import gc
import math
from collections.abc import Callable
from typing import Any

import torch

from rookworld.grpo.prompts import PromptSource
from rookworld.harness.distributed import Comm
from rookworld.net.decoding import release_caches
from rookworld.settings.config import ConfigError


def peak_memory_share(device: torch.device) -> float:
    """The most memory the CUDA allocator held since its peak was last reset, as a share of the GPU's. Held, not
    only what tensors occupied: its cached and fragmented blocks are memory no other allocation can have."""
    return torch.cuda.max_memory_reserved(device) / torch.cuda.get_device_properties(device).total_memory


def largest_batch(start: int, limit: int, usable: Callable[[int], bool], fits: Callable[[int], bool]) -> int | None:
    """The largest of start, 2 start, 4 start, ... up to `limit` that `fits` (a trial step under the memory
    target), doubling until one does not; sizes that are not `usable` are skipped untried. None if none fits."""
    chosen, p = None, start
    while p <= limit:
        if usable(p):
            if not fits(p):
                break
            chosen = p
        p *= 2
    return chosen


class BatchSearch:
    """The search over a `grpo.trainer.Trainer` (its step, networks, prompts and run): trial steps that leave it as
    they found it."""

    def __init__(self, trainer):
        self.trainer = trainer

    def trial_step(self, prompts_per_step: int) -> dict[str, Any]:
        """One real step at `prompts_per_step` on this rank alone, after which the weights, the optimizer, the
        schedule and every counter are as they were. The trial's parts are its own, and the run's are untouched:
        prompts at that size, and this rank as a world of one (its rank kept: the seeds depend on it) whose
        trained module has no DDP wrapper.

        Alone: a step's reductions and DDP's gradient all-reduce are collectives, and a rank that runs out of
        memory halfway would leave the others waiting in one it never joins. Memory is the same alone: DDP's
        buckets exist from its construction on, and the reductions move a few numbers."""
        t = self.trainer
        run = t.run
        # Kept on the host: a copy on the device would count against the memory the trial measures.
        weights = {k: v.detach().to("cpu", copy=True) for k, v in t.models.trained.state_dict().items()}
        optimizer, scheduler = copy.deepcopy(run.optimizer.state_dict()), run.scheduler.state_dict()
        step, state = run.step, copy.deepcopy(t.state())
        alone = Comm(dataclasses.replace(run.dist, world=1), run.device)
        self._free_caches()
        try:
            return t.step_with(alone, t.models.alone(), t.prompts.resized(prompts_per_step))[0]
        finally:
            t.models.trained.load_state_dict(weights)
            run.optimizer.load_state_dict(optimizer)
            run.scheduler.load_state_dict(scheduler)
            run.step = step
            t.load_state(state)

    def probe(self, prompts_per_step: int) -> tuple[float, float]:
        """A trial step at `prompts_per_step` on every rank: (the largest share of GPU memory any rank held at its
        peak, inf if one ran out; this rank's seconds). Every rank reaches the one reduction, whatever its trial
        did, so the ranks agree on the outcome."""
        run = self.trainer.run
        try:
            seconds = self.trial_step(prompts_per_step)["time/step"]
            used = peak_memory_share(run.device)
        except torch.cuda.OutOfMemoryError:
            used, seconds = math.inf, math.nan
        return run.comm.max([used])[0], seconds

    def largest(self) -> int:
        """Real steps at doubling prompts-per-step; the largest whose peak GPU memory stays under --memory-target on
        every rank."""
        t = self.trainer
        cfg, run, G = t.cfg, t.run, t.cfg.group_size
        if not isinstance(t.prompts, PromptSource):
            raise ConfigError("--auto-batch works with the built-in prompt source")

        def fits(p: int) -> bool:
            used, seconds = self.probe(p)
            ok = used <= cfg.memory_target
            shown = "out of memory" if math.isinf(used) else f"peak {100 * used:.0f}% of memory, {seconds:.2f} s/step"
            run.log.say(f"auto-batch: {p} prompts x {G} = {p * G} completions: {shown}"
                        f"{'' if ok else ' (over the target)'}")
            return ok

        start = cfg.prompts_per_step
        run.log.say(f"auto-batch: probing prompts-per-step from {start} (x {G} completions), memory target "
                    f"{100 * cfg.memory_target:.0f}%")
        chosen = largest_batch(start, cfg.auto_batch_max, lambda p: (p // run.dist.world * G) % cfg.minibatches == 0,
                               fits)
        self._release_search()
        if chosen is None:
            raise ConfigError(f"--auto-batch: even {start} prompts per step exceed --memory-target "
                              f"{cfg.memory_target}; lower --prompts-per-step, --group-size or --micro-batch-size")
        return chosen

    def _free_caches(self) -> None:
        """Frees what the last step's decoding kept (KV caches) and what the allocator holds unused, so that a trial
        step's peak is its own."""
        if self.trainer.run.device.type == "cuda":
            release_caches()
            torch.cuda.empty_cache()

    def _release_search(self) -> None:
        """Frees what the search compiled. The decode step recorded a CUDA graph for each (batch, cache length)
        tried: their memory pool stays reserved while they live, each is an entry toward dynamo's recompile limit,
        and an out-of-memory may have cut a recording short. Resetting dynamo drops every compiled entry and graph;
        the compiled functions stay, and compile again on their next call (training's shapes only, once)."""
        if self.trainer.run.device.type != "cuda":
            return
        torch.compiler.reset()
        gc.collect()  # a failed step's tensors, in cycles through its traceback
        self._free_caches()
