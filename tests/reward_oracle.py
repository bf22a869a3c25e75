"""An independent plain-Python reference for the reward rules of docs/rewards.md.

The tests (``tests/test_rewards_oracle.py``) and ``benches/rewards_vs_python.py`` compare the Rust
scorer (``rookworld._core.score``, ``rookworld.chess.rewards.RewardScorer``) against this module. It uses
python-chess and the standard library only, never rookworld, and was written from the
documentation. Where the documentation once left a detail open, the choice made here is named in a
comment marked ``RESOLVED``; ``EDGE_CASES`` at the end lists inputs on which the documentation and
the Rust scorer once disagreed.

Entry points:

* ``reference_score(prompt, completion, truth, shaping)`` -> ``Score`` (reward, quality, parts);
* ``reference_reward(prompt, completion, truth, shaping)`` -> ``float``;
* the components: ``parse_policy_answer``, ``policy_parts``, ``parse_env_answer``, ``env_truth``,
  ``env_parts``, ``similarity``, ``shape``.

``truth`` is the ground truth of a P: prompt (``GroundTruth``): Stockfish's ``(moves, evals)``, best
first, with evals in pawns from the side to move's view; ``None`` (ignored) for A: prompts.

The second half of the module builds test cases (hand-crafted ground truths, mutated completions) for
the tests and the benchmark; it too uses python-chess and ``random`` only.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field

import chess

# The A: environment oracle (tests/oracle.py) supplies legality and the true transition.
from oracle import REWARD_DRAW, REWARD_ILLEGAL, REWARD_LEGAL, REWARD_WIN, legal_move, step_board  # noqa: F401

# ------------------------------------------------------------------------------------------------
# Constants, as docs/rewards.md names them

UNPARSEABLE = -0.3
FORMAT_ONLY = 0.2

W_BEST = 0.5
W_CANDIDATES = 0.3
W_EVALS = 0.2
RANK_CREDIT = (1.0, 0.6, 0.4, 0.25, 0.15)
OUTSIDE_TOP = 0.05
INCONSISTENT_BEST = 0.5
CANDIDATE_PENALTY = 0.5
EVAL_CLAMP = 10.0
EVAL_SCALE = 0.5
LOSS_SCALE = 1.0
LOSS_FLOOR = OUTSIDE_TOP
P_REWARDS = ("rank", "cp-loss")

W_FEN = 0.6
NEAR_MISS_CAP = 0.5
NEAR_MISS_POWER = 16

SHAPINGS = ("continuous", "graduated")

#: The ground truth of a P: prompt: Stockfish's top moves, best first, and their evals in pawns.
GroundTruth = tuple[list[str], list[float]]

#: "Any whitespace": the Unicode White_Space property. (RESOLVED: Python's ``str.split()`` also
#: splits on the ASCII separators U+001C..U+001F, which are not Unicode whitespace; the Rust
#: parser does not split on them, and neither does this module.)
WHITESPACE = "".join(
    map(
        chr,
        [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000],
    )
)
_WS = re.escape(WHITESPACE)
_WS_RUN = re.compile(f"[{_WS}]+")
_FIRST_WORD = re.compile(f"[{_WS}]*([^{_WS}]+)")
_FOURTH_FIELD = re.compile(f"[^+{_WS}]*")

#: A decimal number: what "a number" means for evals and the A: reward. (RESOLVED: plain decimal
#: syntax, ASCII digits, optional sign and exponent. Python's ``float()`` would also take
#: ``1_000``, ``nan``, ``inf`` and non-ASCII digits; nan and inf are not finite anyway.)
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def words(text: str) -> list[str]:
    """``text`` split on runs of whitespace, empty words dropped."""
    return [w for w in _WS_RUN.split(text) if w]


def strip(text: str) -> str:
    return text.strip(WHITESPACE)


def strip_start(text: str) -> str:
    return text.lstrip(WHITESPACE)


def number(text: str) -> float | None:
    """The finite number ``text`` spells, else ``None``."""
    if not _NUMBER.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


# ------------------------------------------------------------------------------------------------
# Chess: legality (``oracle.legal_move``, which also accepts king-takes-rook castling as python-chess does)
# and the A: transition


def is_legal(board: chess.Board, text: str) -> bool:
    return legal_move(board, text) is not None


@dataclass(frozen=True)
class Transition:
    fen: str
    reward: str
    terminated: bool
    truncated: bool

    @property
    def target(self) -> str:
        return f"{self.fen}+{self.reward}+{int(self.terminated)}+{int(self.truncated)}"


def step(board: chess.Board, text: str) -> Transition:
    """The true transition for playing ``text``: python-chess, ``outcome(claim_draw=False)``."""
    return Transition(*step_board(board, text))


# ------------------------------------------------------------------------------------------------
# Prompts


def task_of(prompt: str) -> str | None:
    head = prompt.lstrip(WHITESPACE)[:2]
    return {"P:": "P", "A:": "A"}.get(head)


def policy_prompt_fen(prompt: str) -> str:
    """The FEN of ``P: {fen}`` (padding optional).

    RESOLVED: a prompt cut from training text may run on into ``M:``; the FEN stops there.
    """
    body = strip(prompt.lstrip(WHITESPACE)[2:])
    cut = body.find("M:")
    if cut >= 0:
        body = strip(body[:cut])
    if not body:
        raise ValueError(f"P: prompt without a FEN: {prompt[:200]!r}")
    return body


def env_prompt_parts(prompt: str) -> tuple[str, str]:
    """``(fen, move)`` of ``A: {fen}+{move}+{history}+``."""
    body = strip(prompt)[2:]
    if body.endswith("+"):
        body = body[:-1]
    parts = body.split("+")
    if len(parts) != 3:
        raise ValueError(f"an A: prompt has the shape 'A: {{fen}}+{{move}}+{{history}}+': {prompt[:200]!r}")
    return strip(parts[0]), strip(parts[1])


def env_truth(prompt: str) -> Transition:
    fen, move = env_prompt_parts(prompt)
    return step(chess.Board(fen), move)


# ------------------------------------------------------------------------------------------------
# Shaping


def shape(quality: float, shaping: str) -> float:
    """Quality in [0, 1] -> reward."""
    q = min(max(quality, 0.0), 1.0)
    if shaping == "continuous":
        return FORMAT_ONLY + 0.8 * q
    if shaping == "graduated":
        # 1.0 for q = 1, within the documented 1e-9.
        if q >= 1.0 - 1e-9:
            return 1.0
        if q < 0.25:
            return 0.2
        if q < 0.5:
            return 0.4
        if q < 0.75:
            return 0.6
        return 0.8
    raise ValueError(f"shaping must be one of {SHAPINGS}, got {shaping!r}")


# ------------------------------------------------------------------------------------------------
# P:


@dataclass(frozen=True)
class PolicyAnswer:
    moves: list[str]
    #: The E: words as numbers; ``None`` where a word is not a finite number.
    evals: list[float | None]
    best: str


def parse_policy_answer(text: str) -> PolicyAnswer | None:
    """The first ``M:``, the next ``E:``, the next ``B:`` and the first word after it.

    Well formed: all three markers in that order, at least one move, one eval (any word) and a B: word.
    """
    m = text.find("M:")
    if m < 0:
        return None
    e = text.find("E:", m + 2)
    if e < 0:
        return None
    b = text.find("B:", e + 2)
    if b < 0:
        return None
    moves = words(text[m + 2 : e])
    eval_words = words(text[e + 2 : b])
    best = _FIRST_WORD.match(text, b + 2)
    if not moves or not eval_words or best is None:
        return None
    return PolicyAnswer(moves, [number(w) for w in eval_words], best.group(1))


@dataclass
class PolicyParts:
    best_rank: int = 0  # 1 = best (ties with the best included), 0 = not in Stockfish's list
    best_legal: bool = False
    best: float = 0.0
    hits: int = 0
    candidates: float = 0.0
    evals: float = 0.0
    eval_error: float | None = None
    best_loss: float | None = None


def _clamp(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def _clamp_eval(pawns: float) -> float:
    return _clamp(pawns, -EVAL_CLAMP, EVAL_CLAMP)


def policy_parts(board: chess.Board, answer: PolicyAnswer, truth_moves: list[str],
                 truth_evals: list[float], p_reward: str = "rank") -> PolicyParts:
    if len(truth_moves) != len(truth_evals):
        raise ValueError(f"ground truth with {len(truth_moves)} moves but {len(truth_evals)} evals")
    parts = PolicyParts()
    # Stockfish's five (fewer where the position has fewer legal moves): the ground truth's first moves; the
    # cp-loss reward's ground truth goes on with every other legal move.
    listed = min(len(truth_moves), len(RANK_CREDIT))
    top = truth_moves[:listed]

    # best: credit by rank; moves whose eval equals the best move's share rank 1.
    parts.best_legal = is_legal(board, answer.best)
    if answer.best in top:
        rank = top.index(answer.best)
        if abs(truth_evals[rank] - truth_evals[0]) <= 1e-9:  # evals within 1e-9 of the best's: a tie
            rank = 0
        parts.best_rank = rank + 1
        parts.best = RANK_CREDIT[rank]
    elif parts.best_legal:
        parts.best = OUTSIDE_TOP
    if parts.best_legal and answer.best in truth_moves:
        loss = max(0.0, _clamp_eval(truth_evals[0]) - _clamp_eval(truth_evals[truth_moves.index(answer.best)]))
        parts.best_loss = loss
        if p_reward == "cp-loss":
            parts.best = 1.0 if loss <= 1e-9 else LOSS_FLOOR + (1 - LOSS_FLOOR) * math.exp(-loss / LOSS_SCALE)
    if answer.best not in answer.moves:
        parts.best *= INCONSISTENT_BEST

    # candidates and evals. RESOLVED: a move counts (may hit, may earn its eval) only when it is
    # legal, not a repeat of an earlier counted move, and within the first `listed` M: positions;
    # every other M: word is one penalty ("illegal, repeated or surplus"), even when it is a
    # Stockfish move. The worked example (five f1b5, evals 0.20) shows a repeat earns no eval.
    seen: set[str] = set()
    penalties = 0
    credit = 0.0
    errors: list[float] = []
    for i, mv in enumerate(answer.moves):
        if i >= listed or mv in seen or not is_legal(board, mv):
            penalties += 1
            continue
        seen.add(mv)
        if mv in top:
            parts.hits += 1
            written = answer.evals[i] if i < len(answer.evals) else None
            if written is not None:
                err = abs(_clamp_eval(written) - _clamp_eval(truth_evals[top.index(mv)]))
                errors.append(err)
                credit += math.exp(-err / EVAL_SCALE)
    if listed > 0:  # RESOLVED: nothing listed (no legal moves): both parts are 0
        parts.candidates = _clamp((parts.hits - CANDIDATE_PENALTY * penalties) / listed, 0.0, 1.0)
        surplus_evals = max(0, len(answer.evals) - listed)
        parts.evals = _clamp((credit - CANDIDATE_PENALTY * surplus_evals) / listed, 0.0, 1.0)
    if errors:
        parts.eval_error = sum(errors) / len(errors)
    return parts


def policy_quality(parts: PolicyParts) -> float:
    return W_BEST * parts.best + W_CANDIDATES * parts.candidates + W_EVALS * parts.evals


# ------------------------------------------------------------------------------------------------
# A:


@dataclass(frozen=True)
class EnvAnswer:
    fen: str
    reward: float | None
    terminated: str
    truncated: str


def parse_env_answer(text: str) -> EnvAnswer | None:
    """Split on the first three ``+``; the fourth field ends at the next ``+`` or whitespace.

    Well formed: three ``+`` separators and a non-empty FEN field. Every field is compared without
    surrounding whitespace.
    """
    parts = text.split("+", 3)
    if len(parts) < 4:
        return None
    fen = strip(parts[0])
    if not fen:
        return None
    truncated = _FOURTH_FIELD.match(strip_start(parts[3])).group()
    return EnvAnswer(fen, number(strip(parts[1])), strip(parts[2]), truncated)


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insert, delete, substitute; each costs 1) over characters."""
    # A common prefix and suffix never change the distance.
    start, i, j = 0, len(a), len(b)
    while start < i and start < j and a[start] == b[start]:
        start += 1
    while i > start and j > start and a[i - 1] == b[j - 1]:
        i -= 1
        j -= 1
    a, b = a[start:i], b[start:j]
    if not a:
        return len(b)
    if not b:
        return len(a)
    prev = list(range(len(b) + 1))
    for ca in a:
        cur = [prev[0] + 1]
        for k, cb in enumerate(b):
            cur.append(min(prev[k] + (ca != cb), prev[k + 1] + 1, cur[k] + 1))
        prev = cur
    return prev[-1]


