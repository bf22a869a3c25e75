"""The UCI protocol as `rookworld uci` speaks it: commands read a bounded line at a time, `position` and `go` parsed
(a bad one said, never raised past the loop), the engine's options, and what it says of a model's answer (`info`
lines with UCI scores). The engine around a model is `uci.UciEngine`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from rookworld.chess import rules
from rookworld.io.files import next_line
from rookworld.io.quote import ECHO_LIMIT, quoted, shortened
from rookworld.chess.stockfish.analysis import MATE_SCORE
from rookworld.lm.answers import PROTOCOLS
from rookworld.lm.moves import BEST, LIKELIEST, ModelMove
from rookworld.settings.groups import device_name

AUTHOR = "rookworld"
#: A P: answer has five candidates: more lines than that there are not.
MAX_MULTIPV = 5
#: What a sampled protocol's seed advances by per ply, so that each position of a game draws its own sample.
SEED_STRIDE = 7919
#: The longest info string: what the engine says about bad input is one readable line.
INFO_LIMIT = 400
#: How long `quit`, or the end of the input, lets a search that is still thinking run on before it is cut: a session
#: piped in whole ("go" then "quit") gets the model's own move from a fast model.
QUIT_WAIT_S = 0.5
#: Of a clock's remaining time, the share one move may take (plus half the increment), and the time kept back for
#: the answer to travel: the move's time is an upper bound, as a GUI's clock counts it.
MOVES_TO_GO, MARGIN_MS = 20, 50
#: The longest command read, in characters: `position startpos moves ...` through the longest legal game (17,697
#: plies) takes about 90,000. A longer line is read past to its end, never held: a GUI (or /dev/zero) that sends
#: gigabytes without a newline costs no memory.
MAX_COMMAND = 1 << 20
COMMANDS = ("uci", "debug", "isready", "setoption", "register", "ucinewgame", "position", "go", "stop", "ponderhit",
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
    legal = set(rules.legal_moves(fen))
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
    """Where the move came from (its own B: move, or its likeliest legal one), and the game's counts so far."""
    what = chosen.note or f"played its B: move {chosen.move}"
    return f"info string the model: {what}; this game: B: move {counts[BEST]}, likeliest legal move {counts[LIKELIEST]}"


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
        start = rules.START_FEN
    else:
        text = " ".join(words[1:end])
        if not text:
            raise PositionError("position fen needs a FEN")
        problem = rules.fen_problem(text)
        if problem is not None:
            raise PositionError(f"bad FEN {quoted(text)}: {problem}")
        start = rules.normalize_fen(text)
    moves, fen = list(words[end + 1 :]), start
    for i, move in enumerate(moves):
        step = rules.env_steps([fen], [move])[0]
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

    def budget_s(self, white_to_move: bool) -> float | None:
        """The most seconds this answer may take: `movetime`, or a share of the side to move's clock (`wtime` or
        `btime`: a `MOVES_TO_GO`th, or `movestogo`'s, plus half the increment), less `MARGIN_MS`; None when the
        search waits for `stop` or no time is given."""
        if self.waits:
            return None
        if "movetime" in self.limits:
            return max(0.0, self.limits["movetime"] - MARGIN_MS) / 1000
        clock = self.limits.get("wtime" if white_to_move else "btime")
        if clock is None:
            return None
        increment = self.limits.get("winc" if white_to_move else "binc", 0)
        share = max(clock, 0) / max(1, self.limits.get("movestogo", MOVES_TO_GO)) + max(increment, 0) / 2
        return max(0.0, min(share, max(clock, 0) - MARGIN_MS)) / 1000


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
