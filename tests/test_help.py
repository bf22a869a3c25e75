"""Each command's help is its own: a shared setting says what it means in that command (ask's --seed seeds its
sampling, not a fresh model's weights), in a section of that command's; no default is shown for what has none.
And what a user mistypes is answered with what they meant: a command, a flag, a key of a --config file, and the
type a value should have, in plain words."""

from __future__ import annotations

import argparse
import re

import pytest

from conftest import cli
from rookworld.settings.commands import COMMANDS

NAMES = [command.name for command in COMMANDS]


@pytest.fixture
def helps(monkeypatch) -> dict[str, str]:
    """Each command's --help, on a terminal wide enough that no line wraps."""
    monkeypatch.setenv("COLUMNS", "2000")
    return {name: cli(name, "--help").stdout for name in NAMES}


def entry(text: str, flag: str) -> tuple[str, str]:
    """(the section, the help) of a flag or positional argument in a --help text."""
    section, found, lines = None, None, []
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            if found:
                break
            section = line[:-1]
        elif re.match(rf"  {re.escape(flag)}\b", line):
            found = section
            lines.append(line.strip()[len(flag):])
        elif found and line.startswith("  ") and not line.strip().startswith("-"):
            lines.append(line.strip())
        elif found:
            break
    assert found, (flag, text)
    return found, " ".join(" ".join(lines).split())


def test_ask_play_and_uci_say_their_seed_seeds_their_sampling(helps):
    texts = helps
    for name in ("ask", "play", "uci"):
        section, text = entry(texts[name], "--seed")
        assert section == "decoding" and "--protocol rookworld's sampling" in text, (name, section, text)
        assert "fresh model" not in texts[name] and "run: steps" not in texts[name]
    # A fresh model's weights are sft's alone.
    assert [name for name, text in texts.items() if "fresh model's weights" in text] == ["sft"]


def test_plot_says_what_it_writes_and_shows_no_default_for_its_runs(helps):
    text = helps["plot"]
    section, out = entry(text, "--out")
    assert out.startswith("FILE the PNG file") and out.endswith("(default: curves.png in the first RUN_DIR)"), out
    for other in ("JSONL", "eval", "positions", "suite"):
        assert other not in out
    section, runs = entry(text, "RUN_DIR")
    assert section == "the runs" and "default" not in runs


def test_no_help_shows_a_default_that_is_no_value(helps):
    for name, text in helps.items():
        assert "(default: [])" not in text and "(default: )" not in text and "(default: None)" not in text, name


def test_no_setting_s_help_says_what_it_does_in_another_command():
    """`--out` spoke of positions' JSONL, eval's results and plot's PNG in all three; --data of "train and eval" and
    "sft" in all three; --eval-size of "eval's" default in train's help."""
    from rookworld import cli as rookworld_cli

    parser = rookworld_cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, sub in subparsers.items():
        for action in sub._actions:
            text = action.help or ""
            for other in set(NAMES) - {name}:
                # "as rookworld eval --suite", "output directories of rookworld train": another command by its
                # full name is a pointer to it; "eval's", "(sft: ...)", "with sft", "for train" speak for it.
                said = re.search(rf"(?<!rookworld )(?<![\w-])({other}'s?|{other}:|(with|for|in) {other})(?![\w-])",
                                 text)
                assert said is None, (name, action.dest, text)


def test_the_default_model_of_the_commands_that_use_one_runs_offline(helps):
    for name in ("ask", "play", "uci", "eval"):
        _, text = entry(helps[name], "--model")
        assert "(default: models/chess-play-grpo, here or in the clone rookworld was installed from; without one, " \
               "jrahn/RookWorld-LM-124M from the hub)" in text, (name, text)
    _, text = entry(helps["train"], "--model")
    assert text.endswith("(default: jrahn/RookWorld-LM-124M)")


@pytest.mark.parametrize("typed, meant", [("trian", "train"), ("evl", "eval"), ("sf", "sft"), ("positon", "positions")])
def test_a_mistyped_command_is_answered_with_the_nearest(typed, meant):
    proc = cli(typed, "--help")
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"rookworld: error: argument COMMAND: invalid choice: '{typed}' (did you mean {meant}?) (see rookworld --help)")
    assert "choose from" in cli("zzzz").stderr  # nothing near: every command


@pytest.mark.parametrize("toml, line", [
    ("learning_rate = 1e-4", "unknown setting 'learning_rate' (did you mean lr?)"),
    ("learning-rate = 1e-4", "unknown setting 'learning-rate' (did you mean lr?)"),
    ("stockfish-deth = 4", "unknown setting 'stockfish-deth' (did you mean stockfish-depth?)"),
    ("zzzz = 4", "unknown setting 'zzzz'"),
    ("steps = 'ten'", "steps = 'ten' is not an integer"),
    ("lr = 'high'", "lr = 'high' is not a number"),
    ("compile = 1", "compile = 1 is not true or false"),
    ("output_dir = 3", "output_dir = 3 is not a string"),
])
def test_a_config_file_s_mistake_is_said_in_plain_words_with_what_was_meant(tmp_path, toml, line):
    (tmp_path / "run.toml").write_text(toml + "\n")
    proc = cli("train", "--config", "run.toml", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == f"rookworld train: error: run.toml: {line}", proc.stderr


def test_a_list_setting_of_the_wrong_type_says_so(tmp_path):
    (tmp_path / "run.toml").write_text("[sft]\ndata = 3\n")
    proc = cli("sft", "--config", "run.toml", cwd=tmp_path)
    assert "data = 3 is not a list of file names" in proc.stderr, proc.stderr
    # One file named alone is a list of one (train's --data took one file before it repeated, and runs saved so).
    (tmp_path / "run.toml").write_text("[sft]\ndata = 'samples.txt'\n")
    proc = cli("sft", "--config", "run.toml", cwd=tmp_path)
    assert proc.stderr == "rookworld sft: error: --data: no such file: samples.txt\n", proc.stderr


@pytest.mark.parametrize("command, flags, said", [
    ("train", ["--lr", "1e-4", "--lr", "2e-5"], "--lr given twice: the last (2e-05) is used"),
    ("sft", ["--stockfish-depth", "4", "--stockfish-depth", "6"], "--stockfish-depth given twice: the last (6)"),
    ("train", ["--compile", "--no-compile"], "--compile/--no-compile given twice: the last (--no-compile) is used"),
    ("eval", ["--suite", "best-move", "--suite", "selfplay"], "--suite given twice: the last (selfplay) is used"),
])
def test_a_single_valued_flag_given_twice_says_which_value_is_used(command, flags, said):
    """argparse keeps the last silently: a second --data once dropped the first file (--data repeats now)."""
    proc = cli(command, *flags, "--help")
    assert f"rookworld {command}: warning: {said}" in proc.stderr, proc.stderr
    once = cli(command, *flags[:len(flags) // 2], "--help")
    assert "warning" not in once.stderr, once.stderr
