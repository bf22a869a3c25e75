"""The `rookworld` command."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from pathlib import Path

import rookworld

# Bitwise-reproducible MKL on the CPU (read when torch first calls it, after this): without it, a matrix product's
# last bits depend on where the allocator put its operands, so a resumed run drifted from an unbroken one by
# an ulp once the vocabulary pass worked in chunks small enough to be reused memory. It cost no measurable speed.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")


class CliError(Exception):
    """A user error: printed as one line, exit status 2, no traceback."""


class _Parser(argparse.ArgumentParser):
    """A bad flag is one line (and where to look), not the whole usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Command(_Parser):
    """A subcommand reports its own unknown flags (argparse leaves them to `rookworld`), with the nearest flag."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, unknown = super().parse_known_args(args, namespace)
        if unknown:
            flags = [f for a in self._actions for f in a.option_strings if a.help != argparse.SUPPRESS]
            near = difflib.get_close_matches(unknown[0].split("=")[0], flags, n=1, cutoff=0.6)
            self.error(f"unrecognized arguments: {' '.join(unknown)}" + (f" (did you mean {near[0]}?)" if near else ""))
        return namespace, unknown


class _Renamed(argparse.Action):
    """The old spelling of a renamed flag: one line naming the new one."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is now {self.new}")


class _Gone(argparse.Action):
    """A flag that no longer exists: one line saying why."""

    def __init__(self, option_strings, dest, why: str, **kwargs):
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, default=argparse.SUPPRESS)
        self.why = why

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is gone: {self.why}")


def _renamed(p: argparse.ArgumentParser, **renames: str) -> None:
    """Flags renamed so that every command spells a setting alike: old=new, without the dashes."""
    for old, new in renames.items():
        p.add_argument(f"--{old.replace('_', '-')}", action=_Renamed, new=f"--{new.replace('_', '-')}",
                       dest=f"_renamed_{old}", default=argparse.SUPPRESS)


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _share(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1], got {text}")
    return value


def _add_positions(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "positions",
        help="generate training positions (JSONL)",
        description="Generate legal, unfinished chess positions, each with the moves that led to it "
        "and a move for an A: task. The same seed always gives the same positions.",
    )
    p.add_argument("--count", type=_positive, default=None,
                   help="number of positions (required unless --from; with --from, at most this many)")
    p.add_argument("--seed", type=_non_negative, default=0, help="random seed (default 0)")
    p.add_argument("--out", required=True, help="output JSONL file, or - for stdout")
    p.add_argument("--opening-share", type=_share, default=0.2, help="share of opening positions (default 0.2)")
    p.add_argument("--endgame-share", type=_share, default=0.2, help="share of endgames (default 0.2)")
    p.add_argument("--illegal-share", type=_share, default=0.01,
                   help="share of A: moves that are well-formed but illegal (default 0.01)")
    p.add_argument("--from", dest="source", metavar="FILE",
                   help="read positions from FILE (FEN, EPD or JSONL a line) instead of generating them")
    p.add_argument("--skip-bad", action="store_true",
                   help="with --from: skip bad lines (and count them) instead of stopping")
    p.add_argument("--annotate", action="store_true",
                   help="add Stockfish analyses and the P:/A: prompts and targets (what train and eval read)")
    _add_stockfish_options(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_run_positions)


def _add_stockfish_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Stockfish")
    g.add_argument("--stockfish-path", help="Stockfish binary (default: stockfish on PATH, then /usr/games/stockfish)")
    g.add_argument("--stockfish-depth", type=_positive, default=10, help="analysis depth (default 10)")
    g.add_argument("--stockfish-nodes", type=_positive, default=None,
                   help="analyse to a node count instead of a depth")
    _renamed(p, depth="stockfish_depth", nodes="stockfish_nodes")
    g.add_argument("--stockfish-workers", type=_positive, default=None,
                   help="engine processes (default: one per spare core)")
    g.add_argument("--stockfish-cache", metavar="FILE", default=None,
                   help="sqlite file caching analyses across runs (default: none)")


def stockfish_pool(args: argparse.Namespace):
    """A StockfishPool from the CLI options, with a one-line error when Stockfish is missing."""
    from rookworld.ground.stockfish import StockfishError, StockfishNotFoundError, StockfishPool

    try:
        return StockfishPool(path=args.stockfish_path, workers=args.stockfish_workers, depth=args.stockfish_depth,
                             nodes=args.stockfish_nodes, cache_path=args.stockfish_cache)
    except StockfishNotFoundError as e:
        raise CliError(str(e)) from None
    except (StockfishError, OSError) as e:
        raise CliError(f"cannot start Stockfish: {e}") from None


