"""rookworld's chess as an OpenEnv environment (`pip install 'rookworld[openenv]'`), served by `rookworld serve`.

    from rookworld.integrations.openenv import ChessAction, ChessEnvClient

    with ChessEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
        result = env.reset(task="game", colour="w")           # a game against Stockfish
        while not result.done:
            result = env.step(ChessAction(text=result.observation.legal_moves[0]))

An episode is chosen at reset. `task="game"` (the default) is a whole game against Stockfish
(`rookworld.integrations.game.ChessGame`): each step is a move (UCI or SAN) or a whole P: answer, its reward the
move's and, at the end, the result's. `task="policy"`, `"env"` or `"mixed"` is one turn: reset gives a P: or A:
prompt, the step is the answer, and its reward is rookworld's training reward with its breakdown.

Sessions share one Stockfish pool, which grades moves and answers; each game has an opponent engine of its own,
ended with its session. A bad action in a game (unreadable text, an illegal move) loses it, as in `rookworld eval`;
a request that cannot be answered (a bad FEN, an unknown task, a step before reset or after the end) is an error
said to its client, and the server goes on.

A session belongs to the WebSocket connection that made it and ends with it (`openenv_guard.ConnectionGuard`): a client that
leaves, or waits `IDLE_S` without a word, frees its place. Plain HTTP holds nothing: /reset and /step meet a fresh
environment, and the sessions OpenEnv would make over `POST /mcp` (`openenv/session/create`, which would belong to
no connection) are refused, so that no request can fill `max_sessions` and lock the WebSocket clients out.
"""

from __future__ import annotations

import functools
import random
import re
import threading
from typing import Any, Literal

from rookworld.integrations import extras

extras.check("openenv", "openenv")  # before its imports: a replaced package fails in them

from fastapi import FastAPI, Request  # noqa: E402
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rookworld.chess import rules
from rookworld.chess.data import Record
from rookworld.io.quote import ECHO_LIMIT, quoted, shortened
from rookworld.chess.rewards import RewardScorer
from rookworld.chess.stockfish import Role, find_stockfish, pool_for, workers_count_problem
from rookworld.chess.stockfish.engine import EngineOptionError
from rookworld.integrations.game import (MAX_PLIES, OPPONENT_MOVE_S, ChessGame, GameStep, OpponentError,
                                         read_action)
from rookworld.integrations.openenv_guard import (FIRST_MESSAGE_S, IDLE_S, MAX_REQUEST_BYTES, MESSAGE_LIMIT,
                                                  ConnectionGuard, cut_errors)
from rookworld.integrations.chess_reward import chess_rows

#: The name clients and `openenv.yaml` know the environment by.
ENV_NAME = "rookworld_chess"
#: Stockfish's strength when neither the server nor the reset names one: `rookworld eval`'s opponent.
DEFAULT_ELO = 1350
#: The share of P: prompts in each single-turn task (`rookworld train --task-mix`'s default for "mixed").
TASK_MIX = {"policy": 1.0, "env": 0.0, "mixed": 0.8}
GAME_OPTIONS = ("colour", "opponent_elo", "opponent_skill", "max_plies")
UCI_MOVE = re.compile(r"[a-h][1-8][a-h][1-8][qrbn]?")


class ChessEnvError(ValueError):
    """A request the environment cannot answer: said to its client (HTTP 400), and the server goes on. The message
    is cut to MESSAGE_LIMIT characters, whatever it quotes."""

    def __init__(self, message: str):
        super().__init__(shortened(message, MESSAGE_LIMIT))


class ChessAction(Action):
    """What the policy wrote: in a game, a move (UCI or SAN) or a whole P: answer; in a single-turn task, its
    answer to the prompt."""

    text: str


class ChessObservation(Observation):
    """The position and what the last step did. `prompt` is the P: prompt of the position to move in (a game) or
    the task's P: or A: prompt. `move` is the UCI move read from the action, `legal` whether it was legal (None
    where no move applies). A game's reward is `move_reward` plus `result_reward`; a single-turn task's is
    rookworld's reward, made of `breakdown` (`rookworld.chess.rewards.Scores.breakdown`)."""

    fen: str = ""
    prompt: str = ""
    legal_moves: list[str] = Field(default_factory=list)
    opponent_move: str | None = None
    move: str | None = None
    legal: bool | None = None
    move_reward: float | None = None
    result_reward: float | None = None
    outcome: str | None = None  # a game's, once over: "win", "draw", "loss" or "unfinished"
    reason: str | None = None
    moves: list[str] = Field(default_factory=list)
    breakdown: dict[str, Any] = Field(default_factory=dict)


