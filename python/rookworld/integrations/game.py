"""A game of chess against Stockfish as an RL environment, with no framework: reset to a position, step with a move
or a whole P: completion, a reward for each move from Stockfish's analysis and one at the end from the result.
verifiers' multi-turn game and the OpenEnv server are both this class.

A move's reward is dense and is rookworld's own P: scoring (docs/rewards.md) of the position before it: a whole P:
answer gets the P: reward (-0.3 to 1.0); a bare move gets the `best` part alone, the credit of its rank in
Stockfish's five (1.0, 0.6, 0.4, 0.25, 0.15; 0.05 outside them). An illegal or unreadable move scores `ILLEGAL`
and loses the game, as in `rookworld eval`'s games. The step that ends a game adds `RESULT[outcome]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rookworld.chess import rules
from rookworld.io.quote import shortened
from rookworld.chess.rewards import RewardScorer, policy_prompt
from rookworld.chess.stockfish import Role, StockfishError, StockfishPool, pool_for
from rookworld.chess.stockfish.engine import ANSWER_S
from rookworld.lm.answers import read_policy_answers
from rookworld.lm.games import WHITE, Choice, Game, StockfishPlayer

#: The reward of an illegal or unreadable move, which also ends the game.
ILLEGAL = -1.0
#: Added at a game's last step, by its outcome for the side the environment's user plays.
RESULT = {"win": 1.0, "draw": 0.0, "loss": -1.0, "unfinished": 0.0}
#: Plies (both sides' moves) after which a game stops unfinished.
MAX_PLIES = 200
#: Seconds the opponent may think about one move, whatever its node limit: a client waits on it. 20,000 nodes take
#: Stockfish a few hundredths of a second, so the bound only ever cuts a node limit far past any sensible one.
OPPONENT_MOVE_S = 5.0


class OpponentError(RuntimeError):
    """The opponent gave no move in its time (or its engine failed): the game is stopped, and its engine is started
    again for the next one."""


class TimedOpponent(StockfishPlayer):
    """Stockfish as a game's opponent, whose move has a wall-clock bound: it searches `nodes` nodes or `move_s`
    seconds, whichever ends first (`go movetime`), and an engine that still gives no `bestmove` `ANSWER_S` later
    (one that ignores `movetime` and talks on) is killed and started again. It is asked once, not again as
    `rookworld eval`'s opponent is: a client waits on the move, and a second wait would double the bound."""

    def __init__(self, path: str | None, *, elo: int | None, skill: int | None, nodes: int, move_s: float):
        if not (math.isfinite(move_s) and move_s > 0):
            raise ValueError(f"the opponent's time for a move must be a positive number of seconds, got {move_s}")
        super().__init__(path, elo=elo, skill=skill, nodes=nodes, timeout_s=move_s + ANSWER_S, retries=0)
        # movetime before nodes: Stockfish reads `go` word by word and stops at a number it cannot hold (a node count
        # past 2^64), which would leave the search with no limit at all.
        self.go = f"go movetime {max(1, round(move_s * 1000))} nodes {nodes}"


@dataclass(frozen=True)
class GameStep:
    """What a step (or a reset) gives back. `prompt` is the P: prompt of the position to move in; `move` the UCI move
    read from the action (None when none could be read); `reward` is `move_reward` plus `result_reward`."""

    fen: str
    prompt: str
    legal_moves: list[str]
    opponent_move: str | None = None
    move: str | None = None
    legal: bool = True
    move_reward: float = 0.0
    result_reward: float = 0.0
    done: bool = False
    outcome: str | None = None  # "win", "draw", "loss" or "unfinished" once done
    reason: str | None = None
    moves: list[str] = field(default_factory=list)

    @property
    def reward(self) -> float:
        return self.move_reward + self.result_reward


def read_action(fen: str, action: str) -> tuple[str | None, str | None, bool]:
    """What an action says: the UCI of the legal move it names (None when it names none), the word it was read
    from (its B: move when it is a whole P: answer, else the text when it is one word; None otherwise), and whether
    it was a whole P: answer."""
    answer = read_policy_answers([action])[0]
    words = action.split()
    text = answer.best if answer.well_formed else words[0] if len(words) == 1 else None
    if text is None:
        return None, None, answer.well_formed
    try:
        return rules.parse_move(fen, text), text, answer.well_formed
    except ValueError:
        return None, text[:20], answer.well_formed


