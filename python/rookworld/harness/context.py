"""How a training command starts (`start`): its ranks, device, dtype and compilation settled, the checkpoint it
resumes and the model it loads found, its output directory locked and its log opened, all kept in one frozen
`Context` for the run's life."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from rookworld.harness import checkpoint
from rookworld.harness.compiles import CompileReport
from rookworld.harness.distributed import Comm, DistInfo, init_distributed, name_ranks
from rookworld.harness.rundir import RunDirectoryLock, prepare_output_dir
from rookworld.harness.runlog import Reporting, RunLog, Summary
from rookworld.harness.process import cores_of, settle_process
from rookworld.net.device import BF16_FLAGS, cpu_bf16, resolve_device
from rookworld.net.pretrained import model_directory
from rookworld.settings.base import ConfigError
from rookworld.settings.config import RunConfig


def compute_dtype(dtype: str, kind: str) -> tuple[bool, str]:
    """Whether a run on a `kind` device computes under bf16 autocast, and why, for the run's header (empty when
    --dtype said so). --dtype auto takes bf16 where the hardware multiplies bf16 several times faster than float32:
    on CUDA, and on a CPU with AMX (`cpu_bf16`). AVX-512 BF16 only doubles the products' rate, which a whole step
    turns into a gain for some commands and shapes and a loss for others (GRPO's update cannot reuse sampling's
    products under autocast; BENCHMARKS.md, "bf16 on the CPU", has the figures), so there and elsewhere it keeps
    float32, which is also what reproduces the shipped models bit for bit; --dtype bf16 takes the gain where there
    is one."""
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
    process_settings: bool  # it set the process's seed, threads and precision (`settle_process`)

    @property
    def cores(self) -> int:
        """This rank's share of the machine's cores."""
        return cores_of(self.dist)


def start(cfg: RunConfig, command: str, *, loads_model: bool, stream=None, summary: Summary | None = None,
          process_settings: bool = False) -> Context:
    """A command started: its ranks, device and precision placed, the checkpoint it resumes and the model it loads
    found, its output directory locked and made ready, its log opened, and its header said. Everything a user can
    get wrong is checked before the slow parts (models, engines) and before the header: a model that cannot be
    found (a typo, a hub out of reach) is one line and no run directory."""
    kind = resolve_device(cfg.device).type
    dist = init_distributed(kind)
    device = resolve_device(cfg.device, dist.local_rank)
    comm = Comm(dist, device)
    changed = settle_process(device, dist, cfg.seed) if process_settings else []
    bf16, why = compute_dtype(cfg.dtype, kind)
    try:
        resume_from, model_dir, lock = _agreed(cfg, command, loads_model, comm)
        log = _open_output_dir(cfg, command, resume_from, lock, stream, summary)
    except BaseException:
        # A group left to the interpreter's exit can abort it ("terminate called without an active exception",
        # a refusing rank in CI) after its one line.
        comm.close()
        raise
    compile = cfg.compile and kind == "cuda"
    compiles = CompileReport(log, cfg.output_dir, dist.main) if compile else None
    if compiles is not None and resume_from is not None:
        compiles.load_cache(trusted=cfg.trust_compile_cache)
    ranks = f", {dist.world} ranks" if dist.enabled else ""
    steps = f"{cfg.steps} step{'s' if cfg.steps != 1 else ''}"
    log.say(f"rookworld {command}: {steps} into {cfg.output_dir} on {device} "
            f"({'bf16 autocast' if bf16 else 'fp32'}{why}{', compiled' if compile else ''}{ranks})")
    if changed:
        log.say(f"process: {', '.join(changed)}")
    return Context(dist, comm, device, torch.bfloat16 if bf16 else None, compile,
                   compile and cfg.compile_logprobs, resume_from, model_dir, log, lock, compiles, process_settings)


def _agreed(cfg: RunConfig, command: str, loads_model: bool,
            comm: Comm) -> tuple[Path | None, Path | None, RunDirectoryLock | None]:
    """What every rank checks before any rank writes: the settings against the number of ranks, the checkpoint
    it resumes, the model it loads, and the output directory (rank 0 holding its lock). Then the ranks agree:
    one rank's refusal ends every rank at once, where alone it left the others waiting for it until the
    collectives' timeout; and rank 0 writes to the directory only once every rank has read it, where a rank
    reading it after rank 0 had begun took rank 0's own files for someone else's (a race CI met)."""
    dist, lock, refusal = comm.info, None, None
    resume_from = model_dir = None
    try:
        cfg.check_world(dist.world)
        resume_from = checkpoint.resolve_checkpoint(cfg.resume) if cfg.resume else None
        if resume_from is not None:
            checkpoint.check_weights(resume_from)
        if loads_model:
            model_dir = model_directory(resume_from or cfg.model, revision=None if resume_from else cfg.revision)
        lock = RunDirectoryLock(Path(cfg.output_dir), command) if dist.main else None
        prepare_output_dir(cfg, resume_from, command, write=False)
    except (ConfigError, OSError) as e:
        refusal = e
    refused = comm.which(refusal is not None)
    if refused:
        if lock is not None:
            lock.release()
        if refusal is not None:
            raise refusal
        raise ConfigError(f"{name_ranks(refused)} of {dist.world} refused to start (its own line says why), "
                          "so no rank did")
    return resume_from, model_dir, lock


def _open_output_dir(cfg: RunConfig, command: str, resume_from: Path | None, lock: RunDirectoryLock | None, stream,
                     summary: Summary | None) -> RunLog:
    """The output directory made ready by rank 0, which holds its lock (a resumed run's kept), what a cut-short
    save left removed, and the run's log opened there."""
    main = lock is not None  # rank 0, the only one holding it
    try:
        if main:
            prepare_output_dir(cfg, resume_from, command, write=True)
    except BaseException:
        lock.release()
        raise
    leftovers = checkpoint.remove_leftovers(cfg.output_dir) if main else []
    reporting = Reporting(cfg.reporters, cfg.wandb_project, cfg.to_dict(), command)
    log = RunLog(cfg.output_dir, cfg.steps, enabled=main, stream=stream, summary=summary, reporting=reporting)
    if leftovers:
        log.say(f"removed what a save cut short left: {', '.join(p.name for p in leftovers)}")
    return log
