"""`rookworld sft`'s step on the CPU, today's against each way of making it faster, in one run (issue 68, item 4).

Arms, each its own trainer of the same model on the same rows, taking their steps in turn (so that load on the
machine falls on all alike):
- `fp32`: today's step (`--dtype auto` without AMX: float32, eager, fused AdamW);
- `bf16`: `--dtype bf16` (autocast);
- `compiled`, `compiled-bf16`: the log-prob pass (trunk and vocabulary pass) through torch.compile's inductor, as
  `--compile` does on CUDA (rookworld compiles on CUDA only; the arm sets the run's compile flags after building it);
- `muon`: `--optimizer muon` (its Newton-Schulz iterations are the added work).
It prints the CPU, `torch.mm`'s float32 and bf16 peaks (`sft_dtype.mm_gflops`), then per arm the median step, the
speed against fp32, the first step's time (a compiled arm's includes compiling) and each step's loss beside fp32's
(the same computation in fp32 and compiled; a stated tolerance for bf16; another optimizer for muon).

    python benches/sft_step.py --model models/chess-play-sft --data data/chess-play-held-out.jsonl
    OMP_NUM_THREADS=1 python benches/sft_step.py --model models/chess-play-sft --arms fp32,muon --steps 10

Expectation (2026-11-29, written after a scratch script's first look at the same arms, not blind; this 2-core AMD
EPYC with AVX-512 BF16 and no AMX, one
thread, the chess-play shape with the issue's SFT settings: 16 rows, ranked targets, legality loss): a profile of
the fp32 step puts 70% in the products (mkldnn linear and mm, near float32's peak), 12% in attention, the rest in
GELU, the log-softmax, LayerNorm and AdamW. Compiled fuses only that rest: 1.0-1.1x. bf16 doubles the products'
rate at best: 1.2-1.4x. Muon adds five Newton-Schulz iterations over each of the 16 block matrices, about 18 GFLOP
against the step's 40: 0.7-0.8x at 16 rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sft_dtype import cpu_name, mm_gflops, peak  # noqa: E402

from rookworld.net.logprobs import LogProbs, PassOptions  # noqa: E402
from rookworld.settings.config import SFTConfig  # noqa: E402
from rookworld.sft.trainer import SFTTrainer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ARMS = ("fp32", "bf16", "compiled", "compiled-bf16", "muon")


def trainer(arm: str, args: argparse.Namespace, out: str) -> SFTTrainer:
    cfg = SFTConfig(model=args.model, data=[args.data], output_dir=out, steps=10**6, rows_per_step=args.rows,
                    micro_batch_size=args.rows, loss_on="target", layout="compact", seq_len=256, lr=2e-4,
                    warmup_steps=0, eval_every=0, save_every=0, log_every=10**6, report_to="none", device="cpu",
                    legal_weight=1.0, candidate_order="ranked", dtype="bf16" if arm.endswith("bf16") else "fp32",
                    optimizer="muon" if arm == "muon" else "adamw").validate()
    t = SFTTrainer(cfg, stream=open(os.devnull, "w"), process_settings=True)
    if arm.startswith("compiled"):
        t.run.context = dataclasses.replace(t.run.context, compile=True, compile_logprobs=True)
        t.policy_pass = LogProbs(t.run.policy, PassOptions(compile=True, keep_hidden=True))
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO / "models" / "chess-play-sft"))
    ap.add_argument("--data", default=str(REPO / "data" / "chess-play-held-out.jsonl"))
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--steps", type=int, default=12, help="measured steps per arm")
    ap.add_argument("--warmup", type=int, default=3, help="steps per arm before measuring (compiling among them)")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    arms = args.arms.split(",")
    if any(a not in ARMS for a in arms) or "fp32" not in arms:
        ap.error(f"--arms: of {', '.join(ARMS)}, fp32 among them (the reference)")

    name, flags = cpu_name()
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(os.cpu_count() or 1)
    mm = mm_gflops()
    print(f"CPU: {name}; bf16 flags: {', '.join(flags) or 'none'}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; torch.mm fp32 {peak(mm, 'fp32')[1]:.0f} GFLOP/s, "
          f"bf16 {peak(mm, 'bf16')[1]:.0f}")
    figures: dict = {"cpu": name, "threads": torch.get_num_threads(), "torch": torch.__version__, "mm_gflops": mm}
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {arm: trainer(arm, args, os.path.join(tmp, arm)) for arm in arms}
        loss = {arm: [] for arm in arms}
        times = {arm: [] for arm in arms}
        try:
            for i in range(args.warmup + args.steps):
                for arm, t in trainers.items():
                    t0 = time.perf_counter()
                    loss[arm].append(t.train_step()["loss"])
                    times[arm].append(time.perf_counter() - t0)
                print(f"  step {i + 1}: " + ", ".join(f"{a} {times[a][-1]:.3f} s" for a in arms), file=sys.stderr)
        finally:
            for t in trainers.values():
                t.close()
    base = statistics.median(times["fp32"][args.warmup:])
    for arm in arms:
        step = statistics.median(times[arm][args.warmup:])
        worst = max(abs(a - b) / b for a, b in zip(loss[arm], loss["fp32"]))
        figures[arm] = {"step_s": step, "speed_vs_fp32": base / step, "first_step_s": times[arm][0],
                        "losses": loss[arm], "max_rel_loss_diff_vs_fp32": worst}
        print(f"{arm:>14}: median step {step:.3f} s, {base / step:.2f}x fp32; first step {times[arm][0]:.1f} s; "
              f"loss vs fp32: largest relative difference {100 * worst:.3f}%")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
