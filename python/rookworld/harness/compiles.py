"""What a compiling run compiled, where its user sees it: each graph announced as dynamo begins it (a first step
that compiles for minutes says why it waits), the graphs of each step said after it and kept in its metrics row
(`compiled`: name, seconds, why it compiled again), and dynamo's cache artifacts kept in the run directory, so
that a run resumed on the same machine and torch loads them instead of compiling again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rookworld.io.files import atomic_write
from rookworld.harness.rundir import COMPILE_CACHE
from rookworld.harness.runlog import RunLog
from rookworld.net import compile_log

#: Larger than any cache a run makes (a GPT-2 small step's is a few MB): a bigger file is not ours, and not read.
MAX_CACHE_BYTES = 1 << 30


class CompileReport:
    def __init__(self, log: RunLog, output_dir: str | Path, main: bool):
        self.log, self.path, self.main = log, Path(output_dir) / COMPILE_CACHE, main
        compile_log.announce_compiles(log.say if main else None)
        self.graphs = compile_log.CompileLog()

    def load_cache(self, trusted: bool) -> None:
        """The cache a run's earlier process saved, if any, when the user says the run directory is theirs
        (`trusted`, --trust-compile-cache): torch's cache artifacts are pickles, which run code as they load, and a
        run directory may come from anyone. Untrusted, it is left unread, said in one line. A file that cannot be
        read or loaded costs a warning and a compile, never the run (it is another machine's or torch's, or cut
        short)."""
        if not self.path.is_file() or not hasattr(torch.compiler, "load_cache_artifacts"):
            return
        if not trusted:
            self.log.say(f"the compile cache {self.path} is not loaded (a pickle, which runs code as it loads): "
                         f"compiling anew; give --trust-compile-cache to load it from a run directory you made")
            return
        try:
            size = self.path.stat().st_size
            if size > MAX_CACHE_BYTES:
                raise ValueError(f"{size:,} bytes, more than a run's cache ({MAX_CACHE_BYTES:,})")
            # None: torch read nothing it could use (it logs why: a checksum, a pickle).
            if torch.compiler.load_cache_artifacts(self.path.read_bytes()) is None:
                raise ValueError("torch found nothing it could load in it")
        except Exception as e:  # noqa: BLE001 (a corrupt cache may fail in any way inside torch)
            self.log.say(f"warning: the compile cache {self.path} was not loaded ({type(e).__name__}: "
                         f"{str(e).strip()[:200]}); compiling anew")
            return
        self.log.say(f"loaded the compile cache {self.path} ({size / 1e6:.1f} MB): graphs compiled before load "
                     f"from it")

    def after_step(self, m: dict[str, Any]) -> None:
        """The graphs compiled since the last step (its evaluation's too) into its row and the log; the cache saved
        whenever it grew."""
        new = self.graphs.new()
        if not new:
            return
        m["compiled"] = [g.row() for g in new]
        if not self.main:
            return
        self.log.say(f"step {m['step']} compiled {compile_log.summary(new)}")
        self._save_cache()

    def _save_cache(self) -> None:
        saved = torch.compiler.save_cache_artifacts() if hasattr(torch.compiler, "save_cache_artifacts") else None
        if saved is None:
            return
        try:
            with atomic_write(self.path, "wb") as f:
                f.write(saved[0])
        except OSError as e:  # a full disk costs the next resume's compile, not this run
            self.log.say(f"warning: the compile cache was not saved to {self.path}: {e}")
