"""One GRPO step on fixed P:/A: prompts, alone or as one rank under torchrun; rank 0 writes the gradients the
step left and its metrics, one file per objective setting. `test_objective.py` runs it on 1 and on 2 ranks: the
gradient of a batch's objective must not depend on how the batch is sharded over ranks.

    python tests/ddp_step.py OUT_DIR
    python -m torch.distributed.run --nproc_per_node 2 tests/ddp_step.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import weakref
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import check_teardown_order, fixed_lengths, tiny_gpt  # noqa: E402
from rookworld.settings.config import TrainConfig  # noqa: E402
from rookworld.net.tokenizer import get_tokenizer  # noqa: E402
from rookworld.chess.rewards import Scores  # noqa: E402
from rookworld.grpo.prompts import Prompt  # noqa: E402
from rookworld.grpo.trainer import Trainer  # noqa: E402

# Rank 0 of 2 gets the P: prompts (3-token completions), rank 1 the A: prompts (9 tokens): the ranks hold very
# different numbers of tokens, and different rewards.
PROMPTS = [
    Prompt("P", "P: 3r1r2/ppb4k/8/2R5/5P2/8/1P4PP/2K3R1 w - - 1 27"),
    Prompt("P", "P: 3k4/3b4/2BQ3p/2B5/5p2/8/P4PKP/R4R2 b - - 4 26"),
    Prompt("A", "A: 7k/8/1p6/3r2R1/p1B1P3/1PP5/5KPP/7R w - - 0 32+c4d3+g7g6 e6g6 g8h8 g6g5 a7a5 e2e4 d7d5 f1c4 "
                "a5a4 c4d3+"),
    Prompt("A", "A: r1bqkbnr/pp1ppppp/2n5/2p5/4P3/2N3P1/PPPP1P1P/R1BQKBNR b KQkq - 0 3+f7f6+e2e4 c7c5 b1c3 b8c6 "
                "g2g3 f7f6+"),
]
GROUP = 3

CASES = {
    "token-batch-k3": dict(loss_aggregation="token", std_scaling="batch"),
    "sequence-group-k2": dict(loss_aggregation="sequence", kl_estimator="k2"),
    "constant-ema-k1": dict(loss_aggregation="constant", baseline="ema", std_scaling="batch", kl_estimator="k1"),
    "token-gae-full": dict(advantage="gae", kl_estimator="full", kl_direction="symmetric"),
    # The A: targets' likelihood runs outside DDP's wrapper on rank 1 alone (rank 0 has no A: prompt).
    "token-group-likelihood": dict(a_likelihood_weight=0.5),
}


class Shard:
    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    def batch(self, step):
        n = len(PROMPTS) // self.world
        return PROMPTS[self.rank * n : (self.rank + 1) * n]


class ByPlace:
    """A reward with spread in every group that does not depend on the sampled text (with top-k 1 a group's
    completions are equal): the completion's place in its group, and its prompt."""

    def prefetch(self, prompts):
        pass

    def __call__(self, prompts, completions):
        r = np.array([((i % GROUP) * 0.37 + len(p.text) * 0.013) % 1.0 for i, p in enumerate(prompts)])
        return Scores(r, np.array([p.task for p in prompts]), np.ones(len(r), dtype=bool))


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.set_num_threads(1)
    trainer = None
    wrappers = check_teardown_order()
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in CASES.items():
            cfg = TrainConfig(steps=1, prompts_per_step=len(PROMPTS), group_size=GROUP, max_new_tokens=9, top_k=1,
                              beta=0.1, max_grad_norm=0.0, warmup_steps=0, eval_every=0, save_every=0,
                              sample_every=0, output_dir=f"{tmp}/{name}", compile=False, micro_batch_size=2, device="cpu",
                              dtype="fp32", **extra).validate()  # compared at float32's rounding
            trainer = Trainer(cfg, policy=tiny_gpt(seed=2, scale=3.0),
                              reference=tiny_gpt(seed=3, scale=3.0).requires_grad_(False), tokenizer=get_tokenizer(),
                              reward_fn=ByPlace(), prompts=Shard(rank, world), stream=open(os.devnull, "w"))
            fixed_lengths(trainer, {"P": 3, "A": 9})
            wrappers.append(weakref.ref(trainer.models.policy_pass))
            m = trainer.train_step()
            if rank == 0:
                grads = {f"policy.{k}": p.grad for k, p in trainer.run.policy.named_parameters()}
                if trainer.models.value_head is not None:
                    grads.update({f"value.{k}": p.grad for k, p in trainer.models.value_head.named_parameters()})
                torch.save(grads, out / f"{name}.pt")
                (out / f"{name}.json").write_text(json.dumps(m))
    # Once, at the end: closing a trainer destroys the process group, which torchrun's store cannot start again.
    trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
