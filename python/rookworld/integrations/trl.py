"""rookworld's chess for TRL's GRPOTrainer (`pip install 'rookworld[trl]'`): its rewards as reward functions, its
positions as a dataset, and TRL's trainer made to score a GPT-2 where it sampled it.

    from rookworld.integrations.trl import GRPOTrainer, chess_dataset, load_tokenizer, reward_funcs

    trainer = GRPOTrainer(model="models/chess-cpu-sft", reward_funcs=reward_funcs(),
                          processing_class=load_tokenizer("models/chess-cpu-sft"),
                          train_dataset=chess_dataset(count=10_000), args=GRPOConfig(output_dir=..., ...))

The reward functions are coroutines, so TRL awaits them beside its other reward functions; they score each batch
at once in Rust, P: prompts against the dataset's own analyses or a Stockfish pool (close them after training).

Why a GRPOTrainer of our own: GPT-2 adds a learned embedding of each token's absolute position. TRL
left-pads a batch's prompts; transformers' `generate` gives each row's first real token position 0 (position ids
from the attention mask), but TRL's log-prob forwards (the policy's and the reference's) pass no position ids, and
transformers' GPT-2 then numbers every column from 0, pads included. A prompt padded by k tokens was sampled at
positions 0, 1, ... and scored and trained at k, k+1, ...: on the shipped chess model, with P: prompts padded by up
to 66 tokens beside A: prompts, the sampled tokens' log-probs came out up to 22 nats off those they were sampled
with (2.2 lower on average), and TRL's KL ran away within a few steps. Models with rotary positions
(Llama, Qwen) do not see the shift; GPT-2's do.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import types
from collections.abc import Sequence
from pathlib import Path

import torch
import transformers
import trl
from datasets import Dataset

from rookworld.chess.data import Record, read_records
from rookworld.integrations.chess_reward import AsyncChessReward, chess_rows
from rookworld.integrations.tasks import positions_file
from rookworld.net.tokenizer import TokenizerUnavailableError, has_own_vocabulary
from rookworld.settings.hub import is_local_path

__all__ = ["GRPOTrainer", "chess_dataset", "load_tokenizer", "mask_positions", "reward_funcs"]


def reward_funcs(task: str = "mixed", **stockfish) -> list[AsyncChessReward]:
    """TRL's `reward_funcs`: one reward for `task` ("mixed", "policy" or "env"); `stockfish` as `ChessReward`
    takes it (`stockfish_depth=10`, `stockfish_workers`, `stockfish_cache`, `stockfish_path`)."""
    return [AsyncChessReward(task, **stockfish)]


def chess_dataset(source: str | Sequence[Record] | None = None, *, count: int | None = None, seed: int = 0,
                  task_mix: float = 0.8, document_start: bool = True) -> Dataset:
    """A plain-text GRPO dataset: a `prompt` column and the columns the reward reads (`task`, `fen`,
    `truth_moves`, `truth_evals`). `source` is a positions file (`rookworld positions --out`, annotated or not),
    records, or None for `count` generated positions of `seed`."""
    if source is None or isinstance(source, (str, bytes, os.PathLike)):
        records = source if source is None else read_records(positions_file(source))[0]
    elif isinstance(source, Sequence) and all(isinstance(r, Record) for r in source):
        records = source
    else:
        raise TypeError(f"source must be a positions file's path, a sequence of Records or None, not "
                        f"{type(source).__name__}")
    rows = chess_rows(records, count=count, seed=seed, task_mix=task_mix, document_start=document_start)
    return Dataset.from_list(rows)


def load_tokenizer(model: str | Path) -> transformers.GPT2TokenizerFast:
    """transformers' tokenizer of a rookworld model directory (its vocab.json and merges.txt), as TRL needs it:
    prompts padded on the left, with `<|endoftext|>` as the pad token. The vocabulary has no other token to spare,
    and none is needed: TRL builds its attention masks from the prompts' and completions' lengths, not from the pad
    id, so the `<|endoftext|>` that begins every prompt is kept (and `mask_positions` numbers positions from those
    masks). A local directory without vocab.json and merges.txt is refused (transformers gave a tokenizer of 0
    tokens), as every rookworld command refuses it."""
    if is_local_path(str(model)):
        if not has_own_vocabulary(Path(model)):
            raise TokenizerUnavailableError(f"{model} has no vocab.json and merges.txt: give the model directory "
                                            f"rookworld saved (its vocabulary beside its weights)")
        # The two files rookworld's own loader reads, and no others: a stray tokenizer.json or tokenizer_config
        # in the directory would tokenise otherwise than every rookworld command does, without a word. (Read from
        # a folder holding those two alone: transformers' constructors take them differently from 4.x to 5.x.)
        with tempfile.TemporaryDirectory() as only:
            for name in ("vocab.json", "merges.txt"):
                shutil.copyfile(Path(model) / name, Path(only) / name)
            tokenizer = transformers.GPT2TokenizerFast.from_pretrained(only)
    else:
        tokenizer = transformers.GPT2TokenizerFast.from_pretrained(model)
    tokenizer.pad_token, tokenizer.padding_side = tokenizer.eos_token, "left"
    return tokenizer


def mask_positions(model: torch.nn.Module) -> torch.nn.Module:
    """Makes every transformers GPT-2 trunk inside `model` (a GPT2LMHeadModel, or a wrapper or PEFT model around
    one) number its positions from the attention mask when it is called without position ids, as `generate` does:
    each row's first real token at 0, whatever padding precedes it. Calls that pass position ids, or no attention
    mask, are unchanged, and so is a batch without left padding. Idempotent (a deep copy keeps it, for its own
    weights); returns `model`."""
    for module in model.modules():
        if isinstance(module, transformers.GPT2Model) and "_rookworld_unmasked_forward" not in vars(module):
            module._rookworld_unmasked_forward = module.forward
            module.forward = types.MethodType(_forward_with_mask_positions, module)
    return model


def _forward_with_mask_positions(self, *args, **kwargs):
    # transformers' GPT2LMHeadModel passes the input ids by position and the rest by name; TRL's fused head passes
    # all by name. A call that passes more by position is left as it is.
    tokens = args[0] if args else kwargs.get("input_ids")
    if tokens is None:
        tokens = kwargs.get("inputs_embeds")
    mask = kwargs.get("attention_mask")
    if len(args) <= 1 and kwargs.get("position_ids") is None and tokens is not None and mask is not None \
            and mask.dim() == 2:
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = cache.get_seq_length() if cache is not None and hasattr(cache, "get_seq_length") else 0
        if mask.shape[1] == past + tokens.shape[1]:  # the mask covers the cached tokens and these
            mask = mask.long()
            positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)  # generate's own formula
            kwargs["position_ids"] = positions[:, past:]
    return self._rookworld_unmasked_forward(*args, **kwargs)


class GRPOTrainer(trl.GRPOTrainer):
    """TRL's GRPOTrainer (same arguments) with `mask_positions` applied to its policy and its reference model, so
    that both score each completion at the positions `generate` sampled it at. Without it, a GPT-2 policy is
    trained on log-probs of other positions than it sampled, whenever a batch's prompts differ in length."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        mask_positions(self.model)
        if getattr(self, "ref_model", None) is not None:
            mask_positions(self.ref_model)
