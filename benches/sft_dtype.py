"""`rookworld sft` on the CPU in bf16 autocast against float32, in one run: tokens/s and loss curves (issue 44).

Two trainers of the same fresh model on the same rows, one `--dtype fp32` and one `--dtype bf16`, take their steps
in turn (fp32, bf16, fp32, bf16, ...), so that whatever else loads the machine falls on both alike. First it prints
the CPU (its model name and whether it lists amx_bf16 / avx512_bf16, what `--dtype auto` looks for) and
`torch.mm`'s GFLOP/s in float32 and bfloat16 at 768 and 2048 cubed (a dtype the CPU emulates at 768 alone): the
machine's own limit per dtype. Then, per model shape, tokens/s per dtype (the measured steps' tokens over their
time: both take the same rows), the speedup, model FLOP utilisation against the largest mm figure of the dtype
(6 x parameters x tokens/s: training's forward and backward), and the two loss curves step by step with their
largest difference.

    python benches/sft_dtype.py                         # the shipped chess-cpu shape, then GPT-2 small (1 min on 2 idle cores)
    python benches/sft_dtype.py --shapes chess-cpu --steps 20

Shapes: `chess-cpu` is models/chess-cpu-sft's (12 layers, 4 heads, 128 wide, the chess vocabulary: 3.1M
parameters) at the chess-cpu preset's SFT settings (16 rows a step of up to 256 tokens, compact layout, the loss
on the targets); `chess-play` is models/chess-play-sft's (4 layers, 4 heads, 256 wide, the chess vocabulary: 4.5M)
at the same settings (issue 68; not in the default run); `small` is GPT-2 small (12 layers, 12 heads, 768 wide, GPT-2's vocabulary: 124M), fewer rows
and steps. The rows are data/chess-cpu-held-out.jsonl's samples (it ships with rookworld), in the order the
trainer draws them.

Prediction, written before the first measurement (Machine B, AMD EPYC Zen 4 with AVX-512 BF16, no AMX; numbers
from BENCHMARKS.md: `torch.mm` about 190 GFLOP/s in float32 and 405 in bf16 at 2048 cubed, 2.1x): the float32 run
already makes its products through oneDNN (`rookworld.net.model.linear`), and under bf16 autocast on the CPU the
lm_head's products stay float32 (`head_logits` widens the rounded bf16 operands) and every Linear's weight is cast
to bf16 at every call, with a cast of each activation on the way in and out. GPT-2 small: the trunk's products
are about 70% of a float32 step; at 1.5-2x in bf16 (SFT's shapes are below mm's peak) and the head (about 10%) no
faster, the casts adding a few percent: about 1.3x the tokens/s (1.15-1.45x). chess-cpu (128 wide): the products
are [tokens, 128] x [128, 128..512], too thin for either dtype to approach its peak, and LayerNorm, GELU,
attention's softmax, the 4,364-token log-softmax and AdamW make up more than half the step; the casts are a
larger share of so small a model: 0.9-1.15x, no clear gain. Losses: bf16 rounds each product's inputs to 8
mantissa bits, so the per-step loss should stay within about 1% of float32's over a few dozen steps (a fresh
model's loss near ln V), the difference growing slowly as the weights part.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
from rookworld.net.device import BF16_FLAGS  # noqa: E402
from rookworld.settings.config import SFTConfig  # noqa: E402
from rookworld.sft.trainer import SFTTrainer  # noqa: E402

#: name: SFTConfig settings of the shape
SHAPES = {
    "chess-cpu": dict(init="tiny", n_layer=12, n_head=4, vocabulary="chess", layout="compact", seq_len=256),
    "chess-play": dict(init="mini", vocabulary="chess", layout="compact", seq_len=256),
    "small": dict(init="small", vocabulary="gpt2", seq_len=256),
}


def cpu_name() -> tuple[str, list[str]]:
    """/proc/cpuinfo's model name and which of `BF16_FLAGS` its flags list."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown (no /proc/cpuinfo)", []
    name = next((line.partition(":")[2].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = next((line.partition(":")[2].split() for line in text.splitlines() if line.startswith("flags")), [])
    return name, [f for f in BF16_FLAGS if f in flags]


#: A dtype whose product at the smallest size takes longer than this is measured at that size alone, once: a CPU
#: without bf16 instructions (an AVX2 EPYC: 0.1-0.4 GFLOP/s, three minutes for one 2048^3 product) would spend the
#: benchmark's time, and its smoke test's limit, on its peak.
SLOW_PRODUCT_S = 0.5


def mm_gflops(sizes=(768, 2048), rounds: int = 6) -> dict[str, float]:
    """torch.mm's best GFLOP/s at n x n x n in float32 and bfloat16 with the threads torch has, keyed "fp32_768"
    and so on: rounds of one product of each (dtype, size) in turn, the best of each kept, so that load on the
    machine falls on both dtypes alike and the best is its quietest moment. A slow dtype (`SLOW_PRODUCT_S`) has
    its smallest size only."""
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    first = min(sizes)
    slow = {d for d, dt in dtypes.items() if _product_s(torch.randn(first, first, dtype=dt)) > SLOW_PRODUCT_S}
    operands = {f"{d}_{n}": torch.randn(n, n, dtype=dt) for n in sizes for d, dt in dtypes.items()
                if n == first or d not in slow}
    best = dict.fromkeys(operands, float("inf"))
    for r in range(rounds):
        for key, a in operands.items():
            if key.split("_")[0] in slow and r > 0:
                continue
            for _ in range(1 if key.endswith(str(max(sizes))) else 4):
                best[key] = min(best[key], _product_s(a))
    return {key: 2 * int(key.split("_")[1]) ** 3 / t / 1e9 for key, t in best.items()}


def _product_s(a: torch.Tensor) -> float:
    t0 = time.perf_counter()
    torch.mm(a, a)
    return time.perf_counter() - t0


def peak(mm: dict[str, float], dtype: str) -> tuple[int, float]:
    """(the largest size measured for `dtype`, its GFLOP/s)."""
    n = max(int(key.split("_")[1]) for key in mm if key.startswith(dtype + "_"))
    return n, mm[f"{dtype}_{n}"]


def compare(shape: str, args: argparse.Namespace, peaks: dict[str, float], tmp: str) -> dict:
    """fp32 and bf16 SFT of the same fresh model on the same rows, a step of each in turn."""
    steps, warmup, rows = ((args.small_steps, args.small_warmup, args.small_rows) if shape == "small"
                           else (args.steps, args.warmup, args.rows))
    trainers = {}
    for dtype in ("fp32", "bf16"):
        cfg = SFTConfig(**SHAPES[shape], data=[args.data], output_dir=os.path.join(tmp, f"{shape}-{dtype}"),
                        steps=warmup + steps, rows_per_step=rows, micro_batch_size=rows, loss_on="target",
                        lr=args.lr, warmup_steps=0, eval_every=0, save_every=0, log_every=10**6,
                        report_to="none", device="cpu", dtype=dtype).validate()
        trainers[dtype] = SFTTrainer(cfg, stream=open(os.devnull, "w"), process_settings=True)
    n_params = sum(p.numel() for p in trainers["fp32"].run.policy.parameters())
    assert all(torch.equal(a, b) for a, b in zip(trainers["fp32"].run.policy.parameters(),
                                                 trainers["bf16"].run.policy.parameters()))
    print(f"\n{shape}: {n_params / 1e6:.1f}M parameters, {rows} rows a step of up to {SHAPES[shape]['seq_len']} "
          f"tokens, {warmup} warm-up + {steps} measured steps per dtype, alternated", file=sys.stderr)
    out = {d: {"loss": [], "tokens_per_s": [], "step_s": [], "tokens": []} for d in trainers}
    try:
        for i in range(warmup + steps):
            for dtype, trainer in trainers.items():
                m = trainer.train_step()
                out[dtype]["loss"].append(m["loss"])
                if i >= warmup:
                    out[dtype]["tokens_per_s"].append(m["tokens_per_s"])
                    out[dtype]["step_s"].append(m["time/step"])
                    out[dtype]["tokens"].append(m["tokens_per_s"] * m["time/step"])
            print(f"  step {i + 1}{' (warm-up)' if i < warmup else ''}: loss "
                  + ", ".join(f"{d} {out[d]['loss'][-1]:.4f}" for d in trainers), file=sys.stderr)
    finally:
        for trainer in trainers.values():
            trainer.close()
    result = {"params_m": n_params / 1e6, "rows": rows, "steps": steps, "warmup": warmup}
    for dtype in trainers:
        # Both dtypes take the same rows at each step: their tokens over their time, step for step the same work.
        tps = sum(out[dtype]["tokens"]) / sum(out[dtype]["step_s"])
        result[dtype] = {"tokens_per_s": tps, "median_tokens_per_s": statistics.median(out[dtype]["tokens_per_s"]),
                         "step_s": statistics.median(out[dtype]["step_s"]), "steps_s": out[dtype]["step_s"],
                         "loss": out[dtype]["loss"],
                         "gflops": 6 * n_params * tps / 1e9,
                         "mfu_of_mm": 6 * n_params * tps / 1e9 / peaks[dtype]}
    diffs = [b - a for a, b in zip(result["fp32"]["loss"], result["bf16"]["loss"])]
    rel = [abs(d) / a for d, a in zip(diffs, result["fp32"]["loss"])]
    result.update(speedup=result["bf16"]["tokens_per_s"] / result["fp32"]["tokens_per_s"],
                  max_abs_loss_diff=max(abs(d) for d in diffs), max_rel_loss_diff=max(rel),
                  first_steps_max_rel_loss_diff=max(rel[:5]), final_loss_diff=diffs[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["chess-cpu", "small"], choices=tuple(SHAPES))
    ap.add_argument("--data", default=str(REPO / "data" / "chess-cpu-held-out.jsonl"))
    ap.add_argument("--steps", type=int, default=20, help="measured steps per dtype (chess-cpu)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rows", type=int, default=16, help="rows a step (chess-cpu: the preset's 16)")
    ap.add_argument("--small-steps", type=int, default=4, help="measured steps per dtype (GPT-2 small)")
    ap.add_argument("--small-warmup", type=int, default=1)
    ap.add_argument("--small-rows", type=int, default=4, help="rows a step (GPT-2 small)")
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (chess-cpu's; constant: no warm-up)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()

    name, flags = cpu_name()
    # The threads a run takes (`harness.process.settle_process`), for the mm figures too.
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(os.cpu_count() or 1)
    print(f"CPU: {name}; {os.cpu_count()} cores, torch {torch.__version__} with {torch.get_num_threads()} threads; "
          f"bf16 flags: {', '.join(flags) or 'none'} (of {', '.join(BF16_FLAGS)})")
    mm = mm_gflops()
    for n in (768, 2048):
        shown = [f"{d} {mm[f'{d}_{n}']:.1f} GFLOP/s" for d in ("fp32", "bf16") if f"{d}_{n}" in mm]
        print(f"torch.mm {n}^3: {', '.join(shown)}")
    sizes = {d: peak(mm, d)[0] for d in ("fp32", "bf16")}
    peaks = {d: peak(mm, d)[1] for d in ("fp32", "bf16")}
    figures = {"cpu": name, "bf16_flags": flags, "threads": torch.get_num_threads(), "torch": torch.__version__,
               "mm_gflops": mm, "shapes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes:
            t0 = time.perf_counter()
            r = figures["shapes"][shape] = compare(shape, args, peaks, tmp)
            print(f"\n{shape} ({r['params_m']:.1f}M parameters, {r['rows']} rows a step, {r['steps']} measured "
                  f"steps a dtype, {time.perf_counter() - t0:.0f} s)")
            for dtype in ("fp32", "bf16"):
                d = r[dtype]
                print(f"  {dtype}: {d['tokens_per_s']:>9,.0f} tokens/s (median step {d['step_s']:.2f} s, "
                      f"{d['median_tokens_per_s']:,.0f} tokens/s), "
                      f"{d['gflops']:.1f} GFLOP/s = {100 * d['mfu_of_mm']:.1f}% of {dtype} mm {sizes[dtype]}^3")
            print(f"  bf16 / fp32: {r['speedup']:.2f}x tokens/s")
            print(f"  loss fp32: {' '.join(f'{x:.4f}' for x in r['fp32']['loss'])}")
            print(f"  loss bf16: {' '.join(f'{x:.4f}' for x in r['bf16']['loss'])}")
            print(f"  loss difference (bf16 - fp32): largest {r['max_abs_loss_diff']:.4f} "
                  f"({100 * r['max_rel_loss_diff']:.2f}% of fp32's; {100 * r['first_steps_max_rel_loss_diff']:.2f}% "
                  f"over the first 5 steps), last step {r['final_loss_diff']:+.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
