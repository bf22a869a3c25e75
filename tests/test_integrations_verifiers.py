"""rookworld's chess as a verifiers environment (issue 46): it loads for each task, its rubric scores the shipped
model's real completions exactly as rookworld's scorer does, and games against Stockfish run through verifiers' own
rollouts to their ends, the model answering behind an OpenAI-compatible server, checked by a replay in
python-chess."""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

vf = pytest.importorskip("verifiers", reason="pip install 'rookworld[verifiers]'")
openai = pytest.importorskip("openai")
if not hasattr(vf, "SingleTurnEnv"):
    pytest.skip(f"verifiers {vf.__version__} has no classic API: tests/test_integrations_verifiers_v1.py tests it",
                allow_module_level=True)

import chess as python_chess  # noqa: E402  (python-chess; rookworld.chess.rules has the same name)

from rookworld.chess import rules  # noqa: E402
from rookworld.chess.rewards import RewardScorer, prompt_fen  # noqa: E402
from rookworld.integrations.game import ILLEGAL, RESULT  # noqa: E402
from rookworld.integrations.chess_reward import DOCUMENT_START  # noqa: E402
from rookworld.integrations.verifiers import ChessGameEnv, load_environment  # noqa: E402
from rookworld.io.quote import ECHO_LIMIT, shortened  # noqa: E402
from rookworld.lm.answers import RookWorldLM  # noqa: E402
from rookworld.lm.moves import BEST, choose_moves  # noqa: E402

from conftest import REPO, stockfish_children  # noqa: E402

MODEL = REPO / "models" / "chess-cpu-sft"
HELD_OUT = str(REPO / "data" / "chess-cpu-held-out.jsonl")
DEPTH = 4
#: White to move has one legal move (Kf8), after which Black mates in one five ways.
FORCED_MATE = "6K1/1q5r/8/8/8/8/8/3k4 w - - 0 1"
#: King and pawn against king: a game the model can play for turns on end.
ENDGAME = "8/8/4k3/8/8/3K4/4P3/8 w - - 0 1"
#: A bare move's reward: the credit of its rank in Stockfish's five, or outside them (docs/rewards.md).
MOVE_CREDITS = {1.0, 0.6, 0.4, 0.25, 0.15, 0.05}


# ---- the model behind an OpenAI-compatible completions endpoint -------------------------------------------------


