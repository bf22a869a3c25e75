"""rookworld's rewards as a plain reward function (TRL's signature), issue 46: its scores are the scorer's own,
on real positions, real targets, real Stockfish; rows of other tasks get None; no completion raises."""

from __future__ import annotations

import asyncio
import json
import math
import re

import pytest

from rookworld.chess.data import DataError, read_records
from rookworld.chess.rewards import RewardScorer, policy_targets
from rookworld.chess.stockfish import StockfishPool
from rookworld.chess import rules
from rookworld.integrations.chess_reward import AsyncChessReward, ChessReward, chess_rows

from conftest import REPO

HELD_OUT = REPO / "data" / "chess-cpu-held-out.jsonl"


def annotated_rows(n: int, task_mix: float = 0.5) -> list[dict]:
    records, _ = read_records(HELD_OUT)
    return chess_rows(records, count=n, seed=3, task_mix=task_mix, document_start=False)


def right_answer(row: dict) -> str:
    if row["task"] == "A":
        return rules.env_targets([row["prompt"]])[0]
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


@pytest.mark.parametrize("limits, said", [
    ({"stockfish_depth": 10**20}, "depth must be a whole number from 1 to 30"),
    ({"stockfish_depth": 100}, "depth must be a whole number from 1 to 30"),
    ({"stockfish_depth": 0}, "depth must be a whole number from 1 to 30"),
    ({"stockfish_depth": "10"}, "not '10'"),
    ({"stockfish_depth": True}, "not 'True'"),
])
def test_the_python_api_is_held_to_the_command_line_s_stockfish_limits(limits, said):
    """Issue 71: a depth of 10^20 was an OverflowError naming nothing, and 100 a per-analysis timeout of 10^14 s.
    Every route to a pool (TRL's and verifiers' rewards, a pool of one's own) is held where it is asked for, before
    any engine starts."""
    with pytest.raises(ValueError, match=said):
        ChessReward("mixed", **limits)
    with pytest.raises(ValueError, match=said):
        StockfishPool(depth=limits["stockfish_depth"])
    with pytest.raises(ValueError, match="nodes must be a whole number from 1 to 100,000,000"):
        StockfishPool(nodes=10**9)


def test_a_positions_source_that_is_a_pipe_nobody_writes_is_refused_not_waited_on(tmp_path):
    """The integrations' data readers (verifiers' rows, TRL's dataset) blocked for ever on a FIFO nobody writes
    (issue 71): a library call takes a regular file, and says so."""
    import os

    from rookworld.integrations.tasks import records

    fifo = tmp_path / "positions.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"is not a regular file \(a FIFO\): give a positions file"):
        records(str(fifo), 10, 0)  # what both verifiers environments read their rows with
    trl = pytest.importorskip("rookworld.integrations.trl", exc_type=ImportError)
    with pytest.raises(ValueError, match="not a regular file"):
        trl.chess_dataset(str(fifo))


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


# ---- issue 58, item 6: the batch is checked as `rookworld train --data` checks a file -----------------------------


def policy_rows(n: int) -> list[dict]:
    return [r for r in annotated_rows(3 * n, task_mix=1.0) if r["task"] == "P"][:n]


def test_a_batch_whose_columns_are_not_one_value_a_row_is_one_line_not_an_index_error():
    rows = policy_rows(2)
    prompts, completions = [r["prompt"] for r in rows], [right_answer(r) for r in rows]
    reward = ChessReward("mixed")
    with pytest.raises(ValueError, match=r"^completions holds 1 values and prompts 2: a batch has one of each a row$"):
        reward(prompts, completions[:1], **columns(rows))
    short = columns(rows) | {"truth_evals": columns(rows)["truth_evals"][:1]}
    with pytest.raises(ValueError, match=r"^truth_evals holds 1 values and prompts 2"):
        reward(prompts, completions, **short)
    with pytest.raises(TypeError, match=r"^truth_moves must be a list with one value a row of the batch, got int$"):
        reward(prompts, completions, **columns(rows) | {"truth_moves": 7})
    with pytest.raises(TypeError, match=r"^prompts must be a list with one value a row of the batch, got str$"):
        reward(prompts[0], completions[0])
    assert reward(prompts, completions, **columns(rows)) == [pytest.approx(1.0)] * 2


def _spoiled(row: dict, moves=None, evals=None) -> dict:
    return row | {"truth_moves": row["truth_moves"] if moves is None else moves,
                  "truth_evals": row["truth_evals"] if evals is None else evals}


#: Analyses `--data` refuses: (what a row's truth becomes, the problem said). A file's JSON line says a list of the
#: wrong type in its own words.
FILE_SAYS = '"analysis" must hold a "moves" list of UCI strings and an "evals" list of numbers'
SPOILED = [
    (lambda r: _spoiled(r, evals=[math.nan] + r["truth_evals"][1:]), "eval 1 (NaN) is not a finite number"),
    (lambda r: _spoiled(r, evals=r["truth_evals"][:-1] + [-math.inf]), "is not a finite number"),
    (lambda r: _spoiled(r, moves=[r["truth_moves"][0]] * len(r["truth_moves"])), "is listed twice"),
    (lambda r: _spoiled(r, moves=["a1a1"] + r["truth_moves"][1:]), 'move 1 "a1a1" is not a legal move (UCI) here'),
    (lambda r: _spoiled(r, evals=r["truth_evals"][:-1]), "moves but"),
    (lambda r: _spoiled(r, evals=["0.3"] + r["truth_evals"][1:]), "eval 1 is '0.3', not a number of pawns"),
    (lambda r: _spoiled(r, moves=" ".join(r["truth_moves"])), "moves must be a list, got '"),
    (lambda r: _spoiled(r, moves=[]), "0 moves but"),
]


