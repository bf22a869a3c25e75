"""Shared fixtures: the GPT-2 vocabulary file, tiny GPT-2 models (ours and transformers')."""

from __future__ import annotations

import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

# The test models are tiny, so intra-op threads buy nothing; on a busy 2-core machine their OpenMP spin-waiting
# made the sampling tests 3x slower.
torch.set_num_threads(1)

# A GPT-2 small enough for CPU tests, with the real vocabulary so token ids mean the same as in production.
TINY = dict(n_layer=2, n_head=2, n_embd=64, vocab_size=50257, n_positions=128)


def tiny_gpt(seed: int = 0, scale: float = 1.0):
    """A random rookworld GPT in eval mode. scale > 1 sharpens its next-token distributions (GPT-2's init gives
    nearly uniform ones), so that sampling and greedy decoding depend visibly on the context."""
    from rookworld.net.model import GPT, GPTConfig

    torch.manual_seed(seed)
    model = GPT(
        GPTConfig(
            block_size=TINY["n_positions"],
            vocab_size=TINY["vocab_size"],
            n_layer=TINY["n_layer"],
            n_head=TINY["n_head"],
            n_embd=TINY["n_embd"],
        )
    )
    if scale != 1.0:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if not name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                    p.mul_(scale)
    return model.eval()


def constant_gpt(logits: torch.Tensor):
    """A GPT whose next-token logits are `logits` [vocab] at every position, whatever the input.

    ln_f's weight is zeroed and its bias is the first unit vector, so the final hidden state is e_0 and the
    (tied) lm_head returns column 0 of wte. Sampling tests can then compare against a known distribution.
    """
    model = tiny_gpt()
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.zero_()
        model.transformer.ln_f.bias[0] = 1.0
        model.transformer.wte.weight[:, 0] = logits
    return model


def fixed_lengths(trainer, lengths: dict[str, int]):
    """Makes `trainer` write exactly lengths[task] tokens a completion, EOS or not, so that a step's shapes do not
    depend on what random weights write (benches/grpo_step.py does the same)."""
    from rookworld.net.sampling import generate
    from rookworld.grpo.models import Sampler

    class FixedLengths(Sampler):
        def generate(self, model, ids, mask, task, generator, samples_per_prompt):
            return generate(model, ids, mask, max_new_tokens=lengths[task], stop_at_eos=False, generator=generator,
                            samples_per_prompt=samples_per_prompt, **self.settings)

    trainer.sampler = FixedLengths(trainer.models, trainer.cfg)
    return trainer


@pytest.fixture
def tiny_model():
    return tiny_gpt(scale=4.0)


@pytest.fixture(scope="session")
def hf_tiny(tmp_path_factory):
    """A random GPT-2 built by transformers (gelu_new), in eval mode, and the directory it was saved to."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1234)
    config = transformers.GPT2Config(**TINY, activation_function="gelu_new")
    model = transformers.GPT2LMHeadModel(config).eval()
    # transformers' init is as flat as GPT-2's; sharpen it so logits differ by more than the tolerance.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln_" not in name:
                p.mul_(4.0)
    directory = tmp_path_factory.mktemp("hf_tiny")
    model.save_pretrained(directory)
    return model, directory


@pytest.fixture(scope="session")
def hf_tiny_bin(hf_tiny, tmp_path_factory):
    """The same model as a legacy `pytorch_model.bin` checkpoint (a pickled HF state dict)."""
    model, directory = hf_tiny
    bin_dir = tmp_path_factory.mktemp("hf_tiny_bin")
    (bin_dir / "config.json").write_text((directory / "config.json").read_text())
    torch.save(model.state_dict(), bin_dir / "pytorch_model.bin")
    return model, bin_dir


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny random GPT-2 written by transformers: what a user's local model directory looks like, with room
    for A: prompts (about 91 tokens) plus completions."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=50257, n_positions=256,
                                     activation_function="gelu_new")
    directory = tmp_path_factory.mktemp("tiny")
    transformers.GPT2LMHeadModel(config).save_pretrained(directory)
    return directory


# A scripted UCI engine for failure paths the real Stockfish cannot be made to take on demand: it crashes on
# positions whose FEN starts with "6k1" and hangs on those starting with "7k".
FAKE_ENGINE = textwrap.dedent(
    """\
    import sys, time
    fen = ""
    def say(*lines):
        for line in lines:
            sys.stdout.write(line + "\\n")
        sys.stdout.flush()
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "uci":
            say("id name Fake", "uciok")
        elif cmd[0] == "isready":
            say("readyok")
        elif cmd[0] == "position":
            fen = " ".join(cmd[2:])
        elif cmd[0] == "go":
            if fen.startswith("6k1"):
                sys.exit(3)  # crash on this position
            if fen.startswith("7k"):
                time.sleep(3600)  # hang on this one
            say(
                "info string NNUE evaluation enabled multipv 1 score cp 999 pv a2a3",
                "info depth 1 seldepth 1 multipv 1 score cp 10 nodes 20 pv e2e4",
                "info depth 2 seldepth 2 multipv 1 score cp 50 lowerbound nodes 30 pv d2d4",
                "info depth 2 seldepth 3 multipv 2 score mate -3 nodes 40 pv g1f3 e7e5",
                "info depth 2 seldepth 3 multipv 1 score cp 20 nodes 50 pv e2e4 e7e5",
                "info depth 1 seldepth 1 multipv 2 score cp 5 nodes 60 pv b1c3",
                "info depth 2 seldepth 2 multipv 3 score cp 0 nodes 70 pv e2e4",
                "info depth 2 seldepth 2 multipv 4 score cp -1 nodes 80 pv e7e5",
                "info depth 2 currmove e2e4 currmovenumber 1",
                "bestmove e2e4",
            )
        elif cmd[0] == "quit":
            break
    """
)


@pytest.fixture()
def fake_engine(tmp_path):
    script = tmp_path / "fake-stockfish"
    script.write_text(f"#!{sys.executable}\n" + FAKE_ENGINE)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)
