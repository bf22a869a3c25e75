"""rookworld's rewards as a plain reward function (TRL's signature), issue 46: its scores are the scorer's own,
on real positions, real targets, real Stockfish; rows of other tasks get None; no completion raises."""

from __future__ import annotations

import asyncio
import json

import pytest

from rookworld.ground.data import read_records
from rookworld.ground.rewards import RewardScorer, policy_targets
from rookworld.ground.stockfish import StockfishPool
from rookworld.ground import chess
from rookworld.integrations.rewards import AsyncChessReward, ChessReward, chess_rows

from conftest import REPO

HELD_OUT = REPO / "data" / "chess-cpu-held-out.jsonl"


def annotated_rows(n: int, task_mix: float = 0.5) -> list[dict]:
    records, _ = read_records(HELD_OUT)
    return chess_rows(records, count=n, seed=3, task_mix=task_mix, document_start=False)


def right_answer(row: dict) -> str:
    if row["task"] == "A":
        return chess.env_targets([row["prompt"]])[0]
    moves, evals = row["truth_moves"], row["truth_evals"]
    return policy_targets([row["fen"]], [moves], [evals], [moves[0]], layout="compact")[0]


def columns(rows: list[dict]) -> dict:
    return {k: [r[k] for r in rows] for k in ("task", "fen", "truth_moves", "truth_evals")}


def test_rows_carry_prompts_of_both_tasks_and_the_file_s_analysis():
    rows = annotated_rows(60)
    records = {r.fen: r for r in read_records(HELD_OUT)[0]}
    assert {r["task"] for r in rows} == {"P", "A"}
    for row in rows:
        assert row["prompt"].startswith(f"{row['task']}: {row['fen']}")
        if row["task"] == "P":
            assert row["truth_moves"] == records[row["fen"]].analysis["moves"]
        else:
            assert row["truth_moves"] == [] and row["truth_evals"] == []


def test_scores_are_the_scorer_s_own_for_right_wrong_and_broken_answers():
    rows = annotated_rows(40)
    completions = []
    for i, row in enumerate(rows):
        right = right_answer(row)
        completions += [right, right[: len(right) // 2], "", "\x00" * 3 + "🙂" * 50, right.replace("+", " ", 1)]
    prompts = [row["prompt"] for row in rows for _ in range(5)]
    expanded = [row for row in rows for _ in range(5)]
    with ChessReward("mixed") as reward:
        got = reward(prompts, completions, **columns(expanded))
    truth = [(r["truth_moves"], r["truth_evals"]) if r["task"] == "P" else None for r in expanded]
    want = RewardScorer(None).score_batch(prompts, completions, truth).rewards.tolist()
    assert got == want
    assert all(g == pytest.approx(1.0) for g in got[::5]), "the right answers get the most there is"
    assert min(got) == pytest.approx(-0.3)


def test_each_task_s_reward_leaves_the_other_task_s_rows_to_others():
    rows = annotated_rows(30)
    prompts, completions = [r["prompt"] for r in rows], [right_answer(r) for r in rows]
    policy = ChessReward("policy")(prompts, completions, **columns(rows))
    env = ChessReward("env")(prompts, completions, **columns(rows))
    for row, p, a in zip(rows, policy, env):
        assert (p is None) == (row["task"] == "A") and (a is None) == (row["task"] == "P")
    assert ChessReward("policy").__name__ == "rookworld_policy"
    with pytest.raises(ValueError, match="policy, env, mixed"):
        ChessReward("both")


def test_conversational_prompts_and_completions_are_scored_by_their_last_message():
    rows = [r for r in annotated_rows(20) if r["task"] == "A"][:4]
    plain = ChessReward("env")([r["prompt"] for r in rows], [right_answer(r) for r in rows], **columns(rows))
    chat = ChessReward("env")([[{"role": "user", "content": r["prompt"]}] for r in rows],
                              [[{"role": "assistant", "content": right_answer(r)}] for r in rows], **columns(rows))
    assert chat == plain == [pytest.approx(1.0)] * len(rows)


def test_rows_without_analysis_ask_stockfish_and_score_as_its_analysis_says(tmp_path):
    rows = chess_rows(count=12, seed=5, task_mix=1.0, document_start=False)
    assert all(r["task"] == "P" and r["truth_moves"] == [] for r in rows)
    prompts = [r["prompt"] for r in rows]
    completions = [" M: e2e4 d2d4 E: 0.1 0.2 B: e2e4"] * len(rows)
    cache = tmp_path / "sf.sqlite"
    with ChessReward("policy", stockfish_depth=6, stockfish_workers=2, stockfish_cache=str(cache)) as reward:
        got = reward(prompts, completions, **columns(rows))
    with StockfishPool(depth=6, workers=2, cache_path=cache) as pool:  # the same analyses, from the cache
        want = RewardScorer(pool).score_batch(prompts, completions).rewards.tolist()
    assert got == want and all(isinstance(g, float) for g in got)


def test_prompts_that_begin_as_rookworld_s_documents_score_as_the_bare_ones():
    bare = annotated_rows(30)
    marked = chess_rows(read_records(HELD_OUT)[0], count=30, seed=3, task_mix=0.5)
    assert [m["prompt"] for m in marked] == ["<|endoftext|>" + b["prompt"] for b in bare]
    completions = [right_answer(b) for b in bare]
    reward = ChessReward("mixed")
    assert reward([m["prompt"] for m in marked], completions, **columns(marked)) == \
        reward([b["prompt"] for b in bare], completions, **columns(bare))


def test_the_coroutine_reward_scores_as_the_plain_one():
    rows = annotated_rows(20)
    prompts, completions = [r["prompt"] for r in rows], [right_answer(r)[:-3] for r in rows]
    assert asyncio.run(AsyncChessReward("mixed")(prompts, completions, **columns(rows))) == \
        ChessReward("mixed")(prompts, completions, **columns(rows))


def test_a_generated_dataset_is_a_pure_function_of_its_seed():
    assert chess_rows(count=50, seed=9) == chess_rows(count=50, seed=9) != chess_rows(count=50, seed=10)
    json.dumps(chess_rows(count=5, seed=9))  # rows are plain data: a datasets.Dataset or a JSONL file takes them