class ChessState(State):
    """The episode: its task ("game", "policy", "env" or "mixed"; None before the first reset), the seed its
    position came from, where it started and where it stands."""

    task: str | None = None
    seed: int | None = None
    start_fen: str | None = None
    fen: str | None = None
    prompt: str | None = None
    colour: str | None = None
    moves: list[str] = Field(default_factory=list)
    done: bool = False
    outcome: str | None = None


class ResetOptions(BaseModel):
    """What a reset takes. A position is `fen`, else the generated position of `seed` (`rookworld positions`'),
    else, for a game, the initial one. `move` and `history` (UCI, oldest first) make an A: prompt of `fen`."""

    model_config = ConfigDict(extra="forbid")

    task: Literal["game", "policy", "env", "mixed"] = "game"
    fen: str | None = None
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    episode_id: str | None = None
    colour: Literal["w", "b"] | None = None
    opponent_elo: int | None = Field(None, ge=1)
    opponent_skill: int | None = Field(None, ge=0, le=20)
    max_plies: int | None = Field(None, ge=1)
    move: str | None = None
    history: list[str] = Field(default_factory=list)


def reset_options(**given: Any) -> ResetOptions:
    """The options of a reset, checked; ChessEnvError says what is wrong in one line."""
    try:
        o = ResetOptions(**given)
    except ValidationError as e:
        problems = "; ".join(f"{shortened('.'.join(map(str, err['loc'])), ECHO_LIMIT) or 'reset'}: {err['msg']}"
                             for err in e.errors())
        raise ChessEnvError(f"bad reset: {problems}") from None
    if o.task == "game":
        if o.move is not None or o.history:
            raise ChessEnvError("move and history make A: prompts: give them with task 'env' or 'mixed'")
        if o.opponent_elo is not None and o.opponent_skill is not None:
            raise ChessEnvError("give opponent_elo or opponent_skill, not both")
    else:
        given_game = [name for name in GAME_OPTIONS if getattr(o, name) is not None]
        if given_game:
            raise ChessEnvError(f"{', '.join(given_game)}: options of task 'game', not of task {o.task!r}")
        if (o.move is not None or o.history) and o.fen is None:
            raise ChessEnvError("move and history need the fen they are played in")
    return o


class ChessEngines:
    """The Stockfish engines of one server: the pool that grades every session's moves and answers (started at
    the first that needs it) and each game's opponent, all ended by `close`. The opponents play at `opponent_elo`
    or `opponent_skill` (UCI_Elo 1350 when neither is given) unless a reset says otherwise, for at most
    `opponent_move_s` seconds a move, whatever `opponent_nodes` (`rookworld.integrations.game.TimedOpponent`)."""

    def __init__(self, *, stockfish_path: str | None = None, stockfish_depth: int = 10,
                 stockfish_workers: int | None = None, stockfish_cache: str | None = None,
                 opponent_elo: int | None = None, opponent_skill: int | None = None, opponent_nodes: int = 20_000,
                 max_plies: int = MAX_PLIES, opponent_move_s: float = OPPONENT_MOVE_S):
        if opponent_elo is not None and opponent_skill is not None:
            raise ValueError("give opponent_elo or opponent_skill, not both")
        if problem := workers_count_problem("stockfish_workers", stockfish_workers):
            raise ValueError(problem)  # at start, not at the first session's first answer
        self.stockfish_path = find_stockfish(stockfish_path)  # a missing binary is said at start, not per session
        self._pool_settings = dict(path=self.stockfish_path, depth=stockfish_depth, workers=stockfish_workers,
                                   cache_path=stockfish_cache)
        self.opponent = (DEFAULT_ELO if opponent_elo is None and opponent_skill is None else opponent_elo,
                         opponent_skill)
        self.opponent_nodes, self.max_plies, self.opponent_move_s = opponent_nodes, max_plies, opponent_move_s
        self._lock = threading.Lock()
        self._scorer: RewardScorer | None = None
        self._games: set[ChessGame] = set()
        self._closed = False

    def scorer(self) -> RewardScorer:
        """rookworld's reward scorer, over the shared pool."""
        with self._lock:
            if self._closed:
                raise ChessEnvError("the server is shutting down")
            if self._scorer is None:
                self._scorer = RewardScorer(pool_for(Role.ANALYSIS, **self._pool_settings))
            return self._scorer

    def open_game(self, elo: int | None, skill: int | None) -> ChessGame:
        try:
            game = ChessGame(opponent_elo=elo, opponent_skill=skill, opponent_nodes=self.opponent_nodes,
                             analysis=self.scorer().stockfish, stockfish_path=self.stockfish_path,
                             max_plies=self.max_plies, opponent_move_s=self.opponent_move_s)
        except EngineOptionError as e:  # Stockfish would clamp it without a word: another opponent than asked for
            raise ChessEnvError(f"{'opponent_elo' if elo is not None else 'opponent_skill'}: {e}") from None
        with self._lock:
            closed = self._closed
            if not closed:
                self._games.add(game)
        if closed:
            game.close()
            raise ChessEnvError("the server is shutting down")
        return game

    def close_game(self, game: ChessGame) -> None:
        with self._lock:
            self._games.discard(game)
        game.close()

    def close(self) -> None:
        """Ends every game's opponent and the pool; the server's shutdown calls it."""
        with self._lock:
            self._closed = True
            games, self._games = list(self._games), set()
            scorer, self._scorer = self._scorer, None
        for game in games:
            game.close()
        if scorer is not None:
            scorer.stockfish.close(cancel_pending=True)


