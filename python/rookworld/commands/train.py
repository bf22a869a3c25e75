"""`rookworld train` (GRPO) and `rookworld sft` (supervised): settings (a resumed run keeps its own), then the
trainer's loop."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from rookworld.commands.common import CliError
from rookworld.commands.model import not_available
from rookworld.chess.stockfish import StockfishNotFoundError, find_stockfish
from rookworld.grpo.trainer import Trainer
from rookworld.harness import checkpoint
from rookworld.harness.distributed import DistributedError, lost_rank, rerun
from rookworld.harness.run import complete_message, last_checkpoint, resume_command
from rookworld.harness.rundir import check_resume, run_directory
from rookworld.io.errors import RookworldError
from rookworld.net.pretrained import ModelNotAvailableError
from rookworld.settings.config import ConfigError, SFTConfig, TrainConfig, from_args
from rookworld.sft.trainer import SFTTrainer


def run(args: argparse.Namespace) -> int:
    """The command: its settings, its trainer, the run. An expected failure is a `RookworldError` that says what
    to do next, printed by the command line as one line; an interrupted run says how to go on."""
    command, trainer = args.command, None
    cfg, notes = settings_of(args, command)
    if cfg is None:
        return 0
    try:
        trainer = trainer_for(command, cfg)
        for note in notes:  # once nothing refuses the run: an error stays one line
            print(f"warning: {note}", file=sys.stderr)
        trainer.train()
    except RuntimeError as e:  # a rank that died or stopped answering: gloo's word, or ours (DistributedError)
        if isinstance(e, RookworldError) and not isinstance(e, DistributedError):
            raise
        raise _ranks_apart(e, trainer.run.step if trainer is not None else 0, command, cfg) from None
    finally:
        if trainer is not None:
            trainer.close()
    return stopped(trainer, command, cfg)


def settings_of(args: argparse.Namespace, command: str) -> tuple[TrainConfig | SFTConfig | None, list[str]]:
    """The run's settings (a resumed run's own, filled in) and notes on where it departs from them; None when the
    run it resumes is complete (said here, before any model or engine starts)."""
    resume_from, notes = None, []
    if getattr(args, "resume", None):
        resume_from, notes = resumed_settings(args, command)
    cfg = from_args(args, TrainConfig if command == "train" else SFTConfig)
    done = checkpoint.step_of(resume_from) if resume_from is not None else None
    if done is not None and done >= cfg.steps:
        print(complete_message(command, cfg, done), file=sys.stderr)
        return None, notes
    if command == "train":
        find_stockfish(cfg.stockfish_path)  # a missing engine is reported before any model is loaded
    return cfg, notes


def trainer_for(command: str, cfg: TrainConfig | SFTConfig) -> Trainer | SFTTrainer:
    """The command's trainer, with the process settings a command takes (`harness.process`)."""
    if command == "sft":  # sft's default is a fresh model: no offline preset stands in for a hub one
        return SFTTrainer(cfg, process_settings=True)
    try:
        return Trainer(cfg, process_settings=True)
    except ModelNotAvailableError as e:
        raise CliError(not_available(cfg.model, e, "offline, `rookworld train --config chess-play` trains the small "
                                                   "model that ships with rookworld; or pass --model DIR, a model "
                                                   "directory")) from None


def stopped(trainer: Trainer | SFTTrainer, command: str, cfg) -> int:
    """0 for a run that went to its end; for one stopped by Ctrl-C or SIGTERM (after saving), how to go on."""
    if not trainer.run.interrupted:
        return 0
    ended = "terminated" if trainer.run.stop.terminated else "interrupted"
    print(f"rookworld {command}: {ended} at step {trainer.run.step}; " +
          (f"continue with {resume_command(command, cfg.output_dir)}" if last_checkpoint(cfg.output_dir) else
           "no step was saved, so there is nothing to resume: run the same command again"), file=sys.stderr)
    return 143 if trainer.run.stop.terminated else 130


#: The saved settings --resume does not take as they are: where the run writes, the engine it runs (settings that
#: name a program or a place to write), what starts a run rather than continues one, and trust in what the run
#: directory holds (only the user's command line gives that).
NOT_RESUMED = ("output_dir", "stockfish_path", "stockfish_cache", "resume", "overwrite", "trust_compile_cache")
#: The saved settings that name files a resumed run reads: taken, and a flag that names others is said.
READ_PLACES = ("model", "data", "eval_data")


