"""`rookworld eval`: a model measured by the suites RookWorld reports."""

from __future__ import annotations

import argparse
import json
import sys

from rookworld.commands.common import (CliError, opened_output, read_positions, settings, stockfish_pool,
                                       write_failed)
from rookworld.commands.model import load_lm
from rookworld.chess import data
from rookworld.io.files import Output
from rookworld.io.progress import Progress
from rookworld.chess.rewards import RewardScorer
from rookworld.chess.stockfish import StockfishError, StockfishNotFoundError, find_stockfish
from rookworld.chess.stockfish.engine import EngineOptionError
from rookworld.lm.answers import PROTOCOLS
from rookworld.lm.bestmove import heldout_records
from rookworld.lm.games import StockfishPlayer
from rookworld.lm.suites import SuiteOptions, format_report, run_suites
from rookworld.net.sources import model_step
from rookworld.settings.commands import EvalSettings
from rookworld.settings.groups import parse_suites


def _suite_options(s: EvalSettings) -> tuple[list[str], SuiteOptions]:
    names = parse_suites(s.suite)
    tasks = tuple(t.strip().upper() for t in s.tasks.split(",") if t.strip())
    elo = s.opponent_elo if s.opponent_elo is not None else None if s.opponent_skill is not None else 1350
    opts = SuiteOptions(size=s.eval_size or 128, games=s.games, seed=s.seed, max_plies=s.max_plies, tasks=tasks,
                        decoding=PROTOCOLS[s.protocol], opponent_elo=elo, opponent_skill=s.opponent_skill,
                        opponent_nodes=s.opponent_nodes, stockfish_path=s.stockfish_path)
    return names, opts


def run(args: argparse.Namespace) -> int:
    s = settings(args, EvalSettings, streams={"data": "--data"})
    with opened_output(s.out) as out:
        return _run(s, out)


def _run(s: EvalSettings, out: Output | None) -> int:
    names, opts = _suite_options(s)
    file_records = read_positions(s.data, s.skip_bad) if s.data else None
    records = None
    if "best-move" in names:
        records = (data.assign_moves(file_records[: s.eval_size], s.seed) if file_records is not None
                   else heldout_records(opts.size, s.seed))
    mate_fens = [r.fen for r in file_records[: s.eval_size]] if file_records is not None else None
    need_stockfish = ("mate-in-one" in names or "P" in opts.tasks and records is not None
                      and any(r.analysis is None for r in records))
    if need_stockfish or "vs-stockfish" in names or "ladder" in names:
        try:
            find_stockfish(s.stockfish_path)  # a missing engine is reported before any model is loaded
        except StockfishNotFoundError as e:
            raise CliError(str(e)) from None
    if "vs-stockfish" in names:  # an opponent the engine will not be (UCI_Elo outside its range), said now
        try:
            StockfishPlayer(opts.stockfish_path, elo=opts.opponent_elo, skill=opts.opponent_skill,
                            nodes=opts.opponent_nodes).close()
        except (EngineOptionError, StockfishError) as e:
            flag = "--opponent-skill" if s.opponent_skill is not None else "--opponent-elo"
            raise CliError(f"{flag}: {e}" if isinstance(e, EngineOptionError) else str(e)) from None
    lm = load_lm(s, batch_size=s.decode_batch_size, max_new_tokens=s.max_new_tokens)
    device, directory = lm.model.device, lm.directory
    source = f"--data {s.data}" if s.data else f"generated held-out positions, seed {s.seed}"
    truth = (f"Stockfish depth {s.stockfish_depth}" if s.stockfish_nodes is None
             else f"Stockfish {s.stockfish_nodes} nodes") if need_stockfish else "the file's analyses"
    step = model_step(directory)
    lines = [f"rookworld eval: {directory}{'' if step is None else f' (step {step})'} on {device}",
             f"suites {','.join(names)}; {opts.decoding.describe()}, up to {s.max_new_tokens} tokens"]
    if records is not None:
        lines.append(f"best-move: {len(records)} positions ({source}), tasks {','.join(opts.tasks)}"
                     f"{f'; P: ground truth from {truth}' if 'P' in opts.tasks else ''}")
    print("\n".join(lines), file=sys.stderr)
    pool = stockfish_pool(s) if need_stockfish else None
    try:
        results = run_suites(lm, names, opts, records=records, scorer=RewardScorer(pool), mate_fens=mate_fens,
                             progress=lambda label, total, unit: Progress(total, label, unit))
    except StockfishError as e:  # an engine that kept failing after its restarts: said in one line
        raise CliError(str(e)) from None
    finally:
        if pool is not None:
            pool.close(cancel_pending=True)  # its analyses are in, or no longer wanted (Ctrl-C, SIGTERM)
    print(format_report(results))
    if out is not None:
        try:
            with out.open() as f:
                json.dump({"model": str(directory), "model_step": step, "protocol": opts.decoding.name,
                           "decoding": {"temperature": opts.decoding.temperature, "top_k": opts.decoding.top_k},
                           "data": str(s.data) if s.data else f"generated (seed {s.seed})",
                           "suites": {r.suite: r.to_dict() for r in results}}, f, indent=2)
                f.write("\n")
        except OSError as e:  # checked before the work, so a disk that filled during it; the report is above
            raise CliError(f"{write_failed('--out', s.out, e)}; the report above holds the figures") from None
        print(f"wrote {s.out}", file=sys.stderr)
    return 0
