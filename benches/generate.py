"""Throughput of the policy's two hot paths at the 124M (GPT-2 small) configuration, random weights.

- generation: tokens/s of `rookworld.policy.sampling.generate` with a fixed number of new tokens per row
  (stop_at_eos=False): 48 for P: (policy) prompts, 96 for A: (environment) prompts;
- log-prob pass: completion tokens/s of `rookworld.policy.sampling.token_logprobs` over prompt + completion, without
  gradients, and (with --backward) forward + backward as in the GRPO loss.

- with --mixed: a batch of both tasks (--task-mix of P:) sampled as one batch, each row to its own length, against
  one batch per task as the trainer does it.

    python benches/generate.py                                   # CUDA if present: bf16, eager and compiled
    python benches/generate.py --device cpu --batch-sizes 8 16   # what a small CPU can do
    python benches/generate.py --mixed --batch-sizes 2048        # one mixed batch vs one per task
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import time
from collections.abc import Callable

import torch

from rookworld.policy.model import GPT, GPTConfig
from rookworld.policy.sampling import TokenScores, generate, release_caches, token_logprobs

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> tuple[float, object]:
    """Best-of-`repeats` wall time in seconds (the best run is the least disturbed by the rest of the machine),
    and the last result."""
    for _ in range(warmup):
        fn()
    _sync(device)
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best, result


def _forward_backward(model: GPT, score: Callable[[], TokenScores]) -> None:
    score().logprobs.sum().backward()
    model.zero_grad(set_to_none=True)


def mixed(model: GPT, device: torch.device, rows: int, args: argparse.Namespace, compiled: bool,
          warmup: int) -> str:
    """One P:/A: batch (P: rows left-padded to the A: width, per-row limits) against one batch per task."""
    n_p = round(rows * args.task_mix)
    (p_len, a_len), (p_new, a_new) = args.prompt_len, args.new_tokens
    width = max(p_len, a_len)
    ids = torch.randint(0, 50256, (rows, width), generator=torch.Generator().manual_seed(rows)).to(device)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[:n_p, : width - p_len] = False
    mask[n_p:, : width - a_len] = False
    limits = torch.tensor([p_new] * n_p + [a_new] * (rows - n_p), device=device)
    one = functools.partial(generate, model, ids, mask, max_new_tokens=limits, stop_at_eos=False, seed=0,
                            compile=compiled)

    def per_task() -> None:
        g = torch.Generator(device=device).manual_seed(0)
        for sl, plen, new in ((slice(0, n_p), p_len, p_new), (slice(n_p, rows), a_len, a_new)):
            if sl.stop > sl.start:
                generate(model, ids[sl, width - plen :], mask[sl, width - plen :], max_new_tokens=new,
                         stop_at_eos=False, generator=g, compile=compiled)

    tokens = n_p * p_new + (rows - n_p) * a_new
    one_s, _ = _time(one, device, warmup, args.repeats)
    split_s, _ = _time(per_task, device, warmup, args.repeats)
    return (f"{rows:>6} {n_p:>5} {'compiled' if compiled else 'eager':<9} {one_s:>8.3f} {tokens / one_s:>10,.0f} "
            f"{split_s:>8.3f} {tokens / split_s:>10,.0f} {one_s / split_s:>7.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=DTYPES, default=None, help="bfloat16 on CUDA, float32 on CPU by default")
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compile the decode step (CUDA graphs on CUDA) and the log-prob pass's log-softmax; default: on CUDA "
        "run both eager and compiled",
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    parser.add_argument("--tasks", nargs="+", choices=["P", "A"], default=["P", "A"])
    parser.add_argument("--prompt-len", type=int, nargs=2, default=[48, 91], metavar=("P", "A"),
                        help="prompt tokens for P: and A: (default 48 91)")
    parser.add_argument("--new-tokens", type=int, nargs=2, default=[48, 96], metavar=("P", "A"),
                        help="generated tokens for P: and A: (default 48 96)")
    parser.add_argument("--chunk-size", type=int, default=2048, help="rows per lm_head chunk in the log-prob pass")
    parser.add_argument("--backward", action="store_true", help="also time forward + backward of the log-prob pass")
    parser.add_argument("--no-logprobs", action="store_true", help="skip the log-prob pass")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs first (default 3 on CUDA, 1 on CPU)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--mixed", action="store_true", help="one mixed P:/A: batch vs one batch per task")
    parser.add_argument("--task-mix", type=float, default=0.8, help="share of P: rows with --mixed")
    args = parser.parse_args()

    device = torch.device(args.device)
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    warmup = args.warmup if args.warmup is not None else (3 if device.type == "cuda" else 1)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.compile is not None:
        compile_modes = [args.compile]
    else:
        compile_modes = [False, True] if device.type == "cuda" else [False]
    # Every (batch, length) pair is a separate compiled graph; the default limit of 8 would silently fall back.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    torch.backends.cuda.matmul.allow_tf32 = True

    torch.manual_seed(0)
    model = GPT(GPTConfig()).to(device=device, dtype=dtype).eval()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"GPT-2 124M ({model.num_params():,} params), random weights, {dtype}, {name}, torch {torch.__version__}")
    print(f"best of {args.repeats} after {warmup} warm-up run(s); tokens/s counts generated / completion tokens\n")

    if args.mixed:
        header = (f"{'rows':>6} {'P:':>5} {'decode':<9} {'one s':>8} {'tok/s':>10} {'split s':>8} {'tok/s':>10} "
                  f"{'speed-up':>8}")
        print(f"P: {args.prompt_len[0]}-token prompts, {args.new_tokens[0]} new tokens; A: {args.prompt_len[1]} and "
              f"{args.new_tokens[1]}\n{header}\n{'-' * len(header)}")
        for rows in args.batch_sizes:
            for compiled in compile_modes:
                print(mixed(model, device, rows, args, compiled, warmup), flush=True)
            release_caches(model)
        return

    header = f"{'task':<4} {'batch':>6} {'prompt':>6} {'new':>4} {'decode':<9} {'gen s':>8} {'gen tok/s':>10}"
    if not args.no_logprobs:
        header += f" {'logp tok/s':>11}"
        if args.backward:
            header += f" {'fwd+bwd tok/s':>14}"
    if device.type == "cuda":
        header += f" {'peak GiB':>9}"
    print(header)
    print("-" * len(header))

    for task in args.tasks:
        prompt_len = args.prompt_len[0 if task == "P" else 1]
        new = args.new_tokens[0 if task == "P" else 1]
        for batch in args.batch_sizes:
            g = torch.Generator().manual_seed(batch)
            prompts = torch.randint(0, 50256, (batch, prompt_len), generator=g).to(device)
            mask = torch.ones_like(prompts, dtype=torch.bool)
            for compiled in compile_modes:
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                run_generate = functools.partial(
                    generate, model, prompts, mask, max_new_tokens=new, stop_at_eos=False, seed=0, compile=compiled
                )
                try:
                    gen_s, out = _time(run_generate, device, warmup, args.repeats)
                except torch.OutOfMemoryError:
                    print(f"{task:<4} {batch:>6} {prompt_len:>6} {new:>4} out of memory")
                    release_caches(model)
                    torch.cuda.empty_cache()
                    continue
                row = (
                    f"{task:<4} {batch:>6} {prompt_len:>6} {new:>4} {'compiled' if compiled else 'eager':<9} "
                    f"{gen_s:>8.3f} {batch * new / gen_s:>10,.0f}"
                )
                if not args.no_logprobs:
                    ids = torch.cat([prompts, out.tokens], dim=1)
                    full_mask = torch.cat([mask, out.mask], dim=1)
                    score = functools.partial(
                        token_logprobs, model, ids, full_mask, start=prompt_len, chunk_size=args.chunk_size,
                        compile=compiled,
                    )
                    score_s, _ = _time(torch.no_grad()(score), device, 1, args.repeats)
                    row += f" {batch * new / score_s:>11,.0f}"
                    if args.backward:
                        backward = functools.partial(_forward_backward, model, score)
                        backward_s, _ = _time(backward, device, 1, args.repeats)
                        row += f" {batch * new / backward_s:>14,.0f}"
                if device.type == "cuda":
                    row += f" {torch.cuda.max_memory_allocated(device) / 2**30:>9.1f}"
                print(row, flush=True)
            release_caches(model)  # keep one shape's cache at a time


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
