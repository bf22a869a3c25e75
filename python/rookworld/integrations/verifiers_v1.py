"""rookworld's chess as a verifiers v1 taskset (verifiers 0.4 and later: `Taskset`, `Task`, `Env`, `Harness`,
traces): the P: and A: tasks scored exactly as `rookworld train` scores them, and whole games against Stockfish.
`rookworld.integrations.verifiers` is the same for verifiers' classic API (0.1.11 to 0.3.x).

    from rookworld.integrations.verifiers_v1 import load_environment
    env = load_environment("policy", source="data/chess-cpu-held-out.jsonl", num_examples=200)
    env = load_environment("game", opponent_skill=5, max_turns=40)

or, from the shell, through the taskset id `rookworld-chess-v1` (a top-level module of that name re-exporting this
one's `__all__`, as `environments/verifiers/rookworld_chess_v1` does, for processes that never import this one):

    vf-eval rookworld-chess-v1 --env.taskset.kind game --env.taskset.source start -m MODEL \\
      --client.base-url http://localhost:8000/v1 --client.api-key-var OPENAI_API_KEY --no-push -n 1 -r 8

What the module exports is what verifiers' loaders look for: one `Taskset` (`RookWorldTaskset`, config
`RookWorldConfig`, under `--env.taskset.*`), one `Env` (`RookWorldEnv`: one `agent` seat; it plays the games) and
one `Harness` (`RookWorldHarness`: one chat-completions call a turn, in this process, through verifiers'
interception, so no sandbox, program or `uv` is needed; `--env.agent.harness.id null` runs verifiers' own chat
program instead). The seat runs in the `subprocess` runtime, not verifiers' default remote sandbox, and answers in
at most `MAX_NEW_TOKENS` tokens (`--env.agent.sampling.max-tokens` overrides both the run's and this).

Single-turn tasks (`kind` "policy", "env", "mixed"): a task's prompt is its P: or A: prompt, its data the
position's `fen`, Stockfish's analysis (`truth_moves`, `truth_evals`; empty lists: Stockfish is asked when the
task is scored) and an `answer` that scores 1.0 (empty for a P: position without an analysis). The reward
`rookworld` is `ChessReward`'s, given the model's last reply, whatever it says; the reward's parts are the metrics
(`well_formed` and the P: or A: parts of docs/rewards.md).

The game (`kind` "game"): each task is a starting position; the model plays the side to move against Stockfish.
Each turn the model answers with a move (UCI or SAN) or a whole P: answer; `RookWorldEnv` plays it (`ChessGame`),
answers with Stockfish's move and the P: prompt of the new position, and ends the exchange when the game ends or
after `max_turns` of the model's moves. The rewards are `move_reward`, the sum of the moves' rewards (a whole P:
answer its P: reward, -0.3 to 1.0; a bare move the credit of its rank in Stockfish's five, 1.0 to 0.15, 0.05
outside them; an illegal or unreadable move -1.0, and it loses the game), and `result_reward`, `RESULT` of the
outcome (win 1, draw 0, loss -1; 0 for a game stopped unfinished). `trace.info["chess"]` records the game: its
start, moves (both sides', UCI), each move's reward, outcome and reason.

Stockfish's settings, the reward shaping and the opponent's strength are the tasks' config (`RookWorldTaskConfig`,
under `--env.taskset.task.*`); one analysis pool a setting serves every rollout of the process, and ends when the
environment stops serving (`RookWorldEnv.stop`) or with `close_engines()`.

The module imports without verifiers 0.4: its verifiers classes then are not defined, and asking for one says which
verifiers it needs.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sys
import weakref
from typing import Any, Literal

from rookworld.chess import rules
from rookworld.chess.rewards import SHAPINGS, policy_prompt
from rookworld.chess.stockfish import find_stockfish
from rookworld.chess.stockfish.limits import MAX_DEPTH
from rookworld.integrations.game import MAX_PLIES, ChessGame, GameStep
from rookworld.integrations.chess_reward import DOCUMENT_START, chess_rows
from rookworld.integrations.tasks import (KINDS, PARTS, Gradings, LiveGame, answers, new_record, record_step, records,
                                          unfinished)
from rookworld.integrations import extras
from rookworld.lm.answers import MAX_NEW_TOKENS

#: The first verifiers release this module is written for (0.3 has an earlier `verifiers.v1`, not this one).
MIN_VERIFIERS = (0, 4)


def _verifiers_v1():
    """verifiers.v1 where the installed verifiers is `MIN_VERIFIERS` or later; else an ImportError saying what is."""
    import verifiers

    version = getattr(verifiers, "__version__", "0")
    found = re.match(r"(\d+)\.(\d+)", version)
    if found and not version.endswith("+unknown") and tuple(map(int, found.groups())) < MIN_VERIFIERS:
        raise ImportError(f"verifiers {version} is installed")
    import verifiers.v1

    return verifiers.v1


extras.check("verifiers-v1", "verifiers")  # before its imports: a replaced package fails in them
try:
    vf = _verifiers_v1()
    from verifiers.v1.dialects.chat import message_to_wire
    from verifiers.v1.errors import MODEL_TRANSPORT_ERROR_EXIT_CODE
    from verifiers.v1.types import content_text
except ImportError as _error:  # verifiers before 0.4 (the classic API), or none
    vf = None
    _MISSING: ImportError | None = _error
else:
    _MISSING = None

#: The taskset id: `vf-eval rookworld-chess-v1`, `--env.taskset.id rookworld-chess-v1`.
TASKSET_ID = "rookworld-chess-v1"
#: What a game's record in `trace.info` is kept under.
GAME_INFO = "chess"


# ---- rows (no verifiers needed) ---------------------------------------------------------------------------------


def task_rows(kind: str, *, source: str | None = None, num_examples: int | None = 1000, seed: int = 0,
              task_mix: float = 0.8, document_start: bool = True) -> list[dict[str, Any]]:
    """The tasks' data of `kind`, as dicts: `chess_task` ("P", "A" or "game"), `prompt`, `fen`, `answer`,
    `truth_moves`, `truth_evals` (module docstring). `source` is a positions file (`rookworld positions --out`,
    annotated or not, or FENs a line) and `num_examples` how many of its positions to take (None: all); without a
    file, `num_examples` generated positions of `seed`. For the game, `source="start"` is the initial position
    alone. About `task_mix` of the "mixed" rows are P:. Prompts begin with `DOCUMENT_START` unless
    `document_start` is False."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    start = DOCUMENT_START if document_start else ""
    if kind == "game":
        fens = [rules.START_FEN] if source == "start" else [r.fen for r in records(source, num_examples, seed)]
        return [{"chess_task": "game", "prompt": start + policy_prompt(f), "fen": f, "answer": "",
                 "truth_moves": [], "truth_evals": []} for f in fens]
    mix = {"policy": 1.0, "env": 0.0}.get(kind, task_mix)
    rows = chess_rows(records(source, num_examples, seed), seed=seed, task_mix=mix, document_start=document_start)
    if kind == "env":  # the positions without an A: move stay P: rows
        rows = [r for r in rows if r["task"] == "A"]
    return [{"chess_task": r["task"], "prompt": r["prompt"], "fen": r["fen"], "answer": a,
             "truth_moves": r["truth_moves"], "truth_evals": r["truth_evals"]} for r, a in zip(rows, answers(rows))]


