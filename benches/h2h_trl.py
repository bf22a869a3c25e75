"""Learning per hour: a shipped SFT model trained by TRL's GRPOTrainer with rookworld's reward functions, and by
`rookworld train`, on the same positions, group size, reward, learning rate and wall-clock budget; both evaluated
afterwards on the same held-out positions at the same wall-clock marks (issue 46; issue 60: TRL's trainer scoring
where it sampled, `rookworld.integrations.trl.GRPOTrainer`, and the chess-play chain).

`--chain chess-cpu` (the default) trains models/chess-cpu-sft on 4,000 generated positions it annotates itself and
evaluates on data/chess-cpu-held-out.jsonl; `--chain chess-play` trains models/chess-play-sft on the shipped
data/chess-play-prompts.jsonl (annotated at depth 6) and evaluates on data/chess-play-held-out.jsonl. The trainer
`rookworld-a4` is `rookworld train` with A: completions held to the reference at 4 x beta (`--a-beta-scale 4`,
the chess-play preset's), which TRL has no counterpart of.

Both trainers get the settings of the chess-cpu preset's [train]: 8 prompts of 8 completions a step (80/20 P:/A:),
temperature 0.7, up to 144 new tokens, lr 1e-4 after 5 warm-up steps and constant (so that neither depends on a
step count it never reaches), AdamW betas 0.9/0.95 without weight decay, gradient norm 1, beta 0.04 with the k3
KL, clipping 0.2 / 0.28 with token-level (DAPO) loss, one update per rollout, float32. The positions are one
annotated file (Stockfish depth 6), so neither trainer waits on Stockfish. The clock starts when the trainer's
process is launched (imports, loading and start-up count); a checkpoint's time is its weights file's. Nothing is
evaluated during training: every checkpoint at or before each mark is evaluated afterwards with `rookworld eval`.

    python benches/h2h_trl.py --budget 360 --seeds 0 1 --out h2h      # about 40 minutes on 2 cores
    python benches/h2h_trl.py --chain chess-play --budget 360 --marks 180 360 --seeds 0 1 2 --out h2h-play
    python benches/h2h_trl.py --budget 20 --seeds 0 --marks 20 --eval-size 8 --out /tmp/h2h   # smoke

Needs `pip install 'rookworld[trl]'` and Stockfish.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Chain:
    model: Path
    held_out: Path
    preset: str
    prompts: Path | None  # annotated training positions that ship; None: generated and annotated here


CHAINS = {"chess-cpu": Chain(REPO / "models" / "chess-cpu-sft", REPO / "data" / "chess-cpu-held-out.jsonl",
                             "chess-cpu", None),
          "chess-play": Chain(REPO / "models" / "chess-play-sft", REPO / "data" / "chess-play-held-out.jsonl",
                              "chess-play", REPO / "data" / "chess-play-prompts.jsonl")}

# The chess-cpu preset's [train], spelled for both trainers.
PROMPTS, GROUP, LR, WARMUP, BETA, TEMPERATURE, MAX_NEW_TOKENS = 8, 8, 1e-4, 5, 0.04, 0.7, 144
TRAINERS = ("rookworld", "trl", "rookworld-a4")


def run(cmd: list[str], **kw) -> None:
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run(cmd, check=True, **kw)


def positions(chain: Chain, out: Path, count: int) -> Path:
    if chain.prompts is not None:
        return chain.prompts
    path = out / "train.jsonl"
    if not path.exists():
        run([sys.executable, "-m", "rookworld", "positions", "--count", str(count), "--seed", "7", "--annotate",
             "--stockfish-depth", "6", "--layout", "compact", "--a-history", "full", "--exclude", str(chain.held_out),
             "--out", str(path)])
    return path


def rookworld_command(chain: Chain, data: Path, seed: int, run_dir: Path, a_beta_scale: float) -> list[str]:
    # The preset's other settings (model shape, vocabulary, Stockfish depth) stand; what both trainers share is set.
    return [sys.executable, "-m", "rookworld", "train", "--config", chain.preset, "--model", str(chain.model),
            "--data", str(data), "--seed", str(seed), "--output-dir", str(run_dir), "--steps", "100000",
            "--prompts-per-step", str(PROMPTS), "--group-size", str(GROUP), "--lr", str(LR),
            "--warmup-steps", str(WARMUP), "--min-lr-ratio", "1", "--beta", str(BETA),
            "--temperature", str(TEMPERATURE), "--max-new-tokens", str(MAX_NEW_TOKENS), "--dtype", "fp32",
            "--eval-every", "0", "--save-every", "5", "--keep-checkpoints", "100000", "--log-every", "10",
            "--task-mix", "0.8", "--a-beta-scale", str(a_beta_scale)]


def trl_worker(chain: Chain, data: Path, seed: int, run_dir: Path) -> None:
    """TRL's GRPOTrainer, in this process, until its launcher stops it."""
    import torch
    import transformers
    import trl

    from rookworld.integrations.trl import GRPOTrainer, chess_dataset, load_tokenizer, reward_funcs

    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel.from_pretrained(chain.model, dtype=torch.float32)
    tokenizer = load_tokenizer(chain.model)
    dataset = chess_dataset(str(data), seed=seed, task_mix=0.8)
    config = trl.GRPOConfig(
        output_dir=str(run_dir), max_steps=100_000, per_device_train_batch_size=PROMPTS * GROUP,
        num_generations=GROUP, max_completion_length=MAX_NEW_TOKENS, temperature=TEMPERATURE, learning_rate=LR,
        lr_scheduler_type="constant_with_warmup", warmup_steps=WARMUP, adam_beta1=0.9, adam_beta2=0.95,
        weight_decay=0.0, max_grad_norm=1.0, beta=BETA, epsilon=0.2, epsilon_high=0.28, loss_type="dapo",
        num_iterations=1, use_cpu=True, bf16=False, gradient_checkpointing=False, logging_steps=1,
        report_to="none", save_strategy="steps", save_steps=1, save_only_model=True, seed=seed)
    # rookworld's GRPOTrainer is TRL's with policy and reference scoring the positions generate sampled at: with
    # TRL's own, a left-padded P: prompt was trained k positions off where it was sampled, and its KL ran away
    # (issue 60; the runs in BENCHMARKS.md before it).
    trainer = GRPOTrainer(model=model, reward_funcs=reward_funcs("mixed"), args=config, train_dataset=dataset,
                          processing_class=tokenizer)
    trainer.train()


