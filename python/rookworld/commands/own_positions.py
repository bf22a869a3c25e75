"""`rookworld positions --from-model MODEL`: positions from the model's own games. Apart from the rest of the
command because it alone loads a model, and so torch: the CLI imports this module only for --from-model."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

from rookworld.commands import positions
from rookworld.commands.common import CliError
from rookworld.commands.model import load_lm
from rookworld.chess import data
from rookworld.chess.data import position_key
from rookworld.io.progress import Progress
from rookworld.lm.own_games import ROUND_GAMES, own_game_rounds
from rookworld.settings.commands import PositionsSettings


def run(args: argparse.Namespace) -> int:
    return positions.run(args, model_records)


#: Rounds of the model's games in a row that may bring no new position before --from-model gives up: a model that
#: plays the same games every time would otherwise be asked forever.
EMPTY_ROUNDS = 8


def model_records(s: PositionsSettings, excluded: set[str]) -> list[data.Record]:
    """--count new positions (none twice, none of --exclude) of the --from-model model's own games."""
    lm = load_lm(SimpleNamespace(model=s.from_model, revision=None, device="auto"))
    seen, records, empty = set(excluded), [], 0
    with Progress(s.count, "positions", "pos", enabled=not s.quiet) as bar:
        for round_ in own_game_rounds(lm, seed=s.seed, failures_only=s.model_positions == "failures",
                                      max_plies=s.max_plies):
            new = 0
            for r in round_:
                key = position_key(r.fen)
                if key not in seen and len(records) < s.count:
                    seen.add(key)
                    records.append(r)
                    new += 1
            bar.update(new)
            empty = 0 if new else empty + 1
            if len(records) >= s.count or empty == EMPTY_ROUNDS:
                break
    if len(records) < s.count:
        raise CliError(f"--from-model {s.from_model}: {EMPTY_ROUNDS} rounds of {ROUND_GAMES} games in a row gave no "
                       f"new {s.model_positions} position, {len(records)} of --count {s.count} found")
    return records
