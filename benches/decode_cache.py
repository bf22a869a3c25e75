"""What attending over the whole static KV cache costs one decode step, before anyone changes it.

Compiled decoding (CUDA graphs) allocates each batch's cache at prompt + new tokens rounded up to a multiple of
`CACHE_LEN_BUCKET` and attends over every slot of it on every step, masked, so that no shape depends on how far
decoding has got. On average a step needs only the live prefix: prompt + half the new tokens. This times one
decode step (`rookworld.net.decoding.decode_step`, eager: one compile per cache length would cost more than
the whole measurement) against caches of three lengths at the same live context:

- live: prompt + new/2 slots, the average a step must read (the best that attending only the live prefix can do);
- exact: prompt + new, what eager decoding allocates;
- bucketed: that rounded up to the bucket, what compiled decoding allocates and reads today.

The difference bucketed - live is the time the static cache costs a step; against the compiled step's time from
`benches/generate.py` it is the gain that live-prefix attention could bring. Eager launch overhead sits in all
three times alike and cancels in the difference.

    python benches/decode_cache.py                            # CUDA if present, bf16, batch 256 to 2048
    python benches/decode_cache.py --device cpu --batch-sizes 16
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from rookworld.net.decoding import KVCache
from rookworld.net.model import GPT, GPTConfig
from rookworld.net.decoding import CACHE_LEN_BUCKET, decode_step

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def step_time(model: GPT, batch: int, cache_len: int, live: int, repeats: int) -> float:
    """Median seconds of one decode step for `batch` rows whose first `live` cache slots are filled, against a
    cache of `cache_len` slots."""
    device = model.device
    cache = KVCache(model.config, batch, cache_len, device, model.dtype)
    cache.valid[:, :live] = True
    tokens = torch.randint(0, 50256, (batch, 1), device=device)
    position_ids = torch.full((batch, 1), live, device=device)
    write_pos = torch.tensor([live], device=device)
    times = []
    with torch.no_grad():
        for i in range(3 + repeats):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            decode_step(model, cache, tokens, position_ids, write_pos, device.type, None)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= 3:
                times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=DTYPES, default=None, help="bfloat16 on CUDA, float32 on CPU by default")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 1024, 2048])
    ap.add_argument("--prompt-len", type=int, nargs=2, default=[48, 91], metavar=("P", "A"),
                    help="prompt tokens for P: and A: (default 48 91, as generate.py)")
    ap.add_argument("--new-tokens", type=int, nargs=2, default=[48, 96], metavar=("P", "A"),
                    help="generated tokens for P: and A: (default 48 96)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--json", default=None, help="also write the figures to this file (after every row)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    torch.manual_seed(0)
    model = GPT(GPTConfig()).to(device=device, dtype=dtype).eval()
    cfg = model.config
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"one eager decode step, GPT-2 124M, random weights, {dtype}, {name}, torch {torch.__version__}; median "
          f"of {args.repeats}; ms at three cache lengths for the same live context")
    header = (f"{'task':<4} {'batch':>6} {'live':>5} {'exact':>5} {'bucket':>6} {'live ms':>8} {'exact ms':>9} "
              f"{'bucket ms':>10} {'bucket-live ms':>15} {'extra KV GB/s':>14}")
    print(header + "\n" + "-" * len(header))
    doc = {"device": name, "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__,
           "repeats": args.repeats, "bucket": CACHE_LEN_BUCKET, "rows": []}
    for t, task in enumerate(("P", "A")):
        prompt, new = args.prompt_len[t], args.new_tokens[t]
        live, exact = prompt + new // 2, prompt + new
        bucket = -(-exact // CACHE_LEN_BUCKET) * CACHE_LEN_BUCKET
        for batch in args.batch_sizes:
            # live + 1 slots: the step writes its own key and value at slot `live`.
            ms = {k: 1e3 * step_time(model, batch, n, live, args.repeats)
                  for k, n in (("live", live + 1), ("exact", exact), ("bucket", bucket))}
            extra_bytes = 2 * cfg.n_layer * batch * (bucket - live - 1) * cfg.n_embd * dtype.itemsize
            diff = ms["bucket"] - ms["live"]
            row = {"task": task, "batch": batch, "prompt": prompt, "new": new, "live_slots": live + 1,
                   "exact_slots": exact, "bucket_slots": bucket, "live_ms": ms["live"], "exact_ms": ms["exact"],
                   "bucket_ms": ms["bucket"], "bucket_minus_live_ms": diff, "extra_kv_bytes": extra_bytes,
                   "extra_kv_bytes_per_s": extra_bytes / (diff / 1e3) if diff > 0 else None}
            doc["rows"].append(row)
            rate = f"{row['extra_kv_bytes_per_s'] / 1e9:>14,.0f}" if row["extra_kv_bytes_per_s"] else f"{'-':>14}"
            print(f"{task:<4} {batch:>6} {live + 1:>5} {exact:>5} {bucket:>6} {ms['live']:>8.3f} {ms['exact']:>9.3f} "
                  f"{ms['bucket']:>10.3f} {diff:>15.3f} {rate}", flush=True)
            if args.json:
                tmp = Path(args.json + ".tmp")
                tmp.write_text(json.dumps(doc, indent=1) + "\n")
                tmp.replace(args.json)
            if device.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