def train(chain_name: str, trainer: str, data: Path, seed: int, budget: float, run_dir: Path) -> float:
    """Runs one trainer for `budget` seconds from launch; returns the launch time."""
    if trainer.startswith("rookworld"):
        cmd = rookworld_command(CHAINS[chain_name], data, seed, run_dir, 4.0 if trainer == "rookworld-a4" else 1.0)
    else:
        cmd = [sys.executable, __file__, "--trl-worker", "--chain", chain_name, "--seed", str(seed), "--data",
               str(data), "--run-dir", str(run_dir)]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = open(run_dir.parent / f"{run_dir.name}.log", "w")
    print("+", " ".join(cmd), flush=True)
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        proc.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # checkpoints after the budget would not count anyway
        proc.wait()
    log.close()
    return start


def checkpoints(trainer: str, run_dir: Path, start: float) -> list[tuple[float, int, Path]]:
    """(seconds from launch, step, directory) of every complete checkpoint, oldest first."""
    if trainer.startswith("rookworld"):
        found = [(int(d.name.split("-")[1]), d) for d in (run_dir / "checkpoints").glob("step-*")]
    else:
        found = [(int(d.name.split("-")[1]), d) for d in run_dir.glob("checkpoint-*")]
    out = []
    for step, d in found:
        weights = d / "model.safetensors"
        if weights.exists() and (d / "config.json").exists():
            out.append((weights.stat().st_mtime - start, step, d))
    return sorted(out)


