"""Greedy evaluation on held-out positions: the figures users of RookWorld-LM compare models by."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rookworld import chess
from rookworld.data import Record, assign_moves, finished_message, playable, read_records
from rookworld.policy.sampling import generate
from rookworld.policy.tokenizer import Tokenizer
from rookworld.progress import Progress
from rookworld.rewards import GroundTruth, RewardScorer, Scores

#: New tokens per completion: every P: and A: answer of the data fits.
MAX_NEW_TOKENS = 144
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
        records = [Record.from_position(p) for p in chess.generate_positions(size, seed + EVAL_SEED_OFFSET,
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


@torch.no_grad()
def complete(model, tokenizer: Tokenizer, prompts: Sequence[str], *, batch_size: int = 64,
             max_new_tokens: int = MAX_NEW_TOKENS, compile: bool | None = None,
             progress: Progress | None = None) -> list[str]:
    """Greedy completions, batched; prompts start with EOS as the pretraining documents did. `progress` is
    advanced by the prompts of each batch done."""
    out: list[str] = []
    for i in range(0, len(prompts), batch_size):
        ids, mask = tokenizer.encode_batch(prompts[i : i + batch_size], bos=True, device=model.device)
        gen = generate(model, ids, mask, max_new_tokens=max_new_tokens, temperature=0.0, compile=compile)
        out.extend(tokenizer.decode_batch(gen.tokens, gen.mask))
        if progress is not None:
            progress.update(len(ids))
    return out


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


def evaluate(model, tokenizer: Tokenizer, records: Sequence[Record], scorer: RewardScorer, *,
             tasks: Sequence[str] = ("P", "A"), batch_size: int = 64, max_new_tokens: int = MAX_NEW_TOKENS,
             compile: bool | None = None, samples: int = 0, progress: Progress | None = None) -> dict:
    """Greedy decoding on ``records``; returns per-task metrics (and ``samples`` example completions).
    `progress`, when given, counts the prompts decoded (its total is set here)."""
    items = eval_items(records, tasks)
    if not items:
        raise ValueError("nothing to evaluate: no records (or no A: moves) for the chosen tasks")
    prompts = [it.prompt for it in items]
    if progress is not None:
        progress.total = len(prompts)
    completions = complete(model, tokenizer, prompts, batch_size=batch_size, max_new_tokens=max_new_tokens,
                           compile=compile, progress=progress)
    truth = [it.truth for it in items]
    missing = [i for i, it in enumerate(items) if it.task == "P" and it.truth is None]
    if missing:  # records without an analysis: ask Stockfish now
        found = scorer.ground_truth([prompts[i] for i in missing])
        for i, t in zip(missing, found):
            truth[i] = t
    scores = scorer.score_batch(prompts, completions, ground_truth=truth)
    sizes = np.array([len(t[0]) if t else 0 for t in truth])
    result = summarize(scores, sizes)
    if samples:
        result["samples"] = [{"prompt": prompts[i], "completion": completions[i], **scores.breakdown(i)}
                             for i in range(min(samples, len(items)))]
    return result


_LABELS = {
    "format_valid": "format valid", "mean_reward": "mean reward", "best_move_accuracy": "best move",
    "top5_accuracy": "best move in top 5", "legal_best_move": "legal best move",
    "candidate_overlap": "candidate overlap", "eval_mae": "eval MAE (pawns)",
    "next_state_exact": "next state exact", "fen_similarity": "FEN similarity",
    "reward_accuracy": "reward accuracy", "terminated_accuracy": "terminated accuracy",
    "truncated_accuracy": "truncated accuracy",
}


def format_table(result: dict) -> str:
    lines = []
    for task, title in (("P", "P: policy"), ("A", "A: environment")):
        if task not in result:
            continue
        m = result[task]
        lines.append(f"{title} ({m['n']} positions)")
        for key, value in m.items():
            if key == "n":
                continue
            if value is None or (isinstance(value, float) and math.isnan(value)):
                text = "n/a"
            elif key in ("mean_reward", "eval_mae"):
                text = f"{value:.3f}"
            else:
                text = f"{100 * value:.1f}%"
            lines.append(f"  {_LABELS.get(key, key):<22} {text:>8}")
    return "\n".join(lines)