class ChessEnvironment(Environment[ChessAction, ChessObservation, ChessState]):
    """One session's episodes, on the engines its server shares (`ChessEngines`). `reset` takes `ResetOptions`
    as keywords; `step` a `ChessAction`."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, engines: ChessEngines):
        super().__init__()
        self._engines = engines
        self._game: ChessGame | None = None
        self._strength: tuple[int | None, int | None] | None = None
        self._state = ChessState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **options: Any) -> ChessObservation:
        o = reset_options(seed=seed, episode_id=episode_id, **options)
        if o.task == "game":
            return self._reset_game(o)
        # The seed chooses the position (or, of a FEN, the A: move and the task): one is drawn and said when none
        # is given, so that every episode can be had again.
        return self._reset_turn(o, o.seed if o.seed is not None else random.randrange(2**31))

    def _reset_game(self, o: ResetOptions) -> ChessObservation:
        if o.fen is not None:
            start = _fen(o.fen)
        elif o.seed is not None:
            start = chess_rows(count=1, seed=o.seed, document_start=False)[0]["fen"]
        else:
            start = rules.START_FEN
        strength = self._engines.opponent
        if o.opponent_elo is not None or o.opponent_skill is not None:
            strength = (o.opponent_elo, o.opponent_skill)
        if self._game is None or strength != self._strength:
            self._close_game()
            self._game, self._strength = self._engines.open_game(*strength), strength
        self._game.max_plies = o.max_plies or self._engines.max_plies
        try:
            step = self._game.reset(start, o.colour)
        except ValueError as e:
            raise ChessEnvError(str(e)) from None
        except OpponentError as e:  # the episode began and cannot go on: a step says so, a reset starts another
            self._state = ChessState(episode_id=o.episode_id, task="game", seed=o.seed, start_fen=start, done=True,
                                     outcome="unfinished")
            raise ChessEnvError(str(e)) from None
        self._state = ChessState(episode_id=o.episode_id, task="game", seed=o.seed, start_fen=start,
                                 colour=self._game.colour)
        return self._observe_game(step, legal=None, reward=None)

    def _reset_turn(self, o: ResetOptions, seed: int) -> ChessObservation:
        if o.fen is None:
            row = chess_rows(count=1, seed=seed, task_mix=TASK_MIX[o.task], document_start=False)[0]
        else:
            record = Record(_fen(o.fen), tuple(o.history), _a_move(o.fen, o.move) if o.move else None)
            problem = rules.history_problem(record.fen, record.history) if record.history else None
            if problem is not None:
                raise ChessEnvError(f"bad history: {problem}")
            row = chess_rows([record], seed=seed, task_mix=TASK_MIX[o.task], document_start=False)[0]
        if o.task == "env" and row["task"] != "A":
            raise ChessEnvError(f"no move to make in {row['fen']!r}: an A: prompt needs one")
        if row["task"] == "P":  # Stockfish analyses the position while the policy writes its answer
            self._engines.scorer().prefetch([row["prompt"]])
        self._close_game()
        self._state = ChessState(episode_id=o.episode_id, task=o.task, seed=seed, start_fen=row["fen"],
                                 fen=row["fen"], prompt=row["prompt"])
        return ChessObservation(fen=row["fen"], prompt=row["prompt"], legal_moves=rules.legal_moves(row["fen"]))

    def step(self, action: ChessAction, timeout_s: float | None = None, **kwargs: Any) -> ChessObservation:
        state = self._state
        if state.task is None:
            raise ChessEnvError("step before reset: reset first (over plain HTTP every request meets a fresh "
                                "environment: play episodes over the WebSocket, as ChessEnvClient does)")
        if state.done:
            raise ChessEnvError("the episode is over: reset to start another")
        state.step_count += 1
        if state.task == "game":
            try:
                return self._observe_game(self._game.step(action.text))
            except OpponentError as e:
                state.done, state.outcome = True, "unfinished"
                raise ChessEnvError(str(e)) from None
        scores = self._engines.scorer().score_batch([state.prompt], [action.text])
        breakdown = scores.breakdown(0)
        move, legal = None, None
        if breakdown["task"] == "P":
            move, legal = read_action(state.fen, action.text)[0], breakdown["best_legal"]
        state.done = True
        return ChessObservation(fen=state.fen, prompt=state.prompt, legal_moves=rules.legal_moves(state.fen),
                                move=move, legal=legal, breakdown=breakdown, reward=breakdown["reward"], done=True)

    def _observe_game(self, step: GameStep, **fields: Any) -> ChessObservation:
        state = self._state
        state.fen, state.prompt, state.moves = step.fen, step.prompt, step.moves
        state.done, state.outcome = step.done, step.outcome
        values = dict(fen=step.fen, prompt=step.prompt, legal_moves=step.legal_moves, opponent_move=step.opponent_move,
                      move=step.move, legal=step.legal, move_reward=step.move_reward,
                      result_reward=step.result_reward, outcome=step.outcome, reason=step.reason, moves=step.moves,
                      reward=step.reward, done=step.done)
        return ChessObservation(**(values | fields))

    @property
    def state(self) -> ChessState:
        return self._state

    def _close_game(self) -> None:
        if self._game is not None:
            self._engines.close_game(self._game)
            self._game, self._strength = None, None

    def close(self) -> None:
        self._close_game()


def _fen(text: str) -> str:
    try:
        return rules.normalize_fen(text)
    except ValueError as e:
        # The reason may quote the FEN whole: a megabyte FEN must not come back as a megabyte error.
        raise ChessEnvError(f"bad fen: {str(e).replace(text, shortened(text, ECHO_LIMIT))}") from None


def _a_move(fen: str, text: str) -> str:
    """An A: prompt's move in UCI: a legal one in UCI or SAN, or any well-formed one (an A: task may be illegal)."""
    try:
        return rules.parse_move(_fen(fen), text)
    except ValueError:
        if UCI_MOVE.fullmatch(text.strip()):
            return text.strip()
        raise ChessEnvError(f"bad move {quoted(text)}: neither a legal move nor a UCI move") from None


