"""One Stockfish process spoken to over UCI, and where to find the binary.

Not thread-safe: each `Engine` is owned by one worker thread of the pool. An engine that dies, hangs or
speaks nonsense raises `EngineFailure`; the pool then kills it and starts another. Every wait on an engine is
bounded and its failure says what was waited for: the handshake within the start-up limit, the first answer to a
command within `ANSWER_S`, a whole search within the caller's limit. What an engine says is checked as a data file
is (`reading`): scores in range, a mate that fits the position, legal moves (`BadAnswer` otherwise).
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Sequence

from rookworld.chess import rules
from rookworld.chess.stockfish.analysis import Analysis
from rookworld.io.errors import RookworldError
from rookworld.io.quote import quoted_path
from rookworld.chess.stockfish.reading import (answer_problem, mate_problem, parse_info, position_after,
                                                ranked_candidates)

#: Where Debian/Ubuntu's ``stockfish`` package installs the binary (often not on PATH).
_FALLBACK_PATHS: tuple[str, ...] = ("/usr/games/stockfish",)
_ENV_VAR = "ROOKWORLD_STOCKFISH"
_INSTALL_HINT = (
    "pass its location with --stockfish-path (or the path= argument), or install it: "
    "`apt-get install stockfish` (Debian/Ubuntu, installs /usr/games/stockfish), `brew install stockfish`, "
    "or download a binary from https://stockfishchess.org/download/ "
    f"(the {_ENV_VAR} environment variable may also name it)"
)


class StockfishNotFoundError(RookworldError, FileNotFoundError):
    """No usable Stockfish binary was found."""


class StockfishError(RookworldError, RuntimeError):
    """An engine failed to analyse a position (after restarts and retries), or misbehaved."""


# --------------------------------------------------------------------------------------------------
# Locating the binary


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_stockfish(path: str | None = None) -> str:
    """The Stockfish binary to run.

    ``path`` if given (a file that must exist and be executable, or a command name on PATH); otherwise the
    ``ROOKWORLD_STOCKFISH`` environment variable, then ``stockfish`` on PATH, then ``/usr/games/stockfish``.
    Raises :class:`StockfishNotFoundError` (a ``FileNotFoundError``) saying how to get one.
    """
    if path is not None:
        path = os.path.expanduser(os.fspath(path))
        if _executable(path):
            return os.path.abspath(path)
        if os.sep not in path:
            found = shutil.which(path)
            if found:
                return found
        why = "is not executable" if os.path.exists(path) else "does not exist"
        raise StockfishNotFoundError(f"Stockfish binary {quoted_path(path)} {why}; {_INSTALL_HINT}")
    env = os.environ.get(_ENV_VAR)
    if env:  # a setting beats what happens to be installed
        env = os.path.expanduser(env)
        if _executable(env):
            return os.path.abspath(env)
        found = shutil.which(env) if os.sep not in env else None
        if found:
            return found
        raise StockfishNotFoundError(f"{_ENV_VAR}={quoted_path(env)} is not an executable file; {_INSTALL_HINT}")
    found = shutil.which("stockfish")
    if found:
        return found
    for candidate in _FALLBACK_PATHS:
        if _executable(candidate):
            return candidate
    raise StockfishNotFoundError(
        f"Stockfish not found (not on PATH, not at {', '.join(_FALLBACK_PATHS)}, {_ENV_VAR} unset); "
        + _INSTALL_HINT
    )


# --------------------------------------------------------------------------------------------------
# UCI

#: Seconds an engine may stay silent after `isready` or `go` before it is taken for hung. Stockfish answers
#: `isready` at once and a search with its depth-1 line within milliseconds, whatever the search's limits (those
#: bound the search as a whole); an engine that says nothing for this long will not say anything.
ANSWER_S = 5.0
#: Seconds an engine may take to answer `uci` and `isready` when it starts (Stockfish: milliseconds; a loaded machine
#: starting many at once: a few seconds).
STARTUP_S = 10.0
#: The longest line read from an engine at once (a UCI line is a few hundred characters).
MAX_LINE = 1 << 16


class EngineFailure(Exception):
    """The engine died, hung or spoke nonsense; it must be killed and restarted."""


class EngineHung(EngineFailure):
    """No answer within the time it had."""


class BadAnswer(EngineFailure):
    """An answer that does not check out: a score out of range, a mate that does not fit the position, an illegal
    move. Never kept; the engine is restarted and asked again, as a hung one is."""


class EngineOptionError(ValueError):
    """A setting the engine does not take (outside the range it declares): the user's to change, not a failure."""


