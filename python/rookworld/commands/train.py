"""`rookworld train` (GRPO) and `rookworld sft` (supervised): settings (a resumed run keeps its own), then the
trainer's loop."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rookworld.commands.common import CliError
from rookworld.ground.data import DataError
from rookworld.ground.stockfish import StockfishError, StockfishNotFoundError, find_stockfish
from rookworld.grpo.trainer import Trainer
from rookworld.harness import checkpoint
from rookworld.harness.run import Diverged, complete_message
from rookworld.harness.rundir import check_resume
from rookworld.net.pretrained import ModelNotAvailableError
from rookworld.net.tokenizer import TokenizerUnavailableError
from rookworld.settings.config import ConfigError, SFTConfig, TrainConfig, from_args
from rookworld.sft.trainer import SFTTrainer


def run(args: argparse.Namespace) -> int:
    command = args.command
    cls, trainer_class = (TrainConfig, Trainer) if command == "train" else (SFTConfig, SFTTrainer)
    resume_from = None
    try:
        if getattr(args, "resume", None):
            # A resumed run keeps the settings it was started with, unless flags say otherwise.
            resume_from = checkpoint.resolve_checkpoint(args.resume)
            check_resume(command, resume_from)
            saved = checkpoint.load_config(resume_from)
            given = {k for k in vars(args) if k not in ("command", "config")}
            for key, value in saved.items():
                if key not in given and key != "overwrite" and not getattr(args, "config", None):
                    setattr(args, key, value)
        cfg = from_args(args, cls)
        done = checkpoint.step_of(resume_from) if resume_from is not None else None
        if done is not None and done >= cfg.steps:  # said before any model or engine starts
            print(complete_message(command, cfg, done), file=sys.stderr)
            return 0
        if command == "train":
            find_stockfish(cfg.stockfish_path)  # a missing engine is reported before any model is loaded
    except (ConfigError, checkpoint.CheckpointError, StockfishNotFoundError) as e:
        raise CliError(str(e)) from None

    try:
        trainer = trainer_class(cfg)
    except (ConfigError, DataError, ModelNotAvailableError, TokenizerUnavailableError, StockfishError,
            checkpoint.CheckpointError, FileNotFoundError, NotADirectoryError) as e:
        raise CliError(str(e)) from None
    try:
        trainer.train()
    except StockfishNotFoundError as e:  # sft's evaluation starts Stockfish only when it first needs it
        raise CliError(str(e)) from None
    except checkpoint.SaveFailed as e:
        last = _last_checkpoint(cfg)
        raise CliError(f"{e}; " + (f"its last checkpoint, {last.name}, is intact: once there is room, continue "
                                   f"with {_resume(command, cfg)}" if last else
                                   "it saved no checkpoint before: start again once there is room")) from None
    except KeyboardInterrupt:  # a third Ctrl-C: nothing saved past the last checkpoint
        last = _last_checkpoint(cfg)
        raise CliError(f"aborted at step {trainer.run.step} without saving; " + (
            f"its last checkpoint is {last.name}: continue with {_resume(command, cfg)}"
            if last else "it saved no checkpoint")) from None
    except Diverged as e:
        last = _last_checkpoint(cfg)
        hint = (f"its last checkpoint, {last}, is from before: continue from it with a lower --lr, "
                f"{_resume(command, cfg)} --lr X" if last else
                "it saved no checkpoint: start again with a lower --lr (--overwrite)")
        raise CliError(f"stopped at step {trainer.run.step + 1}: {e}; the step was not applied and nothing was "
                       f"saved after it; {hint}") from None
    finally:
        trainer.close()
    if trainer.run.interrupted:
        print(f"rookworld {command}: interrupted at step {trainer.run.step}; continue with "
              f"{_resume(command, cfg)}", file=sys.stderr)
        return 130
    return 0


def _last_checkpoint(cfg) -> Path | None:
    saved = checkpoint.list_checkpoints(cfg.output_dir)
    return saved[-1] if saved else None


def _resume(command: str, cfg) -> str:
    return f"rookworld {command} --resume {cfg.output_dir}"
