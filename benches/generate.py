"""Throughput of the policy's two hot paths at the 124M (GPT-2 small) configuration, random weights.

- generation: tokens/s of `rookworld.net.sampling.generate` with a fixed number of new tokens per row
  (stop_at_eos=False): 48 for P: (policy) prompts, 96 for A: (environment) prompts;
- log-prob pass: completion tokens/s of `rookworld.net.logprobs.token_logprobs` over prompt + completion, without
  gradients, and (with --backward) forward + backward as in the GRPO loss: the fused pass that makes the loss's
  gradients in its forward (as the trainer runs it), and beside it the plain pass's checkpointed chunks.

- with --mixed: a batch of both tasks (--task-mix of P:) sampled as one batch, each row to its own length, against
  one batch per task as the trainer does it.

    python benches/generate.py                                   # CUDA if present: bf16, eager and compiled
    python benches/generate.py --device cpu --batch-sizes 8 16   # what a small CPU can do
    python benches/generate.py --mixed --batch-sizes 2048        # one mixed batch vs one per task

On CUDA each generation row also gives the decode step's memory-bandwidth floor: every step must read the
weights once and each row's keys and values so far (prompt + half the new tokens on average), at the
device-to-device copy rate measured at start; `% floor` is the measured rate over that bound. `--weights fp32`
keeps fp32 weights under bf16 autocast (as the trainer's policy did, casting every weight at every decode step);
`--weights copy` keeps them too but generates and runs the no-grad log-prob pass through `autocast_copy` of the model,
as the trainer now samples and runs its reference; the default casts the whole model to --dtype.

--json FILE writes every row measured so far after each one, so a run cut short still leaves its figures.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rookworld.net.model import GPT, GPTConfig
from rookworld.net.precision import autocast_copy
from rookworld.net.decoding import release_caches
from rookworld.net.logprobs import PassOptions, TokenLogProbs, TokenTerms, token_logprobs
from rookworld.net.sampling import SamplingOptions, generate

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


def copy_bandwidth(device: torch.device) -> float | None:
    """Device-to-device copy rate in bytes/s (bytes read + bytes written), the ceiling of a memory-bound step."""
    if device.type != "cuda":
        return None
    src = torch.randn(2**28, device=device)  # 1 GiB: far beyond the L2
    dst = torch.empty_like(src)
    best = _time(lambda: dst.copy_(src), device, warmup=3, repeats=10)[0]
    return 2 * src.numel() * src.element_size() / best


def decode_floor(cfg: GPTConfig, params: int, batch: int, prompt_len: int, new: int, elem_bytes: int,
                 bandwidth: float) -> float:
    """Generated tokens/s if every decode step only read the weights once and each row's keys and values so far
    (contexts averaged over the new tokens), at `bandwidth` bytes/s. The fp32 logits [batch, vocab] a step
    writes and the sampler reads are left out: a fused sampler need not write them."""
    context = prompt_len + (new - 1) / 2
    step_bytes = params * elem_bytes + 2 * cfg.n_layer * batch * context * cfg.n_embd * elem_bytes
    return batch * bandwidth / step_bytes


def _autocast_logprobs(model: GPT, ids: torch.Tensor, attention_mask: torch.Tensor, *, options: PassOptions,
                       dtype: torch.dtype | None, **kwargs) -> TokenLogProbs:
    """token_logprobs under autocast to `dtype` (None: in the model's own dtype), as the trainer calls it."""
    with torch.autocast(model.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        return token_logprobs(model, ids, attention_mask, options, **kwargs)


def _forward_backward(model: GPT, logprobs: Callable[..., TokenLogProbs], fused: bool) -> None:
    """Forward and backward of the mean log-prob: made in one pass over the vocabulary (`fused`, as the trainer
    does), or through autograd over checkpointed chunks (the plain pass)."""
    if fused:
        logprobs(loss=lambda lp, entropy, kl, at: TokenTerms(lp)).loss.backward()
    else:
        logprobs().logprobs.sum().backward()
    model.zero_grad(set_to_none=True)


def mixed(model: GPT, device: torch.device, rows: int, args: argparse.Namespace, compiled: bool,
          warmup: int) -> dict:
    """One P:/A: batch (P: rows left-padded to the A: width, per-row limits) against one batch per task."""
    n_p = round(rows * args.task_mix)
    (p_len, a_len), (p_new, a_new) = args.prompt_len, args.new_tokens
    width = max(p_len, a_len)
    ids = torch.randint(0, 50256, (rows, width), generator=torch.Generator().manual_seed(rows)).to(device)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[:n_p, : width - p_len] = False
    mask[n_p:, : width - a_len] = False
    limits = torch.tensor([p_new] * n_p + [a_new] * (rows - n_p), device=device)
    one = functools.partial(generate, model, ids, mask, SamplingOptions(max_new_tokens=limits, stop_at_eos=False,
                                                                          compile=compiled, dtype=args.run_dtype),
                            seed=0)

    def per_task() -> None:
        g = torch.Generator(device=device).manual_seed(0)
        for sl, plen, new in ((slice(0, n_p), p_len, p_new), (slice(n_p, rows), a_len, a_new)):
            if sl.stop > sl.start:
                options = SamplingOptions(max_new_tokens=new, stop_at_eos=False, compile=compiled, dtype=args.run_dtype)
                generate(model, ids[sl, width - plen :], mask[sl, width - plen :], options, generator=g)

    tokens = n_p * p_new + (rows - n_p) * a_new
    one_s, _ = _time(one, device, warmup, args.repeats)
    split_s, _ = _time(per_task, device, warmup, args.repeats)
    return {"rows": rows, "p_rows": n_p, "decode": "compiled" if compiled else "eager", "one_batch_s": one_s,
            "one_batch_tokens_per_s": tokens / one_s, "per_task_s": split_s, "per_task_tokens_per_s": tokens / split_s,
            "speedup": one_s / split_s}


class Results:
    """The rows measured so far, rewritten to --json after each one."""

    def __init__(self, path: str | None, meta: dict):
        self.path, self.doc = path, {**meta, "rows": []}

    def add(self, row: dict) -> None:
        self.doc["rows"].append(row)
        if self.path:
            tmp = Path(self.path + ".tmp")
            tmp.write_text(json.dumps(self.doc, indent=1) + "\n")
            tmp.replace(self.path)


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
    parser.add_argument("--chunk-size", type=int, default=None,
                        help="positions per lm_head chunk in the log-prob pass (default: by bytes, as the trainer)")
    parser.add_argument("--backward", action="store_true", help="also time forward + backward of the log-prob pass")
    parser.add_argument("--no-logprobs", action="store_true", help="skip the log-prob pass")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs first (default 3 on CUDA, 1 on CPU)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--mixed", action="store_true", help="one mixed P:/A: batch vs one batch per task")
    parser.add_argument("--task-mix", type=float, default=0.8, help="share of P: rows with --mixed")
    parser.add_argument("--weights", choices=["compute", "fp32", "copy"], default="compute",
                        help="compute: cast the model to --dtype; fp32: keep fp32 weights and run under autocast to "
                        "--dtype; copy: fp32 weights, but generate and run the no-grad log-prob pass through their "
                        "autocast copy (Linear weights stored in --dtype), as the trainer does")
    parser.add_argument("--json", default=None, help="also write the figures to this file (after every row)")
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
    weight_dtype = dtype if args.weights == "compute" else torch.float32
    trained = GPT(GPTConfig()).to(device=device, dtype=weight_dtype).eval()  # what backward runs through
    args.run_dtype = dtype if weight_dtype != dtype else None  # generate() autocasts when they differ
    model = autocast_copy(trained, dtype) if args.weights == "copy" and args.run_dtype else trained
    bandwidth = copy_bandwidth(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"GPT-2 124M ({trained.num_params():,} params), random weights, {dtype}"
          f"{' under autocast, fp32 weights' if args.run_dtype else ''}"
          f"{' read through their autocast copy' if model is not trained else ''}, {name}, torch {torch.__version__}")
    if bandwidth:
        print(f"device-to-device copy: {bandwidth / 1e12:.2f} TB/s (read + write)")
    print(f"best of {args.repeats} after {warmup} warm-up run(s); tokens/s counts generated / completion tokens\n")
    results = Results(args.json, {"device": name, "dtype": str(dtype).removeprefix("torch."), "weights": args.weights,
                                  "copy_bandwidth_bytes_per_s": bandwidth, "torch": torch.__version__,
                                  "params": trained.num_params(), "repeats": args.repeats, "warmup": warmup,
                                  "mode": "mixed" if args.mixed else "per-task"})

    if args.mixed:
        header = (f"{'rows':>6} {'P:':>5} {'decode':<9} {'one s':>8} {'tok/s':>10} {'split s':>8} {'tok/s':>10} "
                  f"{'speed-up':>8}")
        print(f"P: {args.prompt_len[0]}-token prompts, {args.new_tokens[0]} new tokens; A: {args.prompt_len[1]} and "
              f"{args.new_tokens[1]}\n{header}\n{'-' * len(header)}")
        for rows in args.batch_sizes:
            for compiled in compile_modes:
                r = mixed(model, device, rows, args, compiled, warmup)
                results.add(r)
                print(f"{rows:>6} {r['p_rows']:>5} {r['decode']:<9} {r['one_batch_s']:>8.3f} "
                      f"{r['one_batch_tokens_per_s']:>10,.0f} {r['per_task_s']:>8.3f} "
                      f"{r['per_task_tokens_per_s']:>10,.0f} {r['speedup']:>7.2f}x", flush=True)
            release_caches(model)
        return

    header = f"{'task':<4} {'batch':>6} {'prompt':>6} {'new':>4} {'decode':<9} {'gen s':>8} {'gen tok/s':>10}"
    if not args.no_logprobs:
        header += f" {'logp tok/s':>11}"
        if args.backward:
            header += f" {'fwd+bwd tok/s':>14} {'checkpointed':>13}"
    if device.type == "cuda":
        header += f" {'floor tok/s':>12} {'% floor':>8} {'peak GiB':>9}"
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
                options = SamplingOptions(max_new_tokens=new, stop_at_eos=False, compile=compiled,
                                          dtype=args.run_dtype)
                run_generate = functools.partial(generate, model, prompts, mask, options, seed=0)
                try:
                    gen_s, out = _time(run_generate, device, warmup, args.repeats)
                except torch.OutOfMemoryError:
                    print(f"{task:<4} {batch:>6} {prompt_len:>6} {new:>4} out of memory")
                    results.add({"task": task, "batch": batch, "prompt": prompt_len, "new": new,
                                 "decode": "compiled" if compiled else "eager", "out_of_memory": True})
                    release_caches(model)
                    torch.cuda.empty_cache()
                    continue
                figures = {"task": task, "batch": batch, "prompt": prompt_len, "new": new,
                           "decode": "compiled" if compiled else "eager", "generate_s": gen_s,
                           "generated_tokens_per_s": batch * new / gen_s}
                row = (
                    f"{task:<4} {batch:>6} {prompt_len:>6} {new:>4} {figures['decode']:<9} "
                    f"{gen_s:>8.3f} {batch * new / gen_s:>10,.0f}"
                )
                if not args.no_logprobs:
                    ids = torch.cat([prompts, out.tokens], dim=1)
                    full_mask = torch.cat([mask, out.mask], dim=1)
                    options = PassOptions(start=prompt_len, chunk_size=args.chunk_size, compile=compiled)
                    logprobs = functools.partial(_autocast_logprobs, ids=ids, attention_mask=full_mask,
                                                 options=options, dtype=args.run_dtype)
                    logprobs_s, _ = _time(torch.no_grad()(functools.partial(logprobs, model)), device, 1, args.repeats)
                    figures["logprob_tokens_per_s"] = batch * new / logprobs_s
                    row += f" {batch * new / logprobs_s:>11,.0f}"
                    if args.backward:
                        for fused, key in ((True, "forward_backward_tokens_per_s"),
                                           (False, "checkpointed_forward_backward_tokens_per_s")):
                            backward = functools.partial(_forward_backward, trained, functools.partial(logprobs, trained),
                                                         fused)
                            backward_s, _ = _time(backward, device, 1, args.repeats)
                            figures[key] = batch * new / backward_s
                            row += f" {batch * new / backward_s:>{14 if fused else 13},.0f}"
                if device.type == "cuda":
                    floor = decode_floor(trained.config, trained.num_params(), batch, prompt_len, new, dtype.itemsize,
                                         bandwidth)
                    figures["decode_floor_tokens_per_s"] = floor
                    row += f" {floor:>12,.0f} {100 * batch * new / gen_s / floor:>7.1f}%"
                    figures["peak_memory_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
                    row += f" {figures['peak_memory_gb']:>9.1f}"
                results.add(figures)
                print(row, flush=True)
            release_caches(model)  # keep one shape's cache at a time


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
