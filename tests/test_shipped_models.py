"""The models that ship under models/ (the chess-cpu chain's, float32, and the chess-play chain's, bf16): plain
GPT-2 directories of at most 16 MB that `transformers` and every rookworld command load from a fresh clone, so
LEARNING.md's figures can be checked."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch

from rookworld.net.pretrained import from_pretrained
from rookworld.net.tokenizer import chess_tokenizer, get_tokenizer

from conftest import cli

MODELS = Path(__file__).resolve().parents[1] / "models"
SHIPPED = ("chess-cpu-sft", "chess-cpu-grpo", "chess-play-sft", "chess-play-sft3", "chess-play-grpo")
HELD_OUT = Path(__file__).resolve().parents[1] / "data" / "chess-play-held-out.jsonl"


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_model_is_a_small_plain_gpt2_directory(name):
    d = MODELS / name
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "merges.txt", "model.safetensors", "vocab.json"]
    assert (d / "model.safetensors").stat().st_size <= 16 * 2**20
    config = json.loads((d / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["vocab_size"] == 4364
    assert get_tokenizer(d).encode("P: 8/8/8/8/8/8/8/K6k w - - 0 1") == \
        chess_tokenizer().encode("P: 8/8/8/8/8/8/8/K6k w - - 0 1")


@pytest.mark.parametrize("name", SHIPPED)
def test_transformers_loads_a_shipped_model_and_its_tokenizer_as_they_are(name):
    transformers = pytest.importorskip("transformers")
    d = MODELS / name
    hf = transformers.AutoModelForCausalLM.from_pretrained(d).float()  # bf16 weights: compared in float32
    tok = transformers.AutoTokenizer.from_pretrained(d)
    text = "P: rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"
    ids = tok(text)["input_ids"]
    assert ids == get_tokenizer(d).encode(text)
    ours = from_pretrained(d)
    x = torch.tensor([ids])
    with torch.no_grad():
        assert torch.allclose(hf(x).logits, ours(x), atol=1e-4)


def test_eval_ask_and_play_run_on_the_shipped_grpo_model():
    """From a fresh clone, without training: what the README tells a user to try."""
    d = MODELS / "chess-play-grpo"
    ev = cli(*["eval", "--model", str(d), "--data", str(HELD_OUT), "--eval-size", "8", "--device", "cpu",
                  "--stockfish-depth", "4"])
    assert ev.returncode == 0 and "legal best move" in ev.stdout, ev.stderr
    ask = cli(*["ask", "--model", str(d), "--device", "cpu", "--stockfish-depth", "4",
                   "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"])
    assert ask.returncode == 0 and "completion" in ask.stdout, ask.stderr
    play = cli("play", "--model", str(d), "--device", "cpu", input="e4\nd4\nNf3\n")
    assert play.returncode == 0 and "your move (white): e4" in play.stdout, play.stderr


def test_the_readme_s_a_example_is_one_the_shipped_model_answers_right():
    """The README's `ask FEN MOVE` line shows an A: answer the shipped model gets exactly right (and its text names
    one it gets wrong, after 1.e4, which stays wrong)."""
    readme = (MODELS.parent / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("rookworld ask ") and "A: answer" in line)
    fen, move = shlex.split(line.split("#")[0])[2:]
    shown = cli("ask", fen, move, "--device", "cpu", "--stockfish-depth", "4")
    assert shown.returncode == 0 and "next state exact; reward 1.000" in shown.stdout, shown.stdout + shown.stderr
    assert "after 1.e4 from the initial position" in readme
    start = cli("ask", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", "e4", "--device", "cpu",
                "--stockfish-depth", "4")
    assert "- 0r+" in start.stdout and "next state wrong" in start.stdout, start.stdout