def _lossy_utf8(text: str) -> bytes:
    """UTF-8 of the text the scorer receives: lone surrogates become U+FFFD, as PyO3 passes them."""
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace").encode("utf-8")


def similarity(a: str, b: str) -> float:
    """1 minus the edit distance over the longer length, on the first 256 bytes of each string's UTF-8."""
    a, b = (_lossy_utf8(x)[:256].decode("latin-1") for x in (a, b))  # one character per byte
    longest = max(len(a), len(b))
    if longest == 0:
        return 1.0
    return 1.0 - edit_distance(a, b) / longest


@dataclass
class EnvParts:
    fen_exact: bool = False
    fen_similarity: float = 0.0
    reward_ok: bool = False
    terminated_ok: bool = False
    truncated_ok: bool = False


def env_parts(answer: EnvAnswer, truth: Transition) -> EnvParts:
    return EnvParts(
        fen_exact=answer.fen == truth.fen,
        fen_similarity=similarity(answer.fen, truth.fen),
        reward_ok=answer.reward is not None and abs(answer.reward - float(truth.reward)) < 1e-9,
        terminated_ok=answer.terminated == str(int(truth.terminated)),
        truncated_ok=answer.truncated == str(int(truth.truncated)),
    )


def env_quality(parts: EnvParts) -> float:
    fen = 1.0 if parts.fen_exact else NEAR_MISS_CAP * parts.fen_similarity**NEAR_MISS_POWER
    flags = (parts.reward_ok + parts.terminated_ok + parts.truncated_ok) / 3
    return fen * (W_FEN + (1.0 - W_FEN) * flags)


