"""A trained model put to use: load it, ask it for P: and A: answers, read the answers back.

    from rookworld.lm.answers import RookWorldLM
    lm = RookWorldLM.load("runs/sft")                 # a model directory, a run directory or a hub repo id
    lm.policy(["<fen>"])[0].best                      # the model's best move
    lm.env(["<fen>"], ["e2e4"])[0].fen                # the position it says the move leads to

Decoding follows a named `Decoding` protocol, so that a figure is never compared across protocols by accident:
`greedy` (the default) or `rookworld` (temperature 0.6, top-k 5, as RookWorld's own evaluation scripts sample).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from rookworld import _core
from rookworld.chess import rules
from rookworld.io.progress import Progress
from rookworld.chess.rewards import policy_prompt
from rookworld.net.device import resolve_device
from rookworld.net.limits import ContextTooLong
from rookworld.net.logprobs import PassOptions, token_logprobs
from rookworld.net.pretrained import from_pretrained, model_directory
from rookworld.net.sampling import SamplingOptions, generate
from rookworld.net.sources import model_source
from rookworld.net.tokenizer import Tokenizer, get_tokenizer

#: New tokens per completion: every P: and A: answer of the data fits.
MAX_NEW_TOKENS = 144


@dataclass(frozen=True)
class Decoding:
    """How completions are drawn: `temperature` 0 is greedy; `top_k` restricts sampling to the k likeliest."""

    name: str
    temperature: float = 0.0
    top_k: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def describe(self) -> str:
        return "greedy" if self.greedy else f"{self.name} (temperature {self.temperature:g}, top-k {self.top_k})"


GREEDY = Decoding("greedy")
#: RookWorld's accuracy scripts sample at temperature 0.6 with top-k 5 by default.
ROOKWORLD = Decoding("rookworld", temperature=0.6, top_k=5)
PROTOCOLS = {d.name: d for d in (GREEDY, ROOKWORLD)}


@torch.no_grad()
def complete(model, tokenizer: Tokenizer, prompts: Sequence[str], *, decoding: Decoding = GREEDY, seed: int = 0,
             batch_size: int = 64, max_new_tokens: int = MAX_NEW_TOKENS, compile: bool | None = None,
             progress: Progress | None = None) -> list[str]:
    """Completions of `prompts`, batched; prompts start with EOS as the pretraining documents did. Sampled
    protocols are reproducible for a seed (batch i draws from seed + i). `progress` advances per batch."""
    out: list[str] = []
    for b, i in enumerate(range(0, len(prompts), batch_size)):
        ids, mask = tokenizer.encode_batch(prompts[i : i + batch_size], bos=True, device=model.device)
        options = SamplingOptions(max_new_tokens=max_new_tokens, temperature=decoding.temperature, top_k=decoding.top_k,
                                  compile=compile, eos_id=tokenizer.eos_id)
        gen = generate(model, ids, mask, options, seed=None if decoding.greedy else seed + b)
        out.extend(tokenizer.decode_batch(gen.tokens, gen.mask))
        if progress is not None:
            progress.update(len(ids))
    return out


@dataclass(frozen=True)
class PolicyAnswer:
    """A P: completion read back. `best` is None when the M:/E:/B: structure is missing; an eval that is not a
    number is None."""

    text: str
    moves: tuple[str, ...] = ()
    evals: tuple[float | None, ...] = ()
    best: str | None = None

    @property
    def well_formed(self) -> bool:
        return self.best is not None


@dataclass(frozen=True)
class EnvAnswer:
    """An A: completion read back: `{fen}+{reward}+{terminated}+{truncated}`; a field that cannot be read is None."""

    text: str
    fen: str | None = None
    reward: float | None = None
    terminated: bool | None = None
    truncated: bool | None = None

    @property
    def well_formed(self) -> bool:
        return self.fen is not None


def read_policy_answers(completions: Sequence[str]) -> list[PolicyAnswer]:
    """P: completions read as the reward scorer reads them (the Rust core's parser)."""
    out = []
    for text, parsed in zip(completions, _core.parse_policy_answers(list(completions))):
        if parsed is None:
            out.append(PolicyAnswer(text))
        else:
            moves, evals, best = parsed
            out.append(PolicyAnswer(text, tuple(moves), tuple(evals), best))
    return out


def read_env_answers(completions: Sequence[str]) -> list[EnvAnswer]:
    """A: completions read as the reward scorer reads them."""
    out = []
    for text, parsed in zip(completions, _core.parse_env_answers(list(completions))):
        out.append(EnvAnswer(text) if parsed is None else EnvAnswer(text, *parsed))
    return out


class RookWorldLM:
    """A model with its tokenizer, answering the P: and A: tasks in batches."""

    def __init__(self, model, tokenizer: Tokenizer, *, directory: Path | None = None, batch_size: int = 64,
                 max_new_tokens: int = MAX_NEW_TOKENS, compile: bool | None = None):
        self.model, self.tokenizer, self.directory = model, tokenizer, directory
        self.batch_size, self.max_new_tokens, self.compile = batch_size, max_new_tokens, compile

    @classmethod
    def load(cls, name: str = "jrahn/RookWorld-LM-124M", *, revision: str | None = None,
             device: str | torch.device = "auto", **kwargs) -> RookWorldLM:
        """A hub repo id, a model directory, or a training run's directory (its latest model); `device` as
        --device takes it (auto: CUDA when there is one)."""
        directory = model_directory(model_source(name), revision)
        model = from_pretrained(directory, device=resolve_device(str(device)))
        model.eval()
        return cls(model, get_tokenizer(directory), directory=directory, **kwargs)

    def complete(self, prompts: Sequence[str], *, decoding: Decoding = GREEDY, seed: int = 0,
                 progress: Progress | None = None) -> list[str]:
        return complete(self.model, self.tokenizer, prompts, decoding=decoding, seed=seed,
                        batch_size=self.batch_size, max_new_tokens=self.max_new_tokens, compile=self.compile,
                        progress=progress)

    def policy(self, fens: Sequence[str], *, decoding: Decoding = GREEDY, seed: int = 0,
               progress: Progress | None = None) -> list[PolicyAnswer]:
        """The model's P: answer (candidates, evals, best move) for each position."""
        prompts = [policy_prompt(f) for f in fens]
        return read_policy_answers(self.complete(prompts, decoding=decoding, seed=seed, progress=progress))

    @torch.no_grad()
    def continuation_logprobs(self, context: str, continuations: Sequence[str]) -> list[float]:
        """log p(continuation | context) of each continuation, summed over its tokens: the context (EOS first, as
        `complete` prompts) goes through the model once and every continuation attends to it. ContextTooLong when
        the context and the longest continuation do not fit the model's context."""
        prefix = self.tokenizer.encode(context, bos=True)
        tails = [self.tokenizer.encode(text) for text in continuations]
        if not tails:
            return []
        P, width = len(prefix), max(1, max(len(t) for t in tails))
        limit = self.model.config.block_size
        if P + width > limit:
            raise ContextTooLong(f"{P} tokens of context and {width} of continuation exceed the model's context "
                                 f"of {limit}")
        ids = torch.full((len(tails), P + width), self.tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids, dtype=torch.bool)
        ids[:, :P], mask[:, :P] = torch.tensor(prefix), True
        for row, tail in enumerate(tails):
            ids[row, P : P + len(tail)] = torch.tensor(tail, dtype=torch.long)
            mask[row, P : P + len(tail)] = True
        ids, mask = ids.to(self.model.device), mask.to(self.model.device)
        wanted = mask[:, P:]
        # Rows share their context columns: one pass over it for all of them (rows_per_prompt).
        options = PassOptions(start=P, rows_per_prompt=len(tails))
        lp = token_logprobs(self.model, ids, mask, options, wanted=wanted).logprobs
        return (lp * wanted).sum(1).tolist()

    def env(self, fens: Sequence[str], moves: Sequence[str], histories: Sequence[Sequence[str]] | None = None, *,
            decoding: Decoding = GREEDY, seed: int = 0) -> list[EnvAnswer]:
        """The model's A: answer for playing each move in its position after its history (oldest first)."""
        histories = histories if histories is not None else [()] * len(fens)
        prompts = rules.env_prompts(fens, moves, histories)
        return read_env_answers(self.complete(prompts, decoding=decoding, seed=seed))
