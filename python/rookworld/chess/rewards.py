"""Verifiable rewards for P: and A: completions, scored in batches by the Rust core.

Rules and weights: docs/rewards.md. Every completion gets a reward, never an exception: -0.3
when the answer's structure is missing, 0.2 for a well-formed answer with nothing right, up to
1.0 for a perfect one. A: ground truth is the rules of chess; P: ground truth is Stockfish's
analysis, reduced to a `GroundTruth`. `RewardScorer.score_batch` returns the rewards of a batch
as `Scores`, the one type for rewards that training and custom reward functions also use.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from rookworld import _core
from rookworld.io.quote import quoted

__all__ = ["P_QUALITY_WEIGHTS", "P_REWARDS", "SHAPINGS", "GroundTruth", "RewardScorer", "Scores", "policy_prompt", "policy_targets", "prompt_fen",
           "task_of"]

SHAPINGS = ("continuous", "graduated")
#: How a P: answer's B: move earns credit (docs/rewards.md): by its rank in Stockfish's five, or by the pawns it
#: loses against the best, which needs an analysis of every legal move (`analysis_width`).
P_REWARDS = ("rank", "cp-loss")
#: A P: answer's quality is the sum of its parts `best`, `candidates` and `evals` (`Scores.parts`) at these weights
#: (the Rust core's, docs/rewards.md).
P_QUALITY_WEIGHTS = dict(zip(("best", "candidates", "evals"), _core.P_QUALITY_WEIGHTS))
#: Stockfish's MultiPV for an analysis of every legal move: no position has more than 218.
EVERY_MOVE = 256


def analysis_width(p_reward: str) -> int:
    """The MultiPV the P: reward `p_reward` needs of Stockfish: its five, or every legal move."""
    return EVERY_MOVE if p_reward == "cp-loss" else 5

#: The ground truth of a P: prompt, as the scorer needs it from Stockfish's analysis: the top moves (best
#: first) and their evals in pawns from the side to move's view. The Rust core's twin is `reward::GroundTruth`.
GroundTruth = tuple[list[str], list[float]]


def task_of(prompt: str) -> str | None:
    """``"P"``, ``"A"`` or ``None``."""
    head = prompt.lstrip()[:2]
    return {"P:": "P", "A:": "A"}.get(head)


def policy_prompt(fen: str) -> str:
    """The P: prompt at inference: the model writes the padding itself."""
    return f"P: {fen}"


def prompt_fen(prompt: str) -> str:
    """The FEN of a P: or A: prompt."""
    task = task_of(prompt)
    body = prompt.strip()[2:].strip()
    if task == "P":
        return body.split("M:")[0].strip()
    if task == "A":
        return body.split("+")[0].strip()
    raise ValueError(f"not a P: or A: prompt: {prompt[:120]!r}")


def policy_targets(fens: Sequence[str], moves: Sequence[Sequence[str]], evals: Sequence[Sequence[float]],
                   best: Sequence[str], layout: str = "rookworld") -> list[str]:
    """P: target completions, the text after `P: {fen}`: in RookWorld's layout (FEN padded to 90 columns, moves to
    30, evals to 40), or `compact` (a space between fields)."""
    return _core.policy_targets(list(fens), [list(m) for m in moves], [list(map(float, e)) for e in evals], list(best),
                                layout)


#: The parts of each task, in `Scores.breakdown` order (docs/rewards.md names them).
_POLICY_PARTS = ("best_rank", "best_legal", "best", "hits", "candidates", "evals", "eval_error", "best_loss")
_ENV_PARTS = ("fen_exact", "fen_similarity", "reward_ok", "terminated_ok", "truncated_ok")


@dataclass(frozen=True)
class Scores:
    """The rewards of a batch of completions, one row per completion, and what each is made of.

    `RewardScorer.score_batch` fills every field; a custom reward function for training needs only
    ``rewards``, ``tasks`` and ``well_formed``.
    """

    rewards: np.ndarray  # [n] float64
    tasks: np.ndarray  # [n] str ("P", "A", or a custom reward's own task names)
    well_formed: np.ndarray  # [n] bool
    #: [n] bool: False where no ground truth could be had (the sample is then left out of training); None: all
    valid: np.ndarray | None = None
    #: What each reward is made of, by name (docs/rewards.md): ``quality`` and the P: and A: components as
    #: arrays, NaN or 0 where a part does not apply; empty for a reward function that has none.
    parts: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.rewards)

    def breakdown(self, i: int) -> dict:
        """Completion ``i``'s reward and the parts that apply to its task, as plain Python values."""
        out = {"task": str(self.tasks[i]), "reward": float(self.rewards[i]),
               "well_formed": bool(self.well_formed[i])}
        if self.valid is not None:
            out["valid"] = bool(self.valid[i])
        names = _POLICY_PARTS if self.tasks[i] == "P" else _ENV_PARTS if self.tasks[i] == "A" else ()
        for name in ("quality", *names):
            if name in self.parts:
                value = self.parts[name][i].item()
                out[name] = None if name in ("eval_error", "best_loss") and math.isnan(value) else value
        return out


def _analysis_truth(analysis) -> GroundTruth:
    return [c.move for c in analysis.candidates], [float(c.pawns) for c in analysis.candidates]