# ------------------------------------------------------------------------------------------------
# Scores


@dataclass
class Score:
    task: str
    reward: float
    well_formed: bool
    quality: float
    parts: PolicyParts | EnvParts | None = field(default=None)


def reference_score(prompt: str, completion: str, truth: GroundTruth | None,
                    shaping: str = "continuous", p_reward: str = "rank") -> Score:
    """Scores one completion. ``ValueError`` only for a bad prompt, truth or shaping, never for the completion."""
    if shaping not in SHAPINGS:
        raise ValueError(f"shaping must be one of {SHAPINGS}, got {shaping!r}")
    task = task_of(prompt)
    if task == "P":
        board = chess.Board(policy_prompt_fen(prompt))
        if truth is None:
            raise ValueError("a P: prompt needs a Stockfish analysis")
        answer = parse_policy_answer(completion)
        if answer is None:
            return Score("P", UNPARSEABLE, False, 0.0)
        parts = policy_parts(board, answer, list(truth[0]), [float(e) for e in truth[1]], p_reward)
        quality = policy_quality(parts)
        return Score("P", shape(quality, shaping), True, quality, parts)
    if task == "A":
        transition = env_truth(prompt)
        answer = parse_env_answer(completion)
        if answer is None:
            return Score("A", UNPARSEABLE, False, 0.0)
        parts = env_parts(answer, transition)
        quality = env_quality(parts)
        return Score("A", shape(quality, shaping), True, quality, parts)
    raise ValueError(f"prompt is neither a P: nor an A: prompt: {prompt[:200]!r}")


