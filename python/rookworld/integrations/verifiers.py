"""rookworld's chess as a verifiers environment (`pip install 'rookworld[verifiers]'`; verifiers' classic API,
0.1.10 to 0.3.x): the P: and A: tasks scored exactly as `rookworld train` scores them, and whole games against
Stockfish.

    from rookworld.integrations.verifiers import load_environment
    env = load_environment("policy", source="data/chess-cpu-held-out.jsonl", num_examples=200)
    env = load_environment("game", opponent_skill=5, max_turns=40)

`environments/verifiers/rookworld_chess` is the same function as an Environments Hub package, for
`vf.load_environment("rookworld-chess", ...)` and `vf-eval rookworld-chess`.

Single-turn tasks ("policy", "env", "mixed"): a row's question is its P: or A: prompt, its answer a completion that
scores 1.0 (empty for a P: position without an analysis), its info the position's `fen` and Stockfish's analysis
(`truth_moves`, `truth_evals`; empty lists: Stockfish is asked when the row is scored). The one reward is
`ChessReward`'s; the reward's parts are zero-weight metrics (0 where a part does not apply to the row's task).

The game ("game"): each row is a starting position, the model plays the side to move against Stockfish. Each turn
the model answers with a move (UCI or SAN) or a whole P: answer; the environment plays it (`ChessGame`), replies with
Stockfish's move and the P: prompt of the new position, and ends the episode when the game ends or after `max_turns`
of the model's moves. A rollout's reward is the sum of its moves' rewards plus the result's: each move earns
`ChessGame`'s move reward (a whole P: answer its P: reward, -0.3 to 1.0; a bare move the credit of its rank in
Stockfish's five, 1.0 to 0.15, 0.05 outside them; an illegal or unreadable move -1.0, and it loses the game), and
the end adds `RESULT` (win 1, draw 0, loss -1; 0 for a game stopped unfinished by the turn limit or an error).
`state["chess"]` records the game: its start, moves (both sides', UCI), each move's reward, outcome and reason.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import verifiers as vf

if not hasattr(vf, "SingleTurnEnv"):  # verifiers 0.4 took the classic API away
    raise ImportError(f"rookworld.integrations.verifiers is written for verifiers' classic API (0.1.11 to 0.3.x), and "
                      f"verifiers {getattr(vf, '__version__', '?')} is installed: use "
                      f"rookworld.integrations.verifiers_v1 (pip install 'rookworld[verifiers-v1]')")

from datasets import Dataset  # noqa: E402

from rookworld.chess import rules  # noqa: E402
from rookworld.io.json_line import json_value  # noqa: E402
from rookworld.chess.rewards import policy_prompt, task_of  # noqa: E402
from rookworld.chess.stockfish import StockfishError, find_stockfish  # noqa: E402
from rookworld.integrations.game import MAX_PLIES, ChessGame, GameStep  # noqa: E402
from rookworld.integrations.chess_reward import DOCUMENT_START, chess_rows, message_text  # noqa: E402
from rookworld.integrations.tasks import (PARTS, Grading, LiveGame, answers, new_record, record_step,  # noqa: E402
                                          records, unfinished)
from rookworld.io.quote import ECHO_LIMIT, shortened  # noqa: E402
from rookworld.lm.answers import MAX_NEW_TOKENS  # noqa: E402

#: What `load_environment` serves (`tasks.KINDS`).
TASKS = ("policy", "env", "mixed", "game")
#: verifiers 0.2 and later take their own message objects; 0.1 takes OpenAI's dicts.
_user_message = getattr(vf, "UserMessage", dict)


def load_environment(task: str = "mixed", *, num_examples: int | None = 1000, seed: int = 0,
                     source: str | None = None, task_mix: float = 0.8, document_start: bool = True,
                     stockfish_depth: int = 10, stockfish_path: str | None = None,
                     stockfish_workers: int | None = None, shaping: str = "continuous", opponent_skill: int = 0,
                     opponent_elo: int | None = None, max_turns: int = MAX_PLIES // 2, max_games: int = 64,
                     system_prompt: str | None = None) -> vf.Environment:
    """The environment of `task`: "policy" (P: prompts), "env" (A:), "mixed" (about `task_mix` of the rows P:) or
    "game" (games against Stockfish).

    `source` is a positions file (`rookworld positions --out`, annotated or not, or FENs a line) and
    `num_examples` how many of its positions to take (None: all); without a file, `num_examples` generated positions
    of `seed`. For the game, `source="start"` is the initial position alone. Prompts begin with `DOCUMENT_START`, as
    RookWorld's training documents did, unless `document_start` is False.

    Stockfish (`stockfish_path`, or on PATH) analyses at `stockfish_depth` with `stockfish_workers` engines (one a
    core by default), shared by every rollout. The game's opponent plays at `opponent_skill` (0-20) or
    `opponent_elo` (1350 at least); at most `max_games` games (one opponent engine each) run at once, the others
    wait for theirs. `shaping` is `rookworld train --reward-shaping`."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    if max_turns < 1 or max_games < 1:
        raise ValueError(f"max_turns and max_games must be >= 1, got {max_turns}, {max_games}")
    grading = _Grading(path=stockfish_path, depth=stockfish_depth, workers=stockfish_workers, shaping=shaping)
    # Sampling: every P: and A: answer of the data fits MAX_NEW_TOKENS; the caller's sampling arguments override it.
    common = dict(system_prompt=system_prompt, sampling_args={"max_tokens": MAX_NEW_TOKENS})
    if task == "game":
        find_stockfish(stockfish_path)  # a missing engine fails here, not in every rollout
        rows = _game_rows(source, num_examples, seed, document_start)
        rubric = vf.Rubric(funcs=[game_reward], weights=[1.0])
        for metric in (move_reward, result_reward, legal_moves):
            rubric.add_metric(metric)
        return ChessGameEnv(dataset=Dataset.from_list(rows), rubric=rubric, grading=grading,
                            opponent=dict(path=stockfish_path, skill=opponent_skill, elo=opponent_elo),
                            max_turns=max_turns, max_games=max_games, **common)
    rows = _task_rows(task, source, num_examples, seed, task_mix, document_start)
    if any(task_of(r["question"].removeprefix(DOCUMENT_START)) == "P" and not r["info"]["truth_moves"]
           for r in rows):
        find_stockfish(stockfish_path)
    rubric = vf.Rubric(funcs=[grading.reward_func()], weights=[1.0])
    tasks = {"policy": "P", "env": "A", "mixed": "PA"}[task]
    for name in ("well_formed", *(p for t in tasks for p in PARTS[t])):
        rubric.add_metric(_part(name))
    return ChessTaskEnv(dataset=Dataset.from_list(rows), rubric=rubric, grading=grading, **common)


