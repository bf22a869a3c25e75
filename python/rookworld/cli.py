"""The `rookworld` command: its parser, made from the settings' declarations, and a dispatcher that runs the
chosen command's module (rookworld.commands) once its flags are parsed."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import re
import signal
import sys
import threading

import rookworld
from rookworld.io.errors import RookworldError
from rookworld.io.quote import ECHO_LIMIT, PATH_LIMIT, cut_words, for_terminal, quoted, shortened
from rookworld.settings.base import nearest
from rookworld.settings.commands import COMMANDS
from rookworld.settings.flags import add_arguments

#: A word of argparse's message longer than this is typed input, not a path: it is cut to ECHO_LIMIT characters.
LONGEST_WORD = 256

# The module of each command, imported only once its flags are parsed: most of them load torch, which takes
# seconds, and `--help` or a mistyped flag should answer at once. This is the one place a command is found by
# name; each module imports what it needs at its top. train and sft share one module (and its `run`).
MODULES = {"positions": "positions", "eval": "eval", "ask": "ask", "play": "play", "train": "train", "sft": "train",
           "plot": "plot", "uci": "uci", "serve": "serve"}


class _Parser(argparse.ArgumentParser):
    """A bad flag is one line (and where to look), not the whole usage."""

    def error(self, message: str):
        self.exit(2, for_terminal(f"{self.prog}: error: {_cut_quotes(message)} (see {self.prog} --help)") + "\n")

    def _check_value(self, action, value):
        """A mistyped command is answered with the command it is nearest to (argparse's own check, which this
        extends, only lists them all)."""
        if isinstance(action, argparse._SubParsersAction) and value not in action.choices:
            near = nearest(value, action.choices)
            if near is not None:
                raise argparse.ArgumentError(action, f"invalid choice: {quoted(value)} (did you mean {near}?)")
        super()._check_value(action, value)


def _cut_quotes(message: str) -> str:
    """argparse's message with what it quotes of the command line cut to ECHO_LIMIT characters: its values in
    quotes (`invalid int value: '...'`), and words no path is as long as (`unrecognized arguments: ...`)."""
    message = re.sub(r"'([^']{%d})[^']+'" % ECHO_LIMIT, r"'\1...'", message)
    return re.sub(r"(\S{%d})\S{%d,}" % (ECHO_LIMIT, LONGEST_WORD - ECHO_LIMIT), r"\1...", message)


class _Command(_Parser):
    """A subcommand reports its own unknown flags (argparse leaves them to `rookworld`), with the nearest flag."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, unknown = super().parse_known_args(args, namespace)
        if unknown:
            fen = getattr(namespace, "fen", None) or getattr(namespace, "position", None)
            fen = fen[0] if isinstance(fen, list) and fen else fen
            if isinstance(fen, str) and "/" in fen and " " not in fen.strip():  # the shell split an unquoted FEN
                move = getattr(namespace, "move", None)
                whole = " ".join([fen, *([move] if move else []), *unknown][:6])
                self.error(f"the FEN was split at its spaces: quote it, as in \"{whole}\"")
            flags = [f for a in self._actions for f in a.option_strings if a.help != argparse.SUPPRESS]
            near = nearest(unknown[0].split("=")[0], flags)
            self.error(f"unrecognized arguments: {' '.join(unknown)}" + (f" (did you mean {near}?)" if near else ""))
        return namespace, unknown


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rookworld", description="GRPO with verifiable chess rewards for RookWorld-LM.")
    parser.add_argument("--version", action="version", version=f"rookworld {rookworld.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Command)
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help, description=command.description, usage=command.usage)
        add_arguments(p, command.settings)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is so that files half written are removed (its default ends the process
    at once, leaving them). Training installs its own handler, which saves a checkpoint first."""


def _terminate(signum, frame):
    # Once: a later SIGTERM while the command winds down is ignored, so that it neither cuts a clean-up short nor
    # chains a second exception on the first, and the process still ends with 143 (each of its waits is bounded).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    # Bitwise-reproducible MKL on the CPU, read when torch first calls it (later than this): without it, a matrix
    # product's last bits depend on where the allocator put its operands, so a resumed run drifted from an unbroken
    # one by an ulp once the vocabulary pass worked in chunks small enough to be reused memory. The command sets it,
    # not the package: a library user's process keeps its own.
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    previous = signal.signal(signal.SIGTERM, _terminate) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        # --from-model loads a model, and so torch; the positions command's other sources start without it.
        name = "own_positions" if getattr(args, "from_model", None) else MODULES[args.command]
        module = importlib.import_module(f"rookworld.commands.{name}")
        return module.run(args)
    except RookworldError as e:  # every failure rookworld expects: what went wrong and what to do, one line
        print(for_terminal(cut_words(f"rookworld {args.command}: error: {e}")), file=sys.stderr)
        return 2
    except Terminated:
        print(f"rookworld {args.command}: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"rookworld {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:  # a name no file system takes: said, cut, under every command
            print(for_terminal(f"rookworld {args.command}: error: a file name is too long for the file system "
                               f"(a part of a path may have at most 255 bytes, a path 4,096): "
                               f"{quoted(e.filename or '')} ({len(str(e.filename or '')):,} characters)"),
                  file=sys.stderr)
            return 2
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise
        # A full disk or a read-only file system under any command: what happened, not where in the code.
        print(for_terminal(f"rookworld {args.command}: error: {e.strerror}: {shortened(str(e.filename or ''), PATH_LIMIT)} (free "
                           f"space or choose another directory; a training run continues from its last checkpoint "
                           f"with --resume)"), file=sys.stderr)
        return 2
    finally:
        if previous is not None and signal.getsignal(signal.SIGTERM) is _terminate:  # not once terminated
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
