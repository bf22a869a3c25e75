"""Whole games: the model against itself, against Stockfish, or against a person, every move checked by the Rust
core's A: environment (the same rules the A: task is scored by).

A `Player` chooses a move for each of a batch of games, so that the model answers every game to move in one
batched generation. A game ends at checkmate, a draw of the rules (stalemate, insufficient material, the 75-move
rule, threefold repetition), an illegal or unreadable move (which loses), or the ply limit.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Protocol

from rookworld.chess import rules
from rookworld.chess.stockfish.engine import STARTUP_S, Engine, EngineFailure, StockfishError, find_stockfish
from rookworld.lm.moves import SOURCES, choose_moves

WHITE, BLACK = "w", "b"
COLOUR_NAMES = {WHITE: "white", BLACK: "black"}


def turn(fen: str) -> str:
    return fen.split()[1]


def _repetition_key(fen: str) -> str:
    """Placement, side to move, castling and en passant: what makes positions the same for repetition."""
    return " ".join(fen.split()[:4])


def draw_reason(fen: str) -> str:
    """Why the A: environment called the position after a move a draw."""
    if not rules.legal_moves(fen):
        return "stalemate"
    if int(fen.split()[4]) >= 150:
        return "75-move rule"
    return "insufficient material"


@dataclass
class Choice:
    """A player's move for one game: `move` as written (None when the answer had no move at all), the completion
    it came from, a note when the player did something the user should hear of (a fallback), and, for the model,
    where the move came from (`rookworld.lm.moves.SOURCES`)."""

    move: str | None
    answer: str | None = None
    note: str | None = None
    source: str | None = None


@dataclass
class Game:
    start_fen: str = rules.START_FEN
    fen: str = ""
    #: Legal moves played, UCI, oldest first.
    moves: list[str] = field(default_factory=list)
    #: Per move attempted: the player's completion (None for an engine or a person) and its note.
    answers: list[str | None] = field(default_factory=list)
    notes: list[str | None] = field(default_factory=list)
    #: Per move attempted: where the model's move came from (None for an engine or a person).
    sources: list[str | None] = field(default_factory=list)
    #: "1-0", "0-1", "1/2-1/2", or None while the game goes on (and for a game stopped at the ply limit).
    result: str | None = None
    reason: str | None = None
    #: The colour that played an illegal or unreadable move, which lost the game.
    illegal_by: str | None = None
    ended: bool = False
    _seen: Counter = field(default_factory=Counter, repr=False)

    def __post_init__(self) -> None:
        self.fen = self.fen or self.start_fen
        self._seen[_repetition_key(self.fen)] += 1

    @property
    def turn(self) -> str:
        return turn(self.fen)

    def _end(self, result: str | None, reason: str) -> None:
        self.result, self.reason, self.ended = result, reason, True

    def play(self, choice: Choice) -> bool:
        """Plays a choice; False (and the game lost) for an illegal or missing move."""
        mover = self.turn
        self.answers.append(choice.answer)
        self.notes.append(choice.note)
        self.sources.append(choice.source)
        step = rules.env_steps([self.fen], [choice.move or ""])[0]
        if step.truncated:
            self.illegal_by = mover
            what = f"illegal move {choice.move!r}" if choice.move else "no move in its answer"
            self._end("0-1" if mover == WHITE else "1-0", f"{what} by {COLOUR_NAMES[mover]}")
            return False
        self.moves.append(choice.move)
        self.fen = step.fen
        self._seen[_repetition_key(step.fen)] += 1
        if step.terminated and step.reward == 1.0:
            self._end("1-0" if mover == WHITE else "0-1", "checkmate")
        elif step.terminated:
            self._end("1/2-1/2", draw_reason(step.fen))
        elif self._seen[_repetition_key(step.fen)] >= 3:
            self._end("1/2-1/2", "threefold repetition")
        return True

    def stop(self, reason: str, result: str | None = None) -> None:
        """Ends the game outside the rules: the ply limit (no result), a resignation (a result)."""
        self._end(result, reason)

    def source_counts(self) -> dict[str, int]:
        """How many of the model's moves came from each source: its own B: move, or its likeliest legal move."""
        return {source: self.sources.count(source) for source in SOURCES}

    def to_dict(self) -> dict:
        return {"start_fen": self.start_fen, "moves": list(self.moves), "fen": self.fen, "result": self.result,
                "reason": self.reason, "illegal_by": self.illegal_by, "answers": list(self.answers),
                "notes": [n for n in self.notes if n], "move_sources": self.source_counts()}


def model_score(game: Game, colour: str) -> float:
    """1, 0.5 or 0 from `colour`'s side; a game stopped at the ply limit counts as a draw."""
    if game.result is None or game.result == "1/2-1/2":
        return 0.5
    return 1.0 if (game.result == "1-0") == (colour == WHITE) else 0.0


class Player(Protocol):
    name: str

    def choose(self, games: Sequence[Game]) -> list[Choice]: ...


