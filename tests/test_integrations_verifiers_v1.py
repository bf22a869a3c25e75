"""rookworld's chess as a verifiers v1 taskset (issue 60): with the released verifiers 0.4, the taskset loads for each
kind, rollouts run through verifiers' own env, agent, interception and trace code against a model behind an
OpenAI-compatible chat server, their rewards are rookworld's scorer's (a correct answer 1.0, a wrong one less,
garbage scored, never raised), games against a real Stockfish run to their ends (replayed in python-chess), and
`vf-eval rookworld-chess-v1` runs it as a user would."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

verifiers = pytest.importorskip("verifiers", reason="pip install 'verifiers>=0.4'")

import chess as python_chess  # noqa: E402  (python-chess; rookworld.chess.rules has the same name)

from rookworld.chess import rules  # noqa: E402
from rookworld.chess.rewards import RewardScorer, prompt_fen  # noqa: E402
from rookworld.chess.stockfish import find_stockfish  # noqa: E402
from rookworld.integrations import verifiers_v1  # noqa: E402
from rookworld.integrations.game import ILLEGAL, RESULT  # noqa: E402
from rookworld.integrations.chess_reward import DOCUMENT_START  # noqa: E402
from rookworld.lm.answers import MAX_NEW_TOKENS  # noqa: E402

from conftest import REPO, stockfish_children  # noqa: E402

HELD_OUT = str(REPO / "data" / "chess-cpu-held-out.jsonl")
DEPTH = 4
#: White to move has one legal move (Kf8), after which Black mates in one five ways.
FORCED_MATE = "6K1/1q5r/8/8/8/8/8/3k4 w - - 0 1"
#: Locked pawns, kings far apart: whatever the kings play, no game ends within a few moves.
LOCKED = "7k/8/8/p1p1p1p1/P1P1P1P1/8/8/K7 w - - 0 1"
#: A bare move's reward: the credit of its rank in Stockfish's five, or outside them (docs/rewards.md).
MOVE_CREDITS = {1.0, 0.6, 0.4, 0.25, 0.15, 0.05}
GARBAGE = "I resign, or maybe not \u00a0\x00"
#: The stalling player's moves before it stalls, and the seconds it then takes: past any timeout of the tests.
MOVES_BEFORE_STALLING, STALL = 2, 60.0
#: The agent's time budget the test gives verifiers: long enough for a few moves on a busy machine.
TIMEOUT = 8.0


def _released_v1() -> bool:
    found = re.match(r"(\d+)\.(\d+)", verifiers.__version__)
    return bool(found) and tuple(map(int, found.groups())) >= verifiers_v1.MIN_VERIFIERS


needs_v1 = pytest.mark.skipif(not _released_v1(), reason=f"verifiers {verifiers.__version__} predates the v1 API "
                                                          f"this taskset is written for (0.4)")
if _released_v1():
    import verifiers.v1 as vf


def _stockfish() -> str:
    return find_stockfish()  # ROOKWORLD_STOCKFISH, on PATH, or Debian's /usr/games/stockfish


# ---- the model behind an OpenAI-compatible chat-completions endpoint ------------------------------------------


class _Chat(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(body)
        text = self.server.answer(body["model"], body["messages"])
        reply = json.dumps({"id": "chatcmpl-rookworld", "object": "chat.completion", "created": 0,
                            "model": body["model"],
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                         "finish_reason": "stop", "logprobs": None}],
                            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up on the answer (a rollout's timeout)
            pass

    def log_message(self, *args):
        pass


class ChatServer(ThreadingHTTPServer):
    """Scripted "models": `script` answers each prompt with what `answers` holds for it (the test sets it),
    `player` plays the first legal move of the last P: position it was shown (`stalling-player` too, but stalls
    after `MOVES_BEFORE_STALLING` moves), `garbage` writes no move."""

    daemon_threads, block_on_close = True, False  # a stalled answer holds up no one

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Chat)
        self.answers: dict[str, str] = {}
        self.requests: list[dict] = []

    def answer(self, model: str, messages: list[dict]) -> str:
        text = messages[-1]["content"]
        if model == "garbage":
            return GARBAGE
        if model == "stalling-player" and sum(m["role"] == "user" for m in messages) > MOVES_BEFORE_STALLING:
            time.sleep(STALL)
        if model.endswith("player"):
            fen = re.findall(r"^(?:<\|endoftext\|>)?P: (.+)$", text, re.MULTILINE)[-1].strip()
            return rules.legal_moves(fen)[0]
        return self.answers[text]


@pytest.fixture(scope="module")
def server():
    chat = ChatServer()
    thread = threading.Thread(target=chat.serve_forever, daemon=True)
    thread.start()
    yield chat
    chat.shutdown()
    chat.server_close()
    thread.join(timeout=10)


def _url(server: ChatServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/v1"


def _episodes(env, server: ChatServer, model: str):
    """Every task of `env` rolled out once, as vf-eval rolls them out (`env.serving`, `env.run_slot`)."""
    ctx = vf.ModelContext(model=model, client=vf.EvalClientConfig(base_url=_url(server),
                                                                  api_key_var="ROOKWORLD_TEST_KEY"))

    async def run():
        async with env.serving():
            slots = [slot for task in env.taskset for slot in env.slots(task)]
            return await asyncio.gather(*(env.run_slot(slot, ctx) for slot in slots))

    return asyncio.run(run())


def _trace(episode):
    assert not episode.errors, episode.errors
    (trace,) = episode.traces
    assert trace.ok and not trace.errors, trace.errors
    return trace


def _rewards(trace) -> dict[str, float]:
    return {name: r.score for name, r in trace.rewards.items()}


def _truth(task):
    return (task.data.truth_moves, task.data.truth_evals) if task.data.truth_moves else None


# ---- loading ------------------------------------------------------------------------------------------------------


def test_the_module_imports_without_verifiers_0_4(monkeypatch):
    """Beside an older verifiers (0.3 has an earlier `verifiers.v1`, not this one's) the module imports, its rows
    load, and asking for a verifiers class says what to install."""
    if _released_v1():  # a copy of the module, loaded as if verifiers 0.3.1 were installed
        monkeypatch.setattr(verifiers, "__version__", "0.3.1")
        spec = importlib.util.spec_from_file_location("rookworld_v1_copy", verifiers_v1.__file__)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = verifiers_v1
    assert module.vf is None
    assert module.task_rows("game", source="start")[0]["fen"] == rules.START_FEN
    with pytest.raises(ImportError, match=r"needs verifiers 0.4 or later .*rookworld.integrations.verifiers"):
        module.RookWorldTaskset  # noqa: B018
    with pytest.raises(ImportError, match="needs verifiers 0.4 or later"):
        module.load_environment("policy")


@needs_v1
@pytest.mark.parametrize("kind, heads", [("policy", {"P"}), ("env", {"A"}), ("mixed", {"P", "A"})])
def test_each_kind_loads_as_tasks(kind, heads):
    env = verifiers_v1.load_environment(kind, source=HELD_OUT, num_examples=10, seed=1, task_mix=0.5)
    assert isinstance(env, verifiers_v1.RookWorldEnv) and env.config.env_id == verifiers_v1.TASKSET_ID
    assert isinstance(env.taskset, verifiers_v1.RookWorldTaskset)
    tasks = list(env.taskset)
    assert 0 < len(tasks) <= 10 and [t.data.idx for t in tasks] == list(range(len(tasks)))
    assert {t.data.chess_task for t in tasks} == heads
    assert len({t.key for t in tasks}) == len(tasks)
    scorer = RewardScorer(None)
    for t in tasks:
        assert isinstance(t, verifiers_v1.RookWorldTask) and t.data.prompt.startswith(DOCUMENT_START)
        prompt = t.data.prompt.removeprefix(DOCUMENT_START)
        assert prompt[0] == t.data.chess_task and prompt_fen(prompt) == t.data.fen
        # The held-out file carries Stockfish's analysis; an A: task needs none.
        assert bool(t.data.truth_moves) == (t.data.chess_task == "P")
        # The answer is a completion that scores 1.0.
        assert scorer.score_batch([prompt], [t.data.answer], [_truth(t)]).rewards[0] == 1.0


@needs_v1
def test_the_game_loads_starting_positions():
    (start,) = verifiers_v1.load_environment("game", source="start").taskset
    assert start.data.chess_task == "game" and start.data.fen == rules.START_FEN
    assert start.data.prompt == f"{DOCUMENT_START}P: {rules.START_FEN}"
    generated = list(verifiers_v1.load_environment("game", num_examples=5, seed=2, document_start=False).taskset)
    assert [t.data.fen for t in generated] == [p.fen for p in rules.generate_positions(5, 2)]
    assert all(t.data.prompt == f"P: {t.data.fen}" for t in generated)
    from pydantic import ValidationError

    for kind, bad, where in [("chess", {}, "taskset.kind"), ("game", {"max_turns": 0}, "taskset.task.max_turns"),
                             ("policy", {"shaping": "steep"}, "taskset.task.shaping")]:
        with pytest.raises(ValidationError, match=re.escape(where)):
            verifiers_v1.load_environment(kind, source="start", **bad)
    with pytest.raises(TypeError, match="unknown settings depth"):
        verifiers_v1.load_environment("game", depth=3)


@needs_v1
def test_the_seat_is_rookworlds_harness_in_the_subprocess_runtime():
    env = verifiers_v1.load_environment("policy", source=HELD_OUT, num_examples=1, stockfish_depth=DEPTH)
    harness = env.config.agent_harnesses()["agent"]
    assert isinstance(harness, verifiers_v1.RookWorldHarnessConfig) and harness.id == verifiers_v1.TASKSET_ID
    assert isinstance(env.config.agent.runtime, vf.SubprocessConfig)
    assert env.config.agent.sampling.max_tokens == MAX_NEW_TOKENS
    assert env.taskset.config.task.stockfish_depth == DEPTH


# ---- rollouts: the rewards are rookworld's scorer's -----------------------------------------------------------------


@needs_v1
def test_rollouts_score_correct_wrong_and_garbage_answers_as_rookworld_does(server):
    env = verifiers_v1.load_environment("mixed", source=HELD_OUT, num_examples=8, seed=3, task_mix=0.5,
                                        stockfish_path=_stockfish(), stockfish_depth=DEPTH)
    tasks = list(env.taskset)
    assert {t.data.chess_task for t in tasks} == {"P", "A"}
    scorer = RewardScorer(None)

    def expected(completions):
        prompts = [t.data.prompt.removeprefix(DOCUMENT_START) for t in tasks]
        return scorer.score_batch(prompts, completions, [_truth(t) for t in tasks])

    # Each task's answer: 1.0. A wrong answer: a legal move that is not Stockfish's best as a whole P: answer, or an
    # A: answer with the wrong next position. Garbage, the empty answer and a cut-off answer: scored, not raised.
    wrong = []
    for t in tasks:
        if t.data.chess_task == "P":
            move = next(m for m in rules.legal_moves(t.data.fen) if m != t.data.truth_moves[0])
            wrong.append(f"M: {move} E: 0.0 B: {move}")
        else:
            wrong.append(t.data.fen + "+" + t.data.answer.split("+", 1)[1])  # the position before the move
    cases = {"answer": [t.data.answer for t in tasks], "wrong": wrong,
             "garbage": [GARBAGE, "", "M: e2e4 E: x B:", "\x00" * 50, "B: " * 30, "\u00a0\u2028",
                         tasks[6].data.answer[:25], tasks[7].data.answer.upper()]}
    for name, completions in cases.items():
        server.answers = {t.data.prompt: c for t, c in zip(tasks, completions)}
        server.requests.clear()
        traces = sorted((_trace(e) for e in _episodes(env, server, "script")), key=lambda tr: tr.task.data.idx)
        scores = expected(completions)
        for k, (t, tr) in enumerate(zip(tasks, traces)):
            assert tr.task.data == t.data and tr.num_turns == 1 and tr.last_reply == completions[k].strip()
            assert _rewards(tr) == {"rookworld": pytest.approx(scores.rewards[k], abs=1e-12)}, (name, completions[k])
            parts = scores.breakdown(k)
            names = ("well_formed", *verifiers_v1.PARTS[t.data.chess_task])
            assert set(tr.metrics) == set(names)
            for part in names:
                assert tr.metrics[part] == pytest.approx(float(parts.get(part) or 0.0), abs=1e-12)
        rewards = list(scores.rewards)
        if name == "answer":
            assert rewards == [1.0] * len(tasks)
        elif name == "wrong":
            assert all(r < 1.0 for r in rewards) and len(set(rewards)) > 1
        else:
            assert all(-1.0 <= r <= 1.0 for r in rewards)
        # What reached the model: the task's prompt as the user's message, at most MAX_NEW_TOKENS tokens back.
        assert sorted(r["messages"][-1]["content"] for r in server.requests) == sorted(t.data.prompt for t in tasks)
        assert {r["max_tokens"] for r in server.requests} == {MAX_NEW_TOKENS}


@needs_v1
def test_positions_without_an_analysis_are_scored_by_stockfish(server):
    env = verifiers_v1.load_environment("policy", num_examples=3, seed=4, stockfish_path=_stockfish(),
                                        stockfish_depth=DEPTH)
    tasks = list(env.taskset)
    assert all(not t.data.truth_moves and t.data.answer == "" for t in tasks)
    completions = ["M: e2e4 E: 0.1 B: e2e4", "", "M: a1a1 E: x B: a1a1"]
    server.answers = {t.data.prompt: c for t, c in zip(tasks, completions)}
    traces = sorted((_trace(e) for e in _episodes(env, server, "script")), key=lambda tr: tr.task.data.idx)
    # The analyses the reward used, from its pool's cache: the same truth for rookworld's scorer.
    prompts = [t.data.prompt.removeprefix(DOCUMENT_START) for t in tasks]
    truth = RewardScorer(env.taskset.config.task.grading().pool()).ground_truth(prompts)
    verifiers_v1.close_engines()
    assert all(t and t[0] for t in truth)
    expected = RewardScorer(None).score_batch(prompts, completions, truth).rewards
    assert [tr.rewards["rookworld"].score for tr in traces] == pytest.approx(list(expected), abs=1e-12)
    assert traces[1].rewards["rookworld"].score == -0.3  # the empty answer


@needs_v1
def test_a_system_prompt_reaches_the_model_as_a_system_message(server, tmp_path):
    (tmp_path / "system.txt").write_text("Answer with the position after the move.")
    env = verifiers_v1.load_environment("env", source=HELD_OUT, num_examples=2, system_prompt=tmp_path / "system.txt")
    tasks = list(env.taskset)
    server.answers = {t.data.prompt: t.data.answer for t in tasks}
    server.requests.clear()
    traces = [_trace(e) for e in _episodes(env, server, "script")]
    assert [tr.rewards["rookworld"].score for tr in traces] == [1.0, 1.0]
    assert sorted((r["messages"] for r in server.requests), key=json.dumps) == sorted(
        ([{"role": "system", "content": "Answer with the position after the move."},
          {"role": "user", "content": t.data.prompt}] for t in tasks), key=json.dumps)


# ---- games ----------------------------------------------------------------------------------------------------


def _replay(record: dict, max_turns: int):
    """The game of a rollout's record replayed in python-chess: every move legal, and the outcome the board says."""
    board = python_chess.Board(record["start_fen"])
    mover = board.turn
    for uci in record["moves"]:
        move = python_chess.Move.from_uci(uci)
        assert move in board.legal_moves, (uci, board.fen())
        board.push(move)
    if record["reason"] == "checkmate":
        assert board.is_checkmate()
        outcome = "loss" if board.turn == mover else "win"
    elif board.is_stalemate() or board.is_insufficient_material() or board.is_repetition(3):
        outcome = "draw"
    else:
        assert not board.is_game_over()
        assert len(record["move_rewards"]) == max_turns
        outcome = "unfinished"
    return outcome, (len(record["moves"]) + 1) // 2


@needs_v1
def test_games_against_stockfish_run_to_their_ends(server, tmp_path):
    positions = tmp_path / "positions.txt"
    positions.write_text(f"{FORCED_MATE}\n{LOCKED}\n")
    max_turns = 3
    env = verifiers_v1.load_environment("game", source=str(positions), max_turns=max_turns,
                                        stockfish_path=_stockfish(), stockfish_depth=DEPTH, opponent_skill=20,
                                        stockfish_workers=1)
    try:
        traces = sorted((_trace(e) for e in _episodes(env, server, "player")), key=lambda tr: tr.task.data.idx)
    finally:
        verifiers_v1.close_engines()
    for tr in traces:
        record = tr.info["chess"]
        outcome, model_moves = _replay(record, max_turns)
        assert record["outcome"] == outcome and tr.num_turns == model_moves
        assert len(record["move_rewards"]) == model_moves == record["legal_moves"]
        assert all(r in MOVE_CREDITS for r in record["move_rewards"]), record
        assert _rewards(tr) == {"move_reward": pytest.approx(sum(record["move_rewards"]), abs=1e-12),
                                "result_reward": RESULT[outcome]}
        assert tr.reward == pytest.approx(sum(record["move_rewards"]) + RESULT[outcome], abs=1e-12)
        assert tr.metrics == {"legal_moves": model_moves, "model_moves": model_moves}
        # After each move the model read Stockfish's answer and the new position's P: prompt.
        users = [m.content for m in tr.messages if m.role == "user"]
        assert len(users) == model_moves
        for text, (mine, theirs) in zip(users[1:], zip(record["moves"][::2], record["moves"][1::2])):
            assert text.startswith(f"Stockfish plays {theirs}.\nP: ")
    mate, locked = traces
    assert mate.info["chess"]["reason"] == "checkmate" and mate.info["chess"]["moves"][0] == "g8f8"
    assert mate.reward == pytest.approx(mate.info["chess"]["move_rewards"][0] - 1.0, abs=1e-12)
    assert locked.info["chess"]["outcome"] == "unfinished" and locked.info["chess"]["reason"] == "turn limit"
    assert len(locked.info["chess"]["moves"]) == 2 * max_turns


@needs_v1
def test_a_garbage_answer_loses_the_game_at_once(server):
    env = verifiers_v1.load_environment("game", source="start", stockfish_path=_stockfish(), stockfish_depth=DEPTH,
                                        stockfish_workers=1)
    try:
        (episode,) = _episodes(env, server, "garbage")
    finally:
        verifiers_v1.close_engines()
    tr = _trace(episode)
    record = tr.info["chess"]
    assert record["moves"] == [] and record["move_rewards"] == [ILLEGAL] and record["legal_moves"] == 0
    assert record["outcome"] == "loss" and "by white" in record["reason"]
    assert tr.reward == ILLEGAL + RESULT["loss"] == -2.0 and tr.num_turns == 1
    assert tr.last_reply == GARBAGE.strip()


@needs_v1
@pytest.mark.slow
def test_games_stopped_by_verifiers_timeouts_are_scored_and_end_their_engines(server):
    # From the initial position no game ends within the timeouts, whatever the model plays.
    settings = {"source": "start", "stockfish_path": _stockfish(), "stockfish_depth": DEPTH, "stockfish_workers": 1}
    before = stockfish_children()
    # The agent's time budget (the model's time, not Stockfish's): the game stops after a few moves, scored.
    env = verifiers_v1.load_environment("game", **settings, env={"agent": {"timeout": {"rollout": TIMEOUT}}})
    (episode,) = _episodes(env, server, "stalling-player")
    tr = _trace(episode)
    record = tr.info["chess"]
    assert tr.stop_condition == "agent_timeout" and tr.is_timeout
    assert record["outcome"] == "unfinished" and record["reason"] == "agent_timeout"
    assert len(record["move_rewards"]) == record["legal_moves"] == MOVES_BEFORE_STALLING
    assert _rewards(tr) == {"move_reward": pytest.approx(sum(record["move_rewards"]), abs=1e-12),
                            "result_reward": 0.0}
    _replay(record, len(record["move_rewards"]))
    assert stockfish_children() <= before  # the game's opponent ended; the analysis pool with the env (stop)
    # The episode's deadline cancels the game mid-exchange: an error of the episode, and no engine left behind.
    env = verifiers_v1.load_environment("game", **settings, env={"timeout": {"episode": TIMEOUT / 2}})
    (episode,) = _episodes(env, server, "stalling-player")
    assert episode.is_timeout and not episode.ok and "deadline" in episode.errors[-1].message
    assert stockfish_children() <= before


# ---- vf-eval --------------------------------------------------------------------------------------------------------


@needs_v1
@pytest.mark.slow
def test_vf_eval_runs_the_taskset_by_its_id(server, tmp_path):
    """`vf-eval rookworld-chess-v1`, in a process of its own that never imported rookworld: the taskset id
    resolves through the module `rookworld_chess_v1` (what `environments/verifiers/rookworld_chess_v1` installs)."""
    package = tmp_path / "hub"
    package.mkdir()
    (package / "rookworld_chess_v1.py").write_text(
        "from rookworld.integrations.verifiers_v1 import *  # noqa: F403\n"
        "from rookworld.integrations.verifiers_v1 import __all__  # noqa: F401\n")
    rows = verifiers_v1.task_rows("mixed", source=HELD_OUT, num_examples=3, seed=5, task_mix=0.5)
    server.answers = {r["prompt"]: r["answer"] for r in rows}
    # rookworld as this process found it (installed, or on the caller's PYTHONPATH): the source tree alone has no
    # built extension.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(package), os.environ.get("PYTHONPATH")])),
               ROOKWORLD_TEST_KEY="local")
    cli = [sys.executable, "-c", "from verifiers.v1.cli.eval.main import main; main()", "rookworld-chess-v1",
           "--env.taskset.kind", "mixed", "--env.taskset.source", HELD_OUT, "--env.taskset.num-examples", "3",
           "--env.taskset.seed", "5", "--env.taskset.task-mix", "0.5",
           "--env.taskset.task.stockfish-path", _stockfish(), "--env.taskset.task.stockfish-depth", str(DEPTH),
           "-m", "script", "--client.base-url", _url(server), "--client.api-key-var", "ROOKWORLD_TEST_KEY",
           "--no-push", "--no-rich", "-o", str(tmp_path / "outputs"), "--run.name", "chess", "-n", "3", "-r", "2"]
    done = subprocess.run(cli, check=False, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    episodes = [json.loads(line) for line in (tmp_path / "outputs" / "chess" / "traces.jsonl").read_text().splitlines()]
    assert len(episodes) == 6
    prompts = sorted(r["prompt"] for r in rows)
    for episode in episodes:
        (trace,) = episode["traces"]
        assert trace["ok"] and trace["rewards"] == {"rookworld": {"score": 1.0, "weight": 1.0}}, trace
        assert trace["metrics"]["well_formed"] == 1.0
        assert trace["task"]["data"]["prompt"] in prompts
