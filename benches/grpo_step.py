"""Whole GRPO steps per second: generation, rewards (with Stockfish), reference pass and update.

The 124M RookWorld-LM configuration with random weights and fixed completion lengths (48 new tokens for P:,
96 for A:, 80/20 mix), so every run does the same work whatever the weights write. Prints samples/s,
generated tokens/s, time per phase, model FLOP utilisation and peak memory, after warm-up steps.

    python benches/grpo_step.py                              # one H100: 128 prompts x group 16
    python benches/grpo_step.py --device cpu --tiny --prompts 4 --group 4 --steps 2   # smoke check here

`--uniform-length N` gives every completion N tokens (for a like-for-like run beside benches/trl_baseline.py).
`--rehearse-cuda` runs on the CPU the code paths and compile settings a CUDA run takes (the draw in blocks,
`after_prompts`, bf16 autocast, every hot path compiled), so that a change to compiling is measured before it
reaches a GPU; `--compile-backend eager` counts its graphs in seconds instead of inductor's minutes. Every run
prints each graph compiled (function, seconds, why it compiled again) as the step that compiled it ends, and
`--json` is rewritten after every step, so that a run cut off by a time limit leaves what it measured.
`--kl-estimator full` measures the exact KL over the vocabulary against the default k3; `--advantage gae` the
value head and GAE.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
from rookworld.net import compile_log, compiling, model as model_module, sampling  # noqa: E402
from rookworld.net.model import GPT, GPTConfig  # noqa: E402
from rookworld.net.sampling import generate  # noqa: E402
from rookworld.settings.config import TrainConfig  # noqa: E402
from rookworld.grpo.models import Sampler  # noqa: E402
from rookworld.grpo.trainer import Trainer  # noqa: E402
from rookworld.net.device import peak_tflops  # noqa: E402
from rookworld.net.tokenizer import vocabulary  # noqa: E402



def model_config(args: argparse.Namespace, vocab_size: int = 50257) -> GPTConfig:
    if args.tiny:
        return GPTConfig(block_size=512, vocab_size=vocab_size, n_layer=2, n_head=2, n_embd=64)
    # GPT-2 small (12 layers, 12 heads, 768 wide, 1024 positions) unless told otherwise.
    return GPTConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, vocab_size=vocab_size)


class FixedLengths(Sampler):
    """Every completion exactly `lengths[task]` tokens, EOS or not: the same work whatever random weights write."""

    def __init__(self, models, cfg, eos_id: int, lengths: dict[str, int]):
        super().__init__(models, cfg, eos_id)
        self.lengths = lengths

    def generate(self, model, ids, mask, tasks, generator, rows_per_prompt, memo=None):
        limits = torch.tensor([self.lengths[t] for t in tasks]).repeat_interleave(rows_per_prompt)
        t0 = time.perf_counter()
        options = dataclasses.replace(self.options, max_new_tokens=limits, stop_at_eos=False)
        out = generate(model, ids, mask, options, generator=generator, rows_per_prompt=rows_per_prompt, memo=memo)
        # Each decoding's own line, as it ends: a first step cut off by a time limit (compiling) still shows how far
        # it got and what each new shape cost.
        print(f"  decoded {out.tokens.shape[0]} rows x {int(limits.max())} tokens after prompts of {ids.shape[1]} in "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        return out


def step_flops(cfg: GPTConfig, n_params: int, groups: list[tuple[int, list[int]]], mu: int, old_pass: bool,
               reference_passes: int, shared: bool, memo: bool = False) -> dict[str, float]:
    """Model FLOPs of one GRPO step over its groups (prompt tokens, each completion's tokens), by phase
    (generate, reference: the reference's and the sampling policy's passes, update): the work the model must do,
    whatever padding the implementation adds (2 per multiply-add; attention included; embedding lookups
    excluded; the lm_head only where a token is predicted). The reference runs once per rollout, or once per
    epoch for the exact KL (then in the update's time). With `shared`, each group's prompt goes through the trunk
    once, else once per row. With `memo`, the update's first pass takes the trunk's products from sampling
    (`ProductMemo`): those are not the update's work."""
    head = cfg.vocab_size * cfg.n_embd
    trunk = n_params - cfg.block_size * cfg.n_embd - head  # the position table is a lookup; wte counts as lm_head
    attn = lambda ctx: 4 * cfg.n_layer * ctx * cfg.n_embd  # QK^T and AV per token at context ctx  # noqa: E731
    total = {"generate": 0.0, "reference": 0.0, "update": 0.0}
    exact = reference_passes > 1  # the exact KL's reference runs inside the update
    for prompt_len, lengths in groups:
        prompts = 1 if shared else len(lengths)
        prompt = prompts * (2 * trunk * prompt_len + attn(prompt_len / 2) * prompt_len)
        gen = prompt + sum(2 * (trunk + head) * n + sum(attn(prompt_len + i) for i in range(n)) for n in lengths)
        fwd = prompt + sum(2 * (trunk + head) * n + attn(prompt_len + n / 2) * n for n in lengths)
        total["generate"] += gen
        total["reference"] += (0 if exact else reference_passes * fwd) + (fwd if old_pass else 0)
        kept = 2 * trunk * (prompts * prompt_len + sum(lengths)) if memo else 0  # first pass's trunk products
        total["update"] += mu * 3 * fwd - kept + (reference_passes * fwd if exact else 0)
    return total


def mm_peak_gflops(n: int = 2048, repeats: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """On the CPU, what torch.mm reaches here at n x n x n in `dtype` (the run's compute dtype) with the threads the
    run used: the machine's own limit that each phase's GFLOP/s is read against."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def rehearse_cuda(trainer: Trainer) -> None:
    """The CUDA paths on the CPU: the draw in blocks, continuations through `after_prompts`, and every function a
    CUDA run compiles compiled (decoding without CUDA graphs, which need a GPU)."""
    sampling.DRAWS = {**sampling.DRAWS, "cpu": sampling._draw_in_blocks}
    model_module.GROUPED_PROMPTS_ON = model_module.GROUPED_PROMPTS_ON - {"cpu"}
    trainer.run.context = dataclasses.replace(trainer.run.context, compile=True,
                                              compile_logprobs=trainer.cfg.compile_logprobs)
    trainer.models.compile = True
    compiled = dataclasses.replace(trainer.models.options, compile=trainer.cfg.compile_logprobs)
    trainer.models.options = trainer.models.policy_pass.options = compiled  # the reference's passes and the update's
    trainer.sampler.options = dataclasses.replace(trainer.sampler.options, compile=True)


def write_json(path: str | None, figures: dict) -> None:
    """Atomically: a reader polling the file (benches/gpu_suite.py) never sees half of it."""
    if path:
        tmp = Path(path + ".tmp")
        tmp.write_text(json.dumps(figures, indent=2) + "\n")
        tmp.replace(path)


class Compiles:
    """The graphs compiled so far, each with its step, in the progress figures: collected after each step and each
    time dynamo begins another graph, so that a run cut off while it compiles still has the graphs it finished."""

    def __init__(self, progress: dict, path: str | None):
        self.progress, self.path, self.step = progress, path, 1
        self.log, self.graphs = compile_log.CompileLog(), []
        compile_log.announce_compiles(self.announce)

    def collect(self) -> None:
        self.graphs += [(self.step, g) for g in self.log.new()]
        self.progress["compiled"] = [{**g.row(), "step": step} for step, g in self.graphs]

    def of_step(self, step: int) -> list[compile_log.Graph]:
        self.collect()
        self.progress.pop("compiling", None)
        return [g for s, g in self.graphs if s == step]

    def announce(self, text: str) -> None:
        print("  " + text, file=sys.stderr, flush=True)
        self.collect()
        self.progress["compiling"] = text
        write_json(self.path, self.progress)


def print_graphs(graphs: list[dict]) -> None:
    if not graphs:
        print("graphs compiled: none")
        return
    count = sum(not g.get("backward") for g in graphs)
    print(f"graphs compiled: {count} (and the backwards listed), {sum(g['seconds'] for g in graphs):.1f} s")
    print(f"  {'step':>4}  {'seconds':>8}  function (why it compiled again)")
    for g in graphs:
        print(f"  {g['step']:>4}  {g['seconds']:>8.1f}  {g['name']}" + (f" ({g['reason']})" if g["reason"] else ""))


def profile(trainer: Trainer, args: argparse.Namespace) -> dict:
    """One more step under the profiler (benches/step_profile.py), its account printed and written to
    --profile."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import step_profile

    try:
        summary = step_profile.profile_step(trainer.train_step, trainer.run.device)
    except Exception as e:  # noqa: BLE001 (the profiler's own failure, CUPTI's among them, must not cost the figures)
        summary = {"error": f"{type(e).__name__}: {str(e).strip()[:300]}"}
        print(f"the profiled step failed ({summary['error']}); the measured figures stand", file=sys.stderr)
    else:
        print(step_profile.table(summary), file=sys.stderr, flush=True)
    Path(args.profile).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model (CPU smoke check)")
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-head", type=int, default=12)
    ap.add_argument("--n-embd", type=int, default=768, help="width (LEARNING.md's small model: 12 layers, 128 wide)")
    ap.add_argument("--prompts", type=int, default=128, help="prompts per step")
    ap.add_argument("--group", type=int, default=16, help="completions per prompt")
    ap.add_argument("--p-len", type=int, default=48)
    ap.add_argument("--a-len", type=int, default=96)
    ap.add_argument("--uniform-length", type=int, default=None, help="every completion this long")
    ap.add_argument("--task-mix", type=float, default=0.8)
    ap.add_argument("--steps", type=int, default=5, help="measured steps")
    ap.add_argument("--warmup", type=int, default=2, help="steps before measuring (compilation, caches)")
    ap.add_argument("--micro-batch-size", type=int, default=256)
    ap.add_argument("--mu", type=int, default=1)
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--kl-estimator", default="k3", choices=("k1", "k2", "k3", "full"))
    ap.add_argument("--advantage", default="grpo", choices=("grpo", "gae"))
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--compile-logprobs", action=argparse.BooleanOptionalAction, default=None,
                    help="with compiling, the log-prob passes too (one transformer block for every layer, and the "
                    "vocabulary passes), as rookworld train --compile-logprobs; default: train's (decoding alone)")
    ap.add_argument("--rehearse-cuda", action="store_true", help="on the CPU, the code paths and compile settings of "
                    "a CUDA run (bf16 unless --dtype says otherwise)")
    ap.add_argument("--compile-cache", default=None, help="load torch.compile's cache artifacts from this file first "
                    "if it exists, and save them to it after the warm-up (what `rookworld train --resume` does with "
                    "its run directory's compile_cache.bin)")
    ap.add_argument("--compile-backend", default="inductor", choices=("inductor", "aot_eager", "eager"),
                    help="torch.compile's backend (eager: dynamo's graphs without compiling them, to count them fast)")
    ap.add_argument("--no-shared-prompt", action="store_true", help="compute every row's prompt (today's default "
                    "computes each group's once)")
    ap.add_argument("--dtype", default="auto", choices=("auto", "bf16", "fp32"))
    ap.add_argument("--vocabulary", default="gpt2", choices=("gpt2", "chess"), help="the model's vocabulary (as "
                    "sft --init --vocabulary makes it)")
    ap.add_argument("--stockfish-depth", type=int, default=10)
    ap.add_argument("--stockfish-workers", type=int, default=None)
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="the card's dense bf16 peak for MFU (default: rookworld.net.device.peak_tflops of its name)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--profile", default=None, metavar="FILE", help="after the measured steps, one more under "
                    "torch.profiler: the kernels (the CPU's operators without a GPU) that take the most time, each "
                    "with its share and phase, the syncs and peak memory, printed, written to FILE (JSON) and "
                    "kept in --json's figures")
    args = ap.parse_args()

    lengths = {"P": args.uniform_length or args.p_len, "A": args.uniform_length or args.a_len}
    if args.rehearse_cuda and args.device != "cpu":
        ap.error("--rehearse-cuda rehearses a CUDA run on the CPU: give --device cpu (the default without a GPU)")
    if args.rehearse_cuda and args.dtype == "auto":
        args.dtype = "bf16"
    if args.compile_backend != "inductor":
        compiling.torch.compile = functools.partial(torch.compile, backend=args.compile_backend)
        compiling.DYNAMIC_OPTIONS = {}  # inductor's settings: another backend has none
    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig(
            steps=args.warmup + args.steps + 1 + bool(args.profile), prompts_per_step=args.prompts,
            group_size=args.group,
            max_new_tokens=max(lengths.values()), task_mix=args.task_mix, device=args.device, dtype=args.dtype,
            compile=not args.no_compile, micro_batch_size=args.micro_batch_size, mu=args.mu, beta=args.beta,
            stockfish_depth=args.stockfish_depth, stockfish_workers=args.stockfish_workers, output_dir=out,
            kl_estimator=args.kl_estimator, advantage=args.advantage, shared_prompt=not args.no_shared_prompt,
            eval_every=0, save_every=0, sample_every=0, log_every=1000, warmup_steps=0,
            **({} if args.compile_logprobs is None else {"compile_logprobs": args.compile_logprobs}),
        ).validate()
        torch.manual_seed(0)
        tokenizer = vocabulary(args.vocabulary)
        mcfg = model_config(args, tokenizer.vocab_size)
        policy = GPT(mcfg).to(args.device)
        reference = copy.deepcopy(policy) if args.beta > 0 else None
        trainer = Trainer(cfg, policy=policy, reference=reference, tokenizer=tokenizer, stream=open(os.devnull, "w"),
                          process_settings=True)
        trainer.sampler = FixedLengths(trainer.models, cfg, trainer.run.tokenizer.eos_id, lengths)
        if args.rehearse_cuda:
            rehearse_cuda(trainer)
        n_params = sum(p.numel() for p in policy.parameters())
        print(f"model: {n_params / 1e6:.1f}M parameters on {args.device}; {args.prompts} prompts x group "
              f"{args.group}; completions P:{lengths['P']} A:{lengths['A']} tokens; mix {args.task_mix}"
              f"{'; rehearsing CUDA' if args.rehearse_cuda else ''}", file=sys.stderr)
        rows, steps = [], []
        progress = {"complete": False, "device": args.device, "params_m": n_params / 1e6, "prompts": args.prompts,
                    "group": args.group, "lengths": lengths, "compile": trainer.models.compile,
                    "compile_logprobs": trainer.models.options.compile,
                    "rehearse_cuda": args.rehearse_cuda, "compile_backend": args.compile_backend,
                    "steps": steps, "compiled": []}
        write_json(args.json, progress)
        workers = trainer.pool.workers if trainer.pool is not None else None
        if args.compile_cache and Path(args.compile_cache).is_file():
            torch.compiler.load_cache_artifacts(Path(args.compile_cache).read_bytes())
            print(f"loaded the compile cache {args.compile_cache}", file=sys.stderr)
        compiles = Compiles(progress, args.json)
        try:
            for i in range(args.warmup + args.steps):
                compiles.step = i + 1
                m = trainer.train_step()
                new = compiles.of_step(i + 1)
                tag = "warm-up" if i < args.warmup else "measured"
                phases = {k: m[f"time/{k}"] for k in ("generate", "reward", "reference", "update") if f"time/{k}" in m}
                print(f"step {i + 1} ({tag}): {m['time/step']:.3f} s, {m['samples_per_s']:,.0f} samples/s ("
                      + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()) + f"), loss {m['loss']!r}"
                      + (f"; compiled {compile_log.summary(new)}" if new else ""), file=sys.stderr, flush=True)
                steps.append({"step": i + 1, "warmup": i < args.warmup, "step_s": m["time/step"],
                              "samples_per_s": m["samples_per_s"], **{f"{k}_s": v for k, v in phases.items()},
                              "compiling_s": sum(g.seconds for g in new), "graphs": sum(not g.backward for g in new),
                              "peak_memory_gb": m["peak_memory_gb"], "loss": m["loss"],
                              "kl": m.get("kl/mean")})
                write_json(args.json, progress)
                if args.compile_cache and i + 1 == args.warmup:
                    saved = torch.compiler.save_cache_artifacts()
                    if saved is not None:
                        Path(args.compile_cache).write_bytes(saved[0])
                if i >= args.warmup:
                    rows.append(m)
            if args.profile:
                progress["profile"] = profile(trainer, args)
                write_json(args.json, progress)
            groups_of_steps = []  # (prompt tokens, [completion tokens]) of every group of each measured step
            p_prompts = []
            for i in range(args.warmup, args.warmup + args.steps):
                prompts = trainer.prompts.batch(i)
                p_prompts.append(sum(p.task == "P" for p in prompts))
                _, mask = trainer.run.tokenizer.encode_batch([p.text for p in prompts], bos=True)
                groups_of_steps.append([(int(n), [lengths[p.task]] * args.group) for p, n in zip(prompts, mask.sum(1))])
        finally:
            trainer.close()

    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    samples = args.prompts * args.group
    objective = trainer.objective  # which passes a step runs is the objective's to say
    old_pass = objective.passes.sampler
    reference_passes = 0 if not objective.measures_kl else args.mu if objective.exact_kl else 1
    width = max(p for g in groups_of_steps for p, _ in g)
    memo = trainer.models.product_memo(args.prompts, width, samples, max(lengths.values()), 0) is not None
    per_step = [step_flops(mcfg, n_params, g, args.mu, old_pass, reference_passes, not args.no_shared_prompt, memo)
                for g in groups_of_steps]
    phase_flops = {k: statistics.mean(f[k] for f in per_step) for k in per_step[0]}
    flops = sum(phase_flops.values())
    step_time = med("time/step")
    cuda = args.device.startswith("cuda")
    peak = args.peak_tflops or (peak_tflops(torch.cuda.get_device_name()) if cuda else None)
    figures = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "params_m": n_params / 1e6, "prompts": args.prompts, "group": args.group, "lengths": lengths,
        "samples_per_s": samples / step_time, "generated_tokens_per_s": med("tokens_per_s"),
        "step_s": step_time, "generate_s": med("time/generate"), "reward_s": med("time/reward"),
        "reference_s": med("time/reference"), "update_s": med("time/update"),
        "mfu": flops / step_time / (peak * 1e12) if peak else None,
        "peak_memory_gb": max(r["peak_memory_gb"] for r in rows), "compile": trainer.models.compile,
        "update_padding": med("padding"), "kl_estimator": args.kl_estimator, "advantage": args.advantage,
        "shared_prompt": not args.no_shared_prompt, "threads": torch.get_num_threads(),
        "stockfish_workers": workers, "product_memo": memo,
        "p_prompts": statistics.mean(p_prompts),
        # Model FLOPs a phase does over the time it took (2 a multiply-add; see step_flops).
        "gflops": {k: phase_flops[k] / med(f"time/{k}") / 1e9 for k in phase_flops},
        "step_gflops": flops / step_time / 1e9,
        # A rehearsal measures compiling, not this CPU's speed (and bf16 products without AMX take minutes here).
        "mm_peak_gflops": (mm_peak_gflops(dtype=trainer.run.context.amp_dtype or torch.float32)
                           if args.device == "cpu" and not args.rehearse_cuda else None),
        "dtype": "bf16" if trainer.run.context.amp_dtype is not None else "fp32",
    }
    figures = {**progress, **figures, "complete": True}
    print(f"\n{'samples/s':<22}{figures['samples_per_s']:>12,.2f}")
    print(f"{'generated tokens/s':<22}{figures['generated_tokens_per_s']:>12,.0f}")
    print(f"torch threads {figures['threads']}, Stockfish workers {figures['stockfish_workers']}, "
          f"{figures['p_prompts']:.0f} P: prompts a step; the update's first pass takes sampling's products: "
          f"{'yes' if memo else 'no'}")
    for k in ("step_s", "generate_s", "reward_s", "reference_s", "update_s"):
        phase = k.removesuffix("_s")
        rate = figures["step_gflops"] if phase == "step" else figures["gflops"].get(phase)
        peak = figures["mm_peak_gflops"]
        shown = "" if rate is None else f"{rate:>10.1f} GFLOP/s" + (f" ({100 * rate / peak:.0f}% of mm)" if peak else "")
        print(f"{k.replace('_s', ' (s)'):<22}{figures[k]:>12.3f}{shown}")
    if figures["mm_peak_gflops"]:
        print(f"{'torch.mm 2048^3':<22}{figures['mm_peak_gflops']:>12.1f} GFLOP/s (the CPU's own limit here, in "
              f"{figures['dtype']}, the run's compute dtype)")
    mfu = "n/a" if figures["mfu"] is None else f"{100 * figures['mfu']:.1f}%"
    print(f"{'MFU':<22}{mfu:>12}")
    print(f"{'peak memory (GB)':<22}{figures['peak_memory_gb']:>12.2f}")
    print(f"{'update padding':<22}{100 * figures['update_padding']:>11.1f}%")
    print_graphs(figures["compiled"])
    write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
