"""Time of one sampling draw (`rookworld.net.sampling.sample_next`) from fp32 logits [batch, 50,257], eager and
compiled: between two decode steps the sampler makes its passes over the whole vocabulary for every row, as
many bytes as the keys and values a step reads at batch 1,024.

    python benches/sampler.py                                  # CUDA if present
    python benches/sampler.py --device cpu --batch-sizes 64 256 --threads 2
    python benches/sampler.py --device cpu --draw blocks       # CUDA's draw in blocks, timed on the CPU
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import torch

from rookworld.net import sampling
from rookworld.net.sampling import sample_next

VOCAB = 50257


def _time(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of `repeats` calls after 3 warm-up calls (compilation included in those)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 1024, 2048])
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--draw", choices=("device", "whole", "blocks"), default="device",
                    help="the draw this device runs, or the whole row's running sum (the CPU's), or the sum in "
                         "blocks (CUDA's)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.draw != "device":
        chosen = sampling._draw if args.draw == "whole" else sampling._draw_in_blocks
        sampling.DRAWS = {**sampling.DRAWS, device.type: chosen}
    draw_fn = sampling.device_draw(device.type).__name__
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"sample_next on fp32 logits [batch, {VOCAB:,}], temperature {args.temperature}, {draw_fn}, {name}, torch "
          f"{torch.__version__}; median of {args.repeats}")
    header = f"{'batch':>6} {'eager ms':>9} {'compiled ms':>12} {'speed-up':>9} {'one logits pass ms':>19}"
    print(header + "\n" + "-" * len(header))
    rows = []
    for batch in args.batch_sizes:
        logits = torch.randn(batch, VOCAB, device=device) * 3
        g = torch.Generator(device=device).manual_seed(0)
        draw = functools.partial(sample_next, logits, args.temperature, generator=g)
        eager = _time(draw, device, args.repeats)
        compiled = _time(functools.partial(draw, compile=True), device, args.repeats)
        copy = _time(logits.clone, device, args.repeats)  # one read and one write of the logits
        rows.append({"batch": batch, "eager_s": eager, "compiled_s": compiled, "logits_copy_s": copy})
        print(f"{batch:>6} {1e3 * eager:>9.2f} {1e3 * compiled:>12.2f} {eager / compiled:>8.2f}x {1e3 * copy:>19.2f}",
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": name, "draw": draw_fn, "temperature": args.temperature,
                                               "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