#: The process's `Grading` of each Stockfish setting, which every task of that setting shares. Process-wide because
#: verifiers builds each taskset from its settings alone and keeps no object of ours between them: one Stockfish
#: pool a setting, not one a taskset, and `close_engines` ends them all.
GRADINGS = Gradings()


def close_engines() -> None:
    """Ends the Stockfish pools of every `Grading` (a later score starts its pool again)."""
    GRADINGS.close()


def _reply(step: GameStep) -> str:
    """What the model reads after its move: Stockfish's answer, then the P: prompt of the position to move in."""
    lines = [f"Stockfish plays {step.opponent_move}."] if step.opponent_move else []
    return "\n".join([*lines, step.prompt])


# ---- the verifiers v1 classes ----------------------------------------------------------------------------------

_VERIFIERS_NAMES = ("RookWorldData", "RookWorldTaskConfig", "RookWorldTask", "RookWorldConfig", "RookWorldTaskset",
                    "RookWorldEnvConfig", "RookWorldEnv", "RookWorldHarnessConfig", "RookWorldHarness")

if vf is not None:
    from pydantic import Field, field_validator  # verifiers' own dependency

    class RookWorldData(vf.TaskData):
        """One task: its kind ("P", "A" or "game"), position, the analysis a P: row carries, and an answer that
        scores 1.0 (P: and A:; empty where there is none)."""

        chess_task: Literal["P", "A", "game"]
        fen: str
        answer: str = ""
        truth_moves: list[str] = Field(default_factory=list)
        truth_evals: list[float] = Field(default_factory=list)

    class RookWorldTaskConfig(vf.TaskConfig):
        """How tasks are scored and games played (`--env.taskset.task.*`): Stockfish (`stockfish_path`, or on PATH)
        analyses at `stockfish_depth` with `stockfish_workers` engines (one a core by default); `shaping` is
        `rookworld train --reward-shaping`. The game's opponent plays at `opponent_skill` (0-20) or `opponent_elo`
        (1350 at least), a game stops unfinished after `max_turns` of the model's moves, and at most `max_games`
        games (one opponent engine each) run at once in a process, the others waiting for theirs."""

        stockfish_path: str | None = None
        stockfish_depth: int = Field(10, ge=1, le=MAX_DEPTH)
        stockfish_workers: int | None = Field(None, ge=1)
        shaping: str = "continuous"
        opponent_skill: int = Field(0, ge=0, le=20)
        opponent_elo: int | None = None
        max_turns: int = Field(MAX_PLIES // 2, ge=1)
        max_games: int = Field(64, ge=1)

        @field_validator("shaping")
        @classmethod
        def _known_shaping(cls, shaping: str) -> str:
            if shaping not in SHAPINGS:
                raise ValueError(f"shaping must be one of {', '.join(SHAPINGS)}, got {shaping!r}")
            return shaping

        def grading(self):
            return GRADINGS.get(path=self.stockfish_path, depth=self.stockfish_depth, workers=self.stockfish_workers,
                           shaping=self.shaping)

    class RookWorldTask(vf.Task[RookWorldData, vf.State, RookWorldTaskConfig]):
        """A P: or A: prompt, or a game's starting position, with rookworld's scoring (module docstring)."""

        @vf.reward
        async def rookworld(self, trace: vf.Trace) -> float | dict[str, float]:
            """A P: or A: task: `ChessReward` of the last reply, its parts recorded as metrics. A game: its
            `move_reward` and `result_reward`, from the record `RookWorldEnv` kept."""
            data = self.data
            if data.chess_task == "game":
                record = trace.info.get(GAME_INFO) or {}
                trace.record_metrics({"legal_moves": float(record.get("legal_moves", 0)),
                                      "model_moves": float(len(record.get("move_rewards", [])))})
                return {"move_reward": float(sum(record.get("move_rewards", []))),
                        "result_reward": float(record.get("result_reward", 0.0))}
            config = self.config
            replies = trace.assistant_messages
            completion = content_text(replies[-1].content) if replies else ""
            scored = await asyncio.to_thread(config.grading().score, data.prompt_text, completion,
                                             data.truth_moves, data.truth_evals, "the task's data")
            trace.record_metrics({name: scored[name] for name in ("well_formed", *PARTS[data.chess_task])})
            return scored["reward"]

    class RookWorldConfig(vf.TasksetConfig):
        """Which tasks load (`--env.taskset.*`): `kind` is "policy" (P: prompts), "env" (A:), "mixed" (about
        `task_mix` of them P:) or "game" (games against Stockfish); the rest is `task_rows`'. `task` is how they
        are scored and played (`RookWorldTaskConfig`)."""

        kind: Literal["policy", "env", "mixed", "game"] = "mixed"
        source: str | None = None
        num_examples: int | None = Field(1000, ge=1)
        seed: int = 0
        task_mix: float = Field(0.8, ge=0.0, le=1.0)
        document_start: bool = True
        task: RookWorldTaskConfig = RookWorldTaskConfig()

    class RookWorldTaskset(vf.Taskset[RookWorldTask, RookWorldConfig]):
        """rookworld's P:, A: or game tasks (`RookWorldConfig`). A missing Stockfish fails here, not in every
        rollout, where the tasks need one (the game, P: rows without an analysis)."""

        def load(self) -> list[RookWorldTask]:
            c = self.config
            rows = task_rows(c.kind, source=c.source, num_examples=c.num_examples, seed=c.seed,
                             task_mix=c.task_mix, document_start=c.document_start)
            if any(r["chess_task"] == "game" or r["chess_task"] == "P" and not r["truth_moves"] for r in rows):
                find_stockfish(c.task.stockfish_path)
            return [RookWorldTask(RookWorldData(name=f"{r['chess_task']}#{i}", **r), c.task)
                    for i, r in enumerate(rows)]

    class RookWorldHarnessConfig(vf.HarnessConfig):
        pass

    class RookWorldHarness(vf.Harness[RookWorldHarnessConfig]):
        """One chat-completions call a segment, made in this process through the rollout's interception endpoint
        (so the trace records it as any harness's): the conversation so far in, the model's reply out. No tools,
        no program, no runtime work: what a chess answer needs."""

        APPENDS_SYSTEM_PROMPT = True
        SUPPORTS_RESUME = True
        EXECUTES_CODE = False
        NEEDS_CONTAINER = False

        async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **kwargs) -> vf.ProgramResult:
            import openai  # verifiers' own dependency

            system, prompt = self.resolve_prompt(data)
            messages = [{"role": "system", "content": system}] if system else []
            if isinstance(prompt, str):
                messages.append({"role": "user", "content": prompt})
            else:
                messages.extend(message_to_wire(m) for m in prompt or [])
            client = openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=3)
            try:
                await client.chat.completions.create(model=ctx.model, messages=messages)
            except openai.APIConnectionError as e:
                return vf.ProgramResult(MODEL_TRANSPORT_ERROR_EXIT_CODE, "", str(e))
            except openai.APIError as e:
                return vf.ProgramResult(1, "", f"{type(e).__name__}: {e}")
            finally:
                await client.close()
            return vf.ProgramResult(0, "", "")

    class RookWorldEnvConfig(vf.EnvConfig):
        """The one seat, `agent` (`--env.agent.*`): rookworld's harness (the taskset's) in the subprocess runtime,
        answering in at most `MAX_NEW_TOKENS` tokens."""

        agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig(),
                                               sampling=vf.SamplingConfig(max_tokens=MAX_NEW_TOKENS))

    class RookWorldEnv(vf.Env[RookWorldEnvConfig]):
        """A P: or A: task is one turn of the agent; a game is an exchange with it, this environment playing
        Stockfish's side (module docstring)."""

        def __init__(self, config: RookWorldEnvConfig):
            super().__init__(config)
            # asyncio's semaphores belong to one event loop.
            self._slots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

        async def run(self, task, agents) -> None:
            if getattr(task.data, "chess_task", None) != "game":
                await agents.agent.run(task)
                return
            await self._play(task, agents.agent)

        def _game_slots(self, size: int) -> asyncio.Semaphore:
            loop = asyncio.get_running_loop()
            if loop not in self._slots:
                self._slots[loop] = asyncio.Semaphore(size)
            return self._slots[loop]

        async def _play(self, task: RookWorldTask, agent) -> None:
            c = task.config
            pool = c.grading().pool

            def new_game() -> ChessGame:
                return ChessGame(opponent_skill=c.opponent_skill, opponent_elo=c.opponent_elo, analysis=pool(),
                                 stockfish_path=c.stockfish_path)

            live = await LiveGame.start(new_game, self._game_slots(c.max_games))
            try:
                first = await live.call("reset", task.data.fen)
                record = new_record(task.data.fen, first)
                async with agent.interaction(task) as interaction:
                    interaction.trace.info[GAME_INFO] = record
                    segment = await interaction.turn()  # the task's prompt opens the game
                    while not segment.terminated:
                        step = await live.call("step", segment.last_reply)
                        record_step(record, step)
                        if step.done:
                            break
                        if len(record["move_rewards"]) >= c.max_turns:
                            unfinished(record, "turn limit")
                            break
                        segment = await interaction.turn(_reply(step))
                    # Stopped by the agent's limits or timeout, not by the game: scored as it stands.
                    unfinished(record, interaction.trace.stop_condition or "stopped")
            finally:
                await live.close()

        async def stop(self) -> None:
            await asyncio.to_thread(close_engines)