def resumed_settings(args: argparse.Namespace, command: str) -> tuple[Path, list[str]]:
    """Fills `args` in with the settings a resumed run keeps; returns its checkpoint, and where the run departs
    from its saved settings, in words. A run directory is data, not instructions: its saved settings fill in what
    no flag gives (a --config file's settings instead, when one is given), except those that name a program or a
    place to write. The run goes on where it is (or in --output-dir), with --stockfish-path's engine or the
    default one, and with a --stockfish-cache of the command line or in the run's own directory."""
    resume_from = checkpoint.resolve_checkpoint(args.resume)
    check_resume(command, resume_from)
    saved = checkpoint.load_config(resume_from)
    given = {k for k in vars(args) if k not in ("command", "config")}
    notes = []
    if "output_dir" not in given:
        args.output_dir = str(_run_directory(args.resume, resume_from))
        was = saved.get("output_dir")
        if isinstance(was, str) and _place(was) != _place(args.output_dir):
            notes.append(f"the run goes on in {args.output_dir}, where it is (its settings say {was})")
    if getattr(args, "config", None):  # the file's settings, not the saved ones
        return resume_from, notes
    _check_engine(args.resume, saved.get("stockfish_path"), given)
    cache = saved.get("stockfish_cache")
    if cache is not None and "stockfish_cache" not in given:
        if _within(cache, args.output_dir):
            args.stockfish_cache = cache
        else:
            notes.append(f"the run's --stockfish-cache {cache} is outside it, and --resume writes nowhere a run "
                         f"directory names: no cache (give --stockfish-cache {cache} to keep it)")
    if command == "sft" and "model" in given and saved.get("model") != args.model:
        raise ConfigError(f"--resume {args.resume} continues the run's own weights, and --model {args.model} "
                          f"would be ignored: drop --model, or start a new run from it with --output-dir NEW_DIR")
    for key, value in saved.items():
        if key in NOT_RESUMED:
            continue
        if key not in given:
            setattr(args, key, value)
        elif key in READ_PLACES and value is not None and getattr(args, key) != value:
            notes.append(f"--{key.replace('_', '-')} {_shown(getattr(args, key))} instead of the run's "
                         f"{_shown(value)}")
    return resume_from, notes


def _run_directory(resume: str, resume_from: Path) -> Path:
    """Where a resumed run goes on writing: the run directory its checkpoint is in, never a place its settings
    name (a copied or moved run goes on where it is now)."""
    if resume_from.parent.name != "checkpoints":
        raise ConfigError(f"--resume {resume}: the checkpoint is not in a run's checkpoints directory, so nothing "
                          f"says where the run goes on: give --output-dir DIR")
    return run_directory(resume_from)


def _engine(path: str | None) -> str | None:
    """The engine file `--stockfish-path path` would start (None: the default one), or None when there is none."""
    try:
        return os.path.realpath(find_stockfish(path))
    except (StockfishNotFoundError, TypeError):
        return None


def _check_engine(resume: str, saved: Any, given: set[str]) -> None:
    """A resumed run starts --stockfish-path's engine or the default one; one its saved settings name is started
    only when it is the default one."""
    if saved is None or "stockfish_path" in given:
        return
    default = _engine(None)
    if default is not None and _engine(saved) == default:
        return
    instead = f", or --stockfish-path {default} (the default one)" if default else ""
    raise ConfigError(f"--resume {resume}: the run's settings name the engine {saved}, and --resume starts no "
                      f"program on a run directory's word: give --stockfish-path {saved} to start it{instead}")


def _place(path: Any) -> Path | None:
    """Where a path leads, through every link; None for what is not a path."""
    try:
        return Path(path).expanduser().resolve()
    except (TypeError, OSError, RuntimeError):  # not a path; a loop of links
        return None


def _within(path: Any, directory: str) -> bool:
    place = _place(path)
    return place is not None and place.is_relative_to(_place(directory))


def _shown(value: Any) -> str:
    """A setting's value in a note; an empty list or none (a run of generated positions, no --data) in words."""
    if value is None or value == []:
        return "none (generated positions)"
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


def _ranks_apart(e: RuntimeError, step: int, command: str, cfg) -> Exception:
    """A run whose ranks could not work together, as one line with what to run on every rank; any other error as
    it is."""
    if not isinstance(e, DistributedError):
        e = lost_rank(e, step) or e
        if not isinstance(e, DistributedError):
            return e
    last = last_checkpoint(cfg.output_dir)
    return CliError(f"{e}; " + (f"its last checkpoint, {last.name}, is intact: continue with "
                                f"{rerun(resume_command(command, cfg.output_dir))}" if last else
                                "it saved no checkpoint: start it again on every rank"))
