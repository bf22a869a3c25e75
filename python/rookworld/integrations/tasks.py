"""What both verifiers environments share, without verifiers: the rows of the P:, A: and game tasks (from a
positions file a library call reads, `positions_file`, which TRL's dataset takes too), the answers that score 1.0, one completion's grading (rookworld's reward and its parts), and a game running beside the event
loop. `verifiers` (the classic API, 0.1.11 to 0.3.x) and `verifiers_v1` (0.4 and later) each wrap these in their
own verifiers' classes."""

from __future__ import annotations

import os

import asyncio
import math
import threading
from collections.abc import Callable
from typing import Any

from rookworld.chess import rules
from rookworld.chess.data import Record, read_records
from rookworld.io.files import not_regular
from rookworld.chess.rewards import GroundTruth, RewardScorer, policy_targets, task_of
from rookworld.chess.stockfish import LazyPool, Role, StockfishPool
from rookworld.integrations.game import RESULT, ChessGame, GameStep
from rookworld.integrations.chess_reward import DOCUMENT_START, ChessReward, given_truths

#: Which tasks an environment serves: P: prompts, A: prompts, about `task_mix` of them P:, or games.
KINDS = ("policy", "env", "mixed", "game")
#: The reward's parts shown as metrics, by task (docs/rewards.md).
PARTS = {"P": ("best_legal", "best", "candidates", "evals"), "A": ("fen_exact", "fen_similarity")}


def positions_file(source: str | bytes | os.PathLike) -> str:
    """`source` as a positions file a library call reads: a path (str, bytes or a Path) of a regular file (a FIFO
    nobody writes blocked the call for ever; the command line reads pipes and FIFOs once, the Python API does not);
    ValueError saying why not, TypeError for what is no path."""
    if isinstance(source, (bytes, os.PathLike)):
        source = os.fsdecode(source)
    if not isinstance(source, str):
        raise TypeError(f"source must be a positions file's path (a str or a Path), not a {type(source).__name__}")
    if (why := not_regular(source)) is not None:
        raise ValueError(f"source {source}: {why}: give a positions file")
    return source


def records(source: str | None, num_examples: int | None, seed: int) -> list[Record]:
    """The positions with a move to make (a finished game is no question) of `source`, or generated ones."""
    if source is None:
        if num_examples is None:
            raise ValueError("give a positions file as source, or a number of positions to generate")
        found = [Record.from_position(p) for p in rules.generate_positions(num_examples, seed)]
    else:
        found = read_records(positions_file(source))[0]
    found = [r for r, moves in zip(found, rules.legal_moves_batch([r.fen for r in found])) if moves]
    return found if num_examples is None else found[:num_examples]


def answers(rows: list[dict[str, Any]]) -> list[str]:
    """A completion that scores 1.0 for each of `chess_rows`' rows: RookWorld's P: target where the row has an
    analysis, the A: target (the rules' next state); "" for a P: row without an analysis."""
    out = [""] * len(rows)
    policy = [i for i, r in enumerate(rows) if r["task"] == "P" and r["truth_moves"]]
    env = [i for i, r in enumerate(rows) if r["task"] == "A"]
    if policy:
        targets = policy_targets([rows[i]["fen"] for i in policy], [rows[i]["truth_moves"] for i in policy],
                                 [rows[i]["truth_evals"] for i in policy], [rows[i]["truth_moves"][0] for i in policy])
        for i, t in zip(policy, targets):
            out[i] = t
    if env:
        targets = rules.env_targets([rows[i]["prompt"].removeprefix(DOCUMENT_START) for i in env])
        for i, t in zip(env, targets):
            out[i] = t
    return out