POSITIONS_CHUNK = 20_000


def _check_out_dir(out: str | None) -> None:
    """Before any work: an output that cannot be written is an error now, not after an hour."""
    if out and out != "-" and not Path(out).parent.exists():
        raise CliError(f"output directory does not exist: {Path(out).parent}")


def _run_positions(args: argparse.Namespace) -> int:
    from rookworld.ground.chess import generate_positions
    from rookworld.ground.progress import Progress

    if args.opening_share + args.endgame_share > 1.0:
        raise CliError("--opening-share + --endgame-share must not exceed 1")
    _check_out_dir(args.out)
    if args.count is None and not args.source:
        raise CliError("--count is required (or --from FILE)")
    if args.annotate or args.source:
        return _run_annotate(args)

    def chunks():
        for start in range(0, args.count, POSITIONS_CHUNK):
            n = min(POSITIONS_CHUNK, args.count - start)
            yield generate_positions(n, args.seed, start=start, opening_share=args.opening_share,
                                     endgame_share=args.endgame_share, illegal_share=args.illegal_share)

    from rookworld.ground import data

    with Progress(args.count, "positions", "pos", enabled=not args.quiet) as bar:
        def lines():
            for chunk in chunks():
                yield from (p.to_dict() for p in chunk)
                bar.update(len(chunk))

        if args.out == "-":
            for line in lines():
                sys.stdout.write(json.dumps(line) + "\n")
        else:
            data.write_records(lines(), args.out)  # atomic: an interrupted run leaves no half file
    if args.out != "-" and not args.quiet:
        print(f"wrote {args.count} positions to {args.out}", file=sys.stderr)
    return 0


def _run_annotate(args: argparse.Namespace) -> int:
    from concurrent.futures import FIRST_COMPLETED, wait

    from rookworld.ground import data
    from rookworld.ground.chess import generate_positions
    from rookworld.ground.progress import Progress

    if args.source:
        records = read_positions(args.source, args.skip_bad)[: args.count]
    else:
        records = [data.Record.from_position(p)
                   for p in generate_positions(args.count, args.seed, opening_share=args.opening_share,
                                               endgame_share=args.endgame_share,
                                               illegal_share=args.illegal_share)]
    records = data.assign_moves(records, args.seed)
    if not args.annotate:
        lines = [r.to_dict() for r in records]
    else:
        with stockfish_pool(args) as pool, Progress(len(records), "analyses", "pos", enabled=not args.quiet) as bar:
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
        lines = data.annotated(records, analyses, seed=args.seed)
    if args.out == "-":
        for line in lines:
            sys.stdout.write(json.dumps(line) + "\n")
    else:
        data.write_records(lines, args.out)
        if not args.quiet:
            print(f"wrote {len(lines)} positions to {args.out}", file=sys.stderr)
    return 0


def read_positions(path: str, skip_bad: bool):
    """A positions file's records that have a legal move; bad lines and finished games are said on stderr."""
    from rookworld.ground import data

    try:
        records, skipped = data.read_records(path, skip_bad=skip_bad)
    except data.DataError as e:
        raise CliError(str(e)) from None
    if skipped:
        print(f"skipped {skipped} bad lines of {path}", file=sys.stderr)
    kept, finished = data.playable(records)
    if finished:
        print(f"warning: {data.finished_message(finished, len(records))}", file=sys.stderr)
    if not kept:
        raise CliError("no position with a legal move to work on")
    return kept


