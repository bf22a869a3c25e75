"""RookWorld text samples for supervised training, and the rows they make.

A file holds one sample a line, in either form:
- RookWorld text, as the public RookWorld datasets write it:
  ``P: <fen padded> M: <moves>  E: <evals>  B: <best>`` and
  ``A: <fen>+<move>+<history>+<new fen>+<reward>+<terminated>+<truncated>``;
- the JSONL of ``rookworld positions --annotate`` (its ``p_prompt``/``p_target`` and ``a_prompt``/``a_target``).
Each sample is a prompt, as the model is given it at inference, and the target it must write. A malformed line
is a `DataError` naming the file and line (or skipped and counted); an A: target that disagrees with the rules
is left out and reported, never trained on.

Documents are ``[EOS] + prompt + target`` token ids, as RookWorld-LM was pretrained (the prompt and the target
tokenized apart, as the sampler sees them). Each makes one row (the default), or they are packed into rows of
``seq_len`` tokens (--pack); either way in a new seeded order every pass, so row ``i`` of the stream is a pure
function of (seed, i): a resumed run reads what an unbroken one would have.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rookworld.chess import rules
from rookworld.chess.data import DataError, Record, read_lines
from rookworld.io.json_line import json_value
from rookworld.chess.fields import FIELDS, OTHER, field_starts, policy_fields
from rookworld.io.quote import ECHO_LIMIT, quoted, shortened
from rookworld.chess.rewards import policy_targets
from rookworld.net.tokenizer import OutsideVocabularyError

_P_TEXT = re.compile(r"P:\s+(\S+\s+\S+\s+\S+\s+\S+\s+\S+\s+\S+)(\s.*)$", re.S)


@dataclass(frozen=True)
class Sample:
    task: str  # "P" or "A"
    prompt: str
    target: str
    source: str  # FILE:LINE


@dataclass
class SampleSet:
    samples: list[Sample]
    skipped: int  # malformed lines skipped (--skip-bad)
    disagree: list[Sample]  # A: samples whose target is not what the rules give: left out
    #: A: samples whose history cannot lead to their position (or does not end with their move): left out, since
    #: the model would learn to read a history that is not the game's.
    bad_history: list[tuple[Sample, str]] = dataclasses.field(default_factory=list)

    def report(self) -> list[str]:
        """What a user should hear about the files, one line each."""
        lines = []
        if self.skipped:
            lines.append(f"skipped {self.skipped} malformed line(s)")
        if self.disagree:
            where = ", ".join(s.source for s in self.disagree[:3]) + (", ..." if len(self.disagree) > 3 else "")
            lines.append(f"left out {len(self.disagree)} A: sample(s) whose target disagrees with the rules: {where}")
        if self.bad_history:
            where = ", ".join(f"{s.source} ({why})" for s, why in self.bad_history[:3]) + (
                ", ..." if len(self.bad_history) > 3 else "")
            lines.append(f"left out {len(self.bad_history)} A: sample(s) whose history cannot lead to the position: "
                         f"{where}")
        return lines


def _policy_sample(text: str, source: str) -> Sample:
    m = _P_TEXT.match(text)
    if m is None:
        raise ValueError("a P: sample is 'P: <fen> M: <moves> E: <evals> B: <best>'")
    fen, target = m.group(1), m.group(2)
    t = policy_fields(target)
    if t is None:
        raise ValueError("the P: target needs 'M:', 'E:' and 'B:', in that order")
    moves, evals = t[0].split(), t[1].split()
    if not moves or len(moves) != len(evals):
        raise ValueError(f"{len(moves)} moves but {len(evals)} evals")
    try:
        [float(e) for e in evals]
    except ValueError:
        raise ValueError(f"evals must be numbers: {quoted(t[1])}") from None
    problem = rules.fen_problem(fen)
    if problem is not None:
        raise ValueError(f"not a legal position ({problem})")
    return Sample("P", f"P: {fen}", target, source)


def _env_sample(text: str, source: str) -> Sample:
    parts = text[2:].strip().split("+")
    if len(parts) != 7:
        raise ValueError("an A: sample is 'A: fen+move+history+new fen+reward+terminated+truncated'")
    return Sample("A", "A: " + "+".join(parts[:3]) + "+", "+".join(parts[3:]), source)


def _json_samples(text: str, source: str) -> list[Sample]:
    obj = json_value(text)
    if not isinstance(obj, dict) or not isinstance(obj.get("p_prompt"), str) or not isinstance(obj.get("p_target"),
                                                                                               str):
        raise ValueError('no "p_prompt" and "p_target": write the file with rookworld positions --annotate')
    samples = [_policy_sample(obj["p_prompt"] + obj["p_target"], source)]
    if isinstance(obj.get("a_prompt"), str) and isinstance(obj.get("a_target"), str):
        samples.append(Sample("A", obj["a_prompt"], obj["a_target"], source))
    return samples


def read_samples(paths: Sequence[str], skip_bad: bool = False) -> SampleSet:
    samples: list[Sample] = []
    skipped = 0
    for path in paths:
        lines = read_lines(path)
        for lineno, line in enumerate(lines, 1):
            text, source = line.strip(), f"{path}:{lineno}"
            if not text or text.startswith("#"):
                continue
            try:
                if text.startswith("{"):
                    samples.extend(_json_samples(text, source))
                elif text.startswith("P:"):
                    samples.append(_policy_sample(line.rstrip("\r\n").lstrip(), source))
                elif text.startswith("A:"):
                    samples.append(_env_sample(text, source))
                else:
                    raise ValueError("expected a P: or A: sample, or a JSON line of rookworld positions --annotate")
            except ValueError as e:
                if not skip_bad:
                    raise DataError(f"{source}: {shortened(str(e), 300)}: {shortened(text, ECHO_LIMIT)}") from None
                skipped += 1
    kept, disagree = _check_env_targets(samples)
    kept, bad_history = _check_env_histories(kept)
    if not kept:
        raise DataError(f"{', '.join(paths)}: no usable sample")
    return SampleSet(kept, skipped, disagree, bad_history)


def relayout(samples: Sequence[Sample], layout: str, ranked: bool = False) -> list[Sample]:
    """The samples with each P: target rewritten in `layout` (`policy_targets`: rookworld or compact), its moves,
    evals and best move unchanged, the moves in the data's order or `ranked` by eval, best first (ties keep the
    data's order); A: samples as they are."""
    policy = [i for i, s in enumerate(samples) if s.task == "P"]
    parsed = [policy_fields(samples[i].target) for i in policy]  # every P: sample was checked on reading
    candidates = [list(zip(m[0].split(), map(float, m[1].split()))) for m in parsed]
    if ranked:
        candidates = [sorted(c, key=lambda move_eval: -move_eval[1]) for c in candidates]
    targets = policy_targets([samples[i].prompt[3:] for i in policy], [[m for m, _ in c] for c in candidates],
                             [[e for _, e in c] for c in candidates], [m[2] for m in parsed], layout)
    out = list(samples)
    for i, target in zip(policy, targets):
        out[i] = dataclasses.replace(samples[i], target=target)
    return out


