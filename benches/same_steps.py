"""Seeded GRPO and SFT runs of a tiny model on the CPU, each step's figures printed to 12 significant digits: a change
meant to keep training as it was (a refactor) prints the same lines before and after.

    python benches/same_steps.py > before.txt        # on the commit before
    python benches/same_steps.py > after.txt && diff before.txt after.txt

Each GRPO run takes real prompts (generated positions, P: and A:), real Stockfish rewards and one set of objective
options; together they take each option the tests cover at least once. `--calls` instead counts the package's
functions and files that one steady-state GRPO step calls (the second of three), from a profile hook.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

# One thread and MKL's reproducible mode, whatever a run of the package sets: a product's last bits depend on both.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import torch  # noqa: E402

import rookworld  # noqa: E402

from rookworld.grpo.trainer import Trainer  # noqa: E402
from rookworld.net.model import GPT, GPTConfig  # noqa: E402
from rookworld.net.tokenizer import get_tokenizer  # noqa: E402
from rookworld.settings.config import SFTConfig, TrainConfig  # noqa: E402
from rookworld.sft.trainer import SFTTrainer  # noqa: E402

#: The package as imported (a wheel's copy in site-packages, or the tree's own), whose functions --calls counts.
PACKAGE = Path(rookworld.__file__).parent

#: Objective options, one run each, beside the defaults.
GRPO_RUNS = {
    "defaults": {},
    "k1 ema batch": dict(kl_estimator="k1", baseline="ema", std_scaling="batch", a_beta_scale=2.0),
    "k2 mu2 sequence": dict(kl_estimator="k2", mu=2, minibatches=2, loss_aggregation="sequence", clip_high=0.3),
    "full forward": dict(kl_estimator="full", kl_direction="forward", loss_aggregation="constant"),
    "gae": dict(advantage="gae", std_scaling="batch", kl_estimator="k1"),
    "likelihood target": dict(a_likelihood_weight=0.5, kl_target=0.01, a_advantage_scale=0.5, entropy_coef=0.01),
    "warmup shared": dict(beta_warmup_steps=2, shared_prompt=True, baseline="ema", max_grad_norm=0.0),
    "masks no beta": dict(beta=0.0, mask_truncated=True, drop_zero_spread=True, std_scaling="none"),
}

SKIP = ("time/", "eta_s", "tokens_per_s", "samples_per_s", "peak_memory", "mfu", "throughput")


def tiny_gpt(seed: int) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=256, vocab_size=50257, n_layer=2, n_head=2, n_embd=64))
    with torch.no_grad():  # sharper than GPT-2's init, so that completions differ by prompt
        for name, p in model.named_parameters():
            if not name.endswith("weight") or "ln" not in name:
                p.mul_(3.0)
    return model.eval()


def figures(out: Path) -> list[str]:
    lines = []
    for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()):
        keep = {k: v for k, v in sorted(row.items()) if not any(k.startswith(s) or s in k for s in SKIP)}
        lines.append(" ".join(f"{k}={v:.12g}" if isinstance(v, float) else f"{k}={v}" for k, v in keep.items()))
    return lines


class Spread:
    """The run's own rewards plus a share for each distinct character a completion writes: a random tiny model's
    completions all score alike, and a group without spread would leave the advantages, and so the loss, at 0."""

    def __init__(self, rewards):
        self.rewards = rewards

    def prefetch(self, prompts):
        self.rewards.prefetch(prompts)

    def __call__(self, prompts, completions):
        scores = self.rewards(prompts, completions)
        return dataclasses.replace(scores, rewards=scores.rewards + [len(set(c)) / 50 for c in completions])


def grpo_config(out: Path, steps: int, **options) -> TrainConfig:
    settings = dict(steps=steps, prompts_per_step=4, group_size=4, max_new_tokens=24, warmup_steps=0, eval_every=0,
                    save_every=0, sample_every=0, log_every=100, compile=False, device="cpu", dtype="fp32",
                    seed=7, lr=3e-3, beta=0.05, stockfish_depth=1, stockfish_workers=1, output_dir=str(out))
    return TrainConfig(**(settings | options)).validate()


def grpo_run(out: Path, steps: int = 3, **options) -> list[str]:
    policy = tiny_gpt(1)
    reference = copy.deepcopy(policy).requires_grad_(False)
    trainer = Trainer(grpo_config(out, steps, **options), policy=policy, reference=reference,
                      tokenizer=get_tokenizer(), stream=open(os.devnull, "w"))
    trainer.reward_fn = Spread(trainer.reward_fn)
    try:
        trainer.train()
    finally:
        trainer.close()
    return figures(out)


def sft_run(out: Path, data: Path) -> list[str]:
    rows = [f"P: {fen}                                                             M: e2e4 d2d4 g1f3 c2c4 b1c3"
            f"      E: 0.3 0.2 0.2 0.1 0.0         B: e2e4" for fen in
            ["rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"] * 2]
    rows += ["A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+"
             "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1+0.001+0+0"] * 2
    data.write_text("\n".join(rows * 4) + "\n")
    cfg = SFTConfig(data=[str(data)], init="tiny", steps=3, rows_per_step=4, micro_batch_size=2, warmup_steps=0,
                    eval_every=0, save_every=0, log_every=100, compile=False, device="cpu", dtype="fp32", seed=3,
                    lr=1e-3, legal_weight=0.5, output_dir=str(out)).validate()
    trainer = SFTTrainer(cfg, stream=open(os.devnull, "w"))
    try:
        trainer.train()
    finally:
        trainer.close()
    return figures(out)


def count_calls(out: Path) -> tuple[Counter, set]:
    """The package's functions (by file and first line) called in step 2 of 3, from the start of its prompts
    (`batch(1)`) to the start of step 3's, each with its number of calls."""
    seen: Counter = Counter()
    source = str(PACKAGE)

    def hook(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(source) and not code.co_name.startswith("<"):
            seen[(Path(code.co_filename).relative_to(PACKAGE).as_posix(), code.co_firstlineno, code.co_qualname)] += 1

    policy = tiny_gpt(1)
    trainer = Trainer(grpo_config(out, 3), policy=policy, reference=copy.deepcopy(policy).requires_grad_(False),
                      tokenizer=get_tokenizer(), stream=open(os.devnull, "w"))
    batch = trainer.prompts.batch

    def watched(step):
        if step == 1:
            sys.setprofile(hook)
        elif step == 2:
            sys.setprofile(None)
        return batch(step)

    trainer.prompts.batch = watched
    try:
        trainer.train()
    finally:
        sys.setprofile(None)
        trainer.close()
    return seen, {f for f, _, _ in seen}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", action="store_true", help="count the functions and files of one GRPO step instead")
    p.add_argument("--only", help="run only the GRPO run of this name (or 'sft')")
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.calls:
            seen, files = count_calls(tmp / "calls")
            for (f, line, name), n in sorted(seen.items()):
                print(f"{n:6d}  {f}:{line} {name}")
            print(f"{len(seen)} functions in {len(files)} files")
            return
        for name, options in GRPO_RUNS.items():
            if args.only in (None, name):
                print(f"# grpo {name}: {options}")
                print("\n".join(grpo_run(tmp / name.replace(" ", "-"), **options)))
        if args.only in (None, "sft"):
            print("# sft")
            print("\n".join(sft_run(tmp / "sft", tmp / "sft.txt")))


if __name__ == "__main__":
    main()