def _add_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="measure a model: best move, mate-in-one, self-play, games against Stockfish",
        description="Measures a model the way RookWorld reports its models. Suites (--suite, comma-separated): "
        "best-move (the default: P: best move, top 5, legal best move, candidate overlap, eval error and A: next "
        "state, FEN similarity, reward/terminated/truncated accuracy on held-out positions), mate-in-one (the B: "
        "move mates; and is Stockfish's move), selfplay (legal half-moves before the first illegal move, greedy "
        "and sampled), vs-stockfish (wins, draws, losses and the Elo difference against Stockfish at a fixed "
        "strength). Decoding is greedy unless --protocol rookworld (temperature 0.6, top-k 5, as RookWorld's "
        "scripts); every report names its protocol.",
    )
    _add_model_options(p, seed="seed of the generated positions, of A: moves for positions without one, and of "
                              "sampled decoding (default 0)")
    p.add_argument("--suite", default="best-move", help="suites to run, comma-separated: best-move (default), "
                   "mate-in-one, selfplay, vs-stockfish")
    p.add_argument("--data", default=None, help="positions file (JSONL from `rookworld positions`, FEN or EPD) for "
                   "best-move and mate-in-one (which keeps its positions that have a mate in one); default: "
                   "generated positions of streams no training run draws from (seed --seed)")
    p.add_argument("--tasks", default="P,A", help="best-move's tasks: P, A or P,A (default)")
    p.add_argument("--eval-size", type=_positive, default=None,
                   help="positions of best-move and mate-in-one (without --data: N generated, default 128)")
    p.add_argument("--games", type=_positive, default=8,
                   help="selfplay: start positions (each played greedy and sampled); vs-stockfish: games (default 8)")
    p.add_argument("--max-plies", type=_positive, default=200,
                   help="a game stops after this many half-moves (vs-stockfish counts it a draw; default 200)")
    g = p.add_argument_group("vs-stockfish's opponent")
    g.add_argument("--opponent-elo", type=_positive, default=None,
                   help="Stockfish's strength as UCI_Elo (Stockfish 15.1: 1350-2850; the default is 1350)")
    g.add_argument("--opponent-skill", type=_non_negative, default=None,
                   help="Stockfish's strength as Skill Level 0-20 instead of an Elo")
    g.add_argument("--opponent-nodes", type=_positive, default=20_000,
                   help="nodes Stockfish searches per move (default 20000)")
    p.add_argument("--micro-batch-size", type=_positive, default=64, help="prompts decoded at once (default 64)")
    p.add_argument("--max-new-tokens", type=_positive, default=144, help="completion length limit (default 144)")
    p.add_argument("--out", default=None, help="also write the results as JSON to this file: every suite's "
                   "figures and, per position or game, what the model wrote and how it scored")
    p.add_argument("--samples", action=_Gone, why="--out holds every completion now")
    p.add_argument("--skip-bad", action="store_true", help="skip bad lines of --data instead of stopping")
    _add_stockfish_options(p)
    _renamed(p, limit="eval_size", batch_size="micro_batch_size")
    p.set_defaults(run=_run_eval)


def resolve_device(name: str):
    from rookworld.net.device import resolve_device
    from rookworld.settings.config import ConfigError

    try:
        return resolve_device(name)
    except ConfigError as e:
        raise CliError(str(e)) from None


def _suite_options(args: argparse.Namespace):
    from rookworld.lm.answers import PROTOCOLS
    from rookworld.lm.suites import SuiteOptions, parse_suites

    try:
        names = parse_suites(args.suite)
    except ValueError as e:
        raise CliError(f"--suite: {e}") from None
    tasks = tuple(t.strip().upper() for t in args.tasks.split(",") if t.strip())
    if not tasks or any(t not in ("P", "A") for t in tasks):
        raise CliError(f"--tasks must be P, A or P,A, got {args.tasks!r}")
    if args.opponent_elo is not None and args.opponent_skill is not None:
        raise CliError("give --opponent-elo or --opponent-skill, not both")
    if args.opponent_skill is not None and args.opponent_skill > 20:
        raise CliError(f"--opponent-skill must lie in 0-20, got {args.opponent_skill}")
    elo = args.opponent_elo if args.opponent_elo is not None else None if args.opponent_skill is not None else 1350
    opts = SuiteOptions(size=args.eval_size or 128, games=args.games, seed=args.seed, max_plies=args.max_plies,
                        tasks=tasks, decoding=PROTOCOLS[args.protocol], opponent_elo=elo,
                        opponent_skill=args.opponent_skill, opponent_nodes=args.opponent_nodes,
                        stockfish_path=args.stockfish_path)
    return names, opts


