"""GPT-2 byte-pair tokenizer (tiktoken), with left-padded batch encoding for the policy.

RookWorld-LM was pretrained on `[50256] + encode_ordinary(text)` documents packed together, so
`<|endoftext|>` (50256) is both the separator the model emits after a completion and the pad token here.
Prompts are encoded as ordinary text: a prompt that happens to contain "<|endoftext|>" gets no special token.

The vocabulary comes from, in order: the model's own directory (`vocab.json` + `merges.txt`, as every hub download
of GPT-2 or RookWorld-LM and every checkpoint of ours has them: a model is never read with another vocabulary, and
ROOKWORLD_TIKTOKEN_FILE set beside them is ignored with a warning); the gpt2.tiktoken file named by
ROOKWORLD_TIKTOKEN_FILE; the copy of gpt2.tiktoken shipped inside the package. A model's vocabulary is checked
against its embedding's rows when it loads (`model_tokenizer`). tiktoken's own cache or download is never
asked: it holds the same bytes (the shipped copy is checked against their hash), and offline a download attempt
costs a network timeout before it fails.

The chess vocabulary (`chess_tokenizer`, for fresh models) is GPT-2's BPE restricted to the 4,363 tokens made only
of the characters P: and A: text uses (`CHESS_ALPHABET`), ranked as in GPT-2, then `<|endoftext|>`: 4,364 ids.
BPE builds every token from merges of smaller tokens of the same characters, so it splits any text of that
alphabet into exactly GPT-2's token strings; a model's head shrinks from 50,257 rows to 4,364. Its directory
holds its own vocab.json and merges.txt, which `transformers` reads as any GPT-2 tokenizer.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import tiktoken
import torch

from rookworld.io.errors import RookworldError
from rookworld.io.files import read_json_object, read_small

ENV_VAR = "ROOKWORLD_TIKTOKEN_FILE"
EOS_ID = 50256
PAD_ID = EOS_ID
EOS_TEXT = "<|endoftext|>"
N_VOCAB = 50257

try:
    from tiktoken_ext.openai_public import r50k_pat_str as GPT2_PATTERN
except ImportError:  # tiktoken_ext is an implementation detail; this is the same pattern
    GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


#: The characters of P: and A: text (FENs, UCI moves, evaluations, rewards, the field names) and the newline.
CHESS_ALPHABET = frozenset("ABEKMNPQR" "abcdefghknpqrw" "0123456789" ":/ -+." "\n")


class TokenizerUnavailableError(RookworldError, RuntimeError):
    """The GPT-2 vocabulary could not be loaded."""


def _encoding(ranks: dict[bytes, int], name: str = "gpt2") -> tiktoken.Encoding:
    """A byte-level BPE over GPT-2's pattern with `ranks` (0 to n - 1) and `<|endoftext|>` as id n."""
    return tiktoken.Encoding(name=name, pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOS_TEXT: len(ranks)}, explicit_n_vocab=len(ranks) + 1)


def chess_ranks(gpt2_ranks: dict[bytes, int]) -> dict[bytes, int]:
    """GPT-2's tokens made only of `CHESS_ALPHABET`, renumbered 0 to n - 1 in GPT-2's rank order."""
    chars = {c.encode() for c in CHESS_ALPHABET}
    kept = sorted((rank, token) for token, rank in gpt2_ranks.items() if all(bytes([b]) in chars for b in token))
    return {token: i for i, (_, token) in enumerate(kept)}


def load_encoding(path: str | os.PathLike | None = None, model_dir: str | os.PathLike | None = None
                  ) -> tiktoken.Encoding:
    """The GPT-2 encoding: from the gpt2.tiktoken file `path`, else `model_dir`'s vocab.json and merges.txt, else
    from $ROOKWORLD_TIKTOKEN_FILE, else from the copy shipped with the package."""
    return _load(path, model_dir)[0]