def reference_reward(prompt: str, completion: str, truth: GroundTruth | None,
                     shaping: str = "continuous") -> float:
    return reference_score(prompt, completion, truth, shaping).reward


def policy_target(fen: str, moves: list[str], evals: list[float], best: str) -> str:
    """A P: completion in the training layout: FEN padded to 90 columns, moves to 30, evals to 40."""
    return (" " * max(0, 90 - len(fen)) + "M: " + " ".join(moves).ljust(30) + "E: "
            + " ".join(repr(round(e, 2)) for e in evals).ljust(40) + "B: " + best)


#: Where this module (the documentation) and the Rust scorer are known to differ, with exact inputs.
#: Each entry: (what, prompt, completion, truth, shaping). tests/test_rewards_oracle.py checks them.
_WORKED_FEN = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"
_WORKED_TRUTH = (["f1b5", "d2d4", "f1c4", "b1c3", "c2c3"], [0.45, 0.38, 0.3, 0.21, 0.12])
_ENV_SAMPLE = "A: 8/2k2b2/R1p4r/3p1p2/P7/2P2B1P/5PPK/4R3 w - - 1 31+a6a5+f7e7 h5f3 e6f7 b1b6 h8h6 a1e1 e7d8 b6a6 d8c7 a6a5+"
_ENV_TARGET_FEN = "8/2k2b2/2p4r/R2p1p2/P7/2P2B1P/5PPK/4R3 b - - 2 31"
_CASTLE_FEN = "r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R w KQkq - 0 1"
#: Edge cases where the rules once differed between the docs and the Rust scorer; both now agree on them.
EDGE_CASES = [
    ("king-takes-rook castling text (e1h1) is castling, as in python-chess",
     f"A: {_CASTLE_FEN}+e1h1+e1h1+", "r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R4RK1 b kq - 1 1+0.001+0+0", None, "continuous"),
    ("king-takes-rook castling text (e1h1) as a P: B: move: legal, outside the top 5",
     f"P: {_CASTLE_FEN}", "M: e1h1 E: 0.1 B: e1h1", (["e2e4"], [0.3]), "continuous"),
    ("graduated: q = 1 - 8e-12 earns 1.0 (q = 1 within 1e-9)",
     f"P: {_WORKED_FEN}", "M: f1c4 f1b5 c2c3 d2d4 b1c3 E: 0.3 0.4500000001 0.12 0.38 0.21 B: f1b5",
     _WORKED_TRUTH, "graduated"),
    ("best-move tie: an eval 1e-10 from the best's shares rank 1",
     f"P: {_WORKED_FEN}", "M: d2d4 E: 0.45 B: d2d4", (["f1b5", "d2d4"], [0.45, 0.4499999999]), "continuous"),
    ("A: reward within 1e-9 of the truth counts as right",
     _ENV_SAMPLE, f"{_ENV_TARGET_FEN}+0.0010000000001+0+0", None, "graduated"),
    ("A: FEN similarity is measured in UTF-8 bytes",
     _ENV_SAMPLE, f"{_ENV_TARGET_FEN[:-2]}\u00e91+0.001+0+0", None, "continuous"),
    ("A: FEN similarity compares the first 256 bytes",
     _ENV_SAMPLE, f"{_ENV_TARGET_FEN}{'x' * 300}+0.001+0+0", None, "continuous"),
]


