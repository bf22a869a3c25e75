"""Every setting is declared once (rookworld.settings): each command's flags, help texts, defaults and checks come
from those declarations, and parsing any command's flags loads no torch."""

from __future__ import annotations

import argparse
import dataclasses
import re
import subprocess
import sys

import pytest
from rookworld import cli
from rookworld.settings.commands import COMMANDS
from rookworld.settings.base import ConfigError
from rookworld.settings.declare import composed, declared_fields, declaring_group, group, groups, option, setting
from rookworld.settings.groups import SeedSettings

#: Option strings that are no setting: argparse's own, and --config (read by train and sft before the settings).
NOT_SETTINGS = {"-h", "--help", "--config"}


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_no_flag_is_declared_twice():
    @group
    class Again:
        seed: int = setting(1, "a second seed", "run")

    with pytest.raises(TypeError, match="'seed' is declared twice: in SeedSettings and Again"):
        @composed()
        class Both(SeedSettings, Again):
            pass

    # And across commands: one name, one declaration, whichever commands compose it.
    declared: dict[str, set[type]] = {}
    for command in COMMANDS:
        for g in groups(command.settings):
            for name in g.__declares__:
                declared.setdefault(name, set()).add(g)
    assert {name: owners for name, owners in declared.items() if len(owners) > 1} == {}

    parsers = subparsers()
    assert set(parsers) == {c.name for c in COMMANDS}
    for command in COMMANDS:
        fields = {f.name: f for f in declared_fields(command.settings)}
        assert set(fields) == {f.name for f in dataclasses.fields(command.settings)}, command.name
        seen = set()
        for action in parsers[command.name]._actions:
            if action.dest.startswith(("_renamed_", "_gone_")) or (action.option_strings
                                                                   and set(action.option_strings) <= NOT_SETTINGS):
                continue
            # A flag (or positional argument) of a declared setting, from the group that declares it, spelt and
            # checked as it is declared (its help may be the command's own meaning of it: test_help.py).
            f = fields[action.dest]
            owner = declaring_group(command.settings, f.name)
            assert f.metadata["check"] is owner.__dataclass_fields__[f.name].metadata["check"]
            if action.option_strings:
                spellings = [option(f), *(f"--{a}" for a in f.metadata["aliases"])]
                if isinstance(action, argparse.BooleanOptionalAction):
                    spellings.append(f"--no-{option(f)[2:]}")
                assert action.option_strings == spellings
            seen.add(f.name)
        assert seen == set(fields), f"{command.name}: settings without a flag: {set(fields) - seen}"


#: Every setting of every command -> the group that declares it.
DECLARED_BY = {name: g for command in COMMANDS for g in groups(command.settings) for name in g.__declares__}


def help_texts() -> dict[str, dict[str, str]]:
    """setting -> command -> its help text with the command's default left out."""
    out: dict[str, dict[str, str]] = {}
    for name, p in subparsers().items():
        for action in p._actions:
            if action.help and action.help != argparse.SUPPRESS and action.dest in DECLARED_BY:
                out.setdefault(action.dest, {})[name] = re.sub(r" \(default: [^()]*\)$", "", action.help)
    return out


def test_a_shared_setting_says_the_same_in_every_command_that_means_the_same_by_it():
    texts = help_texts()
    shared = {name: by for name, by in texts.items() if len(by) > 1}
    assert {"seed", "model", "device", "stockfish_depth", "out", "max_plies", "data"} <= set(shared)
    for name in ("model", "device", "revision", "stockfish_depth", "stockfish_path", "protocol", "max_new_tokens"):
        declared = re.sub(r" \(default: [^()]*\)$", "", DECLARED_BY[name].__dataclass_fields__[name].metadata["help"])
        assert set(shared[name].values()) == {declared}, (name, shared[name])
    # ask, play and uci draw nothing but --protocol rookworld's tokens: one meaning of --seed, theirs; positions,
    # eval, train and sft each draw other things.
    seeds = shared["seed"]
    assert seeds["ask"] == seeds["play"] == seeds["uci"]
    assert len({seeds[c] for c in ("positions", "eval", "ask", "train", "sft")}) == 5, seeds


def error_line(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0].split(": error: ", 1)[1]


@pytest.mark.parametrize("flag, value, message", [
    ("--stockfish-depth", "0", "--stockfish-depth must be a positive integer, got 0"),
    ("--seed", "-1", "--seed must be between 0 and 2^63 - 1, got -1"),
    ("--device", "tpu", "--device must be cpu, cuda, cuda:N or auto, got 'tpu'"),
])
def test_a_setting_is_refused_in_the_same_words_by_every_command(capsys, tmp_path, flag, value, message):
    commands = {"positions": ["--count", "1", "--out", str(tmp_path / "p.jsonl")], "eval": [],
                "ask": ["8/8/8/8/8/8/8/K1k5 w - - 0 1"], "play": [], "train": ["--output-dir", str(tmp_path / "t")],
                "sft": ["--init", "tiny", "--data", __file__, "--output-dir", str(tmp_path / "s")]}
    said = {}
    for command, args in commands.items():
        if any(a.option_strings == [flag] for a in subparsers()[command]._actions):
            said[command] = error_line(capsys, [command, *args, flag, value])
    assert len(said) >= 3 and set(said.values()) == {message}, said