def load_environment(kind: str = "mixed", *, env: dict | None = None, **settings) -> Any:
    """The environment `vf-eval rookworld-chess-v1` builds, as verifiers' own loader builds it
    (`vf.load_environment`): `kind` and `settings` are `RookWorldConfig`'s and `RookWorldTaskConfig`'s fields
    (`source=...`, `stockfish_depth=...`), `env` the rest of the env config (`{"agent": {...}}`)."""
    _require()
    taskset_fields, task_fields = set(RookWorldConfig.model_fields), set(RookWorldTaskConfig.model_fields)
    task = {k: settings.pop(k) for k in list(settings) if k in task_fields and k not in taskset_fields}
    unknown = sorted(set(settings) - taskset_fields)
    if unknown:
        raise TypeError(f"load_environment got unknown settings {', '.join(unknown)}")
    taskset = {"id": TASKSET_ID, "kind": kind, **settings}
    taskset["task"] = {**(taskset.get("task") or {}), **task}
    _register()
    return vf.load_environment(vf.resolve_env_config({**(env or {}), "taskset": taskset}))


def _register() -> None:
    """Makes the taskset id importable in this process: verifiers resolves `rookworld-chess-v1` by importing the
    module `rookworld_chess_v1`, which is this one where no package of that name is installed."""
    name = TASKSET_ID.replace("-", "_")
    if name not in sys.modules and importlib.util.find_spec(name) is None:
        sys.modules[name] = sys.modules[__name__]


def _require() -> None:
    if vf is None:
        raise ImportError(f"rookworld.integrations.verifiers_v1 needs verifiers 0.4 or later ({_MISSING}): pip "
                          f"install 'verifiers>=0.4'; verifiers 0.3 and earlier take rookworld.integrations.verifiers")


def __getattr__(name: str):
    if name in _VERIFIERS_NAMES:
        _require()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["TASKSET_ID", "RookWorldConfig", "RookWorldData", "RookWorldEnv", "RookWorldEnvConfig", "RookWorldHarness",
           "RookWorldHarnessConfig", "RookWorldTask", "RookWorldTaskConfig", "RookWorldTaskset", "close_engines",
           "load_environment", "task_rows"]

if vf is not None:
    _register()
