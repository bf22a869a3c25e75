"""rookworld's P: and A: rewards as one plain reward function, `f(prompts, completions, **columns) -> list`, the
signature TRL's GRPOTrainer calls (`reward_funcs=[...]`) and most trainers accept, and the rows it scores.

A batch is scored at once by the Rust core, as in `rookworld train`: the rules of chess for A:, Stockfish's
analysis for P: (from the row's `truth_moves` / `truth_evals` when the data carries it, else from a Stockfish pool
started at the first P: prompt that needs one, with its cache). Any completion's text gets a score, never an
exception; a batch that is not one (columns of other lengths, a prompt that is no text or messages, an analysis
`rookworld train --data` would refuse) is a one-line ValueError or TypeError naming its row.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from rookworld.chess import rules
from rookworld.chess.data import Record, analysis_problems, assign_moves
from rookworld.io.quote import quoted, shortened
from rookworld.chess.rewards import GroundTruth, RewardScorer, prompt_fen, task_of
from rookworld.chess.stockfish import LazyPool, Role

#: Which prompts a reward function scores; the others get None, TRL's word for "this reward does not apply".
TASKS = {"policy": ("P",), "env": ("A",), "mixed": ("P", "A")}


#: What begins each of RookWorld's training documents, and so each prompt a trainer gives its models.
DOCUMENT_START = "<|endoftext|>"


def message_text(messages: Any, role: str | None = None) -> str:
    """A plain-text prompt or completion as it is; a conversational one (a list of messages: dicts, or verifiers'
    message objects) as the content of its last message, or of its last `role` message ("" without one). Anything
    else is a TypeError saying what it is."""
    if messages is None:
        return ""
    if isinstance(messages, str):
        return messages
    if not isinstance(messages, (list, tuple)):
        raise TypeError(f"expected a string or a list of messages, got {type(messages).__name__}")
    for message in reversed(messages):
        if not hasattr(message, "get"):  # verifiers' message objects answer .get as dicts do
            raise TypeError(f"expected a string or a list of messages (each with a role and a content), got a list "
                            f"holding {type(message).__name__}")
        if role is None or message.get("role") == role:
            return content_text(message.get("content"))
    return ""


def content_text(content: Any) -> str:
    """A message's content as text: a string as it is; a list of parts (OpenAI's `[{"type": "text", "text": ...},
    {"type": "image_url", ...}]`) as its text parts joined, the others left out."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, (list, tuple)):
        raise TypeError(f"a message's content must be a string or a list of parts, got {type(content).__name__}")
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif not hasattr(part, "get"):
            raise TypeError(f"a message's content parts must be dicts with a type, got {type(part).__name__}")
        elif part.get("type", "text") == "text":
            texts.append(str(part.get("text") or ""))
    return "".join(texts)


def _row_text(what: str, row: int, message: Any) -> str:
    try:
        return message_text(message)
    except TypeError as e:
        raise TypeError(f"row {row}: {what}: {e}") from None


def _column(name: str, values: Any, rows: int | None = None) -> list:
    """A column of the batch: a list, of `rows` values when given (as many as the prompts)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a list with one value a row of the batch, got {type(values).__name__}")
    if rows is not None and len(values) != rows:
        raise ValueError(f"{name} holds {len(values)} values and prompts {rows}: a batch has one of each a row")
    return list(values)


class ChessReward:
    """rookworld's reward for P: and A: completions with TRL's reward-function signature.

    `task` is "policy" (P: prompts only), "env" (A: only) or "mixed" (both). The Stockfish settings are those of
    `rookworld train` (`--stockfish-depth` and so on); the pool starts at the first P: prompt whose row carries no
    analysis, and `close()` ends it (so does leaving a `with` block)."""

    def __init__(self, task: str = "mixed", *, stockfish_path: str | None = None, stockfish_depth: int = 10,
                 stockfish_workers: int | None = None, stockfish_cache: str | None = None,
                 shaping: str = "continuous"):
        if task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
        self.task, self.shaping = task, shaping
        self.__name__ = f"rookworld_{task}"  # TRL logs each reward under its function's name
        self._pool = LazyPool(Role.ANALYSIS, path=stockfish_path, depth=stockfish_depth, workers=stockfish_workers,
                              cache_path=stockfish_cache)
        self._scorer = RewardScorer(None, shaping)

    def _stockfish(self) -> RewardScorer:
        pool = self._pool.get()
        if self._scorer.stockfish is not pool:
            self._scorer = RewardScorer(pool, self.shaping)
        return self._scorer

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], truth_moves: Sequence | None = None,
                 truth_evals: Sequence | None = None, **columns) -> list[float | None]:
        prompts = _column("prompts", prompts)
        completions = _column("completions", completions, len(prompts))
        moves = [None] * len(prompts) if truth_moves is None else _column("truth_moves", truth_moves, len(prompts))
        evals = [None] * len(prompts) if truth_evals is None else _column("truth_evals", truth_evals, len(prompts))
        prompts = [_row_text("prompt", i, p).removeprefix(DOCUMENT_START) for i, p in enumerate(prompts)]
        completions = [_row_text("completion", i, c) for i, c in enumerate(completions)]
        tasks = [task_of(p) for p in prompts]
        mine = [i for i, t in enumerate(tasks) if t in TASKS[self.task]]
        rewards: list[float | None] = [None] * len(prompts)
        if not mine:
            return rewards
        policy = [i for i in mine if tasks[i] == "P"]
        given = dict(zip(policy, given_truths([prompts[i] for i in policy], [moves[i] for i in policy],
                                              [evals[i] for i in policy], [f"row {i}" for i in policy])))
        truth = [given.get(i) for i in mine]
        needed = [k for k, i in enumerate(mine) if tasks[i] == "P" and truth[k] is None]
        if needed:
            _check_positions([prompts[mine[k]] for k in needed], [mine[k] for k in needed])
            found = self._stockfish().ground_truth([prompts[mine[k]] for k in needed])
            for k, t in zip(needed, found):
                truth[k] = t
        scores = self._scorer.score_batch([prompts[i] for i in mine], [completions[i] for i in mine], truth)
        for i, r in zip(mine, scores.rewards.tolist()):
            rewards[i] = r
        return rewards

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> ChessReward:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncChessReward(ChessReward):
    """`ChessReward` as a coroutine function: a trainer that awaits its reward functions together (TRL's
    GRPOTrainer does) runs its others while the Rust core and Stockfish score, off the event loop's thread."""

    async def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns) -> list[float | None]:
        return await asyncio.to_thread(ChessReward.__call__, self, prompts, completions, **columns)


