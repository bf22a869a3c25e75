"""Does GRPO make the model better? The whole chain in one command, sized by flags:

  1. generate training and held-out positions (held-out FENs never among the training ones) and annotate them
     with Stockfish (`rookworld positions --annotate`);
  2. supervised training of a fresh GPT-2 on their P:/A: samples (`rookworld sft`), then greedy evaluation on
     the held-out positions (`rookworld eval`);
  3. GRPO from the SFT model for each seed (`rookworld train`), and the same evaluation again.

Prints a before/after table of every suite (P: format validity, mean reward, legal best move, best-move accuracy,
top 5; A: format validity, mean reward, next state exact, FEN similarity, all on the held-out positions;
mate-in-one, self-play legal half-moves and the score against Stockfish on their own generated positions),
writes every figure as JSON and a PNG of the GRPO runs' curves (`rookworld plot`, needs matplotlib), all under
--out.

    python benches/learning.py --out runs/learning                  # the defaults: on 2 CPU cores about 65 min
                                                                    # of SFT, then 40 min a GRPO seed
    python benches/learning.py --out runs/learning --reuse          # the same start, other GRPO settings
    python benches/learning.py --out /tmp/l --smoke                 # every stage at a tiny size (CI)

The chess-cpu chain (issue 34; the `chess-cpu` preset's model and SFT settings, the bench's own data seeds): the
chess vocabulary, unpadded P: text, 100,000 positions at depth 6, about 90 minutes of SFT, then three GRPO seeds:

    python benches/learning.py --out runs/chess-cpu-chain --train-positions 100000 --eval-positions 2000 \
        --depth 6 --vocabulary chess --layout compact --sft-steps 10000 --sft-args "--warmup-steps 100" \
        --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
from rookworld import cli  # noqa: E402

#: The before/after table: (task or suite section, metric, label).
ROWS = [("P", "format_valid", "format validity"), ("P", "mean_reward", "mean reward"),
        ("P", "legal_best_move", "legal best move"), ("P", "best_move_accuracy", "best-move accuracy"),
        ("P", "top5_accuracy", "best move in top 5"), ("A", "format_valid", "format validity"),
        ("A", "mean_reward", "mean reward"), ("A", "next_state_exact", "next state exact"),
        ("A", "fen_similarity", "FEN similarity"), ("mate-in-one", "mate_rate", "mate in one"),
        ("mate-in-one", "legal_best_move", "legal best move"),
        ("selfplay/greedy", "legal_half_moves", "legal half-moves"),
        ("selfplay/rookworld", "legal_half_moves", "legal half-moves (s)"), ("vs-stockfish", "score", "score")]


def rookworld(*args: str, log: Path) -> None:
    """One `rookworld` command, run in this process (no second start-up of torch per stage); its output goes to
    `log`, and a failure stops the chain with that output."""
    t0 = time.perf_counter()
    with log.open("w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        try:
            code = cli.main(list(args))
        except SystemExit as e:  # argparse's own exit
            code = e.code
    print(f"  rookworld {args[0]}: {time.perf_counter() - t0:.0f} s (log: {log})", file=sys.stderr)
    if code:
        sys.stderr.write(log.read_text()[-3000:])
        raise SystemExit(f"rookworld {args[0]} failed (exit {code}); see {log}")


def held_out_without(train: Path, held_out: Path) -> None:
    """Drops held-out positions whose FEN is among the training ones (openings recur across seeds)."""
    seen = {json.loads(line)["fen"] for line in train.read_text().splitlines() if line.strip()}
    lines = [line for line in held_out.read_text().splitlines() if line.strip() and json.loads(line)["fen"] not in seen]
    held_out.write_text("".join(line + "\n" for line in lines))


def sft_model(sft: Path, reused: bool) -> dict:
    """What the SFT model really is: with --reuse, the SFT flags of this call did not make it, so the figures name
    its own architecture and the settings it was trained with."""
    from rookworld.harness import checkpoint

    try:
        training = checkpoint.load_config(checkpoint.resolve_checkpoint(sft))
    except checkpoint.CheckpointError:  # a model from elsewhere, without our checkpoints
        training = None
    return {"path": str(sft.resolve()), "reused": reused, "config": json.loads((sft / "config.json").read_text()),
            "training": training}


def table(before: dict, after: dict[str, dict]) -> str:
    seeds = list(after)
    head = f"{'suite':<20}{'metric':<22}{'SFT':>8}" + "".join(f"{'GRPO s' + s:>10}" for s in seeds)
    head += f"{'mean gain':>11}{'seed spread':>13}"
    lines = [head, "-" * len(head)]
    for task, key, label in ROWS:
        b = before.get(task, {}).get(key)
        vals = [after[s].get(task, {}).get(key) for s in seeds]
        if b is None or any(v is None for v in vals):
            continue
        gain = sum(vals) / len(vals) - b
        spread = max(vals) - min(vals)
        lines.append(f"{task + ':':<20}{label:<22}{b:>8.3f}" + "".join(f"{v:>10.3f}" for v in vals)
                     + f"{gain:>+11.3f}{spread:>13.3f}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for every file of the chain")
    ap.add_argument("--smoke", action="store_true", help="every stage at a tiny size, in well under a minute")
    ap.add_argument("--train-positions", type=int, default=4000)
    ap.add_argument("--eval-positions", type=int, default=200)
    ap.add_argument("--eval-data", default=None, help="held-out positions to use (annotated JSONL) instead")
    ap.add_argument("--depth", type=int, default=8, help="Stockfish depth of the annotations and rewards")
    ap.add_argument("--init", default="tiny", help="size of the fresh model: tiny, mini or small")
    ap.add_argument("--layers", type=int, default=12, help="its layers (tiny has 2: depth is cheap beside the "
                                                           "vocabulary projection, and 12 layers learn both formats "
                                                           "above 90%% where 6 stay near 90%%)")
    ap.add_argument("--heads", type=int, default=4, help="its attention heads")
    ap.add_argument("--vocabulary", default="gpt2", choices=("gpt2", "chess"),
                    help="the fresh model's vocabulary (rookworld sft --vocabulary)")
    ap.add_argument("--layout", default=None, choices=("rookworld", "compact"),
                    help="P: text layout of the positions written (rookworld positions --layout; default rookworld)")
    ap.add_argument("--sft-steps", type=int, default=1500)
    ap.add_argument("--sft-lr", type=float, default=1e-3)
    ap.add_argument("--sft-loss-on", default="target", help="all or target (rookworld sft --loss-on)")
    ap.add_argument("--seq-len", type=int, default=256, help="longest SFT document (P:/A: samples: under 190)")
    ap.add_argument("--rows-per-step", type=int, default=16, help="SFT documents per step")
    ap.add_argument("--grpo-steps", type=int, default=30)
    ap.add_argument("--grpo-lr", type=float, default=1e-4, help="GRPO learning rate (for an 8M-parameter model; "
                                                                  "rookworld train's default suits the 124M one)")
    ap.add_argument("--prompts", type=int, default=8, help="GRPO prompts per step")
    ap.add_argument("--group", type=int, default=8, help="GRPO completions per prompt")
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--temperature", type=float, default=0.7,
                    help="GRPO sampling temperature: the held-out evaluation decodes greedily, and GRPO only "
                         "corrects the failures it samples (LEARNING.md)")
    ap.add_argument("--eval-every", type=int, default=10, help="GRPO steps between held-out evaluations")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="one GRPO run per seed")
    ap.add_argument("--mate-positions", type=int, default=500, help="generated positions of the mate-in-one suite")
    ap.add_argument("--games", type=int, default=32, help="games of the selfplay and vs-stockfish suites")
    ap.add_argument("--max-new-tokens", type=int, default=144, help="completion limit of sampling and evaluation")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--reuse", action="store_true", help="keep the positions and the SFT model that --out already "
                                                          "holds (to try other GRPO settings on the same start)")
    ap.add_argument("--sft-args", default="", help="more flags for rookworld sft, as one string")
    ap.add_argument("--grpo-args", default="", help="more flags for rookworld train, as one string")
    args = ap.parse_args()
    if args.smoke:
        args.train_positions, args.eval_positions, args.depth = 24, 6, 4
        args.layers, args.sft_steps, args.rows_per_step = 2, 4, 2
        args.grpo_steps, args.prompts, args.group, args.eval_every, args.seeds = 2, 2, 2, 2, [0]
        args.max_new_tokens, args.mate_positions, args.games = 24, 4, 1

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = ["--stockfish-depth", str(args.depth)]
    layout = ["--layout", args.layout] if args.layout else []
    limit = ["--max-new-tokens", str(args.max_new_tokens)]
    t0 = time.perf_counter()
    print(f"learning chain into {out}", file=sys.stderr)
    train, held_out = out / "train.jsonl", Path(args.eval_data or out / "held_out.jsonl")
    reuse = args.reuse and train.is_file() and held_out.is_file() and (out / "sft" / "config.json").is_file()
    if not reuse:
        rookworld("positions", "--count", str(args.train_positions), "--seed", "1", "--annotate", "--a-history",
                  "full", "--out", str(train), "--quiet", *common, *layout, log=out / "positions_train.log")
    if not reuse and not args.eval_data:
        rookworld("positions", "--count", str(args.eval_positions), "--seed", "2", "--annotate", "--a-history",
                  "full", "--out", str(held_out), "--quiet", *common, *layout, log=out / "positions_held_out.log")
        held_out_without(train, held_out)
    n_eval = sum(1 for line in held_out.read_text().splitlines() if line.strip())

    sft = out / "sft"
    if not reuse:
        rookworld("sft", "--init", args.init, "--n-layer", str(args.layers), "--n-head", str(args.heads),
                  "--vocabulary", args.vocabulary,
                  "--loss-on", args.sft_loss_on, "--data", str(train), "--eval-data", str(held_out), "--output-dir",
                  str(sft), "--overwrite", "--steps", str(args.sft_steps), "--lr", str(args.sft_lr), "--seq-len",
                  str(args.seq_len), "--rows-per-step", str(args.rows_per_step), "--eval-every",
                  str(args.sft_steps if args.smoke else max(1, args.sft_steps // 5)), "--eval-size", str(n_eval),
                  "--save-every", str(args.sft_steps), "--warmup-steps", str(min(20, args.sft_steps)), "--device",
                  args.device, "--stockfish-depth", str(args.depth), *limit, *args.sft_args.split(),
                  log=out / "sft.log")

    def evaluate(model: Path, name: str) -> dict:
        """Every suite: best-move on the held-out positions, the others on their own generated positions (a
        held-out file has few mates in one)."""
        best, rest = out / f"eval_{name}.json", out / f"eval_{name}_suites.json"
        rookworld("eval", "--model", str(model), "--data", str(held_out), "--out", str(best), "--device",
                  args.device, "--eval-size", str(n_eval), *common, *limit, log=out / f"eval_{name}.log")
        rookworld("eval", "--model", str(model), "--suite", "mate-in-one,selfplay,vs-stockfish", "--eval-size",
                  str(args.mate_positions), "--games", str(args.games), "--out", str(rest), "--device", args.device,
                  *common, *limit, log=out / f"eval_{name}_suites.log")
        sections = json.loads(best.read_text())["suites"]["best-move"]["sections"]  # {"P": ..., "A": ...}
        for suite in json.loads(rest.read_text())["suites"].values():
            sections.update(suite["sections"])
        return sections

    before = evaluate(sft, "sft")
    after, runs = {}, []
    for seed in args.seeds:
        run = out / f"grpo_seed{seed}"
        runs.append(run)
        rookworld("train", "--model", str(sft), "--data", str(train), "--eval-data", str(held_out), "--output-dir",
                  str(run), "--overwrite", "--steps", str(args.grpo_steps), "--seed", str(seed), "--lr",
                  str(args.grpo_lr), "--prompts-per-step", str(args.prompts), "--group-size", str(args.group),
                  "--beta", str(args.beta), "--temperature", str(args.temperature), "--eval-every",
                  str(args.eval_every), "--eval-size", str(n_eval),
                  "--save-every", str(args.grpo_steps), "--stockfish-depth", str(args.depth), "--device", args.device,
                  "--warmup-steps", str(min(5, args.grpo_steps)), *limit, *args.grpo_args.split(),
                  log=out / f"{run.name}.log")
        after[str(seed)] = evaluate(run, run.name)

    figures = {"settings": vars(args), "sft_model": sft_model(sft, reused=reuse), "held_out_positions": n_eval,
               "sft": before, "grpo": after, "seconds": time.perf_counter() - t0}
    (out / "learning.json").write_text(json.dumps(figures, indent=2) + "\n")
    try:
        rookworld("plot", *map(str, runs), "--out", str(out / "grpo_curves.png"), "--title",
                  "GRPO from the SFT model", log=out / "plot.log")
        rookworld("plot", str(sft), "--out", str(out / "sft_curves.png"), "--title", "SFT", log=out / "plot_sft.log")
    except SystemExit as e:  # matplotlib missing: the figures stand without the picture
        print(f"no plot: {e}", file=sys.stderr)
    print(f"\nheld-out positions: {n_eval}; {time.perf_counter() - t0:.0f} s in all\n")
    print(table(before, after))
    return 0


if __name__ == "__main__":
    sys.exit(main())
