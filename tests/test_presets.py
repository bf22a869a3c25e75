"""Presets: the settings that work, shipped with the package and read by --config NAME."""

from __future__ import annotations

import argparse
import importlib.resources

import pytest

from rookworld.settings import presets
from rookworld.settings.config import ConfigError, SFTConfig, TrainConfig, from_args

from test_trainer import run_cli

#: Parameters of each preset's model: a fresh 12-layer, 128-wide GPT-2, or RookWorld-LM-124M.
SIZES = {"chess-cpu": 3.1e6, "chess-play": 4.5e6, "cpu-demo": 8.9e6, "learning": 8.9e6,
         "rookworld-lm-124m": 124.4e6}


def test_the_presets_are_installed_with_the_package():
    shipped = {p.name for p in importlib.resources.files("rookworld.settings.presets").iterdir() if p.name.endswith(".toml")}
    assert shipped == {f"{name}.toml" for name in SIZES} and presets.names() == sorted(SIZES)


@pytest.fixture
def user_files(tmp_path, monkeypatch, tiny_dir):
    """The files the presets name, where a user following their comments would have them."""
    monkeypatch.chdir(tmp_path)
    for name in ("train.jsonl", "held_out.jsonl", "chess-cpu-train.jsonl", "data/chess-cpu-held-out.jsonl",
                 "chess-play-train.jsonl", "data/chess-play-held-out.jsonl"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("")
    for run in ("runs/cpu-demo-sft", "runs/learning-sft", "models/chess-cpu-sft", "runs/chess-play-sft"):
        (tmp_path / run).parent.mkdir(exist_ok=True)
        (tmp_path / run).symlink_to(tiny_dir)


@pytest.mark.parametrize("name", sorted(SIZES))
def test_every_preset_gives_valid_settings_at_a_learning_rate_that_works(name, user_files):
    tables = presets.DIRECTORY.joinpath(f"{name}.toml").read_text()
    for command, cls in (("sft", SFTConfig), ("train", TrainConfig)):
        if f"[{command}]" not in tables:
            with pytest.raises(ConfigError, match=f"no settings for rookworld {command}"):
                from_args(argparse.Namespace(config=name), cls)
            continue
        cfg = from_args(argparse.Namespace(config=name), cls)
        # Within the band no run is warned of (chess-play's GRPO runs 5x below it, at the rate its SFT ended on).
        assert presets.schedule_warnings(command, cfg.lr, cfg.warmup_steps, cfg.steps, SIZES[name]) == [], name
        # A flag overrides the preset.
        assert from_args(argparse.Namespace(config=name, steps=cfg.steps + 7), cls).steps == cfg.steps + 7


def test_a_path_wins_over_a_preset_of_the_same_name_and_a_typo_lists_the_presets(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "samples.txt").write_text("")
    (tmp_path / "cpu-demo").write_text("[sft]\nsteps = 3\ninit = 'tiny'\ndata = ['samples.txt']\n")
    assert from_args(argparse.Namespace(config="cpu-demo"), SFTConfig).steps == 3
    with pytest.raises(ConfigError, match="no such file or preset: cpu-dem .*presets: chess-cpu, chess-play, cpu-demo, learning"):
        from_args(argparse.Namespace(config="cpu-dem"), SFTConfig)


def test_schedule_warnings():
    assert presets.schedule_warnings("train", 1e-4, 5, 30, 8_900_000) == []
    assert presets.schedule_warnings("train", 3e-6, 10, 500, 124_000_000) == []
    (low,) = presets.schedule_warnings("train", 3e-6, 5, 30, 8_900_000)
    assert low.startswith("--lr 3e-06 is 33x below the 0.0001 that works for a model of this size (8.9M")
    (high,) = presets.schedule_warnings("sft", 1e-2, 20, 300, 8_900_000)
    assert "10x above the 0.001" in high
    (warmup,) = presets.schedule_warnings("sft", 1e-3, 50, 40, 8_900_000)
    assert warmup.startswith("--warmup-steps 50 is not shorter than --steps 40")


def test_a_run_warns_of_a_schedule_that_cannot_work(tiny_dir, tmp_path):
    from test_trainer import train_args

    proc = run_cli(train_args(tiny_dir, tmp_path / "run", "--steps", "2", "--lr", "3e-6"))
    assert proc.returncode == 0, proc.stderr
    assert "warning: --warmup-steps 10 is not shorter than --steps 2" in proc.stderr
    assert "warning: --lr 3e-06 is" in proc.stderr and "below the 0.0001" in proc.stderr
    # A resumed run was warned when it started.
    more = run_cli(["train", "--resume", str(tmp_path / "run"), "--steps", "3"])
    assert more.returncode == 0 and "warning: --lr" not in more.stderr, more.stderr


def test_a_short_steps_over_a_preset_fits_its_schedule_and_says_so(capsys):
    """--steps 3 over chess-play (10 warm-up and 300 cooldown steps of 1,300) is a short first try, not an error:
    the preset's warm-up and cooldown are scaled to 3 steps as they were to 1,300 (the cooldown kept at one step),
    said in one line; a length given as a flag stays as given; a longer run keeps the preset's."""
    from rookworld.settings.config import TrainConfig

    cfg = from_args(argparse.Namespace(config="chess-play", steps=3), TrainConfig)
    assert (cfg.warmup_steps, cfg.cooldown_steps) == (0, 1)
    line = capsys.readouterr().err.splitlines()[0]  # the next says the evaluation it cut
    assert line == ("rookworld: --steps 3 is shorter than preset chess-play's schedule (warm-up 10 and cooldown 300 "
                    "of its 1,300 steps): scaled to fit, --warmup-steps 0 --cooldown-steps 1"), line
    cfg = from_args(argparse.Namespace(config="chess-play", steps=130), TrainConfig)
    assert (cfg.warmup_steps, cfg.cooldown_steps) == (1, 30)
    cfg = from_args(argparse.Namespace(config="chess-play", steps=3, warmup_steps=2), TrainConfig)
    assert (cfg.warmup_steps, cfg.cooldown_steps) == (2, 1)
    capsys.readouterr()
    cfg = from_args(argparse.Namespace(config="chess-play", steps=2000), TrainConfig)
    assert (cfg.warmup_steps, cfg.cooldown_steps) == (10, 300) and capsys.readouterr().err == ""
    with pytest.raises(ConfigError, match="must fit"):  # what the flags themselves ask is refused as ever
        from_args(argparse.Namespace(config="chess-play", steps=3, cooldown_steps=5), TrainConfig)


def test_a_short_steps_fits_an_sft_preset_s_warm_up_too(capsys):
    """chess-play's SFT warms up for 200 of 32,000 steps and has no cooldown: --steps 5 scales the warm-up to
    nothing, said, rather than a warning that the rate never reaches --lr."""
    from rookworld.settings.config import SFTConfig

    cfg = from_args(argparse.Namespace(config="chess-play", steps=5, data=[__file__]), SFTConfig)
    assert (cfg.warmup_steps, cfg.cooldown_steps) == (0, 0)
    assert "scaled to fit, --warmup-steps 0" in capsys.readouterr().err
    cfg = from_args(argparse.Namespace(config="chess-play", steps=400, data=[__file__]), SFTConfig)
    assert cfg.warmup_steps == 200  # it fits: kept


def test_a_run_shorter_than_eval_every_evaluates_a_share_of_eval_size(capsys):
    """A run of a preset shorter than its --eval-every evaluates where it starts and ends only, on its share of
    --eval-size (20 positions at least), said in one line; --eval-size given as a flag, and runs of --eval-every
    steps or more, keep theirs."""
    from rookworld.settings.config import SFTConfig, TrainConfig

    cfg = from_args(argparse.Namespace(config="chess-play", steps=5), TrainConfig)
    assert cfg.eval_size == 20 and cfg.eval_every == 100
    assert ("rookworld: --steps 5 is shorter than --eval-every 100: its held-out evaluations, where it starts and "
            "where it ends, take the first 20 of --eval-size 200 positions (--eval-size sets them)"
            ) in capsys.readouterr().err
    assert from_args(argparse.Namespace(config="chess-play", steps=50), TrainConfig).eval_size == 100
    assert from_args(argparse.Namespace(config="chess-play", steps=300), TrainConfig).eval_size == 200
    assert from_args(argparse.Namespace(config="chess-play", steps=5, eval_size=200), TrainConfig).eval_size == 200
    capsys.readouterr()
    assert from_args(argparse.Namespace(config="chess-play", steps=5, eval_size=7), TrainConfig).eval_size == 7
    assert "--eval-every" not in capsys.readouterr().err
    cfg = from_args(argparse.Namespace(config="chess-play", steps=5, data=[__file__]), SFTConfig)
    assert cfg.eval_size == 20  # 200 x 5 / 2,000 is 0.5: the floor
    # Without a --config file, what is asked is what runs (train's defaults: 128 positions every 50 steps).
    assert from_args(argparse.Namespace(steps=25), TrainConfig).eval_size == 128
