"""`rookworld positions`: generated positions, or a file's, with Stockfish's analyses and the P:/A: samples."""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import as_completed

from rookworld.commands.common import (CliError, as_given, opened_output, read_from, read_positions, settings,
                                       stockfish_pool, write_failed)
from rookworld.chess import data, pgn, selfplay
from rookworld.chess.rules import generate_positions
from rookworld.chess.data import position_key
from rookworld.io.files import Output
from rookworld.io.progress import Progress
from rookworld.io.quote import quoted
from rookworld.chess.selfplay import SelfPlay
from rookworld.chess.stockfish import StockfishError
from rookworld.settings.commands import PositionsSettings

POSITIONS_CHUNK = 20_000


#: --from-model's positions (`rookworld.commands.own_positions`): the one source that loads a model, and so torch
#: (4 s and 700 MB), given by the module the CLI imports for it, so that every other source starts at once.
ModelRecords = Callable[[PositionsSettings, set[str]], list[data.Record]]


def run(args: argparse.Namespace, model_records: ModelRecords | None = None) -> int:
    s = settings(args, PositionsSettings, streams={"source": "--from", "exclude": "--exclude", "pgn": "--pgn"})
    with opened_output(s.out) as out:
        return _run(s, out, model_records)


def _run(s: PositionsSettings, out: Output, model_records: ModelRecords | None) -> int:
    excluded = {position_key(r.fen) for r in read_positions(s.exclude, s.skip_bad)} if s.exclude else set()
    if s.selfplay:
        try:
            return _selfplay(s, excluded, out)
        except StockfishError as e:  # an engine that kept failing after its restarts, or that the pool gave up on
            raise CliError(str(e)) from None
    if s.annotate or s.source or s.pgn or s.from_model:
        return _annotate(s, excluded, out, model_records)

    with Progress(s.count, "positions", "pos", enabled=not s.quiet) as bar:
        def lines():
            for chunk in _generated(s, excluded):
                yield from (r.to_dict() for r in data.cut_histories(chunk, s.seed, s.a_history))
                bar.update(len(chunk))

        _emit(lines(), s, out)
    return 0


def _emit(lines, s: PositionsSettings, out: Output) -> None:
    if s.out == "-":
        for line in lines:
            sys.stdout.write(json.dumps(line) + "\n")
        return
    n = _write(lines, out)
    if not s.quiet:
        print(f"wrote {n} positions to {s.out}", file=sys.stderr)


def _write(lines, out: Output) -> int:
    """A file written whole or not at all (an interrupted or failed write leaves no half file), or a FIFO or
    device written through."""
    n = 0
    try:
        with out.open() as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
                n += 1
    except OSError as e:
        raise write_failed("--out", out.name, e) from None
    return n


def _generated(s: PositionsSettings, excluded: set[str]) -> Iterator[list[data.Record]]:
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
        yield [data.Record.from_position(p) for p in kept]


def _from_pgn(s: PositionsSettings, excluded: set[str]) -> list[data.Record]:
    """The PGN files' positions with a legal move, none twice and none of --exclude, at most --count (read no
    further than needed: a Lichess dump holds billions)."""
    limit = None if s.count is None else s.count + len(excluded) + 64
    while True:
        try:
            sample = pgn.pgn_positions([read_from(p) for p in s.pgn], per_game=s.per_game, seed=s.seed,
                                       min_elo=s.min_elo, max_elo=s.max_elo, min_base_seconds=s.min_base_time,
                                       skip_bad=s.skip_bad, max_positions=limit)
        except (ValueError, OSError) as e:
            raise CliError(as_given(str(e), s.pgn)) from None
        records = [data.Record(p.fen, p.history, p.move, p.phase, source=as_given(p.source, s.pgn))
                   for p in sample.positions if position_key(p.fen) not in excluded]
        records, _ = data.playable(records)  # a game's last position may be mate or stalemate
        if limit is None or len(records) >= s.count or len(sample.positions) < limit:
            break
        limit *= 2
    if not s.quiet:
        first = as_given(sample.bad_reasons[0], s.pgn) if sample.bad_games else ""
        said = f"; skipped {sample.bad_games} bad games, the first: {first}" if sample.bad_games else ""
        print(f"read {sample.games} games ({sample.filtered_games} left out by --min-elo, --max-elo or "
              f"--min-base-time){said}", file=sys.stderr)
    if not records:
        raise CliError(f"--pgn {' '.join(s.pgn)}: no new position with a legal move in its games")
    return records[: s.count]


def _annotate(s: PositionsSettings, excluded: set[str], out: Output, model_records: ModelRecords | None) -> int:
    if s.source:
        records = [r for r in read_positions(s.source, s.skip_bad) if position_key(r.fen) not in excluded][: s.count]
    elif s.pgn:
        records = _from_pgn(s, excluded)
    elif s.from_model:  # the CLI runs --from-model through own_positions, which gives `model_records`
        records = model_records(s, excluded)
    else:
        records = [r for chunk in _generated(s, excluded) for r in chunk]
    records = data.cut_histories(data.assign_moves(records, s.seed), s.seed, s.a_history)
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
                    raise CliError(f"Stockfish could not analyse {quoted(r.fen)} ({r.source or 'generated'}): "
                                   f"{e}") from None
        lines = data.annotated(records, analyses, seed=s.seed, layout=s.layout or "rookworld")
    _emit(lines, s, out)
    return 0


#: Self-play games in a row that may bring no new position before --selfplay gives up (as many games as
#: --from-model's `EMPTY_ROUNDS` of `ROUND_GAMES`): games at temperature 0 are all one game, and would be played
#: forever.
EMPTY_GAMES = 512


def _per_game(s: PositionsSettings, game: selfplay.Game) -> list[tuple]:
    """A game's positions with their analyses: all of them, or --per-game drawn at random."""
    picked = list(zip(game.records, game.analyses))
    if s.per_game is not None and len(picked) > s.per_game:
        rng = random.Random(f"{s.seed}:per-game:{game.index}")
        picked = [picked[i] for i in sorted(rng.sample(range(len(picked)), s.per_game))]
    return picked


def _selfplay(s: PositionsSettings, excluded: set[str], out: Output) -> int:
    """--count positions from self-play games, new ones only (not in --exclude, not seen before in this run), at
    most --per-game from each game."""
    how = SelfPlay(temperature=s.selfplay_temperature, opening_temperature=s.opening_temperature)
    seen = set(excluded)
    records, analyses, empty = [], [], 0
    with stockfish_pool(s) as pool, Progress(s.count, "positions", "pos", enabled=not s.quiet) as bar:
        for game in selfplay.play(pool, None, s.seed, how):
            new = 0
            for record, analysis in _per_game(s, game):
                key = position_key(record.fen)
                if key in seen or len(records) == s.count:
                    continue
                seen.add(key)
                records.append(record)
                analyses.append(analysis)
                new += 1
            bar.update(new)
            empty = 0 if new else empty + 1
            if len(records) == s.count or empty == EMPTY_GAMES:
                break
    if len(records) < s.count:
        raise CliError(f"--selfplay: {EMPTY_GAMES} games in a row gave no new position ({len(records)} of --count "
                       f"{s.count} found): raise --selfplay-temperature or --opening-temperature so that games "
                       f"differ, or lower --count")
    records = data.cut_histories(records, s.seed, s.a_history)
    if s.annotate:
        _emit(data.annotated(records, analyses, seed=s.seed, layout=s.layout or "rookworld"), s, out)
    else:
        _emit((r.to_dict() for r in records), s, out)
    return 0
