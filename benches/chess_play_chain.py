"""Collects a chain's evaluations (`rookworld eval --out` files) into one JSON and the before/after table of
LEARNING.md: every suite for the SFT model and each GRPO seed, the seeds' mean gain over SFT and their spread
(highest minus lowest), the standard error of a seed's gain over the positions (paired on the same prompts), and
A:'s next states by the length of the history the prompt shows.

    python benches/chess_play_chain.py --evals evals --sft runs_chess-play-sft \
        --seeds runs_chess-play_grpo-s0 runs_chess-play_grpo-s1 runs_chess-play_grpo-s2 \
        --out docs/learning/chess_play_chain.json

reads, for each name, `EVALS/NAME.held-out.json` (best-move on the held-out positions), `EVALS/NAME.games.json`
(self-play and vs-stockfish at Skill Level 0) and `EVALS/NAME.elo1350.json` (vs-stockfish at UCI_Elo 1350),
whichever exist.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

#: (label, file, suite, section, metric, how it prints)
ROWS = [
    ("P: legal best move", "held-out", "best-move", "P", "legal_best_move", "%"),
    ("P: best move in Stockfish's five", "held-out", "best-move", "P", "top5_accuracy", "%"),
    ("P: Stockfish's best move", "held-out", "best-move", "P", "best_move_accuracy", "%"),
    ("P: format valid", "held-out", "best-move", "P", "format_valid", "%"),
    ("P: eval error (pawns)", "held-out", "best-move", "P", "eval_mae", "f"),
    ("A: next state exact", "held-out", "best-move", "A", "next_state_exact", "%"),
    ("A: next state exact, the move alone", "held-out", "history", "A", "0", "%"),
    ("A: next state exact, 1-3 moves before it", "held-out", "history", "A", "1-3", "%"),
    ("A: next state exact, 4-9 moves before it", "held-out", "history", "A", "4-9", "%"),
    ("A: format valid", "held-out", "best-move", "A", "format_valid", "%"),
    ("self-play: legal half-moves, greedy", "games", "selfplay", "selfplay/greedy", "legal_half_moves", "f"),
    ("self-play: legal half-moves, sampled", "games", "selfplay", "selfplay/rookworld", "legal_half_moves", "f"),
    ("vs Skill Level 0: score", "games", "vs-stockfish", "vs-stockfish", "score", "%"),
    ("vs Skill Level 0: own B: move illegal", "games", "vs-stockfish", "vs-stockfish", "own_move_illegal", "%"),
    ("vs Skill Level 0: games without an illegal B: of its own", "games", "vs-stockfish", "vs-stockfish",
     "games_all_own", "%"),
    ("vs UCI_Elo 1350: score", "elo1350", "vs-stockfish", "vs-stockfish", "score", "%"),
    ("vs UCI_Elo 1350: own B: move illegal", "elo1350", "vs-stockfish", "vs-stockfish", "own_move_illegal", "%"),
    ("vs UCI_Elo 1350: games without an illegal B: of its own", "elo1350", "vs-stockfish", "vs-stockfish",
     "games_all_own", "%"),
    # The Elo difference to the opponent and its 95% interval (lm/games.py's elo_difference): with no point scored,
    # 32 games only bound it.
    ("vs Skill Level 0: Elo difference", "games", "vs-stockfish", "vs-stockfish", "elo_difference", "elo"),
    ("vs Skill Level 0: Elo, 95% interval low", "games", "vs-stockfish", "vs-stockfish", "elo_low", "elo"),
    ("vs Skill Level 0: Elo, 95% interval high", "games", "vs-stockfish", "vs-stockfish", "elo_high", "elo"),
    # Against UCI_Elo 1350 the difference is an Elo on Stockfish's own UCI_Elo scale: 1350 plus it.
    ("vs UCI_Elo 1350: Elo difference", "elo1350", "vs-stockfish", "vs-stockfish", "elo_difference", "elo"),
    ("vs UCI_Elo 1350: Elo, 95% interval low", "elo1350", "vs-stockfish", "vs-stockfish", "elo_low", "elo"),
    ("vs UCI_Elo 1350: Elo, 95% interval high", "elo1350", "vs-stockfish", "vs-stockfish", "elo_high", "elo"),
]
HISTORY_BANDS = {"0": range(0, 1), "1-3": range(1, 4), "4-9": range(4, 10)}
#: The held-out figures item by item (lm/bestmove.py's definitions), for a seed's gain over SFT on the same positions.
PER_ITEM = {("P", "legal_best_move"): lambda i: bool(i.get("best_legal")),
            ("P", "top5_accuracy"): lambda i: (i.get("best_rank") or 0) >= 1,
            ("P", "best_move_accuracy"): lambda i: i.get("best_rank") == 1,
            ("A", "next_state_exact"): lambda i: bool(i.get("fen_exact"))}


def history_exact(items: list[dict]) -> dict[str, dict]:
    """A:'s next state exact by the moves the prompt's history shows before the move itself."""
    by: dict[int, list[bool]] = {}
    for item in items:
        if item.get("task") != "A":
            continue
        history = item["prompt"].split("+")[2].split()
        by.setdefault(len(history) - 1, []).append(bool(item.get("fen_exact")))
    bands = {}
    for band, lengths in HISTORY_BANDS.items():
        hits = [h for n in lengths for h in by.get(n, [])]
        bands[band] = {"n": len(hits), "exact": sum(hits) / len(hits) if hits else None}
    return bands


def paired(evals: Path, sft: str, seed: str) -> dict[str, dict]:
    """Each held-out figure's gain of `seed` over `sft` on the prompts both answered, with its standard error
    over those prompts (the paired differences' standard deviation over sqrt(n)): how far a gain can move with the
    positions drawn, which a seed spread measured on one set does not show."""
    files = [evals / f"{name}.held-out.json" for name in (sft, seed)]
    if not all(f.exists() for f in files):
        return {}
    base, got = ({i["prompt"]: i for i in json.loads(f.read_text())["suites"]["best-move"]["items"]} for f in files)
    out = {}
    for (task, metric), hit in PER_ITEM.items():
        diffs = [int(hit(got[p])) - int(hit(base[p])) for p in base if p in got and base[p].get("task") == task]
        if len(diffs) > 1:
            out[f"{task}/{metric}"] = {"n": len(diffs), "gain": statistics.mean(diffs),
                                       "se": statistics.stdev(diffs) / len(diffs) ** 0.5}
    return out


def figures(evals: Path, name: str) -> dict:
    """Every suite's sections of one model, with A:'s next states by history length."""
    out: dict = {}
    for kind in ("held-out", "games", "elo1350"):
        f = evals / f"{name}.{kind}.json"
        if not f.exists():
            continue
        report = json.loads(f.read_text())
        suites = {s: {"sections": r["sections"], "about": r.get("about", "")} for s, r in report["suites"].items()}
        if "best-move" in report["suites"]:
            suites["history"] = {"sections": {"A": history_exact(report["suites"]["best-move"]["items"])}}
        out[kind] = {"model": report["model"], "model_step": report.get("model_step"), "suites": suites}
    return out


def value(model: dict, file: str, suite: str, section: str, metric: str):
    try:
        v = model[file]["suites"][suite]["sections"][section][metric]
    except KeyError:
        return None
    return v["exact"] if isinstance(v, dict) else v


def show(v, how: str) -> str:
    if v is None:
        return "-"
    if how == "elo":
        return f"{v:+.0f}"
    return f"{100 * v:.1f}%" if how == "%" else f"{v:.2f}"


def table(models: dict[str, dict], sft: str, seeds: list[str]) -> str:
    head = ["", "SFT", *[f"GRPO s{i}" for i in range(len(seeds))], "mean gain", "seed spread", "positions' SE"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for label, *where, how in ROWS:
        base = value(models[sft], *where)
        got = [value(models[s], *where) for s in seeds]
        known = [g for g in got if g is not None]
        scale = 100 if how == "%" else 1
        gain = f"{scale * (statistics.mean(known) - base):+.1f}" if known and base is not None else "-"
        spread = f"{scale * (max(known) - min(known)):.1f}" if len(known) > 1 else "-"
        errors = [p["se"] for s in seeds if (p := models[s].get("paired", {}).get(f"{where[2]}/{where[3]}"))
                  and where[0] == "held-out" and where[1] == "best-move"]
        se = f"{100 * statistics.mean(errors):.1f}" if errors else "-"
        lines.append("| " + " | ".join([label, show(base, how), *[show(g, how) for g in got], gain, spread, se])
                     + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--evals", type=Path, required=True, help="the folder of `rookworld eval --out` files")
    ap.add_argument("--sft", required=True, help="the SFT model's name in it")
    ap.add_argument("--seeds", nargs="+", required=True, help="the GRPO seeds' names in it")
    ap.add_argument("--out", type=Path, help="write every figure as JSON here")
    args = ap.parse_args()
    models = {name: figures(args.evals, name) for name in [args.sft, *args.seeds]}
    for seed in args.seeds:
        models[seed]["paired"] = paired(args.evals, args.sft, seed)
    print(table(models, args.sft, args.seeds))
    if args.out:
        args.out.write_text(json.dumps(models, indent=1) + "\n")


if __name__ == "__main__":
    main()
