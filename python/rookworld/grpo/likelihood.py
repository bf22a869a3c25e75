"""The likelihood of A:'s exact targets beside GRPO's loss (--a-likelihood-weight). The rules give every A:
prompt's next state for free, so a run can hold the world model with SFT's own loss on it while the reward moves
the policy: InstructGPT's PPO-ptx, with the rules as its data instead of the pretraining text. The KL leash pulls
toward the reference's habits; this pulls toward the truth.

Each optimizer step adds, for the A: prompts of its minibatch, weight x their targets' mean NLL per token (target
and EOS, at temperature 1, as SFT counts it) to GRPO's loss, in one pass of its own before the GRPO micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rookworld.chess import rules
from rookworld.grpo.models import Models
from rookworld.grpo.prompts import Prompt
from rookworld.harness.distributed import Comm
from rookworld.net.head import NLL
from rookworld.net.logprobs import PassOptions, token_logprobs


@dataclass(frozen=True)
class EnvTargets:
    """A rollout's A: prompts with their exact targets, one row each: the prompt left-padded to `prompt_width` as
    the rollout's, then the target's tokens and EOS, right-padded."""

    ids: torch.Tensor  # [a, P + T]
    mask: torch.Tensor  # [a, P + T] bool
    prompt_width: int  # P
    groups: np.ndarray  # [a] each row's prompt: its index in the rollout's prompts

    @property
    def target_mask(self) -> torch.Tensor:
        """[a, T] the target tokens the NLL counts (EOS included)."""
        return self.mask[:, self.prompt_width:]


def env_targets(prompts: list[Prompt], tokenizer, max_new_tokens: int, device: torch.device) -> EnvTargets | None:
    """The A: prompts of `prompts` with their targets (None: there are none), each target cut to `max_new_tokens`
    tokens, what a completion may hold: its likelihood is of what the policy could have written."""
    groups = np.array([i for i, p in enumerate(prompts) if p.task == "A"], dtype=np.int64)
    if len(groups) == 0:
        return None
    texts = [prompts[i].text for i in groups]
    ids, pmask = tokenizer.encode_batch(texts, bos=True, device=device)
    targets = [[*t, tokenizer.eos_id][:max_new_tokens]
               for t in tokenizer.encoding.encode_ordinary_batch(rules.env_targets(texts))]
    width = max(len(t) for t in targets)
    tids = torch.full((len(targets), width), tokenizer.pad_id, dtype=ids.dtype)
    tmask = torch.zeros((len(targets), width), dtype=torch.bool)
    for row, t in enumerate(targets):
        tids[row, : len(t)] = torch.tensor(t, dtype=ids.dtype)
        tmask[row, : len(t)] = True
    return EnvTargets(torch.cat([ids, tids.to(device)], 1), torch.cat([pmask, tmask.to(device)], 1), ids.shape[1],
                      groups)


def likelihood_backward(models: Models, targets: EnvTargets | None, groups: np.ndarray, weight: float, comm: Comm,
                        micro_batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of `weight` x the mean NLL per token of the targets of the A: prompts among `groups` (a minibatch's
    prompts), the mean over every rank's target tokens; returns the NLL's sum and its token count (detached).

    It runs through the policy itself, not DDP's wrapper: its gradients add to the parameters' as a micro-batch's
    under `no_sync` do, and the minibatch's last GRPO micro-batch all-reduces them with its own. So it must come
    before that one, and it needs no collective of its own beside the token count."""
    nll = torch.zeros((), dtype=torch.float64, device=models.device)
    rows = np.array([], dtype=np.int64) if targets is None else np.flatnonzero(np.isin(targets.groups, groups))
    counted = None if len(rows) == 0 else targets.target_mask[torch.from_numpy(rows).to(targets.ids.device)]
    # Every rank counts, those without an A: prompt too: the sum is a collective.
    total, = comm.sum([0.0 if counted is None else float(counted.sum())])
    if counted is None or total == 0:
        return nll, torch.zeros_like(nll)
    P, compiled = targets.prompt_width, models.options
    options = PassOptions(start=P, compile=compiled.compile, chunk_size=compiled.chunk_size)
    for chunk in np.array_split(rows, -(-len(rows) // micro_batch_size)):
        index = torch.from_numpy(chunk).to(targets.ids.device)
        ids, mask, wanted = targets.ids[index], targets.mask[index], targets.target_mask[index]
        loss = NLL(total / comm.info.world, wanted.reshape(-1).float() * weight)
        with models.autocast():
            out = token_logprobs(models.policy, ids, mask, options, wanted=wanted, loss=loss)
        out.loss.backward()
        nll += -(out.logprobs.double() * wanted).sum()
    return nll, counted.sum().double()