def _check_env_targets(samples: list[Sample]) -> tuple[list[Sample], list[Sample]]:
    """Splits off the A: samples whose target is not the rules' (a prompt that cannot be parsed counts too)."""
    env = [s for s in samples if s.task == "A"]
    truth: list[str | None] = []
    for s in env:  # one by one only for a prompt the batch call refuses
        try:
            truth.append(rules.env_targets([s.prompt])[0])
        except ValueError:
            truth.append(None)
    wrong = {id(s) for s, t in zip(env, truth) if t != s.target}
    return [s for s in samples if id(s) not in wrong], [s for s in samples if id(s) in wrong]


def _env_fields(sample: Sample) -> tuple[str, str, list[str]]:
    """An A: prompt's FEN, move and history field (the recent moves, ending with the move)."""
    fen, move, history = sample.prompt[3:].split("+")[:3]
    return fen, move, history.split()


def _check_env_histories(samples: list[Sample]) -> tuple[list[Sample], list[tuple[Sample, str]]]:
    """Splits off the A: samples whose history field (the recent moves, ending with the move played) cannot lead
    to their position, with why. Every A: prompt here parsed, as its target was checked against the rules."""
    env = [s for s in samples if s.task == "A"]
    fields = [_env_fields(s) for s in env]
    problems = rules.history_problems([fen for fen, _, _ in fields], [history[:-1] for _, _, history in fields])
    bad = {}
    for s, (_, move, history), problem in zip(env, fields, problems):
        if history[-1:] != [move]:
            bad[id(s)] = f"its history does not end with its move {move}"
        elif problem is not None:
            bad[id(s)] = problem
    return [s for s in samples if id(s) not in bad], [(s, bad[id(s)]) for s in samples if id(s) in bad]


