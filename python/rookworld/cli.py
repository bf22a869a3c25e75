"""The `rookworld` command."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import rookworld


class CliError(Exception):
    """A user error: printed as one line, exit status 2, no traceback."""


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
    p.add_argument("--count", type=_positive, required=True, help="number of positions")
    p.add_argument("--seed", type=_non_negative, default=0, help="random seed (default 0)")
    p.add_argument("--out", required=True, help="output JSONL file, or - for stdout")
    p.add_argument("--opening-share", type=_share, default=0.2, help="share of opening positions (default 0.2)")
    p.add_argument("--endgame-share", type=_share, default=0.2, help="share of endgames (default 0.2)")
    p.add_argument("--illegal-share", type=_share, default=0.01,
                   help="share of A: moves that are well-formed but illegal (default 0.01)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_run_positions)


POSITIONS_CHUNK = 20_000


def _run_positions(args: argparse.Namespace) -> int:
    from rookworld.chess import generate_positions
    from rookworld.progress import Progress

    if args.opening_share + args.endgame_share > 1.0:
        raise CliError("--opening-share + --endgame-share must not exceed 1")

    def chunks():
        for start in range(0, args.count, POSITIONS_CHUNK):
            n = min(POSITIONS_CHUNK, args.count - start)
            yield generate_positions(n, args.seed, start=start, opening_share=args.opening_share,
                                     endgame_share=args.endgame_share, illegal_share=args.illegal_share)

    with Progress(args.count, "positions", "pos", enabled=not args.quiet) as bar:
        if args.out == "-":
            for chunk in chunks():
                sys.stdout.write("".join(json.dumps(p.to_dict()) + "\n" for p in chunk))
                bar.update(len(chunk))
        else:
            out = Path(args.out)
            if out.parent and not out.parent.exists():
                raise CliError(f"output directory does not exist: {out.parent}")
            # Written beside the target and renamed, so an interrupted run never leaves half a file.
            fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
            try:
                with os.fdopen(fd, "w") as f:
                    for chunk in chunks():
                        f.write("".join(json.dumps(p.to_dict()) + "\n" for p in chunk))
                        bar.update(len(chunk))
                os.replace(tmp, out)
            except BaseException:
                os.unlink(tmp)
                raise
    if args.out != "-" and not args.quiet:
        print(f"wrote {args.count} positions to {args.out}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rookworld",
        description="GRPO with verifiable chess rewards for RookWorld-LM.",
    )
    parser.add_argument("--version", action="version", version=f"rookworld {rookworld.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_positions(sub)
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