# ------------------------------------------------------------------------------------------------
# Test cases: hand-crafted ground truths and mutated completions (python-chess and `random` only), for
# tests/test_rewards_oracle.py and benches/rewards_vs_python.py.

#: Mate in n as the data writes it: (100000 - n) / 100 pawns.
MATE_EVALS = [(100_000 - n) / 100 for n in (1, 2, 3, 5, 12)]


def full_truth(board: chess.Board, top: GroundTruth, rng: random.Random) -> GroundTruth:
    """A ground truth of every legal move, as the cp-loss reward's MultiPV analysis gives it: `top` (a
    `synthetic_truth`), then every other legal move below it."""
    moves, evals = top
    rest = [m.uci() for m in board.legal_moves if m.uci() not in moves]
    floor = evals[-1] if evals else rng.randint(-600, 600) / 100
    lower = sorted((floor - rng.randint(0, 1500) / 100 for _ in rest), reverse=True)
    return moves + rest, evals + lower


def synthetic_truth(board: chess.Board, rng: random.Random) -> GroundTruth:
    """A plausible ground truth, as a MultiPV-5 analysis gives it: up to five legal moves, best first, evals in pawns.

    Evals are whole centipawns (as Stockfish's), sometimes mate evals (+-999.97 style), beyond
    the clamp (+-15), or tied with the best move.
    """
    legal = [m.uci() for m in board.legal_moves]
    k = min(5, len(legal))
    if k > 1 and rng.random() < 0.1:
        k = rng.randint(1, k)  # a shallow or pruned analysis
    moves = rng.sample(legal, k)
    kind = rng.random()
    evals = []
    for _ in range(k):
        r = rng.random()
        if kind < 0.1 and r < 0.6:
            evals.append(rng.choice(MATE_EVALS))
        elif kind < 0.2 and r < 0.6:
            evals.append(-rng.choice(MATE_EVALS))
        elif kind < 0.3 and r < 0.5:
            evals.append(rng.choice([15.3, -15.3, 10.0, -10.0, 9.99, 25.0]))
        else:
            evals.append(rng.randint(-600, 600) / 100)
    evals.sort(reverse=True)
    if k > 1 and rng.random() < 0.25:  # ties with the best move
        for i in range(1, rng.randint(2, k) if k > 2 else 2):
            evals[i] = evals[0]
    return moves, evals


def eval_text(pawns: float) -> str:
    """An eval as the data prints it (a Python float rounded to 2 decimals)."""
    return repr(round(pawns, 2))


_ILLEGAL_TEXTS = ["e2e5", "zzzz", "0000", "e9e9", "a1a1", "E2E4", "e7e8Q", "e2e4q", "P@e4", "e2", "e2e4e4", "\u00e92e4",
                  "xx", "1-0", "O-O", "Nf3", "e2-e4", "a7a8k", "h1h9", "", "e1e1", "g1f3 ", "b8c6", "d7d5"]
WEIRD_EVALS = ["nan", "NaN", "inf", "-inf", "infinity", "1e999", "-1e999", "7", "+1.5", "1_0", "0x10", ".5", "5.",
               "1e3", "--1", "\u0661", "\u22120.5", "0.0", "-0.0", "1e-999", "+.5", "e5", "1e", ".", "-", "999.97",
               "-999.99", "0.30000000000000004", "3.5e-1", "1E1", "12.345", "+-1", "1.5.2", "0,5", "\uff11"]