def _load(path: str | os.PathLike | None, model_dir: str | os.PathLike | None) -> tuple[tiktoken.Encoding, str]:
    """`load_encoding`'s encoding, and where it was read, in words."""
    named = os.environ.get(ENV_VAR) or None
    if path is None and model_dir is not None and has_own_vocabulary(Path(model_dir)):
        if named is not None:
            print(f"warning: {ENV_VAR}={named} ignored: {model_dir} has its own vocabulary (vocab.json, merges.txt), "
                  f"which its model is read with", file=sys.stderr, flush=True)
        ranks = read_hf_vocabulary(Path(model_dir))
        return (_encoding(ranks, name="gpt2" if len(ranks) == EOS_ID else "chess"),
                f"{Path(model_dir) / 'vocab.json'} and merges.txt")
    path = path or named
    if path is not None:
        file = Path(path).expanduser()
        if not file.is_file():
            raise TokenizerUnavailableError(f"{ENV_VAR}: {file} is not a file (expected a gpt2.tiktoken vocabulary)")
        return _encoding(_read_tiktoken_file(file)), f"{ENV_VAR}={file}" if path == named else str(file)
    if not SHIPPED_VOCABULARY.is_file():
        raise TokenizerUnavailableError(
            f"The GPT-2 vocabulary shipped with rookworld is missing ({SHIPPED_VOCABULARY}): reinstall the package, "
            f"use a model directory that has vocab.json and merges.txt, or set {ENV_VAR} to a gpt2.tiktoken file.")
    return _encoding(_read_tiktoken_file(SHIPPED_VOCABULARY, SHIPPED_SHA256)), "GPT-2's, shipped with rookworld"


def has_own_vocabulary(model_dir: Path) -> bool:
    """Whether a model directory holds its vocabulary; one of its two files alone, or one that is no regular file
    (a FIFO would never end), is an error, not GPT-2's vocabulary in its place."""
    present = [name for name in HF_FILES if (model_dir / name).exists()]
    if odd := next((name for name in present if not (model_dir / name).is_file()), None):
        raise TokenizerUnavailableError(f"{model_dir / odd} is not a regular file: copy the {odd} saved with this "
                                        f"model in its place")
    if len(present) == 1:
        absent = next(name for name in HF_FILES if name not in present)
        raise TokenizerUnavailableError(f"{model_dir} has {present[0]} but no {absent}: a vocabulary needs both; copy "
                                        f"the {absent} saved with this model beside it")
    return bool(present)


# The GPT-2 vocabulary in tiktoken's format, as tiktoken.get_encoding("gpt2") would download it (from the PyPI
# package openai-whisper 20250625, whisper/assets/gpt2.tiktoken; MIT licence, see gpt2.tiktoken.LICENSE).
SHIPPED_VOCABULARY = Path(__file__).with_name("gpt2.tiktoken")
SHIPPED_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


def _read_tiktoken_file(file: Path, sha256: str | None = None) -> dict[bytes, int]:
    try:
        data = read_small(file, VOCABULARY_BYTES)
    except (OSError, ValueError) as e:
        raise TokenizerUnavailableError(f"{file} cannot be read as a gpt2.tiktoken vocabulary: {e}") from None
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is not None and digest != sha256:
        raise TokenizerUnavailableError(f"{file} is damaged (sha256 {digest}, expected {sha256}): reinstall rookworld")
    # Parsed here rather than by tiktoken.load, which would also write a copy of a local file into its cache.
    try:
        ranks = {base64.b64decode(token, validate=True): int(rank)
                 for token, rank in (line.split() for line in data.splitlines() if line)}
    except ValueError as e:  # also binascii.Error, and lines that are not two fields
        raise TokenizerUnavailableError(f"{file} cannot be read as a gpt2.tiktoken vocabulary: {e}") from None
    if len(ranks) != EOS_ID or sorted(ranks.values()) != list(range(EOS_ID)):
        raise TokenizerUnavailableError(f"{file} has {len(ranks)} ranks, GPT-2 has {EOS_ID} (0 to {EOS_ID - 1}): "
                                        "not gpt2.tiktoken")
    return ranks