@pytest.mark.parametrize("spoil, problem", SPOILED)
def test_an_analysis_that_data_refuses_is_refused_naming_its_row_not_scored(spoil, problem, tmp_path):
    """NaN or inf in truth_evals gave a NaN reward; illegal or repeated truth_moves were scored as Stockfish's."""
    rows = policy_rows(4)
    rows[2] = spoil(rows[2])
    prompts, completions = [r["prompt"] for r in rows], [right_answer(r) if r is not rows[2] else "M: e2e4"
                                                          for r in rows]
    with pytest.raises(ValueError, match=r"^row 2: bad truth_moves / truth_evals: .*" + re.escape(problem)) as e:
        ChessReward("policy")(prompts, completions, **columns(rows))
    assert "\n" not in str(e.value) and "empty lists to have Stockfish analyse it" in str(e.value)
    # `rookworld train --data` refuses the same analysis in a positions file, saying the same.
    bad = rows[2]
    data = tmp_path / "positions.jsonl"
    data.write_text(json.dumps({"fen": bad["fen"], "analysis": {"moves": bad["truth_moves"],
                                                                "evals": bad["truth_evals"]}}) + "\n")
    typed = "not a number of pawns" in problem or "must be a list" in problem
    with pytest.raises(DataError, match=re.escape(FILE_SAYS if typed else problem)):
        read_records(data)


def test_the_rows_of_another_task_are_not_asked_for_an_analysis():
    rows = annotated_rows(20)
    rows = [_spoiled(r, moves=["a1a1"], evals=[math.nan]) if r["task"] == "A" else r for r in rows]
    got = ChessReward("mixed")([r["prompt"] for r in rows], [right_answer(r) if r["task"] == "P" else
                                                            rules.env_targets([r["prompt"]])[0] for r in rows],
                               **columns(rows))
    assert got == [pytest.approx(1.0)] * len(rows)


def test_a_policy_prompt_stockfish_cannot_analyse_is_refused_naming_its_row_before_an_engine_starts():
    prompts = ["P: " + rules.START_FEN, "P: 8/8/8/8/8/8/8/8 w - - 0 1"]  # no kings
    with ChessReward("policy") as reward:
        with pytest.raises(ValueError, match=r"^row 1: the P: prompt's position is not legal \(.+\): '8/8/8/8"):
            reward(prompts, ["", ""])
        assert not reward._pool.started


def test_content_given_as_parts_is_read_as_its_text_and_anything_else_said_naming_the_row():
    """A conversational prompt whose content was a list of parts (OpenAI's) got None, silently; a list of plain
    strings was an AttributeError."""
    rows = annotated_rows(10)
    plain = ChessReward("mixed")([r["prompt"] for r in rows], [right_answer(r) for r in rows], **columns(rows))
    parts = ChessReward("mixed")(
        [[{"role": "system", "content": "You play chess."},
          {"role": "user", "content": [{"type": "text", "text": r["prompt"][:9]}, {"type": "text", "text":
                                                                                   r["prompt"][9:]}]}] for r in rows],
        [[{"role": "assistant", "content": [{"type": "text", "text": right_answer(r)},
                                            {"type": "image_url", "image_url": {"url": "data:,"}}]}] for r in rows],
        **columns(rows))
    assert parts == plain == [pytest.approx(1.0)] * len(rows)
    reward = ChessReward("mixed")
    prompts = [r["prompt"] for r in rows[:3]]
    for bad, said in ([prompts[0], [prompts[1]], prompts[2]], "row 1: prompt: expected a string or a list of messages "
                      "(each with a role and a content), got a list holding str"), \
                     ([prompts[0], prompts[1], 3], "row 2: prompt: expected a string or a list of messages, got int"), \
                     ([prompts[0], [{"role": "user", "content": 3}], prompts[2]],
                      "row 1: prompt: a message's content must be a string or a list of parts, got int"):
        with pytest.raises(TypeError, match="^" + re.escape(said) + "$"):
            reward(bad, ["", "", ""], **columns(rows[:3]))


@pytest.mark.parametrize("workers", [1.5, 0, -2, True, "2"])
def test_a_number_of_engines_that_is_no_whole_number_is_named_where_it_is_asked_for(workers):
    """stockfish_workers=1.5 was "can't multiply sequence by non-int of type 'float'" at the first analysis, and 0
    silently the default: each is refused by its name where the reward, the server's engines or a pool is made."""
    from rookworld.chess.stockfish import Role, pool_for

    said = "stockfish_workers must be a whole number of at least 1"
    with pytest.raises(ValueError, match=said):
        ChessReward("mixed", stockfish_workers=workers)
    with pytest.raises(ValueError, match=said):
        pool_for(Role.ANALYSIS, workers=workers)


def test_a_malformed_a_prompt_in_a_batch_is_named_by_its_row():
    """Every P: problem named its row; a malformed A: prompt said only its text."""
    prompts = [rules.env_prompt(rules.START_FEN, "e2e4"), "A: not a fen+e2e4++", "A: nor this+e2e4++"]
    with pytest.raises(ValueError, match=r"^prompt 1 \(and 1 more\): bad prompt: .*'A: not a fen\+e2e4\+\+'"):
        RewardScorer().score_batch(prompts, ["x", "y", "z"])