REWARD_TEXTS = ["0.001", "0.0010", "1e-3", ".001", "+0.001", "0.00100", "1E-3", "0.001e0", "1", "1.0", "0.5", "-1.0",
                "-1", "-1.00", "true", "nan", "inf", "-inf", "", "0", "0.01", "1e999", "1_0", "0x1", "0.5000", "+1",
                " 0.001", "0.001 ", "\u00a00.001", "0.001\u3000", "\u22121.0", "1.", ".5", "5e-1"]
FLAG_TEXTS = ["0", "1", "true", "false", "True", "00", "01", " 0", "0 ", "", "1.0", "0.0", "+0", "-0", "\u00a00",
              "0\u3000", "\t1", "1\n", "O", "l"]
_WHITESPACE_SEPS = [" ", " ", " ", "  ", "\t", "\n", "\r\n", "\x0b", "\x0c", "\u00a0", "\u3000", "\u2003", "\u0085",
                    "\u2028", " \n\t "]
_NOT_WHITESPACE = ["\x1c", "\x1f", "\u200b", "\ufeff", ",", ";", "\u180e"]
JUNK = (list("abcdefghxyzMEBP0123456789+-.:/ ") + ["M:", "E:", "B:", "A:", "P:", "\t", "\n", "\r\n", "\u00a0",
        "\u3000", "\u2003", "\u0085", "\x1c", "\x1f", "\u200b", "\ufeff", "\u00e9", "\u00df", "\u2654", "\u265e",
        "\u65e5\u672c", "\U0001f642", "\u0301", "\x00", "\ud800", "\udfff", "\uffff", "\u2212", "\u0661",
        "<|endoftext|>", "e2e4", "0.5", "+0+0"])
ASCII_JUNK = list("abcdefghxyzMEBPkqrnbKQRNB0123456789+-.:/ w") + ["\t", "  ", "e2e4", "0.5", "+0+0", "/8/"]
_TRAILING = ["", "", "", " ", "\n", "<|endoftext|>", " P: 8/8 M: a1a2 E: 0.1 B: a1a2", "\n\nM: e2e4 E: 1 B: e2e4",
             " and then some", " B: a1a1", "0.5 junk", "\u00a0\u3000", "+0+1+", " +1.0+1+0"]


def junk(rng: random.Random, k: int | None = None, ascii_only: bool = False) -> str:
    pool = ASCII_JUNK if ascii_only else JUNK
    return "".join(rng.choice(pool) for _ in range(rng.randint(1, 12) if k is None else k))


def illegal_text(board: chess.Board, rng: random.Random) -> str:
    while True:
        if rng.random() < 0.5:
            text = rng.choice(_ILLEGAL_TEXTS)
        else:
            text = rng.choice(chess.SQUARE_NAMES) + rng.choice(chess.SQUARE_NAMES) + rng.choice(["", "", "", "q", "n"])
        if not is_legal(board, text) or rng.random() < 0.2:
            return text


def _sep(rng: random.Random, whitespace_only: bool = True) -> str:
    if not whitespace_only and rng.random() < 0.15:
        return rng.choice(_NOT_WHITESPACE)
    return rng.choice(_WHITESPACE_SEPS)