def given_truths(prompts: Sequence[str], moves: Sequence, evals: Sequence,
                 rows: Sequence[str]) -> list[GroundTruth | None]:
    """The analyses P: prompts' rows carry (`truth_moves`, `truth_evals`), as the scorer takes them; None for a row
    that carries none (empty lists or None: Stockfish is asked). Each is checked as `rookworld train --data` checks
    a file's, against its prompt's position: a bad one is a ValueError naming its row (`rows` names them), never a
    score, since an illegal or repeated move scored as Stockfish's would be rewarded."""
    carried = [i for i, (m, e) in enumerate(zip(moves, evals)) if not (_empty(m) and _empty(e))]
    problems = analysis_problems([prompt_fen(prompts[i]) for i in carried], [_listed(moves[i]) for i in carried],
                                 [_listed(evals[i]) for i in carried])
    for i, problem in zip(carried, problems):
        if problem is not None:
            raise ValueError(f"{rows[i]}: bad truth_moves / truth_evals: {shortened(problem, 200)}: give Stockfish's "
                             f"analysis of the prompt's position, or empty lists to have Stockfish analyse it")
    truths: list[GroundTruth | None] = [None] * len(prompts)
    for i in carried:
        truths[i] = list(_listed(moves[i])), [float(e) for e in _listed(evals[i])]
    return truths


def _check_positions(prompts: Sequence[str], rows: Sequence[int]) -> None:
    """P: prompts for Stockfish to analyse hold legal positions: said naming the row, before an engine is asked."""
    fens = [prompt_fen(p) for p in prompts]
    for row, fen, legal in zip(rows, fens, rules.normalize_fens(fens)):
        if legal is None:
            raise ValueError(f"row {row}: the P: prompt's position is not legal ({rules.fen_problem(fen)}): "
                             f"{quoted(fen)}")


def _empty(value: Any) -> bool:
    return value is None or isinstance(value, (list, tuple)) and not value


def _listed(value: Any) -> Any:
    """A row's list as it is, None as an empty one (the other column carries the analysis)."""
    return [] if value is None else value


def chess_rows(records: Sequence[Record] | None = None, *, count: int | None = None, seed: int = 0,
               task_mix: float = 0.8, document_start: bool = True) -> list[dict[str, Any]]:
    """The rows of a chess RL dataset: a `prompt` (P: or A:), its `task`, the position's `fen`, and Stockfish's
    analysis as `truth_moves` / `truth_evals` where the record has one (empty lists otherwise: the reward asks
    Stockfish). `records` are a positions file's (`rookworld.chess.data.read_records`); without them, `count`
    generated positions of `seed`. About `task_mix` of the rows are P: (`rookworld train --task-mix`), the rest A:
    (for positions with a move to make). Each prompt begins with `DOCUMENT_START`, as RookWorld's training documents
    did, unless `document_start` is False."""
    if records is None:
        if count is None:
            raise ValueError("give records, or a count of positions to generate")
        records = [Record.from_position(p) for p in rules.generate_positions(count, seed)]
    elif count is not None:
        records = list(records)[:count]
    records = assign_moves(records, seed)
    rng = random.Random(seed)
    rows = []
    for r in records:
        env = r.move is not None and rng.random() >= task_mix
        truth = r.truth if not env else None
        prompt = (DOCUMENT_START if document_start else "") + (r.env_prompt if env else r.policy_prompt)
        rows.append({"prompt": prompt, "task": "A" if env else "P", "fen": r.fen,
                     "truth_moves": list(truth[0]) if truth else [], "truth_evals": list(truth[1]) if truth else []})
    return rows