def evaluate(chain: Chain, model: Path, eval_size: int, out: Path) -> dict:
    if not out.exists():
        for name in ("vocab.json", "merges.txt"):  # TRL's checkpoints hold the tokenizer as tokenizer.json
            if not (model / name).exists():
                (model / name).write_bytes((chain.model / name).read_bytes())
        run([sys.executable, "-m", "rookworld", "eval", "--model", str(model), "--data", str(chain.held_out),
             "--eval-size", str(eval_size), "--suite", "best-move", "--out", str(out)],
            stdout=subprocess.DEVNULL)
    sections = json.loads(out.read_text())["suites"]["best-move"]["sections"]
    return {"legal_best_move": sections["P"]["legal_best_move"], "best_move": sections["P"]["best_move_accuracy"],
            "top5": sections["P"]["top5_accuracy"], "next_state_exact": sections["A"]["next_state_exact"],
            "p_reward": sections["P"]["mean_reward"], "a_reward": sections["A"]["mean_reward"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chain", choices=sorted(CHAINS), default="chess-cpu", help="the SFT model and its positions")
    ap.add_argument("--budget", type=float, default=360, help="seconds of wall clock per run")
    ap.add_argument("--marks", type=float, nargs="*", default=None, help="seconds at which to evaluate "
                    "(default: thirds of the budget)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--trainers", nargs="+", default=list(TRAINERS), choices=TRAINERS)
    ap.add_argument("--positions", type=int, default=4000, help="training positions")
    ap.add_argument("--eval-size", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("h2h"))
    ap.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trl_worker:
        trl_worker(CHAINS[args.chain], args.data, args.seed, args.run_dir)
        return 0

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    marks = args.marks or [args.budget * k / 3 for k in (1, 2, 3)]
    chain = CHAINS[args.chain]
    data = positions(chain, out, args.positions)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {"runs": {}}
    results |= {"budget_s": args.budget, "marks_s": marks, "eval_size": args.eval_size,
                "base": evaluate(chain, chain.model, args.eval_size, out / "eval-base.json"), "chain": args.chain}
    for seed in args.seeds:
        for trainer in args.trainers:
            name = f"{trainer}-s{seed}"
            run_dir = out / name
            if name not in results["runs"]:
                start = train(args.chain, trainer, data, seed, args.budget, run_dir)
                found = checkpoints(trainer, run_dir, start)
                results["runs"][name] = {"trainer": trainer, "seed": seed, "checkpoints":
                                         [[round(t, 1), step, str(d)] for t, step, d in found]}
                results_path.write_text(json.dumps(results, indent=1))
            entry = results["runs"][name]
            entry["marks"] = []
            for mark in marks:
                done = [c for c in entry["checkpoints"] if c[0] <= mark]
                if not done:
                    entry["marks"].append({"mark_s": mark, "step": 0, **results["base"]})
                    continue
                t, step, d = done[-1]
                figures = evaluate(chain, Path(d), args.eval_size, out / f"eval-{name}-{step}.json")
                entry["marks"].append({"mark_s": mark, "time_s": t, "step": step, **figures})
            results_path.write_text(json.dumps(results, indent=1))
            print(name, json.dumps(entry["marks"]), flush=True)
    table(results)
    plot(results, out / "h2h.png")
    return 0


def plot(results: dict, path: Path) -> None:
    """Each figure against wall-clock seconds, a line per run (solid rookworld, dashed TRL), from the SFT model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [("legal_best_move", "legal best move"), ("top5", "Stockfish's five"), ("next_state_exact", "next state exact")]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.4), constrained_layout=True)
    colours = {"rookworld": "tab:blue", "trl": "tab:orange", "rookworld-a4": "tab:green"}
    labels = {"rookworld": "rookworld train", "trl": "TRL GRPOTrainer", "rookworld-a4": "rookworld, A: beta x 4"}
    for ax, (key, label) in zip(axes, keys):
        for name, entry in sorted(results["runs"].items()):
            xs = [0.0] + [m["mark_s"] for m in entry["marks"]]
            ys = [results["base"][key]] + [m[key] for m in entry["marks"]]
            ax.plot(xs, ys, marker="o", color=colours[entry["trainer"]],
                    linestyle="--" if entry["trainer"] == "trl" else "-",
                    label=f"{labels[entry['trainer']]}, seed {entry['seed']}")
        ax.set_title(label)
        ax.set_xlabel("wall clock from launch (s)")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower left", fontsize=8)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def table(results: dict) -> None:
    base = results["base"]
    print("| trainer | seed | mark (s) | steps | legal best | best | top 5 | next state exact |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print(f"| SFT model | | 0 | 0 | {base['legal_best_move']:.1%} | {base['best_move']:.1%} | {base['top5']:.1%} | "
          f"{base['next_state_exact']:.1%} |")
    for name, entry in sorted(results["runs"].items()):
        for m in entry.get("marks", []):
            print(f"| {entry['trainer']} | {entry['seed']} | {m['mark_s']:.0f} | {m['step']} | "
                  f"{m['legal_best_move']:.1%} | {m['best_move']:.1%} | {m['top5']:.1%} | "
                  f"{m['next_state_exact']:.1%} |")


if __name__ == "__main__":
    sys.exit(main())