def positions(samples: Sequence[Sample], limit: int | None = None) -> list[Record]:
    """The samples' positions for greedy evaluation, one record a FEN: a P: sample gives the analysis (its moves
    ranked by their evals), an A: sample the move and the history before it."""
    by_fen: dict[str, Record] = {}
    for s in samples:
        if s.task == "P":
            fen = rules.normalize_fen(s.prompt[3:].strip())
            moves, evals, _ = policy_fields(s.target)
            ranked = sorted(zip(moves.split(), map(float, evals.split())), key=lambda me: -me[1])
            analysis = {"moves": [m for m, _ in ranked], "evals": [e for _, e in ranked]}
            old = by_fen.get(fen) or Record(fen=fen, source=s.source)
            by_fen[fen] = Record(old.fen, old.history, old.move, old.phase, analysis, old.source)
        else:
            fen_text, move, history = _env_fields(s)
            fen = rules.normalize_fen(fen_text)
            old = by_fen.get(fen) or Record(fen=fen, source=s.source)
            by_fen[fen] = Record(old.fen, tuple(history[:-1]), move, old.phase, old.analysis, old.source)
    return list(by_fen.values())[:limit]


# ----------------------------------------------------------------------------------------------------------
# Documents and rows


@dataclass
class Documents:
    ids: list[np.ndarray]  # [EOS] + prompt + target, int64
    #: float32 per token: the weight of predicting it in the loss (0: the loss does not count it)
    weights: list[np.ndarray]
    eos_id: int  # the tokenizer's <|endoftext|>: each document's first token, and the pad
    #: per document: a P: sample's (FEN, index of its target's first token), for the legality loss; None for A:
    policy: list[tuple[str, int] | None] = dataclasses.field(default_factory=list)
    #: uint8 per token: its field (1 + the index in `FIELDS`), or `OTHER` (the prompt, the EOS)
    fields: list[np.ndarray] = dataclasses.field(default_factory=list)
    sources: list[str] = dataclasses.field(default_factory=list)  # per document: its sample's FILE:LINE

    def row(self, d: int) -> tuple[np.ndarray, np.ndarray]:
        """Document `d` as a row of its own, closed by an EOS the loss counts at weight 1."""
        return np.append(self.ids[d], self.eos_id), np.append(self.weights[d], np.float32(1.0))


def token_sizes(tokenizer) -> np.ndarray:
    """Every token's length in bytes (the EOS 0): where each token of a text begins."""
    decode = tokenizer.encoding.decode_single_token_bytes
    return np.array([0 if t == tokenizer.eos_id else len(decode(t)) for t in range(tokenizer.vocab_size)])


def token_fields(sizes: np.ndarray, task: str, target: str, tokens: Sequence[int]) -> np.ndarray:
    """Each target token's field (1 + its index in `FIELDS`): the field its first character lies in. `sizes`:
    `token_sizes` of the vocabulary that spelled `tokens`."""
    size = sizes[np.asarray(tokens, dtype=np.int64)]
    begins = np.cumsum(size) - size  # the chess text is ASCII: a byte a character
    starts = field_starts(task, target)
    at = np.searchsorted(np.array([o for o, _ in starts]), begins, side="right") - 1
    numbers = np.array([f for _, f in starts], dtype=np.uint8)
    return np.where(at >= 0, numbers[np.maximum(at, 0)], OTHER).astype(np.uint8)


def field_table(weights: dict[str, float] | None = None) -> np.ndarray:
    """Weight by field number, `OTHER` first (always 1): the table `tokenize` reads (None: every field 1)."""
    return np.array([1.0] + [1.0 if weights is None else weights[f] for f in FIELDS], dtype=np.float32)