def create_chess_app(engines: ChessEngines, *, max_sessions: int = 8, idle_s: float = IDLE_S,
                     max_request_bytes: int = MAX_REQUEST_BYTES, first_message_s: float = FIRST_MESSAGE_S) -> FastAPI:
    """The OpenEnv server's FastAPI app: `max_sessions` WebSocket sessions at once, each with its own
    `ChessEnvironment` on `engines`, which the app's shutdown closes; each connection held to `ConnectionGuard`'s
    bounds (`idle_s`, `first_message_s`, `max_request_bytes`). Run it with uvicorn (`rookworld serve`)."""
    app = create_app(functools.partial(ChessEnvironment, engines), ChessAction, ChessObservation,
                     env_name=ENV_NAME, max_concurrent_envs=max_sessions)

    async def refused(request: Request, error: ChessEnvError) -> JSONResponse:
        return JSONResponse(status_code=400, content={"detail": str(error)})

    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": cut_errors(error.errors())})

    async def http_error(request: Request, error: HTTPException) -> Response:
        if isinstance(error.detail, list):  # OpenEnv's 422 for a bad action: pydantic's errors, with their input
            error = HTTPException(error.status_code, cut_errors(error.detail), error.headers)
        return await http_exception_handler(request, error)

    app.add_exception_handler(ChessEnvError, refused)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
    app.add_middleware(ConnectionGuard, idle_s=idle_s, max_request_bytes=max_request_bytes,
                       first_message_s=first_message_s)
    app.router.on_shutdown.append(engines.close)
    return app


class ChessEnvClient(EnvClient[ChessAction, ChessObservation, ChessState]):
    """The typed client: `reset(**ResetOptions)` and `step(ChessAction)` give `StepResult[ChessObservation]`.
    Async by default; `.sync()` for plain calls. A refused request raises RuntimeError with the server's reason."""

    def _step_payload(self, action: ChessAction) -> dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[ChessObservation]:
        # The wire format carries reward and done beside the observation, not in it.
        reward, done = payload.get("reward"), payload.get("done", False)
        observation = ChessObservation(**payload.get("observation", {}), reward=reward, done=done)
        return StepResult(observation=observation, reward=reward, done=done)

    def _parse_state(self, payload: dict[str, Any]) -> ChessState:
        return ChessState(**payload)