class _Completions(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = self.server.answer(body["model"], body["prompt"])
        reply = json.dumps({"id": "cmpl-rookworld", "object": "text_completion", "created": 0, "model": body["model"],
                            "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
                            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        try:
            self.wfile.write(reply)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up on the answer (a rollout's timeout)
            pass

    def log_message(self, *args):
        pass


class ModelServer(ThreadingHTTPServer):
    """The shipped model as three "models": `rookworld` completes the prompt as written; `rookworld-player` plays
    the last P: position of the conversation, always legally (rookworld's fallback), answering with its whole P:
    answer when its B: move is legal and with the fallback's bare move otherwise; `garbage` writes no move."""

    def __init__(self, lm: RookWorldLM):
        super().__init__(("127.0.0.1", 0), _Completions)
        self.lm, self.lock = lm, threading.Lock()  # one generation at a time: the server answers in threads

    def answer(self, model: str, prompt: str) -> str:
        if model == "garbage":
            return "I resign, or maybe not"
        with self.lock:
            if model == "rookworld":
                return self.lm.complete([prompt.removeprefix(DOCUMENT_START)])[0]
            fen = re.findall(r"^(?:<\|endoftext\|>)?P: (.+)$", prompt, re.MULTILINE)[-1].strip()
            (chosen,) = choose_moves(self.lm, [fen])
            return chosen.answer.text if chosen.source == BEST else chosen.move


@pytest.fixture(scope="module")
def server():
    models = ModelServer(RookWorldLM.load(str(MODEL), device="cpu"))
    thread = threading.Thread(target=models.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{models.server_address[1]}/v1"
    models.shutdown()
    models.server_close()
    thread.join(timeout=10)


def client(base_url: str):
    return vf.OpenAICompletionsClient(openai.AsyncOpenAI(base_url=base_url, api_key="local", timeout=120.0,
                                                         max_retries=0))


# ---- loading --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task, heads", [("policy", {"P"}), ("env", {"A"}), ("mixed", {"P", "A"})])
def test_each_single_turn_task_loads_as_verifiers_rows(task, heads):
    env = load_environment(task, source=HELD_OUT, num_examples=10, seed=1, task_mix=0.5, stockfish_depth=DEPTH)
    assert isinstance(env, vf.SingleTurnEnv)
    rows = env.get_dataset().to_list()
    assert 0 < len(rows) <= 10
    assert {r["question"].removeprefix(DOCUMENT_START)[0] for r in rows} == heads
    scorer = RewardScorer(None)
    for r in rows:
        assert r["question"].startswith(DOCUMENT_START)
        assert r["prompt"] == [{"role": "user", "content": r["question"]}]
        prompt = r["question"].removeprefix(DOCUMENT_START)
        assert prompt_fen(prompt) == r["info"]["fen"]
        policy = prompt.startswith("P:")
        # The held-out file carries Stockfish's analysis; an A: row needs none.
        assert bool(r["info"]["truth_moves"]) == policy
        truth = (r["info"]["truth_moves"], r["info"]["truth_evals"]) if policy else None
        # The answer is a completion that scores 1.0.
        assert scorer.score_batch([prompt], [r["answer"]], [truth]).rewards[0] == 1.0


def test_the_game_loads_starting_positions():
    start = load_environment("game", source="start")
    assert isinstance(start, ChessGameEnv) and isinstance(start, vf.MultiTurnEnv)
    (row,) = start.get_dataset().to_list()
    assert row["info"] == {"fen": rules.START_FEN}
    assert row["question"] == f"{DOCUMENT_START}P: {rules.START_FEN}"
    generated = load_environment("game", num_examples=5, seed=2, document_start=False).get_dataset().to_list()
    assert [r["info"]["fen"] for r in generated] == [p.fen for p in rules.generate_positions(5, 2)]
    assert all(r["question"] == f"P: {r['info']['fen']}" for r in generated)
    with pytest.raises(ValueError, match="task must be one of"):
        load_environment("chess")


def test_the_hub_package_loads_through_verifiers(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "environments" / "verifiers" / "rookworld_chess"))
    monkeypatch.delitem(sys.modules, "rookworld_chess", raising=False)
    env = vf.load_environment("rookworld-chess", task="policy", source=HELD_OUT, num_examples=3)
    assert isinstance(env, vf.SingleTurnEnv) and env.env_id == "rookworld-chess"
    assert len(env.get_dataset()) == 3


# ---- the rubric is rookworld's scorer ------------------------------------------------------------------------------


def _truth(row):
    return (row["info"]["truth_moves"], row["info"]["truth_evals"]) if row["info"]["truth_moves"] else None


@pytest.mark.slow
def test_the_rubric_scores_real_completions_as_rookworld_does(server):
    env = load_environment("mixed", source=HELD_OUT, num_examples=12, seed=3, task_mix=0.5, stockfish_depth=DEPTH)
    rows = env.get_dataset().to_list()

    async def run():
        model = client(server)
        try:
            # The shipped model's own completions, scored as verifiers scores a group.
            results = await env.generate(rows, client=model, model="rookworld")
            # And hand-written ones, through the rubric's per-rollout and per-group entry points.
            hand = [(0, rows[0]["answer"]), (1, ""), (2, "M: e2e4 E: 0.3 B: e2e4"), (3, rows[3]["answer"][:25]),
                    (4, "\u00a0\x00garbled " * 20), (5, rows[5]["answer"].upper())]
            states = []
            for i, text in hand:
                state = await env.init_state(rows[i], model, "hand-written")
                state["completion"] = [vf.AssistantMessage(content=text)]
                states.append(state)
            await env.rubric.score_rollout(states[0])
            first = (states[0]["reward"], dict(states[0]["metrics"]))
            await env.rubric.score_group(states)
            return results["outputs"], hand, states, first
        finally:
            await model.client.close()
            await env.close_engines()

    outputs, hand, states, first = asyncio.run(run())
    by_row = {o["example_id"]: o for o in outputs}
    assert sorted(by_row) == [r["example_id"] for r in rows]
    assert sum(o["metrics"]["well_formed"] for o in outputs) >= len(outputs) // 2  # the model writes answers

    prompts = [r["question"].removeprefix(DOCUMENT_START) for r in rows]
    scores = RewardScorer(None).score_batch(prompts, [by_row[r["example_id"]]["completion"][-1]["content"]
                                                      for r in rows], [_truth(r) for r in rows])
    for k, r in enumerate(rows):
        out = by_row[r["example_id"]]
        assert abs(out["reward"] - scores.rewards[k]) <= 1e-12, (prompts[k], out["completion"])
        parts = scores.breakdown(k)
        for name in ("best", "candidates", "evals", "fen_similarity"):
            assert out["metrics"][name] == pytest.approx(parts.get(name, 0.0), abs=1e-12)
        assert out["metrics"]["well_formed"] == float(parts["well_formed"])
    assert set(scores.tasks) == {"P", "A"} and len({round(s, 6) for s in scores.rewards}) > 2  # varied, real

    expected = RewardScorer(None).score_batch([prompts[i] for i, _ in hand], [t for _, t in hand],
                                              [_truth(rows[i]) for i, _ in hand]).rewards
    assert [s["reward"] for s in states] == pytest.approx(list(expected), abs=1e-12)
    assert first[0] == pytest.approx(expected[0], abs=1e-12) and expected[0] == 1.0
    assert expected[1] == -0.3  # an empty answer is scored, not raised


def test_hand_written_completions_are_scored_without_a_model_client():
    """verifiers' own scoring needs a client even for answers written by hand; env.score needs none, and gives
    what rookworld's scorer gives, the parts beside."""
    env = load_environment("mixed", source=HELD_OUT, num_examples=6, seed=3, task_mix=0.5, stockfish_depth=DEPTH)
    rows = env.get_dataset().to_list()
    texts = [rows[0]["answer"], "", "M: e2e4 E: 0.3 B: e2e4", rows[3]["answer"][:25], "\u00a0\x00garbled",
             rows[5]["answer"]]
    try:
        got = env.score(texts)
        assert env.score(texts[2:4], start=2) == got[2:4]
        with pytest.raises(IndexError):
            env.score(["x"], start=len(rows))
    finally:
        asyncio.run(env.close_engines())
    prompts = [r["question"].removeprefix(DOCUMENT_START) for r in rows]
    scores = RewardScorer(None).score_batch(prompts, texts, [_truth(r) for r in rows])
    assert [g["reward"] for g in got] == pytest.approx(list(scores.rewards), abs=1e-12)
    assert got[0]["reward"] == 1.0 and got[1]["reward"] == -0.3
    assert [g["well_formed"] for g in got] == [float(scores.breakdown(k)["well_formed"]) for k in range(6)]


def test_the_rubric_asks_stockfish_for_positions_without_analysis():
    env = load_environment("policy", num_examples=3, seed=4, stockfish_depth=DEPTH)
    rows = env.get_dataset().to_list()
    assert all(not r["info"]["truth_moves"] and r["answer"] == "" for r in rows)
    completions = ["M: e2e4 E: 0.1 B: e2e4", "", "M: a1a1 E: x B: a1a1"]

    async def run():
        states = []
        for r, text in zip(rows, completions):
            state = vf.State(input=dict(r), prompt=r["prompt"], completion=[{"role": "assistant", "content": text}],
                             trajectory=[])
            states.append(state)
        await env.rubric.score_group(states)
        # The analyses the rubric used, from its pool's cache: the same truth for rookworld's scorer.
        pool = env.grading.pool()
        truth = RewardScorer(pool).ground_truth([r["question"].removeprefix(DOCUMENT_START) for r in rows])
        await env.close_engines()
        return states, truth

    before = stockfish_children()
    states, truth = asyncio.run(run())
    assert stockfish_children() <= before  # the pool ended with the environment
    assert all(t and t[0] for t in truth)
    prompts = [r["question"].removeprefix(DOCUMENT_START) for r in rows]
    expected = RewardScorer(None).score_batch(prompts, completions, truth).rewards
    assert [s["reward"] for s in states] == pytest.approx(list(expected), abs=1e-12)


# ---- games ----------------------------------------------------------------------------------------------------


def _replay(record: dict, max_turns: int):
    """The game of a rollout's record replayed in python-chess: every move legal, and the outcome the board says."""
    board = python_chess.Board(record["start_fen"])
    mover = board.turn
    for uci in record["moves"]:
        move = python_chess.Move.from_uci(uci)
        assert move in board.legal_moves, (uci, board.fen())
        board.push(move)
    model_moves = (len(record["moves"]) + 1) // 2
    if record["reason"] == "checkmate":
        assert board.is_checkmate()
        outcome = "loss" if board.turn == mover else "win"
    elif board.is_stalemate() or board.is_insufficient_material() or board.is_repetition(3):
        outcome = "draw"
    else:
        assert not board.is_game_over()
        assert len(record["move_rewards"]) == max_turns
        outcome = "unfinished"
    return board, outcome, model_moves


def test_games_run_to_their_ends_through_verifiers_rollouts(server, tmp_path):
    positions = tmp_path / "positions.txt"
    positions.write_text(f"{FORCED_MATE}\n{ENDGAME}\n")
    max_turns = 3
    env = load_environment("game", source=str(positions), max_turns=max_turns, stockfish_depth=DEPTH,
                           opponent_skill=20, stockfish_workers=1)
    rows = env.get_dataset().to_list()
    before = stockfish_children()

    async def run():
        model = client(server)
        try:
            return await env.generate(rows, client=model, model="rookworld-player", state_columns=["chess"],
                                      independent_scoring=True)
        finally:
            await model.client.close()

    outputs = sorted(asyncio.run(run())["outputs"], key=lambda o: o["example_id"])
    assert stockfish_children() <= before + 1  # each game's opponent ended; the grading pool's one engine remains
    asyncio.run(env.close_engines())
    assert stockfish_children() <= before

    for out in outputs:
        record = out["chess"]
        assert out["error"] is None, out["error"]
        board, outcome, model_moves = _replay(record, max_turns)
        assert record["outcome"] == outcome
        assert len(record["move_rewards"]) == model_moves == record["legal_moves"]
        assert all(r in MOVE_CREDITS or 0.2 <= r <= 1.0 for r in record["move_rewards"]), record
        assert out["reward"] == pytest.approx(sum(record["move_rewards"]) + RESULT[outcome], abs=1e-12)
        assert out["metrics"]["result_reward"] == RESULT[outcome]
        # The model saw each position it moved in; the transcript ends with how the game ended.
        assert out["completion"][-1]["content"].endswith(f": {outcome}.")
        assert out["is_completed"] and out["stop_condition"] in ("has_final_env_response", "max_turns_reached")

    mate, endgame = outputs
    assert mate["chess"]["reason"] == "checkmate" and mate["chess"]["moves"][0] == "g8f8"
    assert mate["reward"] == pytest.approx(mate["chess"]["move_rewards"][0] - 1.0, abs=1e-12)
    assert endgame["chess"]["start_fen"] == ENDGAME and len(endgame["chess"]["moves"]) >= 2


def test_a_garbage_answer_loses_the_game_at_once(server):
    env = load_environment("game", source="start", stockfish_depth=DEPTH, stockfish_workers=1)

    async def run():
        model = client(server)
        try:
            return await env.generate(env.get_dataset(), client=model, model="garbage", state_columns=["chess"])
        finally:
            await model.client.close()
            await env.close_engines()

    (out,) = asyncio.run(run())["outputs"]
    record = out["chess"]
    assert record["moves"] == [] and record["move_rewards"] == [ILLEGAL] and record["legal_moves"] == 0
    assert record["outcome"] == "loss" and "by white" in record["reason"]
    assert out["reward"] == ILLEGAL + RESULT["loss"] == -2.0
    assert out["metrics"]["num_turns"] == 1
    assert python_chess.Board(record["start_fen"]).fen() == python_chess.STARTING_FEN


def test_a_game_cut_by_verifiers_timeout_is_scored_and_ends_its_engines(server):
    # From the initial position no game ends within the timeout, whatever the model plays.
    env = load_environment("game", source="start", stockfish_depth=DEPTH, stockfish_workers=1)
    env.timeout_seconds = 1.5  # verifiers' own rollout timeout (MultiTurnEnv(timeout_seconds=...))
    before = stockfish_children()

    async def run():
        model = client(server)
        try:
            return await env.generate(env.get_dataset(), client=model, model="rookworld-player",
                                      state_columns=["chess"])
        finally:
            await model.client.close()

    (out,) = asyncio.run(run())["outputs"]
    assert stockfish_children() <= before + 1  # the game's opponent ended with the rollout
    asyncio.run(env.close_engines())
    record = out["chess"]
    assert out["stop_condition"] == "timeout_reached"
    assert record["outcome"] == "unfinished" and record["reason"] == "timeout_reached"
    assert out["reward"] == pytest.approx(sum(record["move_rewards"]), abs=1e-12)
    _replay(record, len(record["move_rewards"]))


# ---- issue 58, item 6: what the rubric is given is checked ---------------------------------------------------------


def test_the_rubric_reads_content_parts_and_says_in_one_line_what_it_cannot_score(caplog):
    """Content given as parts (OpenAI's) was read; a completion of plain strings was an AttributeError; NaN in an
    info's truth_evals was a NaN reward; an info kept as its JSON text, or a list, was an AttributeError (issue 71):
    the text is read, the list said in one line."""
    env = load_environment("policy", source=HELD_OUT, num_examples=2, seed=3, stockfish_depth=DEPTH)
    row = env.get_dataset().to_list()[0]
    answer = row["answer"]
    parts = [{"type": "text", "text": answer[:10]}, {"type": "text", "text": answer[10:]}]
    nan = dict(row["info"], truth_evals=[math.nan] + row["info"]["truth_evals"][1:])
    illegal = dict(row["info"], truth_moves=[row["info"]["truth_moves"][0]] * len(row["info"]["truth_moves"]))
    cases = [  # (prompt, completion, info)
        (row["prompt"], [{"role": "assistant", "content": parts}], row["info"]),
        ([{"role": "user", "content": [{"type": "text", "text": row["question"]}]}],
         [vf.AssistantMessage(content=answer)], row["info"]),
        (row["prompt"], [answer], row["info"]),
        (row["prompt"], [{"role": "assistant", "content": answer}], nan),
        (row["prompt"], [{"role": "assistant", "content": answer}], illegal),
        (row["prompt"], [{"role": "assistant", "content": answer}], json.dumps(row["info"])),
        (row["prompt"], [{"role": "assistant", "content": answer}], [row["info"]]),
    ]

    async def run():
        states = [vf.State(input=dict(row, prompt=prompt, info=info), prompt=prompt, completion=completion,
                           trajectory=[]) for prompt, completion, info in cases]
        await env.rubric.score_group(states)
        await env.close_engines()
        return [s["reward"] for s in states]

    with caplog.at_level("ERROR"):
        rewards = asyncio.run(run())
    assert rewards == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]  # verifiers scores a reward function's error 0, never NaN
    errors = sorted(r.getMessage() for r in caplog.records if "rookworld" in r.getMessage())  # scored at once
    assert errors == sorted([
        "Error calling reward function rookworld: completion: expected a string or a list of messages (each with a "
        "role and a content), got a list holding str",
        "Error calling reward function rookworld: the row's info: bad truth_moves / truth_evals: eval 1 (NaN) is not "
        "a finite number: give Stockfish's analysis of the prompt's position, or empty lists to have Stockfish "
        "analyse it",
        "Error calling reward function rookworld: the row's info: bad truth_moves / truth_evals: move "
        f"\"{row['info']['truth_moves'][0]}\" is listed twice: give Stockfish's analysis of the prompt's position, "
        "or empty lists to have Stockfish analyse it",
        "Error calling reward function rookworld: the row's info must be a dict (or its JSON text), not a list: "
        + shortened(repr([row["info"]]), ECHO_LIMIT)]), errors
