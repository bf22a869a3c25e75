"""The networks of a GRPO run and how they are run: the policy (with its value head, for GAE), the frozen
reference, the device, autocast and compilation. Sampling (`Sampler`) lives here; the rollout's no-grad log-prob
passes are `rollout`'s, and the update's differentiable pass goes through `LogProbs`, which DDP wraps."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rookworld.harness.distributed import data_parallel, unwrapped
from rookworld.net.decoding import decodes_eagerly
from rookworld.net.logprobs import LogProbs, PassOptions
from rookworld.net.memo import ProductMemo
from rookworld.net.precision import autocast_copy, refresh_copy
from rookworld.net.sampling import GenerationOutput, SamplingOptions, generate
from rookworld.settings.base import Slice


#: The most memory a rollout's `ProductMemo` may hold (GPT-2 small keeps 330 KB a token: 64 rows of 32 tokens and
#: their prompts take about 0.7 GB); past it the update makes its forward products again.
PRODUCT_MEMO_BYTES = 2 << 30


@dataclass(frozen=True)
class Placement:
    """Where and how the networks run: the run's device, its autocast dtype (None: float32) and context, whether
    decoding is compiled, whether DDP wraps the trained modules."""

    device: torch.device
    amp_dtype: torch.dtype | None
    compile: bool
    ddp: bool
    autocast: Callable[[], contextlib.AbstractContextManager]


class Models:
    """The networks and how they run. `options`: the log-prob passes' (`PassOptions`: temperature, compilation,
    KL directions, and `rows_per_prompt`, consecutive rows whose prompt is computed once, in sampling and in every
    log-prob pass: a group (--group-size) with --shared-prompt, else 1)."""

    def __init__(self, policy: nn.Module, reference: nn.Module | None, value_head: nn.Module | None,
                 placement: Placement, options: PassOptions):
        # Under autocast, sampling and the frozen reference read weights stored in the compute dtype: the same
        # bits, without every decode step and every log-prob pass casting every weight again.
        amp_dtype = placement.amp_dtype
        casts = amp_dtype is not None and policy.dtype != amp_dtype
        self._sampling_copy = autocast_copy(policy, amp_dtype) if casts else None
        if casts and reference is not None:
            reference = autocast_copy(reference, amp_dtype)
        self.policy, self.reference, self.value_head = policy, reference, value_head
        # compile: decoding (the decode step, the draw); options.compile: the log-prob passes (trunk, vocabulary).
        self.device, self.amp_dtype, self.compile, self.autocast = (placement.device, amp_dtype, placement.compile,
                                                                    placement.autocast)
        #: The update's pass (DDP's wrapper of it under torchrun, which is called alike).
        self.policy_pass: LogProbs = data_parallel(LogProbs(policy, options, value_head), self.device, placement.ddp)
        #: The log-prob passes' options (the policy pass's own: one changed is changed in both), and the consecutive
        #: rows whose prompt is computed once.
        self.options, self.rows_per_prompt = options, options.rows_per_prompt

    def product_memo(self, prompts: int, prompt_width: int, rows: int, new_tokens: int,
                     prompt_left: int) -> ProductMemo | None:
        """A memo for sampling to keep the trunk's products in, for the update's first pass (`ProductMemo`), or
        None: it needs eager decoding of the policy itself (no autocast copy) on the CPU (`ProductMemo.fits`),
        shared prompts, and at most `PRODUCT_MEMO_BYTES` of memory."""
        policy = self.policy
        if (self.amp_dtype is not None or self.rows_per_prompt == 1 or not decodes_eagerly(self.device, self.compile)
                or not ProductMemo.fits(policy)):
            return None
        if ProductMemo.bytes_needed(policy.config, prompts, prompt_width, rows, new_tokens) > PRODUCT_MEMO_BYTES:
            return None
        return ProductMemo(rows, new_tokens, self.rows_per_prompt, prompt_left)

    def sampling_model(self) -> nn.Module:
        """The policy as sampling runs it (under `amp_dtype` autocast only): its autocast copy, brought up to the
        current weights, or the policy itself where nothing is cast."""
        return self.policy if self._sampling_copy is None else refresh_copy(self._sampling_copy, self.policy)

    @property
    def trained(self) -> nn.Module:
        """Every trained parameter (policy and value head), as one module."""
        return unwrapped(self.policy_pass)

    def alone(self) -> Models:
        """These networks as one rank alone runs them (auto-batch's trial steps): the trained module without the DDP
        wrapper, whose gradient all-reduce is a collective. A new object over the same modules; this one keeps
        its wrapper."""
        fresh = copy.copy(self)
        fresh.policy_pass = self.trained
        return fresh

    def close(self) -> None:
        """The DDP wrapper let go, before the process group goes (`Comm.close`)."""
        self.policy_pass = self.trained


@dataclass(frozen=True)
class SamplerSettings(Slice):
    """The settings sampling reads (`SamplerSettings.of(cfg)` from a `TrainConfig`)."""

    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float


class Sampler:
    """A rollout's completions: `group_size` for each of the left-padded prompts [n, P], consecutive rows, with the
    run's sampling settings; each prompt computed once unless `models.rows_per_prompt` is 1.

    A: prompts are about twice as wide as P: prompts and their completions about twice as long, and a batch
    decodes until its longest row is done. Decoding eagerly (the CPU), groups whose rows are done leave the batch,
    so one `generate` call takes every task: P: rows stop costing when they are done, and the rows still decoding
    share taller matrix products. Compiled (CUDA graphs, static shapes), every row would ride along to the end, in
    a KV cache sized for the longest: one call per task there, each stopping and sizing its cache on its own.

    A call returns the completions and the trunk's products of their sampling (`Models.product_memo`), or None.
    """

    def __init__(self, models: Models, cfg, eos_id: int):
        cfg = SamplerSettings.of(cfg)
        self.models = models
        #: `generate`'s options beside the prompts and the generator (eos_id: the tokenizer's).
        self.options = SamplingOptions(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                       top_k=cfg.top_k or None, top_p=cfg.top_p if cfg.top_p < 1.0 else None,
                                       eos_id=eos_id, compile=models.compile, dtype=models.amp_dtype)

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, tasks: np.ndarray, group_size: int,
                 generator: torch.Generator) -> tuple[GenerationOutput, ProductMemo | None]:
        P, n, G = ids.shape[1], ids.shape[0] * group_size, group_size
        model, device = self.models.sampling_model(), self.models.device
        prompt_lens, once = mask.sum(1).cpu().numpy(), self.models.rows_per_prompt > 1
        together = decodes_eagerly(device, self.options.compile)
        # Tasks in first-seen order: fixed for a step, so seeded runs repeat exactly.
        batches = [np.arange(len(tasks))] if together else [np.flatnonzero(tasks == t) for t in dict.fromkeys(tasks)]
        parts, kept = [], None
        for prompts in batches:
            index, left = torch.from_numpy(prompts).to(device), P - int(prompt_lens[prompts].max())
            batch_ids, batch_mask, batch_tasks = ids[index, left:], mask[index, left:], tasks[prompts]
            if not once:  # every row's prompt computed: the prompts repeated, the rows in the same order
                batch_ids, batch_mask = batch_ids.repeat_interleave(G, 0), batch_mask.repeat_interleave(G, 0)
                batch_tasks = batch_tasks.repeat(G)
            # One batch of every prompt in order: its rows are the rollout's, and its products can be kept.
            memo = self.models.product_memo(len(prompts), P - left, n, self.options.max_new_tokens, left) \
                if together and model is self.models.policy else None
            out = self.generate(model, batch_ids, batch_mask, batch_tasks, generator, G if once else 1, memo)
            kept = memo
            parts.append(((index[:, None] * G + torch.arange(G, device=device)).reshape(-1), out))
        width = max((o.tokens.shape[1] for _, o in parts), default=0)
        out = GenerationOutput(tokens=torch.full((n, width), self.options.eos_id, dtype=torch.long, device=device),
                               mask=torch.zeros((n, width), dtype=torch.bool, device=device),
                               logprobs=torch.zeros((n, width), device=device),
                               lengths=torch.zeros(n, dtype=torch.long, device=device),
                               stopped=torch.zeros(n, dtype=torch.bool, device=device))
        for rows, o in parts:
            w = o.tokens.shape[1]
            out.tokens[rows, :w], out.mask[rows, :w], out.logprobs[rows, :w] = o.tokens, o.mask, o.logprobs
            out.lengths[rows], out.stopped[rows] = o.lengths, o.stopped
        return out, kept

    def generate(self, model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, tasks: np.ndarray,
                 generator: torch.Generator, rows_per_prompt: int, memo: ProductMemo | None = None
                 ) -> GenerationOutput:
        """The completions of these prompts (`tasks`: each one's task: a subclass may sample each task its own
        way), `rows_per_prompt` each; `memo` keeps the trunk's products."""
        return generate(model, ids, mask, self.options, generator=generator, rows_per_prompt=rows_per_prompt,
                        memo=memo)