class Engine:
    """One Stockfish process. Not thread-safe: owned by one worker thread."""

    def __init__(self, path: str, options: dict[str, int | str], startup_timeout: float):
        self.path = path
        self._lines: queue.Queue[str | None] = queue.Queue()
        try:
            self.proc = subprocess.Popen(
                [path],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                bufsize=1,
                errors="replace",
                start_new_session=True,  # a Ctrl-C in the terminal must not kill the engines under us
            )
        except OSError as exc:
            raise EngineFailure(f"cannot start {path!r}: {exc}") from exc
        self.pid = self.proc.pid
        self._reader = threading.Thread(
            target=self._read, args=(self.proc.stdout, self._lines), name=f"stockfish-reader-{self.pid}", daemon=True
        )
        self._reader.start()
        try:
            deadline = time.monotonic() + startup_timeout
            self._send("uci")
            ranges = self._spin_ranges(deadline, f"`uciok` to `uci` within {startup_timeout:g} s")
            for name, value in options.items():
                low, high = ranges.get(name, (value, value)) if isinstance(value, int) else (value, value)
                if not low <= value <= high:  # an engine clamps it silently: the strength asked for is not had
                    raise EngineOptionError(f"{path} takes {name} from {low} to {high}, not {value}")
                self._send(f"setoption name {name} value {value}")
            self._send("isready")
            self._wait_for("readyok", deadline, f"`readyok` to `isready` within {startup_timeout:g} s")
        except BaseException:
            self.kill()
            raise

    @staticmethod
    def _read(stream, lines: queue.Queue) -> None:
        try:
            # A line longer than any UCI line comes in pieces: an engine that never ends one cannot fill the memory.
            for line in iter(lambda: stream.readline(MAX_LINE), ""):
                lines.put(line)
        except (OSError, ValueError):
            pass
        finally:
            lines.put(None)

    def _send(self, command: str) -> None:
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError) as exc:  # BrokenPipeError when the process is gone
            raise EngineFailure(f"engine pid {self.pid} is gone ({exc!r}; exit code {self.proc.poll()})") from exc

    def _readline(self, deadline: float, waiting_for: str) -> str:
        """The engine's next line by ``deadline``; `EngineHung` saying it gave no ``waiting_for`` otherwise."""
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise queue.Empty
            line = self._lines.get(timeout=remaining)
        except queue.Empty:
            raise EngineHung(f"engine pid {self.pid} gave no {waiting_for}") from None
        if line is None:
            code = self.proc.poll()
            if code is None:
                try:
                    code = self.proc.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    pass
            raise EngineFailure(f"engine pid {self.pid} died (exit code {code})")
        return line

    def _spin_ranges(self, deadline: float, waiting_for: str) -> dict[str, tuple[int, int]]:
        """Reads `uci`'s answer to its `uciok`: the bounds of each numeric option the engine declares."""
        ranges = {}
        while True:
            words = self._readline(deadline, waiting_for).split()
            if words[:1] == ["uciok"]:
                return ranges
            if words[:2] == ["option", "name"] and "type" in words and "min" in words and "max" in words:
                name = " ".join(words[2:words.index("type")])
                try:
                    ranges[name] = (int(words[words.index("min") + 1]), int(words[words.index("max") + 1]))
                except (ValueError, IndexError):
                    pass

    def _wait_for(self, token: str, deadline: float, waiting_for: str) -> None:
        while True:
            line = self._readline(deadline, waiting_for)
            if line.split()[:1] == [token]:
                return

    def _search(self, position: str, go: str, timeout: float) -> tuple[dict, str]:
        """Sends ``position`` and ``go``: the deepest scored line per MultiPV index,
        ``{index: (depth, seldepth, cp, mate, move)}``, and the ``bestmove`` word (``""`` when there is none).

        The engine must begin answering within `ANSWER_S` and end with ``bestmove`` within ``timeout``."""
        deadline = time.monotonic() + timeout
        # `isready` first: what an earlier answer left unread is passed over, and the engine's silence shows at once.
        self._send("isready")
        self._wait_for("readyok", min(deadline, time.monotonic() + ANSWER_S),
                       f"`readyok` to `isready` within {ANSWER_S:g} s")
        self._send(position)
        self._send(go)
        first = min(deadline, time.monotonic() + ANSWER_S)
        line = self._readline(first, f"answer to `{go}` within {ANSWER_S:g} s")
        lines: dict[int, tuple[int, int, int | None, int | None, str]] = {}
        while not line.startswith("bestmove"):
            parsed = parse_info(line)
            if parsed is not None:
                index, depth, seldepth, cp, mate, move = parsed
                old = lines.get(index)
                if old is None or depth >= old[0]:  # deepest wins; among equals the latest
                    lines[index] = (depth, seldepth, cp, mate, move)
            line = self._readline(deadline, f"`bestmove` to `{go}` within {timeout:g} s")
        words = line.split()
        return lines, words[1] if len(words) > 1 else ""

    def analyse(self, fen: str, go: str, timeout: float):
        """Deepest scored line per MultiPV index: ``{index: (depth, seldepth, cp, mate, move)}``, unchecked."""
        # ucinewgame clears the hash and history (~1 ms): results then depend only on the position.
        self._send("ucinewgame")
        return self._search(f"position fen {fen}", go, timeout)[0]

    def analysis(self, fen: str, legal: Sequence[str], go: str, timeout: float, multipv: int) -> Analysis:
        """The engine's analysis of ``fen`` (normalized, with the legal moves ``legal``), checked as an analysis read
        from a file is: `BadAnswer` naming what does not check out."""
        self._send("ucinewgame")
        lines, bestmove = self._search(f"position fen {fen}", go, timeout)
        problem = answer_problem(lines, bestmove, set(legal))
        if problem is None:
            candidates, depth = ranked_candidates(lines, legal, multipv)
            analysis = Analysis(fen, candidates, depth)
            problem = (mate_problem(fen, candidates) or
                       rules.analysis_problems([fen], [analysis.moves], [analysis.evals], max_moves=multipv)[0])
        if problem is not None:
            raise BadAnswer(f"engine pid {self.pid} answered `{go}` in {fen} with nonsense: {problem}")
        return analysis

    def best_move(self, fen: str, moves: Sequence[str], go: str, timeout: float) -> str:
        """The engine's move in the game from `fen` after `moves`, as a player: with Skill Level or UCI_Elo set it
        is a weaker move than the analysis's first line, so it is read from ``bestmove``; `BadAnswer` when it is no
        legal move there. The moves let the engine see repetitions."""
        _lines, move = self._search("position fen " + fen + (" moves " + " ".join(moves) if moves else ""), go,
                                    timeout)
        if move not in rules.legal_moves(position_after(fen, moves)):
            raise BadAnswer(f"engine pid {self.pid} answered `{go}` with bestmove {move!r}, not a legal move in the "
                            f"game from {fen} after {' '.join(moves) or 'no moves'}")
        return move

    def alive(self) -> bool:
        return self.proc.poll() is None

    def abort(self) -> None:
        """Kills the engine and whatever it started, and nothing else: safe from a thread that does not own it, whose
        owner then sees the engine die in the middle of its wait."""
        if self.proc.returncode is None:  # not reaped yet: its pid, and so its process group, is still its own
            try:
                # Its own process group (start_new_session): a child it left holding the pipe dies with it, and
                # SIGKILL also ends a stopped (SIGSTOP) process.
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                try:
                    self.proc.kill()
                except OSError:
                    pass

    def kill(self) -> None:
        self.abort()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._close_pipes()

    def quit(self, timeout: float = 2.0) -> None:
        if self.proc.poll() is None:
            try:
                self._send("quit")
                self.proc.wait(timeout=timeout)
            except (EngineFailure, subprocess.TimeoutExpired):
                pass
        self.kill()

    def _close_pipes(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        self._reader.join(timeout=1)
