"""One Stockfish process spoken to over UCI, and where to find the binary.

Not thread-safe: each `Engine` is owned by one worker thread of the pool. An engine that dies, hangs or
speaks nonsense raises `EngineFailure`; the pool then kills it and starts another.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence

from rookworld.ground.stockfish.analysis import Candidate

#: Where Debian/Ubuntu's ``stockfish`` package installs the binary (often not on PATH).
_FALLBACK_PATHS: tuple[str, ...] = ("/usr/games/stockfish",)
_ENV_VAR = "ROOKWORLD_STOCKFISH"
_INSTALL_HINT = (
    "pass its location with --stockfish-path (or the path= argument), or install it: "
    "`apt-get install stockfish` (Debian/Ubuntu, installs /usr/games/stockfish), `brew install stockfish`, "
    "or download a binary from https://stockfishchess.org/download/ "
    f"(the {_ENV_VAR} environment variable may also name it)"
)


class StockfishNotFoundError(FileNotFoundError):
    """No usable Stockfish binary was found."""


class StockfishError(RuntimeError):
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
        raise StockfishNotFoundError(f"Stockfish binary {path!r} {why}; {_INSTALL_HINT}")
    env = os.environ.get(_ENV_VAR)
    if env:  # a setting beats what happens to be installed
        env = os.path.expanduser(env)
        if _executable(env):
            return os.path.abspath(env)
        found = shutil.which(env) if os.sep not in env else None
        if found:
            return found
        raise StockfishNotFoundError(f"{_ENV_VAR}={env!r} is not an executable file; {_INSTALL_HINT}")
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


def parse_info(line: str) -> tuple[int, int, int, int | None, int | None, str] | None:
    """``(multipv, depth, seldepth, cp, mate, first_move)`` of a scored PV line, else ``None``.

    ``info string`` lines, bound-only scores (``lowerbound``/``upperbound``) and lines without a
    score or PV are ignored.
    """
    tokens = line.split()
    if len(tokens) < 2 or tokens[0] != "info":
        return None
    multipv, depth, seldepth = 1, None, 0
    cp = mate = None
    move = None
    i, n = 1, len(tokens)
    try:
        while i < n:
            tok = tokens[i]
            if tok == "string":
                return None
            if tok == "score":
                kind, value = tokens[i + 1], int(tokens[i + 2])
                if kind == "cp":
                    cp = value
                elif kind == "mate":
                    mate = value
                else:
                    return None
                i += 3
                if i < n and tokens[i] in ("lowerbound", "upperbound"):
                    return None
                continue
            if tok == "pv":
                if i + 1 < n:
                    move = tokens[i + 1]
                break
            if tok == "multipv":
                multipv = int(tokens[i + 1])
            elif tok == "depth":
                depth = int(tokens[i + 1])
            elif tok == "seldepth":
                seldepth = int(tokens[i + 1])
            elif tok == "wdl":
                i += 4
                continue
            elif tok in ("lowerbound", "upperbound"):
                return None
            i += 2
    except (IndexError, ValueError):
        return None
    if depth is None or move is None or (cp is None and mate is None):
        return None
    return multipv, depth, seldepth, cp, mate, move


def ranked_candidates(lines: dict[int, tuple[int, int, int | None, int | None, str]], legal: Sequence[str],
                      k: int) -> tuple[tuple[Candidate, ...], int]:
    """Candidates ranked by MultiPV index: distinct, legal, at most ``k``; and the best line's depth."""
    legal_set = set(legal)
    out: list[Candidate] = []
    seen: set[str] = set()
    for index in sorted(lines):
        depth, _sel, cp, mate, move = lines[index]
        if move in seen or move not in legal_set:
            continue
        seen.add(move)
        out.append(Candidate(move, cp, mate))
        if len(out) == k:
            break
    best_depth = lines[min(lines)][0] if lines else 0
    return tuple(out), best_depth


class EngineFailure(Exception):
    """The engine died, hung or spoke nonsense; it must be killed and restarted."""


class EngineHung(EngineFailure):
    pass


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
            ranges = self._spin_ranges(deadline)
            for name, value in options.items():
                low, high = ranges.get(name, (value, value)) if isinstance(value, int) else (value, value)
                if not low <= value <= high:  # an engine clamps it silently: the strength asked for is not had
                    raise EngineOptionError(f"{path} takes {name} from {low} to {high}, not {value}")
                self._send(f"setoption name {name} value {value}")
            self._send("isready")
            self._wait_for("readyok", deadline)
        except BaseException:
            self.kill()
            raise

    @staticmethod
    def _read(stream, lines: queue.Queue) -> None:
        try:
            for line in stream:
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

    def _readline(self, deadline: float) -> str:
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise queue.Empty
            line = self._lines.get(timeout=remaining)
        except queue.Empty:
            raise EngineHung(f"engine pid {self.pid} gave no answer in time") from None
        if line is None:
            code = self.proc.poll()
            if code is None:
                try:
                    code = self.proc.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    pass
            raise EngineFailure(f"engine pid {self.pid} died (exit code {code})")
        return line

    def _spin_ranges(self, deadline: float) -> dict[str, tuple[int, int]]:
        """Reads `uci`'s answer to its `uciok`: the bounds of each numeric option the engine declares."""
        ranges = {}
        while True:
            words = self._readline(deadline).split()
            if words[:1] == ["uciok"]:
                return ranges
            if words[:2] == ["option", "name"] and "type" in words and "min" in words and "max" in words:
                name = " ".join(words[2:words.index("type")])
                try:
                    ranges[name] = (int(words[words.index("min") + 1]), int(words[words.index("max") + 1]))
                except (ValueError, IndexError):
                    pass

    def _wait_for(self, token: str, deadline: float) -> None:
        while True:
            line = self._readline(deadline)
            if line.split()[:1] == [token]:
                return

    def analyse(self, fen: str, go: str, timeout: float):
        """Deepest scored line per MultiPV index: ``{index: (depth, seldepth, cp, mate, move)}``."""
        deadline = time.monotonic() + timeout
        # ucinewgame clears the hash and history (~1 ms): results then depend only on the position.
        self._send("ucinewgame")
        self._send(f"position fen {fen}")
        self._send(go)
        lines: dict[int, tuple[int, int, int | None, int | None, str]] = {}
        while True:
            line = self._readline(deadline)
            if line.startswith("bestmove"):
                return lines
            parsed = parse_info(line)
            if parsed is None:
                continue
            index, depth, seldepth, cp, mate, move = parsed
            old = lines.get(index)
            if old is None or depth >= old[0]:  # deepest wins; among equals the latest
                lines[index] = (depth, seldepth, cp, mate, move)

    def best_move(self, fen: str, moves: Sequence[str], go: str, timeout: float) -> str:
        """The engine's move in the game from `fen` after `moves`, as a player: with Skill Level or UCI_Elo set it
        is a weaker move than the analysis's first line, so it is read from ``bestmove``. The moves let the engine
        see repetitions."""
        deadline = time.monotonic() + timeout
        self._send("position fen " + fen + (" moves " + " ".join(moves) if moves else ""))
        self._send(go)
        while True:
            line = self._readline(deadline)
            if line.startswith("bestmove"):
                words = line.split()
                if len(words) < 2 or words[1] == "(none)":
                    raise EngineFailure(f"engine pid {self.pid} has no move in a finished game: {fen} {moves}")
                return words[1]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        proc = self.proc
        if proc.poll() is None:
            try:
                proc.kill()  # SIGKILL also ends a stopped (SIGSTOP) process
            except OSError:
                pass
        try:
            proc.wait(timeout=5)
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
