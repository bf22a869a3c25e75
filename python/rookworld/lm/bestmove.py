"""The best-move suite: P: and A: answers on held-out positions, scored by the reward scorer; the figures users
of RookWorld-LM compare models by. The other suites are in `rookworld.lm.suites`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rookworld.chess import rules
from rookworld.chess.data import Record, assign_moves, finished_message, playable, read_records
from rookworld.io.progress import Progress
from rookworld.chess.rewards import GroundTruth, RewardScorer, Scores
from rookworld.lm.answers import GREEDY, MAX_NEW_TOKENS, Decoding, complete
from rookworld.net.tokenizer import Tokenizer

#: Seed offset of the generated held-out positions, so they never share a stream with training prompts.
EVAL_SEED_OFFSET = 1_000_003


def heldout_records(size: int, seed: int = 0, path: str | None = None, illegal_share: float = 0.01,
                    warn: Callable[[str], None] | None = None) -> list[Record]:
    """The held-out positions of training's evaluation and of `rookworld eval` without --data: the first `size`
    records of `path` that are not finished games (`warn` is told of those), or `size` generated positions of a
    seed no training run draws prompts from."""
    if path:
        records, finished = playable(read_records(path)[0])
        if finished and warn is not None:
            warn(f"{path}: {finished_message(finished, len(records) + len(finished))}")
    else:
        records = [Record.from_position(p) for p in rules.generate_positions(size, seed + EVAL_SEED_OFFSET,
                                                                             illegal_share=illegal_share)]
    return assign_moves(records[:size], seed)


@dataclass(frozen=True)
class EvalItem:
    task: str
    prompt: str
    truth: GroundTruth | None


def eval_items(records: Sequence[Record], tasks: Sequence[str] = ("P", "A")) -> list[EvalItem]:
    """A P: item for every record, an A: item for every record with a move."""
    items = []
    if "P" in tasks:
        items.extend(EvalItem("P", r.policy_prompt, r.truth) for r in records)
    if "A" in tasks:
        items.extend(EvalItem("A", r.env_prompt, None) for r in records if r.move is not None)
    return items


def _mean(x: np.ndarray) -> float | None:
    return float(np.mean(x)) if len(x) else None


def summarize(scores: Scores, truth_sizes: np.ndarray) -> dict:
    """Per-task metrics from scored completions; ``truth_sizes`` counts the moves of each P: ground truth."""
    tasks, parts = scores.tasks, scores.parts
    result: dict = {}
    p = tasks == "P"
    if p.any():
        err = parts["eval_error"][p]
        err = err[~np.isnan(err)]
        result["P"] = {
            "n": int(p.sum()),
            "format_valid": _mean(scores.well_formed[p]),
            "mean_reward": _mean(scores.rewards[p]),
            "best_move_accuracy": _mean(parts["best_rank"][p] == 1),
            "top5_accuracy": _mean(parts["best_rank"][p] >= 1),
            "legal_best_move": _mean(parts["best_legal"][p]),
            "candidate_overlap": _mean(parts["hits"][p] / np.maximum(truth_sizes[p], 1)),
            "eval_mae": _mean(err),
        }
    a = tasks == "A"
    if a.any():
        result["A"] = {
            "n": int(a.sum()),
            "format_valid": _mean(scores.well_formed[a]),
            "mean_reward": _mean(scores.rewards[a]),
            "next_state_exact": _mean(parts["fen_exact"][a]),
            "fen_similarity": _mean(parts["fen_similarity"][a]),
            "reward_accuracy": _mean(parts["reward_ok"][a]),
            "terminated_accuracy": _mean(parts["terminated_ok"][a]),
            "truncated_accuracy": _mean(parts["truncated_ok"][a]),
        }
    return result


#: The headline figures as one outcome per position (the fraction of 1s is the figure summarize gives): what a
#: run's closing lines pair its first and last evaluations by, position by position.
OUTCOMES = {"P": {"legal_best_move": lambda row: bool(row["best_legal"]),
                  "top5_accuracy": lambda row: row["best_rank"] >= 1,
                  "best_move_accuracy": lambda row: row["best_rank"] == 1},
            "A": {"next_state_exact": lambda row: bool(row["fen_exact"])}}


def position_outcomes(rows: Sequence[dict]) -> dict[str, str]:
    """Each headline figure's outcome per position of `evaluate`'s rows, in their order, as a string of 0s and 1s
    under "TASK/figure"."""
    out = {}
    for task, figures in OUTCOMES.items():
        mine = [row for row in rows if row["task"] == task]
        if mine:
            out.update({f"{task}/{key}": "".join("01"[bool(of(row))] for row in mine) for key, of in figures.items()})
    return out


def evaluate(model, tokenizer: Tokenizer, records: Sequence[Record], scorer: RewardScorer, *,
             tasks: Sequence[str] = ("P", "A"), decoding: Decoding = GREEDY, seed: int = 0, batch_size: int = 64,
             max_new_tokens: int = MAX_NEW_TOKENS, compile: bool | None = None,
             progress: Progress | None = None) -> tuple[dict, list[dict]]:
    """Decodes ``records``' prompts (greedy unless `decoding` says otherwise) and scores the answers: per-task
    metrics, and per prompt its text, the completion and its score's parts. `progress`, when given, counts the
    prompts decoded (its total is set here)."""
    items = eval_items(records, tasks)
    if not items:
        raise ValueError("nothing to evaluate: no records (or no A: moves) for the chosen tasks")
    prompts = [it.prompt for it in items]
    if progress is not None:
        progress.total = len(prompts)
    completions = complete(model, tokenizer, prompts, decoding=decoding, seed=seed, batch_size=batch_size,
                           max_new_tokens=max_new_tokens, compile=compile, progress=progress)
    truth = [it.truth for it in items]
    missing = [i for i, it in enumerate(items) if it.task == "P" and it.truth is None]
    if missing:  # records without an analysis: ask Stockfish now
        found = scorer.ground_truth([prompts[i] for i in missing])
        for i, t in zip(missing, found):
            truth[i] = t
    scores = scorer.score_batch(prompts, completions, ground_truth=truth)
    sizes = np.array([len(t[0]) if t else 0 for t in truth])
    rows = [{"prompt": prompts[i], "completion": completions[i], **scores.breakdown(i),
             **({"truth": {"moves": list(truth[i][0]), "evals": list(truth[i][1])}} if truth[i] else {})}
            for i in range(len(items))]
    return summarize(scores, sizes), rows