def _mutate_policy(rng: random.Random, board: chess.Board, truth: GroundTruth,
                   moves: list[str], evals: list[str], best: str) -> str:
    """One random edit of (moves, evals) in place; returns the B: move."""
    truth_moves, truth_evals = truth
    legal = [m.uci() for m in board.legal_moves]
    outside = [m for m in legal if m not in truth_moves] or ["a1a1"]
    op = rng.randrange(22)
    i = rng.randrange(len(moves)) if moves else 0
    j = rng.randrange(len(moves)) if moves else 0
    if op == 0 and moves:
        moves[i], moves[j] = moves[j], moves[i]
    elif op == 1 and evals:
        i, j = rng.randrange(len(evals)), rng.randrange(len(evals))
        evals[i], evals[j] = evals[j], evals[i]
    elif op == 2 and moves:
        del moves[i]
        if i < len(evals):
            del evals[i]
    elif op == 3 and moves:
        del moves[i]
    elif op == 4 and evals:
        del evals[rng.randrange(len(evals))]
    elif op == 5 and moves:
        moves[j] = moves[i]
    elif op == 6 and moves:
        moves.insert(rng.randrange(len(moves) + 1), rng.choice(moves))
        evals.insert(rng.randrange(len(evals) + 1), rng.choice(evals) if evals else "0.0")
    elif op == 7 and moves:
        moves[i] = illegal_text(board, rng)
    elif op == 8 and moves:
        moves[i] = rng.choice(outside)
    elif op == 9:
        for _ in range(rng.randint(1, 3)):
            moves.append(rng.choice([rng.choice(outside), illegal_text(board, rng), *truth_moves[:1]]))
            evals.append(eval_text(rng.randint(-300, 300) / 100))
    elif op == 10:
        for _ in range(rng.randint(1, 3)):
            evals.append(rng.choice([eval_text(rng.randint(-300, 300) / 100), rng.choice(WEIRD_EVALS)]))
    elif op in (11, 12) and evals:
        i = rng.randrange(len(evals))
        value = number(evals[i])
        delta = rng.choice([-3, -1, -0.5, -0.1, -0.01, 0.01, 0.1, 0.5, 1, 3, 20])
        evals[i] = eval_text((value if value is not None else 0.0) + delta)
    elif op == 13 and evals:
        evals[rng.randrange(len(evals))] = rng.choice(WEIRD_EVALS)
    elif op == 14:
        evals[:] = ["0.0"] * len(evals)
    elif op == 15 and evals:
        evals[rng.randrange(len(evals))] = eval_text(rng.choice([1, -1]) * rng.choice(MATE_EVALS))
    elif op == 16:
        paired = list(zip(moves, evals))
        rng.shuffle(paired)
        moves[:] = [m for m, _ in paired]
        evals[:] = [e for _, e in paired]
    elif op == 17:
        moves.clear() if rng.random() < 0.5 else evals.clear()
    elif op == 18 and moves and best in moves:
        k = moves.index(best)
        del moves[k]
        if k < len(evals):
            del evals[k]
    elif op == 19 and moves:
        moves[i] = moves[i].upper() if rng.random() < 0.5 else moves[i] + rng.choice(["q", "x", "+", "#"])
    # op 20, 21 and the rest: B: below
    r = rng.random()
    if op >= 20 or r < 0.3:
        choice = rng.randrange(8)
        if choice == 0 and truth_moves:
            return rng.choice(truth_moves)
        if choice == 1 and truth_moves:
            tied = [m for m, e in zip(truth_moves, truth_evals) if e == truth_evals[0]]
            return rng.choice(tied)
        if choice == 2:
            return rng.choice(outside)
        if choice == 3:
            return illegal_text(board, rng)
        if choice == 4 and moves:
            return rng.choice(moves)
        if choice == 5:
            return junk(rng, rng.randint(1, 4)).replace(" ", "")
        if choice == 6 and truth_moves:
            return truth_moves[-1]
        return rng.choice(legal) if legal else best
    return best


def render_policy(rng: random.Random, fen: str, moves: list[str], evals: list[str], best: str) -> str:
    layout = rng.randrange(4)
    if layout == 0:  # the training layout
        return policy_target_layout(fen, moves, evals, best)
    if layout == 1:
        return f"M: {' '.join(moves)} E: {' '.join(evals)} B: {best}"
    strict = layout == 2

    def run(items: list[str]) -> str:
        return "".join(_sep(rng, strict) + item for item in items)

    lead = rng.choice(["", " ", "  " * rng.randint(1, 20), "\n", "\t"])
    after = rng.choice(["", " ", "\t", "\n", "  "])
    return (lead + "M:" + run(moves) + _sep(rng) + "E:" + run(evals) + _sep(rng) + "B:" + after + best)


def policy_target_layout(fen: str, moves: list[str], evals: list[str], best: str) -> str:
    return (" " * max(0, 90 - len(fen)) + "M: " + " ".join(moves).ljust(30) + "E: " + " ".join(evals).ljust(40)
            + "B: " + best)


def mutate_text(rng: random.Random, text: str) -> str:
    op = rng.randrange(9)
    if op == 0:
        return text[: rng.randint(0, len(text))]
    if op == 1:
        k = rng.randint(0, len(text))
        return text[:k] + junk(rng) + text[k:]
    if op == 2:
        marker = rng.choice(["M:", "E:", "B:"])
        return text.replace(marker, rng.choice(["", "M :", "m:", marker.lower(), marker[0], marker + marker]), 1)
    if op == 3:
        k = text.find("B:")
        return text[k:] + " " + text[:k] if k >= 0 else text
    if op == 4:
        return junk(rng) + text
    if op == 5:
        return text + rng.choice(_TRAILING[4:]) + (junk(rng) if rng.random() < 0.5 else "")
    if op == 6:
        return text + rng.choice([" ", "\n", ""]) + text
    if op == 7:
        return text.replace(" ", rng.choice(_WHITESPACE_SEPS))
    k = rng.randint(0, len(text))
    return text[:k] + text[k + rng.randint(1, 5):]


