"""GPT-2 byte-pair tokenizer (tiktoken), with left-padded batch encoding for the policy.

RookWorld-LM was pretrained on `[50256] + encode_ordinary(text)` documents packed together, so
`<|endoftext|>` (50256) is both the separator the model emits after a completion and the pad token here.
Prompts are encoded as ordinary text: a prompt that happens to contain "<|endoftext|>" gets no special token.

The vocabulary comes from, in order: the gpt2.tiktoken file named by ROOKWORLD_TIKTOKEN_FILE; the model's own
directory (`vocab.json` + `merges.txt`, as every hub download of GPT-2 or RookWorld-LM and every checkpoint of
ours has them); the copy of gpt2.tiktoken shipped inside the package. tiktoken's own cache or download is never
asked: it holds the same bytes (the shipped copy is checked against their hash), and offline a download attempt
costs a network timeout before it fails.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import tiktoken
import torch

ENV_VAR = "ROOKWORLD_TIKTOKEN_FILE"
EOS_ID = 50256
PAD_ID = EOS_ID
EOS_TEXT = "<|endoftext|>"
N_VOCAB = 50257

try:
    from tiktoken_ext.openai_public import r50k_pat_str as GPT2_PATTERN
except ImportError:  # tiktoken_ext is an implementation detail; this is the same pattern
    GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


class TokenizerUnavailableError(RuntimeError):
    """The GPT-2 vocabulary could not be loaded."""


def _encoding(ranks: dict[bytes, int]) -> tiktoken.Encoding:
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOS_TEXT: EOS_ID}, explicit_n_vocab=N_VOCAB)


def load_encoding(path: str | os.PathLike | None = None, model_dir: str | os.PathLike | None = None
                  ) -> tiktoken.Encoding:
    """The GPT-2 encoding: from the gpt2.tiktoken file `path` or $ROOKWORLD_TIKTOKEN_FILE, else from
    `model_dir`'s vocab.json and merges.txt, else from the copy shipped with the package."""
    path = path or os.environ.get(ENV_VAR) or None
    if path is not None:
        file = Path(path).expanduser()
        if not file.is_file():
            raise TokenizerUnavailableError(f"{ENV_VAR}: {file} is not a file (expected a gpt2.tiktoken vocabulary)")
        return _encoding(_read_tiktoken_file(file))
    if model_dir is not None and all((Path(model_dir) / name).is_file() for name in HF_FILES):
        return _encoding(read_hf_vocabulary(Path(model_dir)))
    if not SHIPPED_VOCABULARY.is_file():
        raise TokenizerUnavailableError(
            f"The GPT-2 vocabulary shipped with rookworld is missing ({SHIPPED_VOCABULARY}): reinstall the package, "
            f"use a model directory that has vocab.json and merges.txt, or set {ENV_VAR} to a gpt2.tiktoken file.")
    return _encoding(_read_tiktoken_file(SHIPPED_VOCABULARY, SHIPPED_SHA256))


# The GPT-2 vocabulary in tiktoken's format, as tiktoken.get_encoding("gpt2") would download it (from the PyPI
# package openai-whisper 20250625, whisper/assets/gpt2.tiktoken; MIT licence, see gpt2.tiktoken.LICENSE).
SHIPPED_VOCABULARY = Path(__file__).with_name("gpt2.tiktoken")
SHIPPED_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


def _read_tiktoken_file(file: Path, sha256: str | None = None) -> dict[bytes, int]:
    data = file.read_bytes()
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
    """BPE ranks from a directory's vocab.json and merges.txt, checked to be GPT-2's byte-level BPE."""
    decode = {c: b for b, c in _byte_alphabet().items()}
    where = f"{directory}: vocab.json and merges.txt"
    try:
        vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
        merges = [line for line in (directory / "merges.txt").read_text(encoding="utf-8").splitlines()
                  if line and not line.startswith("#version")]
        ranks = {bytes(decode[c] for c in token): int(i) for token, i in vocab.items() if token != EOS_TEXT}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise TokenizerUnavailableError(f"{where} cannot be read as GPT-2's vocabulary: {e}") from None
    if sorted(ranks.values()) != list(range(EOS_ID)) or vocab.get(EOS_TEXT) != EOS_ID or len(merges) != EOS_ID - 256:
        raise TokenizerUnavailableError(f"{where} are not GPT-2's vocabulary ({len(ranks)} tokens, "
                                        f"{len(merges)} merges; GPT-2 has {EOS_ID} and {EOS_ID - 256})")
    for rank, line in enumerate(merges, start=256):
        left, _, right = line.partition(" ")
        if ranks.get(bytes(decode.get(c, 0) for c in left + right)) != rank:
            raise TokenizerUnavailableError(f"{where}: merge {rank - 255} ({line!r}) does not make token {rank}")
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
    """The text of vocab.json and merges.txt for a GPT-2 encoding."""
    alphabet = _byte_alphabet()
    spell = lambda b: "".join(alphabet[x] for x in b)  # noqa: E731
    by_rank = [encoding.decode_single_token_bytes(i) for i in range(EOS_ID)]
    ranks = {b: i for i, b in enumerate(by_rank)}
    vocab = {spell(b): i for i, b in enumerate(by_rank)}
    vocab[EOS_TEXT] = EOS_ID
    merges = ["#version: 0.2"] + [" ".join(map(spell, _merge_of(by_rank[r], r, ranks))) for r in range(256, EOS_ID)]
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


class Tokenizer:
    """tiktoken's GPT-2 encoding with the conventions of the policy: EOS = pad = 50256, left padding."""

    eos_id: int = EOS_ID
    pad_id: int = PAD_ID

    def __init__(self, encoding: tiktoken.Encoding | None = None) -> None:
        self.encoding = encoding if encoding is not None else load_encoding()
        self._hf_files: dict[str, str] | None = None

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
        ids = self.encoding.encode_ordinary(text)
        return [EOS_ID, *ids] if bos else ids

    def encode_batch(
        self,
        texts: Sequence[str],
        *,
        bos: bool = False,
        length: int | None = None,
        device: torch.device | str | None = None,
    ) -> PaddedBatch:
        """Encode and left-pad: (input_ids [B, T], attention_mask [B, T] bool)."""
        ids = self.encoding.encode_ordinary_batch(list(texts))
        if bos:
            ids = [[EOS_ID, *row] for row in ids]
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
        if EOS_ID in ids:
            ids = ids[: ids.index(EOS_ID)]
        return self.encoding.decode(ids)

    def decode_batch(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> list[str]:
        """Completions [B, N] (with their mask) to texts, each cut at its first EOS."""
        rows = tokens.tolist()
        if mask is not None:
            rows = [[t for t, m in zip(row, mrow) if m] for row, mrow in zip(rows, mask.tolist())]
        return [self.decode_completion(row) for row in rows]


def get_tokenizer(model_dir: str | os.PathLike | None = None) -> Tokenizer:
    """The shared Tokenizer of a model directory (see `load_encoding`), read once per process and directory."""
    return _tokenizer(None if model_dir is None else str(model_dir))


@functools.lru_cache(maxsize=8)
def _tokenizer(model_dir: str | None) -> Tokenizer:
    return Tokenizer(load_encoding(model_dir=model_dir))