# ----------------------------------------------------------------------------------------------------------
# The Hugging Face files: vocab.json (token -> id, bytes spelt with GPT-2's printable alphabet) and merges.txt
# (the BPE merges in rank order). In GPT-2 a token's id is its BPE rank, so the two say the same thing twice.

HF_FILES = ("vocab.json", "merges.txt")
#: The largest vocabulary file read (GPT-2's vocab.json is 1 MB, its merges.txt 0.5 MB, gpt2.tiktoken 1.6 MB).
VOCABULARY_BYTES = 16 << 20


@functools.lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (printable ASCII and Latin-1 stand for themselves)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)]
    alphabet, extra = {}, 0
    for b in range(256):
        if b in printable:
            alphabet[b] = chr(b)
        else:
            alphabet[b] = chr(256 + extra)
            extra += 1
    return alphabet


def read_hf_vocabulary(directory: Path) -> dict[bytes, int]:
    """BPE ranks from a directory's vocab.json and merges.txt, checked to be a byte-level BPE of GPT-2's kind:
    ids 0 to n - 1 for the tokens, single bytes first, each later token the merge of its line in merges.txt, and
    `<|endoftext|>` as id n (GPT-2's own vocabulary, or a restriction of it such as the chess vocabulary)."""
    decode = {c: b for b, c in _byte_alphabet().items()}
    where = f"{directory}: vocab.json and merges.txt"
    # Each file read as data (`read_small`: no pipe, no more than a vocabulary holds), a byte order mark read past.
    file = directory / "vocab.json"
    try:
        vocab = read_json_object(file, VOCABULARY_BYTES)
        file = directory / "merges.txt"
        merges_text = read_small(file, VOCABULARY_BYTES).decode("utf-8-sig")
    except (OSError, ValueError) as e:
        raise TokenizerUnavailableError(f"{file} cannot be read as a GPT-2 vocabulary's: {e}") from None
    merges = [line for line in merges_text.splitlines() if line and not line.startswith("#version")]
    try:
        ranks = {bytes(decode[c] for c in token): int(i) for token, i in vocab.items() if token != EOS_TEXT}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise TokenizerUnavailableError(f"{where} cannot be read as a GPT-2 vocabulary: {e}") from None
    n, singles = len(ranks), sum(len(token) == 1 for token in ranks)
    if (sorted(ranks.values()) != list(range(n)) or vocab.get(EOS_TEXT) != n or len(merges) != n - singles
            or any(len(token) != 1 for token, rank in ranks.items() if rank < singles)):
        raise TokenizerUnavailableError(f"{where} are not a GPT-2 vocabulary ({n} tokens of which {singles} single "
                                        f"bytes, {len(merges)} merges, <|endoftext|> at {vocab.get(EOS_TEXT)}; "
                                        f"GPT-2 has {EOS_ID} tokens, 256 bytes, {EOS_ID - 256} merges, 50256)")
    for rank, line in enumerate(merges, start=singles):
        left, _, right = line.partition(" ")
        if ranks.get(bytes(decode.get(c, 0) for c in left + right)) != rank:
            raise TokenizerUnavailableError(f"{where}: merge {rank - singles + 1} ({line!r}) does not make token "
                                            f"{rank}")
    return ranks


