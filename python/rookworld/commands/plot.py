"""`rookworld plot`: training curves of one or more runs in one PNG."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from rookworld.commands.common import CliError, opened_output, settings, write_failed
from rookworld.harness.plot import PlotError, plot_runs
from rookworld.settings.commands import PlotSettings


def run(args: argparse.Namespace) -> int:
    s = settings(args, PlotSettings)
    if s.out is None:  # beside the run's own files, not in whatever directory the command was typed in
        first = Path(s.runs[0])
        s = replace(s, out=str(first / "curves.png" if first.is_dir() else "curves.png"))
    with opened_output(s.out) as out:
        try:
            panels = plot_runs(s.runs, out, title=s.title)
        except PlotError as e:
            raise CliError(str(e)) from None
        except OSError as e:
            raise write_failed("--out", s.out, e) from None
    print(f"wrote {s.out} ({panels} panels, {len(s.runs)} run(s))", file=sys.stderr)
    return 0