class RewardScorer:
    """Scores (prompt, completion) pairs. P: prompts need Stockfish: pass a ``StockfishPool``.

    ``prefetch(prompts)`` starts the Stockfish analyses of upcoming prompts in the background,
    so they overlap generation on the GPU; ``score`` then finds them ready (or cached).
    """

    def __init__(self, stockfish=None, shaping: str = "continuous", p_reward: str = "rank"):
        if shaping not in SHAPINGS:
            raise ValueError(f"shaping must be one of {SHAPINGS}, got {shaping!r}")
        if p_reward not in P_REWARDS:
            raise ValueError(f"p_reward must be one of {P_REWARDS}, got {p_reward!r}")
        # Graded against five moves, every legal move outside them would earn the floor: a silent rank reward.
        width = getattr(stockfish, "multipv", EVERY_MOVE)
        if width < analysis_width(p_reward):
            raise ValueError(f"the {p_reward} P: reward needs Stockfish's MultiPV at {analysis_width(p_reward)} or "
                             f"more (every legal move), not {width}: StockfishPool(multipv=analysis_width(p_reward))")
        self.stockfish = stockfish
        self.shaping = shaping
        self.p_reward = p_reward

    def _policy_fens(self, prompts: Sequence[str]) -> dict[int, str]:
        return {i: prompt_fen(p) for i, p in enumerate(prompts) if task_of(p) == "P"}

    def prefetch(self, prompts: Sequence[str]) -> list[Future]:
        fens = list(dict.fromkeys(self._policy_fens(prompts).values()))
        if not fens:
            return []
        if self.stockfish is None:
            raise ValueError("P: prompts need Stockfish: create the RewardScorer with a StockfishPool")
        return self.stockfish.submit(fens)

    def ground_truth(self, prompts: Sequence[str]) -> list[GroundTruth | None]:
        """The ground truth of each P: prompt, from Stockfish (``None`` for A: prompts)."""
        fens = self._policy_fens(prompts)
        truth: list[GroundTruth | None] = [None] * len(prompts)
        if not fens:
            return truth
        if self.stockfish is None:
            raise ValueError("P: prompts need Stockfish: create the RewardScorer with a StockfishPool")
        unique = list(dict.fromkeys(fens.values()))
        by_fen = dict(zip(unique, (_analysis_truth(a) for a in self.stockfish.analyse(unique))))
        for i, fen in fens.items():
            truth[i] = by_fen[fen]
        return truth

    def ground_truth_or_failures(self, prompts: Sequence[str]) -> tuple[list[GroundTruth | None], list[int]]:
        """Like `ground_truth`, but a position Stockfish could not analyse (after the pool's restarts and
        retries) is reported by index instead of raised, so a training run can leave it out and go on."""
        fens = self._policy_fens(prompts)
        truth: list[GroundTruth | None] = [None] * len(prompts)
        if not fens:
            return truth, []
        if self.stockfish is None:
            raise ValueError("P: prompts need Stockfish: create the RewardScorer with a StockfishPool")
        unique = list(dict.fromkeys(fens.values()))
        by_fen: dict[str, GroundTruth | None] = {}
        for fen, future in zip(unique, self.stockfish.submit(unique)):
            try:
                by_fen[fen] = _analysis_truth(future.result())
            except Exception:  # StockfishError after retries; the pool itself goes on
                by_fen[fen] = None
        failed = [i for i, fen in fens.items() if by_fen[fen] is None]
        for i, fen in fens.items():
            truth[i] = by_fen[fen]
        return truth, failed

    def score_batch(self, prompts: Sequence[str], completions: Sequence[str],
                    ground_truth: Sequence[GroundTruth | None] | None = None) -> Scores:
        """Scores every pair. Completions may be anything; a prompt that is not a valid P: or A:
        prompt raises ``ValueError`` naming it."""
        prompts, completions = list(prompts), list(completions)
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        if ground_truth is None:
            ground_truth = self.ground_truth(prompts)
        if len(ground_truth) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(ground_truth)} ground truths")
        # The completions of a group share their ground truth object: convert each one once.
        slot: dict[int, int] = {}
        truths: list = []
        index = []
        for t in ground_truth:
            if t is None:
                index.append(-1)
                continue
            k = slot.get(id(t))
            if k is None:
                k = slot[id(t)] = len(truths)
                truths.append((list(t[0]), [float(e) for e in t[1]]))
            index.append(k)
        cols, errors = _core.score(prompts, completions, index, truths, self.shaping, self.p_reward)
        if errors:
            i, message = errors[0]  # its row, as every P: problem names its own
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            raise ValueError(f"prompt {i}{more}: {message}: {quoted(prompts[i])}")
        # frombuffer views are read-only; the copies are ordinary arrays users may modify.
        f64 = {k: np.frombuffer(cols[k], dtype="<f8").astype(np.float64) for k in
               ("reward", "quality", "best", "candidates", "evals", "eval_error", "best_loss",
                "fen_similarity")}
        flags = {k: np.frombuffer(cols[k], dtype=np.uint8).astype(bool) for k in
                 ("well_formed", "best_legal", "fen_exact", "reward_ok", "terminated_ok", "truncated_ok")}
        counts = {k: np.frombuffer(cols[k], dtype=np.uint8).astype(np.int64) for k in ("best_rank", "hits")}
        tasks = np.frombuffer(cols["task"], dtype="S1").astype(str)
        columns = f64 | flags | counts
        return Scores(rewards=columns["reward"], tasks=tasks, well_formed=columns["well_formed"],
                      parts={name: columns[name] for name in ("quality", *_POLICY_PARTS, *_ENV_PARTS)})

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        return self.score_batch(prompts, completions).rewards.tolist()