class ChessGame:
    """One game against Stockfish at a fixed strength (`opponent_skill` 0-20, or `opponent_elo`, 1350 at least).

    `reset(fen)` starts from `fen` (the start position by default) with the user playing `colour` ("w" or "b"; the
    side to move by default): when that is not the side to move, Stockfish moves first. `step(action)` plays the
    user's move and Stockfish's answer, which takes at most `opponent_move_s` seconds of search (`TimedOpponent`);
    an opponent that gives none stops the game with `OpponentError`. `analysis` is the Stockfish pool that grades
    moves; one of one engine is started when none is given (sessions of a server share theirs). Close the game to
    end its engines."""

    def __init__(self, *, opponent_skill: int | None = 0, opponent_elo: int | None = None, opponent_nodes: int = 20_000,
                 analysis: StockfishPool | None = None, stockfish_path: str | None = None, stockfish_depth: int = 10,
                 max_plies: int = MAX_PLIES, opponent_move_s: float = OPPONENT_MOVE_S):
        self._opponent = TimedOpponent(stockfish_path, skill=None if opponent_elo is not None else opponent_skill,
                                       elo=opponent_elo, nodes=opponent_nodes, move_s=opponent_move_s)
        self._own_pool = analysis is None
        self._pool = analysis or pool_for(Role.GAME, path=stockfish_path, depth=stockfish_depth)
        self._scorer = RewardScorer(self._pool)
        self.max_plies = max_plies
        self.game: Game | None = None
        self.colour = WHITE

    def reset(self, fen: str | None = None, colour: str | None = None) -> GameStep:
        start = rules.normalize_fen(fen) if fen else rules.START_FEN
        if not rules.legal_moves(start):
            raise ValueError(f"the game is over in this position: {start}")
        if colour not in (None, "w", "b"):
            raise ValueError(f"colour must be 'w' or 'b', got {colour!r}")
        self.game = Game(start)
        self.colour = colour or self.game.turn
        opponent_move = self._opponent_moves() if self.game.turn != self.colour else None
        return self._observe(opponent_move=opponent_move)

    def step(self, action: str) -> GameStep:
        game = self.game
        if game is None:
            raise RuntimeError("reset the game before stepping it")
        if game.ended:
            raise RuntimeError("the game is over: reset it")
        fen = game.fen
        move, word, whole = read_action(fen, action)
        if move is None:  # the game's record says "illegal move 'e2e5'" or "no move in its answer"
            game.play(Choice(word, action))
            return self._observe(move=None, legal=False, move_reward=ILLEGAL)
        prompt = policy_prompt(fen)
        completion = action if whole else f"M: {move} E: 0 B: {move}"
        scores = self._scorer.score_batch([prompt], [completion])
        move_reward = float(scores.rewards[0] if whole else scores.parts["best"][0])
        game.play(Choice(move, action))
        opponent_move = self._opponent_moves()
        return self._observe(move=move, move_reward=move_reward, opponent_move=opponent_move)

    def _opponent_moves(self) -> str | None:
        game = self.game
        self._stop_at_limit()
        if game.ended:
            return None
        try:
            (choice,) = self._opponent.choose([game])
        except StockfishError as e:
            raise self._opponent_failed(e) from None
        game.play(choice)
        self._stop_at_limit()
        return choice.move

    def _opponent_failed(self, error: StockfishError) -> OpponentError:
        """Stops the game that its opponent could not go on with; the error says why in one line."""
        self.game.stop("the opponent gave no move")
        why = str(error).rpartition("; last: ")[2]  # the engine's own failure, without the game's whole move list
        return OpponentError(f"{self._opponent.name} gave no move within {self._opponent.timeout_s:g} s "
                             f"({shortened(why, 200)}): the game is stopped; reset to play another")

    def _stop_at_limit(self) -> None:
        if not self.game.ended and len(self.game.moves) >= self.max_plies:
            self.game.stop("ply limit")

    def _outcome(self) -> str:
        result = self.game.result
        if result is None:
            return "unfinished"
        if result == "1/2-1/2":
            return "draw"
        return "win" if (result == "1-0") == (self.colour == WHITE) else "loss"

    def _observe(self, *, move: str | None = None, legal: bool = True, move_reward: float = 0.0,
                 opponent_move: str | None = None) -> GameStep:
        game = self.game
        outcome = self._outcome() if game.ended else None
        return GameStep(fen=game.fen, prompt=policy_prompt(game.fen),
                        legal_moves=[] if game.ended else rules.legal_moves(game.fen),
                        opponent_move=opponent_move, move=move, legal=legal, move_reward=move_reward,
                        result_reward=RESULT[outcome] if outcome else 0.0, done=game.ended, outcome=outcome,
                        reason=game.reason, moves=list(game.moves))

    def close(self) -> None:
        self._opponent.close()
        if self._own_pool:
            self._pool.close()

    def __enter__(self) -> ChessGame:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