def _merge_of(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The pair BPE merged into `token`: byte-level BPE of its bytes with the merges ranked below it."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best = min(((r, i) for i in range(len(parts) - 1)
                    if (r := ranks.get(parts[i] + parts[i + 1])) is not None and r < rank), default=None)
        if best is None:
            break
        i = best[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    if len(parts) != 2:
        raise ValueError(f"token {rank} ({token!r}) is no merge of two lower-ranked tokens")
    return parts[0], parts[1]


def hf_vocabulary_files(encoding: tiktoken.Encoding) -> dict[str, str]:
    """The text of vocab.json and merges.txt for an encoding of `_encoding`'s kind."""
    alphabet = _byte_alphabet()
    spell = lambda b: "".join(alphabet[x] for x in b)  # noqa: E731
    eos = encoding.eot_token
    by_rank = [encoding.decode_single_token_bytes(i) for i in range(eos)]
    ranks = {b: i for i, b in enumerate(by_rank)}
    vocab = {spell(b): i for i, b in enumerate(by_rank)}
    vocab[EOS_TEXT] = eos
    singles = sum(len(b) == 1 for b in by_rank)
    merges = ["#version: 0.2"] + [" ".join(map(spell, _merge_of(by_rank[r], r, ranks))) for r in range(singles, eos)]
    return {"vocab.json": json.dumps(vocab, ensure_ascii=False), "merges.txt": "\n".join(merges) + "\n"}


class PaddedBatch(NamedTuple):
    input_ids: torch.Tensor  # [B, T] long, left-padded with PAD_ID
    attention_mask: torch.Tensor  # [B, T] bool, True on real tokens


def pad_left(
    sequences: Sequence[Sequence[int]],
    *,
    pad_id: int = PAD_ID,
    length: int | None = None,
    device: torch.device | str | None = None,
) -> PaddedBatch:
    """Left-pad token lists to one width, so every prompt ends at the same column and decoding can write the
    next token of all rows at one cache position."""
    if len(sequences) == 0:
        raise ValueError("empty batch")
    longest = max(len(s) for s in sequences)
    width = longest if length is None else length
    if width < longest:
        raise ValueError(f"length {length} is shorter than the longest sequence ({longest} tokens)")
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.bool)
    for row, seq in enumerate(sequences):
        if len(seq):
            ids[row, width - len(seq) :] = torch.as_tensor(seq, dtype=torch.long)
            mask[row, width - len(seq) :] = True
    return PaddedBatch(ids.to(device), mask.to(device))


class OutsideVocabularyError(ValueError):
    """Text with characters a restricted vocabulary (the chess vocabulary) has no token for."""


