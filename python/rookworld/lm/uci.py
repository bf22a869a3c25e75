"""A trained model as a UCI engine (`rookworld uci`), so that chess GUIs, tournament managers and lichess-bot can
play it.

The model answers a position with one P: generation whatever the time control says; its move is chosen as
`rookworld play` and the vs-stockfish suite choose it (`rookworld.lm.moves`: never illegal), and its P: answer is
shown as UCI thinking: one `info multipv N score ... pv MOVE` line per legal candidate, the played move first.

A reader thread feeds the input lines to the loop, and the model's work runs in a search thread, so that `stop`,
`isready` and `quit` are read while the model thinks. The model loads at the first `isready` (or `go`), never
before `uciok`, so that a GUI's handshake does not time out. Bad input is an `info string` saying what is wrong
(quoting at most ECHO_LIMIT characters of it); unknown commands are ignored, as the protocol says. `quit`, or the
end of the input, ends the engine at once even mid-search: the generation stops between two decoding steps, and
the move it did not finish is never said.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from rookworld.ground import chess
from rookworld.ground.files import next_line
from rookworld.ground.quote import ECHO_LIMIT, quoted, shortened
from rookworld.ground.stockfish.analysis import MATE_SCORE
from rookworld.lm.answers import PROTOCOLS
from rookworld.lm.moves import BEST, CANDIDATE, LIKELIEST, ModelMove, choose_moves
from rookworld.net.decoding import decodes_eagerly
from rookworld.settings.groups import device_name

AUTHOR = "rookworld"
#: A P: answer has five candidates: more lines than that there are not.
MAX_MULTIPV = 5
#: What a sampled protocol's seed advances by per ply, so that each position of a game draws its own sample.
SEED_STRIDE = 7919
#: The longest info string: what the engine says about bad input is one readable line.
INFO_LIMIT = 400
#: How long `quit`, or the end of the input, lets a search that is still thinking run on: a session piped in whole
#: ("go" then "quit") gets its bestmove from a fast model, and a long generation ends within about this long.
QUIT_WAIT_S = 0.5
#: The longest command read, in characters: `position startpos moves ...` through the longest legal game (17,697
#: plies) takes about 90,000. A longer line is read past to its end, never held: a GUI (or /dev/zero) that sends
#: gigabytes without a newline costs no memory.
MAX_COMMAND = 1 << 20
_COMMANDS = ("uci", "debug", "isready", "setoption", "register", "ucinewgame", "position", "go", "stop", "ponderhit",
             "quit")


class Overlong(str):
    """What `read_command` gives for a line past MAX_COMMAND characters: a command to refuse, not to read."""


def read_command(stream: TextIO) -> str | None:
    """The next line of `stream` (None at its end), at most MAX_COMMAND characters: a longer one is an `Overlong`
    holding its first ECHO_LIMIT characters, the rest read past and dropped."""
    got = next_line(stream, MAX_COMMAND)
    if got is None:
        return None
    line, whole = got
    return line if whole else Overlong(line[:ECHO_LIMIT + 1])  # one past the limit: `quoted` marks it cut


def commands(stream: TextIO) -> Iterator[str]:
    """The lines of `stream` as `read_command` reads them, to its end."""
    while (line := read_command(stream)) is not None:
        yield line


# -- scores and info lines ------------------------------------------------------------------------------------------

def uci_score(pawns: float) -> str:
    """A P: eval (pawns, from the side to move) as UCI's score: centipawns, or a mate. The data wrote mate in n as
    (100000 - n) / 100 (python-chess's mate_score), so 999.97 is `mate 3` and -999.97 is `mate -3`."""
    cp = round(pawns * 100)
    if abs(cp) > MATE_SCORE - 1000:
        moves = max(1, MATE_SCORE - abs(cp))
        return f"mate {moves if cp > 0 else -moves}"
    return f"cp {cp}"


def info_lines(fen: str, chosen: ModelMove, multipv: int = MAX_MULTIPV) -> list[str]:
    """The model's thinking as UCI info: the played move as line 1 (with its eval when it is a candidate), then
    the answer's other legal candidates, best eval first; illegal candidates are left out, GUIs reject them."""
    if chosen.move is None:
        return []
    legal = set(chess.legal_moves(fen))
    evals: dict[str, float | None] = {}
    for i, move in enumerate(chosen.answer.moves):
        if move in legal and move not in evals:
            evals[move] = chosen.answer.evals[i] if i < len(chosen.answer.evals) else None
    others = sorted((m for m in evals if m != chosen.move), key=lambda m: -evals[m] if evals[m] is not None else 1e9)
    lines = []
    for k, move in enumerate([chosen.move, *others][:multipv], 1):
        pawns = evals.get(move)
        lines.append(f"info multipv {k}" + (f" score {uci_score(pawns)}" if pawns is not None else "") + f" pv {move}")
    return lines


def source_line(chosen: ModelMove, counts: Counter) -> str:
    """Which of the three levels gave the move, and the game's counts so far."""
    what = chosen.note or f"played its B: move {chosen.move}"
    return (f"info string the model: {what}; this game: B: move {counts[BEST]}, candidate {counts[CANDIDATE]}, "
            f"likeliest legal move {counts[LIKELIEST]}")


# -- parsing position and go ----------------------------------------------------------------------------------------

class PositionError(ValueError):
    """A `position` line that does not give a position."""


def parse_position(words: Sequence[str]) -> tuple[str, list[str], str]:
    """`startpos|fen FEN [moves M...]` (the words after `position`) -> (start FEN, moves, the position now).
    PositionError naming what is wrong: a missing or bad FEN, a move that is malformed or illegal."""
    if not words or words[0] not in ("startpos", "fen"):
        raise PositionError("position needs 'startpos' or 'fen FEN' first")
    end = words.index("moves") if "moves" in words else len(words)
    if words[0] == "startpos":
        if end != 1:
            raise PositionError(f"unexpected {quoted(' '.join(words[1:end]))} after startpos")
        start = chess.START_FEN
    else:
        text = " ".join(words[1:end])
        if not text:
            raise PositionError("position fen needs a FEN")
        problem = chess.fen_problem(text)
        if problem is not None:
            raise PositionError(f"bad FEN {quoted(text)}: {problem}")
        start = chess.normalize_fen(text)
    moves, fen = list(words[end + 1 :]), start
    for i, move in enumerate(moves):
        step = chess.env_steps([fen], [move])[0]
        if step.truncated:
            raise PositionError(f"move {i + 1} of the moves, {quoted(move)}, is not legal in {fen}")
        fen = step.fen
    return start, moves, fen


_GO_NUMBERS = ("wtime", "btime", "winc", "binc", "movestogo", "depth", "nodes", "mate", "movetime")
#: The clocks may be below zero: a GUI that is late reports the time left as it is.
_MAY_BE_NEGATIVE = ("wtime", "btime")
_GO_FLAGS = ("infinite", "ponder")


@dataclass(frozen=True)
class Go:
    """A `go` line's parameters, read and checked. The model answers in one generation whatever the limits say;
    `infinite` and `ponder` hold the answer back until `stop` (or `ponderhit`), and `searchmoves` restricts the
    moves it may play."""

    limits: dict[str, int] = field(default_factory=dict)
    infinite: bool = False
    ponder: bool = False
    searchmoves: tuple[str, ...] = ()

    @property
    def waits(self) -> bool:
        return self.infinite or self.ponder


def parse_go(words: Sequence[str]) -> tuple[Go, list[str]]:
    """The words after `go` -> (Go, what was wrong with them, each said and otherwise ignored)."""
    limits: dict[str, int] = {}
    flags: set[str] = set()
    searchmoves: list[str] = []
    problems: list[str] = []
    keywords = {*_GO_NUMBERS, *_GO_FLAGS, "searchmoves"}
    i = 0
    while i < len(words):
        word = words[i]
        if word in _GO_FLAGS:
            flags.add(word)
            i += 1
        elif word in _GO_NUMBERS:
            value = words[i + 1] if i + 1 < len(words) else None
            try:
                number = int(value)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                problems.append(f"{word} needs a whole number, got {'nothing' if value is None else quoted(value)}")
                i += 1 if value is None or value in keywords else 2
                continue
            if number < 0 and word not in _MAY_BE_NEGATIVE:
                problems.append(f"{word} must not be negative, got {shortened(str(number), ECHO_LIMIT)}")
            else:
                limits[word] = number
            i += 2
        elif word == "searchmoves":
            i += 1
            while i < len(words) and words[i] not in keywords:
                searchmoves.append(words[i])
                i += 1
        else:
            problems.append(f"unknown parameter {quoted(word)}")
            i += 1
    go = Go(limits, "infinite" in flags, "ponder" in flags, tuple(searchmoves))
    return go, problems


# -- options --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Option:
    """A UCI option: its declaration for `uci`'s answer, and its value read from `setoption`."""

    name: str
    kind: str  # combo, spin or string
    default: Any
    choices: tuple[str, ...] = ()
    low: int = 0
    high: int = 0
    check: Callable[[str, Any], str | None] | None = None

    def declaration(self) -> str:
        text = f"option name {self.name} type {self.kind} default {self.default}"
        if self.kind == "combo":
            text += "".join(f" var {c}" for c in self.choices)
        elif self.kind == "spin":
            text += f" min {self.low} max {self.high}"
        return text

    def read(self, value: str) -> Any:
        """The value of `setoption name NAME value VALUE`; ValueError saying why it is refused."""
        if self.kind == "combo":
            found = next((c for c in self.choices if c.lower() == value.lower()), None)
            if found is None:
                raise ValueError(f"{self.name} must be one of {', '.join(self.choices)}, got {quoted(value)}")
            return found
        if self.kind == "spin":
            try:
                number = int(value)
            except ValueError:
                raise ValueError(f"{self.name} needs a whole number, got {quoted(value)}") from None
            if not self.low <= number <= self.high:
                raise ValueError(f"{self.name} must lie in {self.low}..{self.high}, got "
                                 f"{shortened(str(number), ECHO_LIMIT)}")
            return number
        problem = self.check(self.name, value) if self.check is not None else None
        if problem:  # the check's own words may quote the value whole
            raise ValueError(shortened(problem, INFO_LIMIT // 2))
        return value


def engine_options(protocol: str, seed: int, device: str) -> dict[str, Option]:
    """The options `uci` declares, their defaults the command's flags."""
    options = [Option("Protocol", "combo", protocol, tuple(PROTOCOLS)),
               # GUIs read spins as 32-bit numbers; a --seed beyond that stays settable as the default
               Option("Seed", "spin", seed, low=0, high=max(2**31 - 1, seed)),
               Option("Device", "string", device, check=device_name),
               Option("MultiPV", "spin", MAX_MULTIPV, low=1, high=MAX_MULTIPV)]
    return {o.name.lower(): o for o in options}


# -- the engine -----------------------------------------------------------------------------------------------------

class SearchAbandoned(Exception):
    """Raised in the search thread as the model starts a pass after the engine quit: the generation ends between
    two decoding steps rather than after all of them."""


class UciEngine:
    """The UCI protocol around a model. `load(device)` gives the model (a `RookWorldLM`) on a device; `name` is what
    `id name` says."""

    def __init__(self, load: Callable[[str], Any], *, name: str, protocol: str, seed: int, device: str,
                 out: TextIO):
        self._load, self.name, self._out = load, name, out
        self.options = engine_options(protocol, seed, device)
        self.values = {key: o.default for key, o in self.options.items()}
        self.lm, self._lm_device = None, None
        self.fen: str | None = chess.START_FEN
        self.counts: Counter = Counter()
        self._write = threading.Lock()
        self._search: threading.Thread | None = None
        self._stop = threading.Event()
        self._abandon = threading.Event()
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
        while words and words[0] not in _COMMANDS:
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
            # The GUI should have stopped a search first; one left running ends here, with its bestmove.
            self._end_search()
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
        self._ensure_model()
        self._stop.clear()
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
        if self._search is not None:
            self._stop.set()
            self._search.join()
            self._search = None

    def _quit_search(self) -> None:
        """The search at `quit` or the end of the input: one waiting for `stop` ends with its bestmove, as `stop`
        ends it; one still thinking has QUIT_WAIT_S to finish, then is abandoned at the model's next pass, its
        move never said (a GUI that quit reads no bestmove, and no move but the model's is ever played)."""
        if self._search is None:
            return
        self._stop.set()
        self._search.join(QUIT_WAIT_S)
        if self._search.is_alive():
            with self._write:
                self.closed = True
            self._abandon.set()
            # Each pass checks: the wait is one decoding step (or, compiled on a GPU, the rest of a fast generation).
            # A thread left running instead would be killed mid-computation as the interpreter exits: an abort.
            self._search.join()
        self._search = None

    @contextlib.contextmanager
    def _abandonable(self):
        """The model's passes in this block raise SearchAbandoned once the engine quit. Only an eager decoding runs
        the check: a compiled step is one graph, which Python code inside would break."""
        model = self.lm.model
        if not decodes_eagerly(model.device, self.lm.compile):
            yield
            return

        def check(module, args):
            if self._abandon.is_set():
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
        legal = chess.legal_moves(fen)
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
                return
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