def tokenize(samples: Sequence[Sample], tokenizer, loss_on: str = "all",
             field_weights: dict[str, float] | None = None) -> Documents:
    """With ``loss_on="target"`` the loss counts the target and the EOS that opens a document (which the
    previous document's last token predicts: the end of its completion), not the prompt. Each counted target token
    weighs its field's `field_weights` (`rookworld.chess.fields`; None: all 1); the prompt and EOS weigh 1. A
    sample with text the vocabulary cannot spell is an error naming its file and line."""
    for s in samples:
        try:
            tokenizer.check(s.prompt + s.target)
        except OutsideVocabularyError as e:
            raise DataError(f"{s.source}: {e}") from None
    prompts = tokenizer.encoding.encode_ordinary_batch([s.prompt for s in samples])
    targets = tokenizer.encoding.encode_ordinary_batch([s.target for s in samples])
    table, sizes = field_table(field_weights), token_sizes(tokenizer)
    ids, weights, policy, fields = [], [], [], []
    for s, p, t in zip(samples, prompts, targets):
        ids.append(np.array([tokenizer.eos_id, *p, *t], dtype=np.int64))
        field = np.concatenate([np.full(1 + len(p), OTHER, np.uint8), token_fields(sizes, s.task, s.target, t)])
        weight = table[field]
        if loss_on == "target":
            weight[1 : 1 + len(p)] = 0.0
        fields.append(field)
        weights.append(weight)
        policy.append((s.prompt[3:].strip(), 1 + len(p)) if s.task == "P" else None)
    return Documents(ids, weights, tokenizer.eos_id, policy, fields, [s.source for s in samples])


class Rows:
    """Training rows of a set of documents: packed into `seq_len` tokens, or one document a row (closed by an
    EOS the loss counts). Row `i` of the endless stream is a pure function of (seed, i): pass k over the
    documents is its own seeded order."""

    def __init__(self, docs: Documents, seq_len: int, pack: bool, seed: int = 0):
        self.docs, self.seq_len, self.pack, self.seed = docs, seq_len, pack, seed
        n_tokens = sum(len(d) for d in docs.ids)
        self.per_pass = n_tokens // seq_len if pack else len(docs.ids)
        if self.per_pass == 0:
            raise DataError(f"the samples hold {n_tokens} tokens, fewer than one row of --seq-len {seq_len}")
        if not pack:
            d = max(range(len(docs.ids)), key=lambda i: len(docs.ids[i]))
            longest = len(docs.ids[d]) + 1
            if longest > seq_len:
                where = f"{docs.sources[d]}: " if docs.sources else ""
                raise DataError(f"{where}a document of {longest:,} tokens does not fit --seq-len {seq_len} (one "
                                "document a row; raise --seq-len, or --pack documents into rows)")
        self._pass = -1
        self._ids = self._weights = None
        self._order: list[int] = []

    def _load(self, k: int) -> None:
        if self._pass == k:
            return
        order = list(range(len(self.docs.ids)))
        random.Random(self.seed * 1_000_033 + k).shuffle(order)
        self._order, self._pass = order, k
        if self.pack:
            self._ids = np.concatenate([self.docs.ids[i] for i in order])
            self._weights = np.concatenate([self.docs.weights[i] for i in order])

    def document(self, index: int) -> int | None:
        """The document row `index` holds whole (one document a row), else None."""
        if self.pack:
            return None
        self._load(index // self.per_pass)
        return self._order[index % self.per_pass]

    def row(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, loss weights) of row `index`."""
        self._load(index // self.per_pass)
        i = index % self.per_pass
        if self.pack:
            span = slice(i * self.seq_len, (i + 1) * self.seq_len)
            return self._ids[span], self._weights[span]
        return self.docs.row(self._order[i])


def eval_rows(docs: Documents, seq_len: int, pack: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """Rows that predict every token of the documents once, in order: packed rows overlapping by one token (a
    row's first token is context only), or one document a row."""
    if not pack:
        return [docs.row(d) for d in range(len(docs.ids))]
    ids, weights = np.concatenate(docs.ids), np.concatenate(docs.weights)
    stride = seq_len - 1
    return [(ids[s : s + seq_len], weights[s : s + seq_len]) for s in range(0, len(ids) - 1, stride)]


def collate(rows: Sequence[tuple[np.ndarray, np.ndarray]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows right-padded to the longest with `pad_id`: (ids [B, T], loss weights [B, T] float32); the loss never
    counts a pad."""
    width = max(len(i) for i, _ in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    weights = np.zeros((len(rows), width), dtype=np.float32)
    for r, (i, w) in enumerate(rows):
        ids[r, : len(i)], weights[r, : len(i)] = i, w
    return ids, weights