def play_games(games: Sequence[Game], players: Sequence[Player], player_of, *, max_plies: int,
               progress=None) -> None:
    """Plays every game to its end: `player_of(game)` is the index in `players` of the one to move. Each round,
    every game moves once and each player answers its games in one batch. A game at `max_plies` moves is stopped
    ("ply limit"). `progress` counts the games as they end, with the moves played so far."""

    def stop_at_limit() -> None:
        for g in games:
            if not g.ended and len(g.moves) >= max_plies:
                g.stop("ply limit")

    stop_at_limit()
    counted = 0
    while live := [g for g in games if not g.ended]:
        to_move = [player_of(g) for g in live]  # before anyone moves: each game moves once a round
        for index, player in enumerate(players):
            mine = [g for g, i in zip(live, to_move) if i == index]
            if mine:
                for g, choice in zip(mine, player.choose(mine)):
                    g.play(choice)
        stop_at_limit()
        if progress is not None:
            ended, moves = sum(g.ended for g in games), sum(len(g.moves) for g in games)
            progress.update(ended - counted, postfix=f"{moves} move{'s' * (moves != 1)}")
            counted = ended


class ModelPlayer:
    """The model's move. With `fallback` (play, vs-stockfish, and the UCI engine through the same
    `rookworld.lm.moves.choose_moves`) always a legal one: its B: move when legal, else the legal move it finds most
    probable at its B:, the choice saying which. Without it, the B: move as written, an illegal one
    losing the game: self-play counts the legal moves before the first illegal one, as RookWorld does."""

    def __init__(self, lm, decoding, *, seed: int = 0, fallback: bool = False):
        self.lm, self.decoding, self.seed, self.fallback = lm, decoding, seed, fallback
        self.name = f"model ({decoding.name})"
        self._calls = 0

    def choose(self, games: Sequence[Game]) -> list[Choice]:
        self._calls += 1
        fens, seed = [g.fen for g in games], self.seed + 7919 * self._calls
        if not self.fallback:
            return [Choice(a.best, a.text) for a in self.lm.policy(fens, decoding=self.decoding, seed=seed)]
        return [Choice(m.move, m.answer.text, m.note, m.source)
                for m in choose_moves(self.lm, fens, decoding=self.decoding, seed=seed)]


class StockfishPlayer:
    """Stockfish as an opponent at a fixed strength: `elo` (UCI_LimitStrength, calibrated; Stockfish 15.1 accepts
    1350-2850) or `skill` (Skill Level 0-20), searching `nodes` nodes a move. An engine that dies or hangs is
    killed, started again and asked again (`retries` times a move, as the analysis pool does), so that one crash
    does not end a suite; `restarts` counts them."""

    def __init__(self, path: str | None = None, *, elo: int | None = None, skill: int | None = None,
                 nodes: int = 20_000, timeout_s: float = 60.0, retries: int = 3):

        if elo is not None and skill is not None:
            raise ValueError("give Stockfish's strength as elo or as skill, not both")
        options: dict[str, int | str] = {"Threads": 1, "Hash": 16}
        if elo is not None:
            options |= {"UCI_LimitStrength": "true", "UCI_Elo": elo}
            self.strength = f"UCI_Elo {elo}"
        elif skill is not None:
            options["Skill Level"] = skill
            self.strength = f"Skill Level {skill}"
        else:
            self.strength = "full strength"
        self.name = f"Stockfish ({self.strength}, {nodes} nodes)"
        self.go, self.timeout_s, self.retries = f"go nodes {nodes}", timeout_s, max(0, retries)
        self.path, self.options, self.restarts = find_stockfish(path), options, 0
        self.engine = self._start()

    def _start(self) -> Engine:
        try:
            return Engine(self.path, self.options, startup_timeout=min(self.timeout_s, STARTUP_S))
        except EngineFailure as exc:
            raise StockfishError(f"cannot start Stockfish ({self.path}): {exc}") from exc

    def _best_move(self, game: Game) -> str:
        for _ in range(self.retries + 1):
            try:
                return self.engine.best_move(game.start_fen, game.moves, self.go, self.timeout_s)
            except EngineFailure as exc:
                failure = exc
                self.engine.kill()
                self.restarts += 1
                self.engine = self._start()
        raise StockfishError(f"Stockfish failed {self.retries + 1} times on a move from {game.start_fen} after "
                             f"{' '.join(game.moves) or 'no moves'}; last: {failure}")

    def choose(self, games: Sequence[Game]) -> list[Choice]:
        return [Choice(self._best_move(g)) for g in games]

    def close(self) -> None:
        self.engine.quit()

    def __enter__(self) -> StockfishPlayer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


#: The two-sided 95% quantile of the standard normal.
Z95 = NormalDist().inv_cdf(0.975)


def elo_difference(wins: int, draws: int, losses: int) -> tuple[float, float, float]:
    """The Elo difference a score implies, with a 95% interval: finite for every result, 0 wins in 4 games too.

    The score counts one virtual drawn game beside the real ones (add-half smoothing: half a point in one more
    game), so that no score is 0 or 1, whose Elo is infinite; the interval is Wilson's score interval on that score,
    each game a trial worth 0 to 1 (conservative when there are draws, whose spread is smaller), which stays inside
    (0, 1) where the normal approximation crosses 0 or 1 with few games. With many games both are the plain
    score's. NaN for no games."""
    n = wins + draws + losses
    if n == 0:
        return math.nan, math.nan, math.nan
    games = n + 1
    s = (wins + 0.5 * draws + 0.5) / games
    z2 = Z95 * Z95
    centre = (s + z2 / (2 * games)) / (1 + z2 / games)
    half = Z95 / (1 + z2 / games) * math.sqrt(s * (1 - s) / games + z2 / (4 * games * games))
    return _elo(s), _elo(centre - half), _elo(centre + half)


def _elo(score: float) -> float:
    return -400 * math.log10(1 / score - 1)