def _run_eval(args: argparse.Namespace) -> int:
    from rookworld.ground import data
    from rookworld.ground.progress import Progress
    from rookworld.ground.rewards import RewardScorer
    from rookworld.ground.stockfish import StockfishNotFoundError, find_stockfish
    from rookworld.harness.checkpoint import model_step
    from rookworld.lm.bestmove import heldout_records
    from rookworld.lm.suites import format_report, run_suites

    _check_out_dir(args.out)
    names, opts = _suite_options(args)
    file_records = read_positions(args.data, args.skip_bad) if args.data else None
    records = None
    if "best-move" in names:
        records = (data.assign_moves(file_records[: args.eval_size], args.seed) if file_records is not None
                   else heldout_records(opts.size, args.seed))
    mate_fens = [r.fen for r in file_records[: args.eval_size]] if file_records is not None else None
    need_stockfish = ("mate-in-one" in names or "P" in opts.tasks and records is not None
                      and any(r.analysis is None for r in records))
    if need_stockfish or "vs-stockfish" in names:
        try:
            find_stockfish(args.stockfish_path)  # a missing engine is reported before any model is loaded
        except StockfishNotFoundError as e:
            raise CliError(str(e)) from None
    lm = _load_lm(args, batch_size=args.micro_batch_size, max_new_tokens=args.max_new_tokens)
    device, directory = lm.model.device, lm.directory
    source = f"--data {args.data}" if args.data else f"generated held-out positions, seed {args.seed}"
    truth = (f"Stockfish depth {args.stockfish_depth}" if args.stockfish_nodes is None
             else f"Stockfish {args.stockfish_nodes} nodes") if need_stockfish else "the file's analyses"
    step = model_step(directory)
    lines = [f"rookworld eval: {directory}{'' if step is None else f' (step {step})'} on {device}",
             f"suites {','.join(names)}; {opts.decoding.describe()}, up to {args.max_new_tokens} tokens"]
    if records is not None:
        lines.append(f"best-move: {len(records)} positions ({source}), tasks {','.join(opts.tasks)}"
                     f"{f'; P: ground truth from {truth}' if 'P' in opts.tasks else ''}")
    print("\n".join(lines), file=sys.stderr)
    pool = stockfish_pool(args) if need_stockfish else None
    try:
        results = run_suites(lm, names, opts, records=records, scorer=RewardScorer(pool), mate_fens=mate_fens,
                             progress=lambda label, total, unit: Progress(total, label, unit))
    finally:
        if pool is not None:
            pool.close()
    print(format_report(results))
    if args.out:
        data.write_json({"model": str(directory), "model_step": step, "protocol": opts.decoding.name,
                         "decoding": {"temperature": opts.decoding.temperature, "top_k": opts.decoding.top_k},
                         "data": str(args.data) if args.data else f"generated (seed {args.seed})",
                         "suites": {r.suite: r.to_dict() for r in results}}, args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _add_model_options(p: argparse.ArgumentParser, seed: str = "seed of sampled decoding (default 0)") -> None:
    """The model to load and how it decodes: shared by eval, ask and play."""
    p.add_argument("--model", default="jrahn/RookWorld-LM-124M",
                   help="hub repo id, model directory, or a training run's directory (its latest checkpoint)")
    p.add_argument("--revision", default=None, help="hub revision (branch, tag or commit)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    p.add_argument("--protocol", choices=("greedy", "rookworld"), default="greedy",
                   help="decoding: greedy (default) or rookworld (temperature 0.6, top-k 5, seeded by --seed)")
    p.add_argument("--seed", type=_non_negative, default=0, help=seed)


def _load_lm(args: argparse.Namespace, **kwargs):
    """The model of --model/--revision on --device, with its tokenizer; a model that cannot be had is one line."""
    from rookworld.lm.answers import RookWorldLM
    from rookworld.net.model import ModelNotAvailableError
    from rookworld.net.tokenizer import TokenizerUnavailableError

    device = resolve_device(args.device)
    try:
        return RookWorldLM.load(args.model, revision=args.revision, device=device, **kwargs)
    except (ModelNotAvailableError, FileNotFoundError, NotADirectoryError, ValueError, TokenizerUnavailableError) as e:
        raise CliError(str(e)) from None


def _add_ask(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ask", help="the model's answer for a position (P:), and for a move played in it (A:)",
        description="Puts a position to the model: its P: answer (candidates, evals, best move), every move marked "
        "legal or not, and, when Stockfish is there, Stockfish's five and the reward the answer would get in "
        "training. With MOVE (UCI or SAN), also its A: answer for playing it, next to the true transition.")
    p.add_argument("fen", metavar="FEN", help="the position (quote it: a FEN has spaces)")
    p.add_argument("move", metavar="MOVE", nargs="?", default=None, help="a move to play in it (UCI or SAN)")
    p.add_argument("--history", default="", help="UCI moves before MOVE, oldest first, for the A: prompt")
    p.add_argument("--json", action="store_true", help="print the answers as JSON")
    _add_model_options(p)
    _add_stockfish_options(p)
    p.set_defaults(run=_run_ask)


def _run_ask(args: argparse.Namespace) -> int:
    from rookworld.ground import chess
    from rookworld.ground.stockfish import StockfishNotFoundError, find_stockfish
    from rookworld.lm.answers import PROTOCOLS
    from rookworld.lm.ask import ask_env, ask_policy, format_env, format_policy

    try:
        fen = chess.normalize_fen(args.fen)
        move = chess.parse_move(fen, args.move) if args.move else None
    except ValueError as e:
        raise CliError(str(e)) from None
    history = args.history.replace(",", " ").split()
    if not chess.legal_moves(fen):
        raise CliError(f"the game is over in this position (no legal move): {fen}")
    try:
        find_stockfish(args.stockfish_path)
        pool = stockfish_pool(args)
    except StockfishNotFoundError:
        pool = None
        print("Stockfish not found: no reward (install it, or give --stockfish-path)", file=sys.stderr)
    lm = _load_lm(args)
    decoding = PROTOCOLS[args.protocol]
    try:
        policy = ask_policy(lm, fen, decoding=decoding, seed=args.seed, stockfish=pool)
    finally:
        if pool is not None:
            pool.close()
    env = ask_env(lm, fen, move, history, decoding=decoding, seed=args.seed) if move else None
    if args.json:
        print(json.dumps({"fen": fen, "protocol": decoding.name, "policy": policy,
                          **({"env": env} if env else {})}, indent=2))
    else:
        print(format_policy(fen, policy))
        if env:
            print(format_env(env))
    return 0


def _add_play(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "play", help="play a game against the model in the terminal",
        description="A game against the model. Type moves in UCI (e2e4) or SAN (e4, Nf3, O-O); 'quit' resigns. "
        "The model plays the B: move of its P: answer; when that is illegal it falls back to its first legal "
        "candidate and says so.")
    p.add_argument("--colour", "--color", dest="colour", choices=("white", "black"), default="white",
                   help="your colour (default white)")
    p.add_argument("--fen", default=None, help="start from this position instead of the initial one")
    p.add_argument("--max-plies", type=_positive, default=400, help="stop the game after N half-moves (default 400)")
    _add_model_options(p)
    p.set_defaults(run=_run_play)


def _run_play(args: argparse.Namespace) -> int:
    from rookworld.ground import chess
    from rookworld.lm.answers import PROTOCOLS
    from rookworld.lm.games import BLACK, WHITE, ModelPlayer
    from rookworld.lm.play import play_game

    try:
        start = chess.normalize_fen(args.fen) if args.fen else chess.START_FEN
    except ValueError as e:
        raise CliError(str(e)) from None
    if not chess.legal_moves(start):
        raise CliError(f"the game is over in this position (no legal move): {start}")
    lm = _load_lm(args)
    player = ModelPlayer(lm, PROTOCOLS[args.protocol], seed=args.seed, fallback=True)
    read = input if sys.stdin.isatty() else _read_piped
    play_game(player, user=WHITE if args.colour == "white" else BLACK, start_fen=start, read=read, out=sys.stdout,
              max_plies=args.max_plies)
    return 0


def _read_piped(prompt: str) -> str:
    """A move from a pipe: the prompt and the line echoed, so that a transcript reads like a session."""
    sys.stdout.write(prompt)
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    sys.stdout.write(line if line.endswith("\n") else line + "\n")
    return line


def _add_train(sub: argparse._SubParsersAction) -> None:
    from rookworld.settings.config import TrainConfig, add_arguments

    p = sub.add_parser(
        "train",
        usage="%(prog)s [--config FILE.toml] [--model DIR] [--output-dir DIR] [options]",
        help="fine-tune RookWorld-LM with GRPO on P: and A: tasks",
        description="GRPO on mixed P:/A: chess tasks with verifiable rewards (Stockfish for P:, the rules for A:). "
        "Settings come from the defaults, then --config FILE.toml, then flags; --resume DIR continues a run with "
        "its saved settings (flags still override). Under torchrun it trains data-parallel.",
    )
    add_arguments(p, TrainConfig)
    p.set_defaults(run=lambda args: _run_training(args, "train"))


def _add_sft(sub: argparse._SubParsersAction) -> None:
    from rookworld.settings.config import SFTConfig, add_arguments

    p = sub.add_parser(
        "sft",
        usage="%(prog)s (--init SIZE | --model DIR) --data FILE [--output-dir DIR] [options]",
        help="supervised training on P:/A: text (RookWorld datasets, or rookworld positions --annotate)",
        description="Supervised training of a GPT-2 policy on RookWorld P:/A: samples, as RookWorld-LM was made: "
        "documents are [EOS] + text, one a row (or packed into full rows with --pack); continue a checkpoint (--model) or start a fresh GPT-2 "
        "(--init). The output directory holds the latest model, a --model for rookworld train. Settings, "
        "--config, --resume and torchrun work as for rookworld train.",
    )
    add_arguments(p, SFTConfig)
    p.set_defaults(run=lambda args: _run_training(args, "sft"))


def _run_training(args: argparse.Namespace, command: str) -> int:
    """`rookworld train` and `rookworld sft`: settings (a resumed run keeps its own), then the trainer's loop."""
    from rookworld.ground.data import DataError
    from rookworld.ground.stockfish import StockfishError, StockfishNotFoundError, find_stockfish
    from rookworld.harness import checkpoint
    from rookworld.harness.rundir import check_resume
    from rookworld.net.model import ModelNotAvailableError
    from rookworld.net.tokenizer import TokenizerUnavailableError
    from rookworld.settings.config import ConfigError, SFTConfig, TrainConfig, from_args

    cls = TrainConfig if command == "train" else SFTConfig
    resume_from = None
    try:
        if getattr(args, "resume", None):
            # A resumed run keeps the settings it was started with, unless flags say otherwise.
            resume_from = checkpoint.resolve_checkpoint(args.resume)
            check_resume(command, resume_from)
            saved = checkpoint.load_config(resume_from)
            given = {k for k in vars(args) if k not in ("command", "run", "config")}
            for key, value in saved.items():
                if key not in given and key != "overwrite" and not getattr(args, "config", None):
                    setattr(args, key, value)
        cfg = from_args(args, cls)
        done = checkpoint.step_of(resume_from) if resume_from is not None else None
        if done is not None and done >= cfg.steps:  # said before any model or engine starts
            from rookworld.harness.run import complete_message

            print(complete_message(command, cfg, done), file=sys.stderr)
            return 0
        if command == "train":
            find_stockfish(cfg.stockfish_path)  # a missing engine is reported before any model is loaded
    except (ConfigError, checkpoint.CheckpointError, StockfishNotFoundError) as e:
        raise CliError(str(e)) from None

    try:
        if command == "train":
            from rookworld.grpo.trainer import Trainer

            trainer = Trainer(cfg)
        else:
            from rookworld.sft.trainer import SFTTrainer

            trainer = SFTTrainer(cfg)
    except (ConfigError, DataError, ModelNotAvailableError, TokenizerUnavailableError, StockfishError,
            checkpoint.CheckpointError, FileNotFoundError, NotADirectoryError) as e:
        raise CliError(str(e)) from None
    try:
        trainer.train()
    except StockfishNotFoundError as e:  # sft's evaluation starts Stockfish only when it first needs it
        raise CliError(str(e)) from None
    finally:
        trainer.close()
    if trainer.run.interrupted:
        print(f"rookworld {command}: interrupted at step {trainer.run.step}; continue with "
              f"rookworld {command} --resume {cfg.output_dir}", file=sys.stderr)
        return 130
    return 0


def _add_plot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot",
        help="draw training curves of one or more runs (needs matplotlib: pip install 'rookworld[plot]')",
        description="Reads each RUN_DIR's metrics.jsonl and draws its curves (rewards per task, KL, losses, "
        "evaluation metrics) into one PNG, several runs overlaid, so settings compare by looking.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="output directories of rookworld train or sft")
    p.add_argument("--out", default="curves.png", help="the PNG to write (default curves.png)")
    p.add_argument("--title", default=None, help="a title above the panels")
    p.set_defaults(run=_run_plot)


def _run_plot(args: argparse.Namespace) -> int:
    from rookworld.harness.plot import PlotError, plot_runs

    _check_out_dir(args.out)
    try:
        panels = plot_runs(args.runs, args.out, title=args.title)
    except PlotError as e:
        raise CliError(str(e)) from None
    print(f"wrote {args.out} ({panels} panels, {len(args.runs)} run(s))", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="rookworld",
        description="GRPO with verifiable chess rewards for RookWorld-LM.",
    )
    parser.add_argument("--version", action="version", version=f"rookworld {rookworld.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Command)
    _add_positions(sub)
    _add_eval(sub)
    _add_ask(sub)
    _add_play(sub)
    _add_train(sub)
    _add_sft(sub)
    _add_plot(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return args.run(args)
    except CliError as e:
        print(f"rookworld {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rookworld {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
