"""GPT-2 byte-pair tokenizer (tiktoken), with left-padded batch encoding for the policy.

RookWorld-LM was pretrained on `[50256] + encode_ordinary(text)` documents packed together, so
`<|endoftext|>` (50256) is both the separator the model emits after a completion and the pad token here.
Prompts are encoded as ordinary text: a prompt that happens to contain "<|endoftext|>" gets no special token.

The vocabulary comes from the file named by ROOKWORLD_TIKTOKEN_FILE when that is set (machines without network
access, tests, CI), else from tiktoken's own cache or download (`tiktoken.get_encoding("gpt2")`).
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import tiktoken
import tiktoken.load
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


def load_encoding(path: str | os.PathLike | None = None) -> tiktoken.Encoding:
    """The GPT-2 encoding, from `path`, else from $ROOKWORLD_TIKTOKEN_FILE, else from tiktoken itself."""
    path = path or os.environ.get(ENV_VAR) or None
    if path is not None:
        file = Path(path).expanduser()
        if not file.is_file():
            raise TokenizerUnavailableError(f"{ENV_VAR}: {file} is not a file (expected a gpt2.tiktoken vocabulary)")
        # load_tiktoken_bpe keeps a copy in tiktoken's cache keyed by the path; passing the content hash makes
        # it notice when the file at that path has changed instead of serving the stale copy.
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        ranks = tiktoken.load.load_tiktoken_bpe(str(file), expected_hash=digest)
        if len(ranks) != EOS_ID:
            raise TokenizerUnavailableError(f"{file} has {len(ranks)} ranks, GPT-2 has {EOS_ID}: not gpt2.tiktoken")
        return tiktoken.Encoding(
            name="gpt2",
            pat_str=GPT2_PATTERN,
            mergeable_ranks=ranks,
            special_tokens={EOS_TEXT: EOS_ID},
            explicit_n_vocab=N_VOCAB,
        )
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # tiktoken raises whatever its HTTP client raises when offline
        raise TokenizerUnavailableError(
            "Cannot load the GPT-2 vocabulary: tiktoken has no cached copy and could not download it "
            f"({type(e).__name__}: {e}). Set {ENV_VAR} to the path of a gpt2.tiktoken file "
            "(for example ../shared/data/gpt2.tiktoken, or whisper/assets/gpt2.tiktoken from openai-whisper)."
        ) from e


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


@functools.lru_cache(maxsize=1)
def get_tokenizer() -> Tokenizer:
    """The shared Tokenizer (the vocabulary is read once per process; ROOKWORLD_TIKTOKEN_FILE is read then)."""
    return Tokenizer()