def policy_completions(fen: str, truth: GroundTruth, rng: random.Random, n: int,
                       exact_share: float = 0.2) -> list[str]:
    """``n`` completions for ``P: {fen}``: exact targets (a share) and mutated ones."""
    board = chess.Board(fen)
    truth_moves, truth_evals = truth
    legal = [m.uci() for m in board.legal_moves]
    out = []
    for _ in range(n):
        order = list(range(len(truth_moves)))
        rng.shuffle(order)
        moves = [truth_moves[i] for i in order]
        evals = [eval_text(truth_evals[i]) for i in order]
        best = truth_moves[0] if truth_moves else (rng.choice(legal) if legal else "e2e4")
        if not moves:
            moves, evals = [illegal_text(board, rng)], ["0.0"]
        if rng.random() < exact_share:
            text = policy_target_layout(fen, moves, evals, best)
        else:
            for _ in range(rng.choice([1, 1, 1, 2, 2, 3])):
                best = _mutate_policy(rng, board, truth, moves, evals, best)
            text = render_policy(rng, fen, moves, evals, best)
            text += rng.choice(_TRAILING)
            for _ in range(rng.choice([0, 0, 0, 1, 1, 2])):
                text = mutate_text(rng, text)
        out.append(text)
    return out


def _fen_edit(rng: random.Random, fen: str, prompt_fen: str, other_fens: list[str]) -> str:
    op = rng.randrange(11)
    k = rng.randrange(len(fen)) if fen else 0
    chars = "pnbrqkPNBRQK12345678/ -wabcdefgh"
    if op == 0:
        return fen[:k] + rng.choice(chars) + fen[k + 1:]
    if op == 1:
        return fen[:k] + fen[k + 1:]
    if op == 2:
        return fen[:k] + rng.choice(chars) + fen[k:]
    if op == 3 and len(fen) > 1:
        k = min(k, len(fen) - 2)
        return fen[:k] + fen[k + 1] + fen[k] + fen[k + 2:]
    if op == 4:
        return prompt_fen
    if op == 5 and other_fens:
        return rng.choice(other_fens)
    if op == 6:
        return rng.choice(["", " ", "\t"])
    if op == 7:
        return fen.swapcase() if rng.random() < 0.5 else fen.lower()
    if op == 8:
        return fen[: rng.randint(0, len(fen))]
    if op == 9:
        return rng.choice(_WHITESPACE_SEPS) + fen + rng.choice(_WHITESPACE_SEPS)
    return fen.rsplit(" ", 2)[0] + f" {rng.randint(0, 200)} {rng.randint(1, 200)}"


def env_completions(prompt: str, target: str, rng: random.Random, n: int, other_fens: list[str] = (),
                    exact_share: float = 0.2) -> list[str]:
    """``n`` completions for an A: prompt whose exact target is ``target``."""
    prompt_fen = env_prompt_parts(prompt)[0]
    out = []
    for _ in range(n):
        fields = target.split("+")
        if rng.random() < exact_share:
            out.append(target)
            continue
        for _ in range(rng.choice([1, 1, 1, 2, 2, 3])):
            op = rng.randrange(6)
            if op in (0, 1):
                fields[0] = _fen_edit(rng, fields[0], prompt_fen, list(other_fens))
            elif op == 2 and len(fields) > 1:
                fields[1] = rng.choice(REWARD_TEXTS)
            elif op in (3, 4) and len(fields) > 2:
                fields[rng.randrange(2, len(fields))] = rng.choice(FLAG_TEXTS)
            elif len(fields) > 1:
                del fields[rng.randrange(1, len(fields))]  # a missing field
        text = "+".join(fields) + rng.choice(_TRAILING)
        for _ in range(rng.choice([0, 0, 1, 1, 2])):
            op = rng.randrange(5)
            if op == 0:
                text = text[: rng.randint(0, len(text))]
            elif op == 1:
                k = rng.randint(0, len(text))
                in_fen = "+" not in text[:k]
                text = text[:k] + junk(rng, ascii_only=in_fen) + text[k:]
            elif op == 2:
                text = rng.choice(_WHITESPACE_SEPS) + text
            elif op == 3:
                text = text + rng.choice([" ", "\n", ""]) + target
            else:
                text = text + junk(rng)
        out.append(text)
    return out
