"""`rookworld uci`: a trained model as a UCI engine on standard input and output."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from rookworld.commands.common import settings
from rookworld.commands.model import load_lm
from rookworld.lm.uci import UciEngine
from rookworld.lm.uci_protocol import commands
from rookworld.net.sources import model_source, model_step
from rookworld.settings.commands import UciSettings


def engine_name(model: str) -> str:
    """`id name`: the model as given, and its training step when a local checkpoint says it (known without
    loading anything, so that `uci` answers at once)."""
    source = Path(model_source(model)).expanduser()
    step = model_step(source) if source.is_dir() else None
    return f"rookworld {model}" + (f" step {step}" if step is not None else "")


def run(args: argparse.Namespace) -> int:
    s = settings(args, UciSettings)

    def load(device: str):
        return load_lm(dataclasses.replace(s, device=device), batch_size=1, max_new_tokens=s.max_new_tokens)

    engine = UciEngine(load, name=engine_name(s.model), protocol=s.protocol, seed=s.seed, device=s.device,
                       out=sys.stdout)
    if hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(errors="replace")  # a stray byte from a GUI is a bad command, not the engine's end
    return engine.run(commands(sys.stdin))