def test_a_command_shows_its_own_default_of_a_shared_setting():
    texts = {name: p.format_help() for name, p in subparsers().items()}
    flat = {name: " ".join(t.split()) for name, t in texts.items()}
    assert "peak learning rate (AdamW, betas 0.9/0.95) (default: 0.0003)" in flat["sft"]
    assert "peak learning rate (AdamW, betas 0.9/0.95) (default: 3e-06)" in flat["train"]
    assert "(default: 400)" in flat["play"] and "(default: 200)" in flat["eval"]  # --max-plies


def test_a_micro_batch_means_rows_per_forward_backward_only():
    parsers = subparsers()
    for name in ("train", "sft"):
        assert any(a.dest == "micro_batch_size" for a in parsers[name]._actions)
    assert [a.dest for a in parsers["eval"]._actions if "--micro-batch-size" in a.option_strings] == \
        ["_renamed_micro_batch_size"]


def test_parsing_any_commands_flags_loads_no_torch(tmp_path):
    """--help and a command's settings read from its flags answer at once: torch takes seconds to import."""
    code = f"""
import sys
from rookworld import cli
from rookworld.settings.commands import COMMANDS
from rookworld.settings.flags import from_args
parser = cli.build_parser()
for command in COMMANDS:
    try:
        parser.parse_args([command.name, "--help"])
    except SystemExit:
        pass
argv = {{"positions": ["--count", "3", "--out", "x.jsonl", "--stockfish-depth", "4"],
         "eval": ["--suite", "best-move,selfplay", "--decode-batch-size", "8", "--device", "cpu"],
         "ask": ["8/8/8/8/8/8/8/K1k5 w - - 0 1", "--protocol", "rookworld"], "play": ["--colour", "black"],
         "train": ["--steps", "3", "--lr", "1e-4", "--output-dir", {str(tmp_path / 't')!r}],
         "sft": ["--init", "tiny", "--data", {__file__!r}, "--lr", "1e-3"], "plot": ["runs/a", "--title", "t"],
         "uci": ["--protocol", "rookworld", "--seed", "3"],
         "serve": ["--port", "0", "--max-sessions", "2", "--opponent-skill", "3", "--stockfish-depth", "4"]}}
for command in COMMANDS:
    from_args(parser.parse_args([command.name, *argv[command.name]]), command.settings)
assert "torch" not in sys.modules, "torch was imported"
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_every_integer_setting_of_every_command_has_a_largest_value():
    """A number typed in is refused where it enters, not where it overflows: in a Rust call (--min-elo 10^20 was an
    OverflowError traceback), a UCI command (--opponent-nodes 10^20 held a served game's engine forever) or
    mid-game."""
    for command in COMMANDS:
        for f in declared_fields(command.settings):
            if str(f.type).startswith("int"):
                most = f.metadata["most"]
                assert most <= 2**31 - 1 or f.name == "seed", (command.name, f.name, most)
                own = f.metadata["check"] and f.metadata["check"](option(f), 10**20)  # its own words come first
                said = re.escape(own) if own else rf"{option(f)} must be at most {most:,}, got 1000"
                with pytest.raises(ConfigError, match=f"^{said}"):
                    dataclasses.replace(command.settings(), **{f.name: 10**20}).validate()
                with pytest.raises(ConfigError):
                    dataclasses.replace(command.settings(), **{f.name: -10**20}).validate()


@pytest.mark.parametrize("argv, message", [
    (["positions", "--pgn", "GAMES", "--min-elo", "100000000000000000000", "--out", "OUT"],
     "--min-elo must be at most 2,147,483,647, got 100000000000000000000"),
    (["serve", "--opponent-nodes", "99999999999999999999"],
     "--opponent-nodes must be at most 100,000,000, got 99999999999999999999"),
    (["positions", "--count", "4", "--stockfish-depth", "99", "--out", "OUT"], "--stockfish-depth must be at most 30, got 99"),
    (["eval", "--max-plies", "4294967296"], "--max-plies must be at most 20,000, got 4294967296"),
    (["eval", "--eval-size", "2147483647"], "--eval-size must be at most 1,000,000, got 2147483647"),
])
def test_a_number_past_its_range_is_one_line_from_the_command(capsys, tmp_path, argv, message):
    games = tmp_path / "games.pgn"
    games.write_text('[Event "x"]\n\n1. e4 e5 *\n')
    argv = [str(games) if a == "GAMES" else str(tmp_path / "out.jsonl") if a == "OUT" else a for a in argv]
    assert error_line(capsys, argv) == message
