"""`rookworld positions`: generated positions, or a file's, with Stockfish's analyses and the P:/A: samples."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from concurrent.futures import as_completed

from rookworld.commands.common import (CliError, check_out_file, read_positions, settings, stockfish_pool,
                                       write_failed)
from rookworld.ground import data
from rookworld.ground.data import position_key
from rookworld.ground.chess import Position, generate_positions
from rookworld.ground.progress import Progress
from rookworld.settings.commands import PositionsSettings

POSITIONS_CHUNK = 20_000


def run(args: argparse.Namespace) -> int:
    s = settings(args, PositionsSettings)
    check_out_file(s.out)
    excluded = {position_key(r.fen) for r in read_positions(s.exclude, s.skip_bad)} if s.exclude else set()
    if s.annotate or s.source:
        return _annotate(s, excluded)

    with Progress(s.count, "positions", "pos", enabled=not s.quiet) as bar:
        def lines():
            for chunk in _generated(s, excluded):
                yield from (p.to_dict() for p in chunk)
                bar.update(len(chunk))

        if s.out == "-":
            for line in lines():
                sys.stdout.write(json.dumps(line) + "\n")
        else:
            _write(lines(), s.out)
    if s.out != "-" and not s.quiet:
        print(f"wrote {s.count} positions to {s.out}", file=sys.stderr)
    return 0


def _write(lines, out: str) -> None:
    try:
        data.write_records(lines, out)  # atomic: an interrupted or failed write leaves no half file
    except OSError as e:
        raise write_failed("--out", out, e) from None


def _generated(s: PositionsSettings, excluded: set[str]) -> Iterator[list[Position]]:
    """--count generated positions in chunks, in index order, leaving out those in `excluded` (then generating
    further indices in their place)."""
    made, start = 0, 0
    while made < s.count:
        if start > 10 * s.count + POSITIONS_CHUNK:
            raise CliError(f"--exclude {s.exclude} holds nearly every position the generator makes: "
                           f"{made} of --count {s.count} after {start} tries")
        chunk = generate_positions(min(POSITIONS_CHUNK, s.count - made), s.seed, start=start,
                                   opening_share=s.opening_share, endgame_share=s.endgame_share,
                                   illegal_share=s.illegal_share)
        start += len(chunk)
        kept = [p for p in chunk if position_key(p.fen) not in excluded]
        made += len(kept)
        yield kept


def _annotate(s: PositionsSettings, excluded: set[str]) -> int:
    if s.source:
        records = [r for r in read_positions(s.source, s.skip_bad) if position_key(r.fen) not in excluded][: s.count]
    else:
        records = [data.Record.from_position(p) for chunk in _generated(s, excluded) for p in chunk]
    records = data.assign_moves(records, s.seed)
    if not s.annotate:
        lines = [r.to_dict() for r in records]
    else:
        with stockfish_pool(s) as pool, Progress(len(records), "analyses", "pos", enabled=not s.quiet) as bar:
            futures = pool.submit([r.fen for r in records])
            # as_completed waits on all of them at once: `wait` on the pending set after every completion went
            # over every future each time (quadratic: 100,000 positions kept a core on it, the engines at 12%).
            for _ in as_completed(futures):
                bar.update(1)
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
        _write(lines, s.out)
        if not s.quiet:
            print(f"wrote {len(lines)} positions to {s.out}", file=sys.stderr)
    return 0