class Grading:
    """What scores the rollouts of one Stockfish setting: rookworld's reward (`ChessReward`), and one Stockfish
    pool, started when a position first needs it (from any thread), for the rows that carry no analysis and for the
    games' moves."""

    def __init__(self, *, path: str | None, depth: int, workers: int | None, shaping: str):
        self.reward = ChessReward("mixed", stockfish_path=path, stockfish_depth=depth, stockfish_workers=workers,
                                  shaping=shaping)
        self._parts = RewardScorer(None, shaping)
        self._pool = LazyPool(Role.ANALYSIS, path=path, depth=depth, workers=workers)

    def pool(self) -> StockfishPool:
        return self._pool.get()

    def score(self, prompt: str, completion: str, truth_moves: list | None, truth_evals: list | None,
              where: str = "the row's info") -> dict[str, float]:
        """One completion's reward as `ChessReward` gives it (key "reward"), and the reward's parts (0 where one
        does not apply). Any completion is scored; a row's bad analysis is a ValueError naming `where` it is.
        Stockfish analyses a P: position once, for both."""
        prompt = prompt.removeprefix(DOCUMENT_START)
        truth: GroundTruth | None = None
        if task_of(prompt) == "P":
            (truth,) = given_truths([prompt], [truth_moves], [truth_evals], [where])
            if truth is None:
                truth = RewardScorer(self.pool()).ground_truth([prompt])[0]
        moves, evals = truth or ([], [])
        reward = self.reward([prompt], [completion], truth_moves=[moves], truth_evals=[evals])[0]
        parts = self._parts.score_batch([prompt], [completion], [truth]).breakdown(0)
        scored = {name: finite(parts.get(name)) for name in ("well_formed", *PARTS["P"], *PARTS["A"])}
        return scored | {"reward": float(reward)}

    def close(self) -> None:
        self.reward.close()
        self._pool.close()


class Gradings:
    """The process's `Grading` of each setting: the tasks of a verifiers v1 taskset, built one by one from their
    config, share one, whichever thread asks."""

    def __init__(self):
        self._by_setting: dict[tuple, Grading] = {}
        self._lock = threading.Lock()

    def get(self, *, path: str | None = None, depth: int = 10, workers: int | None = None,
            shaping: str = "continuous") -> Grading:
        key = (path, depth, workers, shaping)
        with self._lock:
            if key not in self._by_setting:
                self._by_setting[key] = Grading(path=path, depth=depth, workers=workers, shaping=shaping)
            return self._by_setting[key]

    def close(self) -> None:
        """Ends every `Grading`'s Stockfish pool (a later score starts its pool again)."""
        with self._lock:
            gradings = list(self._by_setting.values())
        for g in gradings:
            g.close()


def finite(value) -> float:
    """A part as a metric: verifiers weighs every metric by 0 into the reward, so NaN must not reach it."""
    value = float(value or 0.0)
    return value if math.isfinite(value) else 0.0


async def in_thread(call: Callable, *args):
    return await asyncio.to_thread(call, *args)


class LiveGame:
    """A rollout's game and its place among the games running at once (`slots`). Its calls run one at a time in a
    thread (`off_loop`, which may turn an engine's failure into the environment's error): a rollout cancelled
    mid-move (a timeout) closes its game only once that move's thread is done with it."""

    def __init__(self, game: ChessGame, slots: asyncio.Semaphore, off_loop: Callable = in_thread):
        self.game, self.slots, self.off_loop, self._lock = game, slots, off_loop, threading.Lock()

    @classmethod
    async def start(cls, new_game: Callable[[], ChessGame], slots: asyncio.Semaphore,
                    off_loop: Callable = in_thread) -> LiveGame:
        await slots.acquire()
        try:
            return cls(await off_loop(new_game), slots, off_loop)
        except BaseException:
            slots.release()
            raise

    async def call(self, method: str, *args):
        return await self.off_loop(self._locked, getattr(self.game, method), *args)

    def _locked(self, call: Callable, *args):
        with self._lock:
            return call(*args)

    async def close(self) -> None:
        try:
            await asyncio.to_thread(self._locked, self.game.close)
        finally:
            self.slots.release()


def new_record(start_fen: str, first: GameStep) -> dict[str, Any]:
    """A game's record as both environments keep it: its start, moves (both sides', UCI), each move's reward, how
    many of the model's moves were legal, the result's reward, outcome and reason."""
    return {"start_fen": start_fen, "moves": list(first.moves), "move_rewards": [], "legal_moves": 0,
            "result_reward": 0.0, "outcome": None, "reason": None}


def record_step(record: dict, step: GameStep) -> None:
    record["moves"] = list(step.moves)
    record["move_rewards"].append(step.move_reward)
    record["legal_moves"] += step.legal
    if step.done:
        record.update(result_reward=step.result_reward, outcome=step.outcome, reason=step.reason)


def unfinished(record: dict, reason: str) -> None:
    """A game stopped before its end (a turn limit, a timeout, an error): scored as it stands."""
    if record["outcome"] is None:
        record.update(result_reward=RESULT["unfinished"], outcome="unfinished", reason=reason)
