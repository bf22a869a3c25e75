"""A trained model as a UCI engine (`rookworld uci`), so that chess GUIs, tournament managers and lichess-bot can
play it.

The model answers a position with one P: generation whatever the time control says; its move is chosen as
`rookworld play` and the vs-stockfish suite choose it (`rookworld.lm.moves`: never illegal), and its P: answer is
shown as UCI thinking: one `info multipv N score ... pv MOVE` line per legal candidate, the played move first.

A reader thread feeds the input lines to the loop, and the model's work runs in a search thread, so that `stop`,
`isready` and `quit` are read while the model thinks. The model loads at the first `isready` (or `go`), never
before `uciok`, so that a GUI's handshake does not time out. Bad input is an `info string` saying what is wrong
(quoting at most ECHO_LIMIT characters of it); unknown commands are ignored, as the protocol says.

Every search answers `bestmove`, as Stockfish does, and within its time: `stop`, `quit` (or the end of the input,
after QUIT_WAIT_S) and the end of `go movetime` or of the clock's share (`Go.budget_s`) cut the generation between
two decoding steps, and a search cut before the model wrote its move answers the first legal move, saying so in
an info string. (A compiled decoding, a GPU's, is one graph a step that cannot be cut: it runs to its end, fast.)
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TextIO

from rookworld.chess import rules
from rookworld.io.quote import quoted, shortened
from rookworld.lm.answers import PROTOCOLS
from rookworld.lm.moves import choose_moves
from rookworld.lm.uci_protocol import (AUTHOR, COMMANDS, INFO_LIMIT, MAX_COMMAND, QUIT_WAIT_S, SEED_STRIDE, Go,
                                       Overlong, PositionError, engine_options, info_lines, parse_go, parse_position,
                                       source_line)
from rookworld.net.decoding import decodes_eagerly

# -- the engine -----------------------------------------------------------------------------------------------------

class SearchAbandoned(Exception):
    """Raised in the search thread as the model starts a pass once the search was cut (`stop`, `quit`, its time):
    the generation ends between two decoding steps rather than after all of them."""


class UciEngine:
    """The UCI protocol around a model. `load(device)` gives the model (a `RookWorldLM`) on a device; `name` is what
    `id name` says."""

    def __init__(self, load: Callable[[str], Any], *, name: str, protocol: str, seed: int, device: str,
                 out: TextIO):
        self._load, self.name, self._out = load, name, out
        self.options = engine_options(protocol, seed, device)
        self.values = {key: o.default for key, o in self.options.items()}
        self.lm, self._lm_device = None, None
        self.fen: str | None = rules.START_FEN
        self.counts: Counter = Counter()
        self._write = threading.Lock()
        self._search: threading.Thread | None = None
        self._stop = threading.Event()
        self._abandon = threading.Event()  # cut the search under way at the model's next pass
        self._deadline: float | None = None  # time.monotonic() by which the search answers
        self.closed = False

    def say(self, *lines: str) -> None:
        with self._write:
            if self.closed:
                return
            try:
                for line in lines:  # an error's text may hold a newline: one command a line, always
                    if line.startswith("info string"):
                        line = shortened(line, INFO_LIMIT)
                    self._out.write(line.replace("\n", " ") + "\n")
                self._out.flush()
            except (BrokenPipeError, ValueError):  # the GUI went away: nothing more to say to anyone
                self.closed = True

    def run(self, lines: Iterable[str]) -> int:
        """Reads commands to the end of the input or `quit`, which end the engine at once, even mid-search."""
        inbox: queue.Queue[str | None] = queue.Queue()

        def feed() -> None:
            try:
                for line in lines:
                    inbox.put(line)
            finally:
                inbox.put(None)

        threading.Thread(target=feed, name="uci-reader", daemon=True).start()
        try:
            while not self.closed:
                line = inbox.get()
                if line is None or not self.handle(line):
                    break
        finally:
            self._quit_search()
        return 0

    def handle(self, line: str) -> bool:
        """One command; False for `quit`. Words before the first command are skipped, as the protocol asks."""
        if isinstance(line, Overlong):
            self.say(f"info string a line over {MAX_COMMAND:,} characters, ignored: {quoted(line)}")
            return True
        words = line.split()
        while words and words[0] not in COMMANDS:
            words = words[1:]
        if not words:
            return True
        command, rest = words[0], words[1:]
        if command == "quit":
            return False
        if command == "stop":
            self._end_search()
        elif command == "ponderhit":
            self._stop.set()
        elif command == "isready":
            if not self._searching():  # during a search the model is loaded already
                self._ensure_model()
            self.say("readyok")
        elif command == "uci":
            self.say(f"id name {self.name}", f"id author {AUTHOR}",
                     *(o.declaration() for o in self.options.values()), "uciok")
        elif command in ("setoption", "ucinewgame", "position", "go"):
            # The GUI should have stopped a search first; one left running finishes here (within its time, if it
            # has one), with its bestmove, as Stockfish waits for its search: a session piped in whole gets answers.
            self._finish_search()
            getattr(self, f"_{command}")(rest)
        return True

    # -- commands --

    def _setoption(self, words: list[str]) -> None:
        if not words or words[0] != "name":
            self.say("info string setoption needs 'name NAME [value VALUE]'")
            return
        end = words.index("value") if "value" in words else len(words)
        name, value = " ".join(words[1:end]), " ".join(words[end + 1 :])
        option = self.options.get(name.lower())
        if option is None:
            self.say(f"info string no option {quoted(name)}: the options are "
                     f"{', '.join(o.name for o in self.options.values())}")
            return
        try:
            self.values[option.name.lower()] = option.read(value)
        except ValueError as e:
            self.say(f"info string {e}; {option.name} stays {self.values[option.name.lower()]}")

    def _ucinewgame(self, words: list[str]) -> None:
        self.counts.clear()

    def _position(self, words: list[str]) -> None:
        try:
            self.fen = parse_position(words)[2]
        except PositionError as e:
            self.fen = None
            self.say(f"info string {e}; no position until a good one")

    def _go(self, words: list[str]) -> None:
        go, problems = parse_go(words)
        if problems:
            self.say(f"info string go: {'; '.join(problems)} (ignored)")
        if self.fen is None:
            self.say("info string no position to play: the last position line was malformed", "bestmove 0000")
            return
        budget = go.budget_s(self.fen.split()[1] == "w")
        self._deadline = None if budget is None else time.monotonic() + budget  # counted from `go`, as a clock is
        self._ensure_model()
        self._stop.clear()
        self._abandon.clear()
        self._search = threading.Thread(target=self._think, args=(self.fen, go), name="uci-search", daemon=True)
        self._search.start()

    # -- the model --

    def _ensure_model(self) -> None:
        """The model on the Device option's device: loaded at the first need, again when the option changed. A
        device it cannot load on is said, and the model runs where it ran (or on the --device of the command);
        only a model that loads nowhere ends the engine (the error said, then raised)."""
        device = self.values["device"]
        if self.lm is not None and device == self._lm_device:
            return
        try:
            lm = self._load(device)
        except Exception as e:
            fallback = self._lm_device if self.lm is not None else self.options["device"].default
            if device == fallback:
                self.say(f"info string cannot load the model: {e}")
                raise
            self.say(f"info string cannot load the model on {device}: {e}; it runs on {fallback}")
            self.values["device"] = fallback
            self._ensure_model()
            return
        self.lm, self._lm_device = lm, device

    def _searching(self) -> bool:
        return self._search is not None and self._search.is_alive()

    def _end_search(self) -> None:
        """`stop`: the search is cut at the model's next pass and answers its bestmove before the next command is
        read."""
        self._abandon.set()
        self._finish_search()

    def _finish_search(self) -> None:
        """The search under way to its answer (one waiting for `stop` answers at once)."""
        if self._search is not None:
            self._stop.set()
            self._search.join()
            self._search = None

    def _quit_search(self) -> None:
        """The search at `quit` or the end of the input: one waiting for `stop` answers at once; one still thinking
        has QUIT_WAIT_S to finish (a session piped in whole gets the model's own move), then is cut, and answers
        too, as Stockfish does. A thread left running would be killed mid-computation as the interpreter exits."""
        if self._search is None:
            return
        self._stop.set()
        self._search.join(QUIT_WAIT_S)
        self._end_search()

    @contextlib.contextmanager
    def _abandonable(self):
        """The model's passes in this block raise SearchAbandoned once the engine quit. Only an eager decoding runs
        the check: a compiled step is one graph, which Python code inside would break."""
        model = self.lm.model
        if not decodes_eagerly(model.device, self.lm.compile):
            yield
            return

        deadline = self._deadline

        def check(module, args):
            if self._abandon.is_set() or (deadline is not None and time.monotonic() >= deadline):
                raise SearchAbandoned

        # The token embedding starts every pass: the prompt's, each decoding step's, and the scoring of moves.
        handle = model.transformer.wte.register_forward_pre_hook(check)
        try:
            yield
        finally:
            handle.remove()

    def _think(self, fen: str, go: Go) -> None:
        """The search thread: the model's move and its info lines, then, after `stop` when the search waits,
        bestmove."""
        best = "(none)"
        legal = rules.legal_moves(fen)
        if not legal:
            self.say("info string no legal move: the game is over")
        else:
            allowed = [m for m in legal if m in go.searchmoves] if go.searchmoves else legal
            if not allowed:
                self.say(f"info string searchmoves: none of {quoted(' '.join(go.searchmoves))} is legal here "
                         f"(ignored)")
                allowed = legal
            try:
                best = self._move(fen, allowed)
            except SearchAbandoned:
                why = "stopped" if self._abandon.is_set() else "out of time"
                self.say(f"info string {why} before the model wrote its move: {allowed[0]} is the first legal move, "
                         f"not the model's")
                best = allowed[0]
            except Exception as e:  # a GUI waits for bestmove: the failure is said, never left hanging
                self.say(f"info string the model failed: {type(e).__name__}: {e}")
                best = "0000"
        if go.waits:
            self._stop.wait()
        self.say(f"bestmove {best}")

    def _move(self, fen: str, allowed: list[str]) -> str:
        fields = fen.split()
        ply = 2 * (int(fields[5]) - 1) + (fields[1] == "b")
        decoding = PROTOCOLS[self.values["protocol"]]
        with self._abandonable():
            (chosen,) = choose_moves(self.lm, [fen], decoding=decoding, allowed=[allowed],
                                     seed=self.values["seed"] + SEED_STRIDE * ply)
        self.counts[chosen.source] += 1
        self.say(*info_lines(fen, chosen, self.values["multipv"]), source_line(chosen, self.counts))
        return chosen.move