class Tokenizer:
    """A tiktoken encoding of GPT-2's kind with the conventions of the policy: EOS = pad = `<|endoftext|>` (50256 in
    GPT-2's vocabulary, the last id in a restricted one), left padding."""

    def __init__(self, encoding: tiktoken.Encoding | None = None, source: str | None = None) -> None:
        """`source` says where the vocabulary was read, for messages."""
        if encoding is None:
            encoding, source = _load(None, None)
        self.encoding, self.source = encoding, source or encoding.name
        self.eos_id = self.pad_id = self.encoding.eot_token
        # Single bytes rank first in a byte-level BPE (read_hf_vocabulary checks it), so the first 256 ids hold them.
        first = [self.encoding.decode_single_token_bytes(i) for i in range(min(256, self.eos_id))]
        chars = {t.decode("latin-1") for t in first if len(t) == 1}
        # A vocabulary without every byte cannot spell every text: what it cannot is an error, not a crash.
        self.alphabet: frozenset[str] | None = frozenset(chars) if len(chars) < 256 else None
        self._hf_files: dict[str, str] | None = None

    def check(self, text: str) -> None:
        """Raises OutsideVocabularyError if `text` has a character the vocabulary cannot spell."""
        if self.alphabet is None or set(text) <= self.alphabet:
            return
        bad = next(i for i, c in enumerate(text) if c not in self.alphabet)
        raise OutsideVocabularyError(
            f"{text[bad]!r} (column {bad + 1} of {text[:60]!r}{'...' if len(text) > 60 else ''}) is not in this "
            f"model's vocabulary, which spells only P: and A: text: {''.join(sorted(self.alphabet))!r}")

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Writes vocab.json and merges.txt, so that the directory of a checkpoint loads offline, by us and by
        transformers' GPT-2 tokenizers."""
        if self._hf_files is None:
            self._hf_files = hf_vocabulary_files(self.encoding)
        for name, text in self._hf_files.items():
            (Path(directory) / name).write_text(text, encoding="utf-8")

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    def encode(self, text: str, *, bos: bool = False) -> list[int]:
        """Token ids of `text`. bos=True prepends EOS, as every pretraining document started with it."""
        self.check(text)
        ids = self.encoding.encode_ordinary(text)
        return [self.eos_id, *ids] if bos else ids

    def encode_batch(
        self,
        texts: Sequence[str],
        *,
        bos: bool = False,
        length: int | None = None,
        device: torch.device | str | None = None,
    ) -> PaddedBatch:
        """Encode and left-pad: (input_ids [B, T], attention_mask [B, T] bool)."""
        texts = list(texts)
        for text in texts:
            self.check(text)
        ids = self.encoding.encode_ordinary_batch(texts)
        if bos:
            ids = [[self.eos_id, *row] for row in ids]
        return pad_left(ids, pad_id=self.pad_id, length=length, device=device)

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        """Exact inverse of `encode` (EOS, if present, is rendered as <|endoftext|>)."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self.encoding.decode(list(ids))

    def decode_completion(self, ids: Iterable[int] | torch.Tensor) -> str:
        """Text of a generated completion: everything before the first EOS."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        ids = list(ids)
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return self.encoding.decode(ids)

    def decode_batch(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> list[str]:
        """Completions [B, N] (with their mask) to texts, each cut at its first EOS."""
        rows = tokens.tolist()
        if mask is not None:
            rows = [[t for t, m in zip(row, mrow) if m] for row, mrow in zip(rows, mask.tolist())]
        return [self.decode_completion(row) for row in rows]


@functools.lru_cache(maxsize=1)
def chess_tokenizer() -> Tokenizer:
    """The chess vocabulary (module docstring), made once from the GPT-2 vocabulary shipped with the package."""
    return Tokenizer(_encoding(chess_ranks(_read_tiktoken_file(SHIPPED_VOCABULARY, SHIPPED_SHA256)), name="chess"))


def vocabulary(name: str) -> Tokenizer:
    """A fresh model's tokenizer by the name `--vocabulary` gives: gpt2 or chess."""
    if name not in ("gpt2", "chess"):
        raise ValueError(f"unknown vocabulary {name!r}: gpt2 or chess")
    return chess_tokenizer() if name == "chess" else get_tokenizer()


def get_tokenizer(model_dir: str | os.PathLike | None = None) -> Tokenizer:
    """The shared Tokenizer of a model directory (see `load_encoding`), read once per process and directory."""
    return _tokenizer(None if model_dir is None else str(model_dir))


@functools.lru_cache(maxsize=8)
def _tokenizer(model_dir: str | None) -> Tokenizer:
    return Tokenizer(*_load(None, model_dir))


def model_tokenizer(model_dir: str | os.PathLike, rows: int) -> Tokenizer:
    """`get_tokenizer(model_dir)` for a model whose embedding has `rows` rows (its config's vocab_size), refused
    unless it has as many tokens: another model's vocabulary turns the model's ids into other text, or into ids no
    token has (an error mid-answer, an engine that plays nothing)."""
    tokenizer = get_tokenizer(model_dir)
    if tokenizer.vocab_size != rows:
        fix = ("they are not one model's: put the vocab.json and merges.txt saved with these weights in it"
               if has_own_vocabulary(Path(model_dir)) else
               "it has no vocab.json and merges.txt of its own: put those saved with these weights in it")
        raise TokenizerUnavailableError(f"{model_dir}: its vocabulary ({tokenizer.source}) has "
                                        f"{tokenizer.vocab_size:,} tokens and its weights' embedding {rows:,} rows "
                                        f"(config.json's vocab_size); {fix}")
    return tokenizer