# ---- rows -----------------------------------------------------------------------------------------------------


def _task_rows(task: str, source: str | None, num_examples: int | None, seed: int, task_mix: float,
               document_start: bool) -> list[dict[str, Any]]:
    """verifiers' columns for `chess_rows`: question, answer, info. verifiers reads a `task` column (and
    `info["task"]`) as a task payload of its own, so the row's task is left to its prompt."""
    mix = {"policy": 1.0, "env": 0.0}.get(task, task_mix)
    rows = chess_rows(records(source, num_examples, seed), seed=seed, task_mix=mix, document_start=document_start)
    if task == "env":  # the positions without an A: move stay P: rows
        rows = [r for r in rows if r["task"] == "A"]
    return [{"question": r["prompt"], "answer": a,
             "info": {"fen": r["fen"], "truth_moves": r["truth_moves"], "truth_evals": r["truth_evals"]}}
            for r, a in zip(rows, answers(rows))]


def _game_rows(source: str | None, num_examples: int | None, seed: int,
               document_start: bool) -> list[dict[str, Any]]:
    fens = [rules.START_FEN] if source == "start" else [r.fen for r in records(source, num_examples, seed)]
    start = DOCUMENT_START if document_start else ""
    return [{"question": start + policy_prompt(f), "answer": "", "info": {"fen": f}} for f in fens]


# ---- scoring --------------------------------------------------------------------------------------------------


def _text(what: str, messages: Any, role: str) -> str:
    """The text of the last `role` message: verifiers' messages or dicts; a plain string is its own text. Anything
    else is a TypeError naming `what` it is (verifiers logs a reward function's error in one line)."""
    try:
        return message_text(messages, role)
    except TypeError as e:
        raise TypeError(f"{what}: {e}") from None


def row_info(info: Any) -> dict:
    """A row's `info` as verifiers hands it: a dict, or its JSON text (a dataset may keep it so), or None for none;
    anything else a TypeError naming it, which verifiers logs and scores 0 (never an AttributeError inside)."""
    if info is None:
        return {}
    if isinstance(info, str):
        try:
            info = json_value(info)
        except ValueError as e:
            raise TypeError(f"the row's info is text but no JSON object: {shortened(str(e), 200)}") from None
    if not isinstance(info, dict):
        raise TypeError(f"the row's info must be a dict (or its JSON text), not a {type(info).__name__}: "
                        f"{shortened(repr(info), ECHO_LIMIT)}")
    return info


class _Grading(Grading):
    """`Grading`, with the reward function a classic environment calls."""

    def reward_func(self) -> Callable:
        grading = self

        async def rookworld(prompt, completion, info, state) -> float:
            prompt_text = _text("prompt", prompt, "user")
            completion_text = _text("completion", completion, "assistant")
            info = row_info(info)
            scored = await asyncio.to_thread(grading.score, prompt_text, completion_text, info.get("truth_moves"),
                                             info.get("truth_evals"))
            state["rookworld"] = scored  # the parts' metrics read it, after this function (verifiers' order)
            return scored["reward"]

        return rookworld


def _part(name: str) -> Callable:
    async def part(state) -> float:
        return (state.get("rookworld") or {}).get(name, 0.0)

    part.__name__ = name
    return part


