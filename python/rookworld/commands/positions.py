"""`rookworld positions`: generated positions, or a file's, with Stockfish's analyses and the P:/A: samples."""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import FIRST_COMPLETED, wait

from rookworld.commands.common import CliError, check_out_dir, read_positions, settings, stockfish_pool
from rookworld.ground import data
from rookworld.ground.chess import generate_positions
from rookworld.ground.progress import Progress
from rookworld.settings.commands import PositionsSettings

POSITIONS_CHUNK = 20_000


def run(args: argparse.Namespace) -> int:
    s = settings(args, PositionsSettings)
    check_out_dir(s.out)
    if s.annotate or s.source:
        return _annotate(s)

    def chunks():
        for start in range(0, s.count, POSITIONS_CHUNK):
            n = min(POSITIONS_CHUNK, s.count - start)
            yield generate_positions(n, s.seed, start=start, opening_share=s.opening_share,
                                     endgame_share=s.endgame_share, illegal_share=s.illegal_share)

    with Progress(s.count, "positions", "pos", enabled=not s.quiet) as bar:
        def lines():
            for chunk in chunks():
                yield from (p.to_dict() for p in chunk)
                bar.update(len(chunk))

        if s.out == "-":
            for line in lines():
                sys.stdout.write(json.dumps(line) + "\n")
        else:
            data.write_records(lines(), s.out)  # atomic: an interrupted run leaves no half file
    if s.out != "-" and not s.quiet:
        print(f"wrote {s.count} positions to {s.out}", file=sys.stderr)
    return 0


def _annotate(s: PositionsSettings) -> int:
    if s.source:
        records = read_positions(s.source, s.skip_bad)[: s.count]
    else:
        records = [data.Record.from_position(p)
                   for p in generate_positions(s.count, s.seed, opening_share=s.opening_share,
                                               endgame_share=s.endgame_share, illegal_share=s.illegal_share)]
    records = data.assign_moves(records, s.seed)
    if not s.annotate:
        lines = [r.to_dict() for r in records]
    else:
        with stockfish_pool(s) as pool, Progress(len(records), "analyses", "pos", enabled=not s.quiet) as bar:
            futures = pool.submit([r.fen for r in records])
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                bar.update(len(done))
            analyses = []
            for r, f in zip(records, futures):
                try:
                    analyses.append(f.result())
                except Exception as e:  # an engine that failed every retry: say which position
                    raise CliError(f"Stockfish could not analyse {r.fen!r} ({r.source or 'generated'}): {e}") from None
        lines = data.annotated(records, analyses, seed=s.seed, layout=s.layout or "rookworld")
    if s.out == "-":
        for line in lines:
            sys.stdout.write(json.dumps(line) + "\n")
    else:
        data.write_records(lines, s.out)
        if not s.quiet:
            print(f"wrote {len(lines)} positions to {s.out}", file=sys.stderr)
    return 0
