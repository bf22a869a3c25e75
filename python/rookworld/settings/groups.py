"""The settings more than one command takes, each declared once, in small groups that commands compose
(`rookworld.settings.config` for train and sft, `rookworld.settings.commands` for the others)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rookworld.io.files import no_directory_there
from rookworld.io.quote import quoted
from rookworld.chess.stockfish.cache import cache_path_problem
from rookworld.chess.stockfish.limits import MAX_DEPTH, MAX_NODES, workers_problem
from rookworld.settings import shipped
from rookworld.settings.base import MAX_SEED, existing_files, positive, seed_range, share
from rookworld.settings.declare import (DATA, DECODING, GAME, LOGGING, MODEL, OUTPUT, RUN, SAMPLING, STOCKFISH, group,
                                        setting)
from rookworld.settings.hub import is_local_path

#: Half-moves past the longest game the rules allow (17,697 plies, with the 75-move rule and fivefold repetition
#: ending games by themselves): a longer --max-plies changes nothing but the size of the number carried.
LONGEST_GAME = 20_000

#: The evaluation suites, as --suite and --eval-suites name them.
SUITES = ("best-move", "mate-in-one", "selfplay", "vs-stockfish", "ladder")
#: Decoding protocols of a model in use: greedy, or RookWorld's own sampling (rookworld.lm.answers.PROTOCOLS).
PROTOCOLS = ("greedy", "rookworld")


def parse_suites(text: str) -> list[str]:
    """`best-move,mate-in-one` -> the names, in the order given; ValueError naming the choices."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in SUITES]
    if not names or bad:
        raise ValueError(f"unknown suite {quoted(bad[0] if bad else text)}: choose from {', '.join(SUITES)}")
    return list(dict.fromkeys(names))


def suites(option: str, value: Any) -> str | None:
    try:
        parse_suites(value)
    except ValueError as e:
        return f"{option}: {e}"
    return None


def local_model(option: str, value: Any) -> str | None:
    """A model named by a local path must be a directory (a hub repo id is looked up when it is loaded)."""
    if is_local_path(value) and (why := no_directory_there(Path(value).expanduser())) is not None:
        if why == "no such directory":
            return f"{option}: no such model directory: {value}{shipped.elsewhere(value)}"
        return f"{option}: {value} is {why}: give a model directory"
    return None


def device_name(option: str, value: Any) -> str | None:
    ok = re.fullmatch(r"auto|cpu|cuda(:\d+)?", value)
    return None if ok else f"{option} must be cpu, cuda, cuda:N or auto, got {quoted(value)}"


@group
class ModelSettings:
    """The model, and where it runs."""

    model: str | None = setting(
        shipped.HUB_MODEL, "the model: hub repo id, model directory, or a training run's directory (its latest "
        "model)", MODEL, main=True, check=local_model)
    revision: str | None = setting(None, "hub revision of --model (branch, tag or commit)", MODEL)
    device: str = setting("auto", "cpu, cuda, cuda:N or auto (CUDA when available; under torchrun, the local rank's "
                                  "GPU)", MODEL, check=device_name)


@group
class SeedSettings:
    # What it seeds is each command's own (its `Meaning`): a fresh model's weights in sft, sampling in ask.
    seed: int = setting(0, "random seed", RUN, check=seed_range, most=MAX_SEED)


@group
class StockfishSettings:
    """The engine that scores P: answers and analyses positions."""

    stockfish_path: str | None = setting(None, "Stockfish binary (default: ROOKWORLD_STOCKFISH, stockfish on PATH, "
                                               "then /usr/games/stockfish)", STOCKFISH,
                                         metavar="FILE")
    stockfish_depth: int = setting(10, "Stockfish's analysis depth", STOCKFISH, check=positive, was=("depth",),
                                   most=MAX_DEPTH)
    stockfish_workers: int | None = setting(None, "Stockfish processes (default: one per core)", STOCKFISH,
                                              check=lambda option, n: positive(option, n) or workers_problem(option, n))
    stockfish_cache: str | None = setting(None, "sqlite file that caches analyses across runs (default: none)",
                                          STOCKFISH, metavar="FILE", check=lambda _, path: cache_path_problem(path))


@group
class StockfishNodesSettings:
    """Analysis to a node count: the commands whose analyses are not training's rewards (those go to a depth)."""

    stockfish_nodes: int | None = setting(None, "analyse to a node count instead of --stockfish-depth", STOCKFISH,
                                          check=positive, was=("nodes",), most=MAX_NODES)


@group
class DecodingSettings:
    """How a model in use picks its tokens."""

    protocol: str = setting("greedy", "decoding: greedy, or rookworld (temperature 0.6, top-k 5, as RookWorld's "
                                      "scripts, seeded by --seed)", DECODING, choices=PROTOCOLS)


@group
class DecodeBatchSettings:
    # Not --micro-batch-size: that is rows per forward/backward in training, and a training run's evaluation
    # decodes too.
    decode_batch_size: int = setting(64, "prompts decoded at once", SAMPLING, check=positive)


@group
class CompletionSettings:
    max_new_tokens: int = setting(144, "completion length limit", SAMPLING, check=positive)


@group
class DataSettings:
    # What it holds is each command's own (its `Meaning`): positions for train and eval, samples for sft.
    data: str | None = setting(None, "the positions or samples to read", DATA, main=True, check=existing_files)


@group
class BadLinesSettings:
    skip_bad: bool = setting(False, "skip (and count) bad lines of the input files instead of stopping at the first",
                             DATA)


@group
class LayoutSettings:
    layout: str | None = setting(None, "layout of P: text: rookworld (the FEN padded to 90 columns, the moves to 30, "
                                       "the evals to 40, as RookWorld-LM's data: about 145 tokens a sample) or "
                                       "compact (a space between fields: about 98)", DATA,
                                 choices=("rookworld", "compact"))


@group
class IllegalShareSettings:
    illegal_share: float = setting(0.01, "share of generated A: moves that are well-formed but illegal", DATA,
                                   check=share)


#: Positions an evaluation takes at most: a million answers are hours of a GPU, and the generator makes at most a
#: hundred million in one call (2^31 - 1 was a ValueError traceback from it).
MAX_EVAL_SIZE = 1_000_000


@group
class EvalSizeSettings:
    eval_size: int | None = setting(128, "positions of --eval-every's best-move and mate-in-one suites: the first "
                                         "N of --eval-data, or N generated", LOGGING, check=positive,
                                    was=("limit",), most=MAX_EVAL_SIZE)


@group
class GameSettings:
    max_plies: int = setting(200, "a game stops after this many half-moves", GAME, check=positive,
                             most=LONGEST_GAME)


@group
class OutputSettings:
    # What it holds is each command's own (its `Meaning`): positions, eval's results, plot's figure.
    out: str | None = setting(None, "the file to write", OUTPUT, metavar="FILE")