class _Engines:
    """An environment's Stockfish pool, ended when verifiers tears the environment down (at exit too) or by
    `await env.close_engines()`."""

    grading: _Grading

    @vf.teardown
    async def close_engines(self) -> None:
        # On the loop's thread: verifiers also tears down at interpreter exit, when no thread can be started.
        self.grading.close()


class ChessTaskEnv(_Engines, vf.SingleTurnEnv):
    """The P: and A: tasks: one answer a rollout, scored by rookworld's reward (module docstring)."""

    def __init__(self, *, grading: _Grading, **kwargs):
        self.grading = grading
        super().__init__(**kwargs)

    def score(self, completions: Sequence[str], start: int = 0) -> list[dict[str, float]]:
        """Completions of the dataset's rows `start`, `start` + 1, ... scored as a rollout scores them (the reward
        under "reward", and its parts), without a model client: verifiers' own scoring needs one, even for answers
        written by hand."""
        rows = self.dataset.select(range(start, start + len(completions)))  # an IndexError past the last row
        return [self.grading.score(row["question"], completion, (info := row_info(row["info"])).get("truth_moves"),
                                   info.get("truth_evals"), where=f"row {start + i}'s info")
                for i, (row, completion) in enumerate(zip(rows, completions))]


# ---- the game -------------------------------------------------------------------------------------------------


# verifiers names each reward and metric by its function's name.


def game_reward(state) -> float:
    """A game's reward: its moves' rewards and its result's (module docstring)."""
    return move_reward(state) + result_reward(state)


def move_reward(state) -> float:
    return float(sum((state.get("chess") or {}).get("move_rewards", [])))


def result_reward(state) -> float:
    return float((state.get("chess") or {}).get("result_reward", 0.0))


def legal_moves(state) -> float:
    """How many of the model's moves were legal."""
    return float((state.get("chess") or {}).get("legal_moves", 0))


async def _off_loop(call: Callable, *args):
    """A blocking call (Stockfish's analyses and moves) in a thread, so that the other rollouts run on. An engine
    that fails for good ends this rollout, which verifiers records as its error, not the whole run."""
    try:
        return await asyncio.to_thread(call, *args)
    except StockfishError as e:
        raise vf.InfraError(str(e)) from e


class ChessGameEnv(_Engines, vf.MultiTurnEnv):
    """Games against Stockfish, one a rollout (module docstring). The model's move is played as soon as verifiers
    records it (`add_trajectory_step`), so that every move is scored whatever stops the rollout next; env_response
    then gives Stockfish's answer."""

    def __init__(self, *, grading: _Grading, opponent: dict, max_turns: int, max_games: int, **kwargs):
        self.grading, self.opponent, self.max_games = grading, opponent, max_games
        super().__init__(max_turns=max_turns, **kwargs)
        # asyncio's semaphores belong to one event loop, and verifiers' *_sync methods start a loop a call.
        self._slots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _game_slots(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._slots:
            self._slots[loop] = asyncio.Semaphore(self.max_games)
        return self._slots[loop]

    def _new_game(self) -> ChessGame:
        o = self.opponent
        return ChessGame(opponent_skill=o["skill"], opponent_elo=o["elo"], analysis=self.grading.pool(),
                         stockfish_path=o["path"])

    async def setup_state(self, state):
        live = state["chess_game"] = await LiveGame.start(self._new_game, self._game_slots(), _off_loop)  # ended by end_game
        fen = row_info(state.get("info")).get("fen")
        if not isinstance(fen, str):
            raise TypeError(f"a game row's info needs its \"fen\", text: {shortened(repr(fen), ECHO_LIMIT)}")
        first = await live.call("reset", fen)
        state["chess"] = new_record(fen, first)
        return state

    async def add_trajectory_step(self, state, trajectory_step) -> None:
        await super().add_trajectory_step(state, trajectory_step)
        record = state["chess"]
        if record["outcome"] is not None:
            return
        step = await state["chess_game"].call("step", _text("completion", trajectory_step["completion"], "assistant"))
        record_step(record, step)
        if not step.done and len(state["trajectory"]) >= self.max_turns:
            unfinished(record, "turn limit")
        reply = [_user_message(role="user", content=_reply(step, record))]
        state["chess_reply"] = reply
        if record["outcome"] is not None:
            state["final_env_response"] = reply

    async def env_response(self, messages, state, **kwargs):
        return state["chess_reply"]

    @vf.cleanup
    async def end_game(self, state) -> None:
        record = state.get("chess")
        if record is not None:  # stopped by an error or a budget, not the game
            unfinished(record, state.get("stop_condition") or "stopped")
        live = state.pop("chess_game", None)
        if live is not None:
            await live.close()


def _reply(step: GameStep, record: dict) -> str:
    """What the model reads after its move: Stockfish's answer, then the position's P: prompt, or how the game
    ended."""
    lines = [f"Stockfish plays {step.opponent_move}."] if step.opponent_move else []
    if record["outcome"] is None:
        lines.append(step.prompt)
    else:
        lines.append(f"The game is over ({record['reason']}): {record['outcome']}.")
    return "\n".join(lines)
