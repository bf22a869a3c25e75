"""A model directory is checked before memory is taken (issue 45): its weights' shapes against its config.json, from
the safetensors header; its vocabulary against its embedding; its size against the memory free for it. Each case
is one line naming the files or the sizes, a non-zero exit status, and no traceback, in every command that loads a
model. Cases that would take a machine's memory without the checks run in a process whose address space is capped,
so that a missing check fails its test (the process refused its memory) instead of making the machine swap."""

from __future__ import annotations

import json
import re
import math
import resource
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rookworld.net.memory import NotEnoughMemory, available_memory, check_memory
from rookworld.net.model import GPT, GPTConfig
from rookworld.net.pretrained import config_to_hf
from rookworld.net.tokenizer import ENV_VAR, SHIPPED_VOCABULARY

from conftest import REPO, rookworld_process
from test_trainer import run_cli, train_args

FEN = "4k3/8/8/8/8/8/8/4K3 w - - 0 1"
CHESS_MODEL = REPO / "models" / "chess-cpu-sft"
#: Address space of a capped process: torch and a tiny model fit in it, a model built or read for real would not.
CAP = 8 << 30
# An SFT sample of each task (tests/test_sft.py has their story).
P_LINE = ("P: 2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34                                    "
          "M: a4a3 c8f5 h7f6 h7g5 h7f8      E: -3.06 -2.82 -3.21 -3.16 -2.3            B: h7f6")
A_LINE = ("A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+"
          "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0")


def model_dir(tmp_path: Path, name: str, *sources: Path) -> Path:
    """A model directory made of files copied from `sources` (later ones win)."""
    target = tmp_path / name
    target.mkdir()
    for source in sources:
        for file in ([source] if source.is_file() else source.iterdir()):
            shutil.copy(file, target / file.name)
    return target


def with_config(directory: Path, **sizes) -> Path:
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **sizes}))
    return directory


def sft_data(tmp_path: Path) -> Path:
    data = tmp_path / "sft.txt"
    data.write_text(f"{P_LINE}\n{A_LINE}\n")
    return data


def every_command(model: Path, tmp_path: Path) -> dict[str, list[str]]:
    """Each command that loads a model, on `model`."""
    return {"ask": ["ask", "--model", model, FEN],
            "eval": ["eval", "--model", model, "--suite", "selfplay", "--games", "1", "--device", "cpu"],
            "play": ["play", "--model", model, "--device", "cpu"],
            "uci": ["uci", "--model", model, "--device", "cpu"],
            "train": train_args(model, tmp_path / "train-run", "--steps", "1"),
            "sft": ["sft", "--model", model, "--data", sft_data(tmp_path), "--output-dir", tmp_path / "sft-run",
                    "--steps", "1", "--device", "cpu"]}


def assert_refused(proc, *said: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    error = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(error) == 1, proc.stderr
    for text in said:
        assert text in error[0], (text, proc.stderr)


def assert_refused_everywhere(model: Path, tmp_path: Path, *said: str) -> None:
    for name, args in every_command(model, tmp_path).items():
        proc = run_cli(args, cwd=tmp_path) if name != "uci" else _uci(args, tmp_path)
        assert_refused(proc, *said)
        if name == "uci":  # never ready with a model it cannot play, and no move of nothing
            assert "readyok" not in proc.stdout and "bestmove" not in proc.stdout, proc.stdout
            assert "info string cannot load the model" in proc.stdout
    assert not (tmp_path / "train-run").exists() or not any((tmp_path / "train-run").glob("checkpoints/step-*"))


def _uci(args, tmp_path):
    from conftest import cli

    return cli(*args, input="uci\nisready\nposition startpos\ngo depth 1\nquit\n", cwd=tmp_path)


# -- capped processes ------------------------------------------------------------------------------------------

# Runs `rookworld.cli.main` on each argv of a JSON list in one process (torch imported once), printing a JSON line
# [status, stdout, stderr] for each; an exception is a traceback in stderr and status 1, as in a fresh process.
DRIVER = textwrap.dedent(
    """\
    import contextlib, io, json, sys, traceback
    from rookworld.cli import main
    for argv in json.loads(sys.argv[1]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:
                traceback.print_exc()
                code = 1
        print(json.dumps([code, out.getvalue(), err.getvalue()]), flush=True)
    """
)


def capped(*commands: list, cwd: Path, timeout: float = 120) -> list[subprocess.CompletedProcess]:
    """`rookworld ARGS` for each command, in one process that cannot map more than CAP bytes and is stopped after
    `timeout` seconds: a model built or read for real is refused its memory there (a traceback), never the
    machine's."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))

    argvs = [[str(a) for a in args] for args in commands]
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(argvs)], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, preexec_fn=cap)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("[")]
    assert len(results) == len(argvs), proc.stderr
    return [subprocess.CompletedProcess(argv, code, out, err) for argv, (code, out, err) in zip(argvs, results)]


# -- item 5: sizes are measured before memory is taken ---------------------------------------------------------

@pytest.mark.slow
def test_a_config_far_larger_than_its_weights_is_refused_from_the_header_before_anything_is_built(tiny_dir, tmp_path):
    """config.json said n_layer=100000 beside a 2-layer model's weights: `ask` printed nothing for 300 s while it
    grew past 4 GB, building the model before its weights were compared."""
    deep = with_config(model_dir(tmp_path, "deep", tiny_dir), n_layer=100_000)
    wide = with_config(model_dir(tmp_path, "wide", tiny_dir), n_embd=65536, n_head=1)
    long = with_config(model_dir(tmp_path, "long", tiny_dir), n_positions=10**9, vocab_size=10**7)
    ask, train, wide_ask, long_ask = capped(["ask", "--model", deep, FEN],
                                            train_args(deep, tmp_path / "run", "--steps", "1"),
                                            ["ask", "--model", wide, FEN], ["ask", "--model", long, FEN], cwd=tmp_path,
                                            timeout=90)
    for proc in (ask, train):
        assert_refused(proc, f"{deep / 'model.safetensors'} do not match {deep / 'config.json'}",
                       "transformer.h.2.ln_1.weight is missing", "100000 layers", "the weights hold 2 layers")
    assert_refused(wide_ask, "transformer.wte.weight is [50257, 32] where the config makes it [50257, 65536]")
    assert_refused(long_ask, "transformer.wte.weight is [50257, 32] where the config makes it [10000000, 32]")


def test_fresh_sizes_too_large_for_this_machine_are_refused_naming_bytes_needed_and_free(tmp_path):
    """`sft --init tiny --n-layer 100000` passed 6 GB in 25 s; `--n-embd 65536 --n-head 1` was a 13 GB allocation
    and a traceback."""
    data = sft_data(tmp_path)
    runs = [["sft", "--init", "tiny", *sizes, "--data", data, "--output-dir", tmp_path / f"run{i}", "--steps", "1",
             "--device", "cpu"] for i, sizes in enumerate((["--n-layer", "100000"], ["--n-embd", "65536", "--n-head",
                                                                                    "1"]))]
    deep, wide = capped(*runs, cwd=tmp_path)
    n_params = GPTConfig(n_layer=100_000, n_head=2, n_embd=128).n_params
    assert_refused(deep, "a fresh GPT-2 (100000 layers, 2 heads, 128 wide", f"{n_params:,} parameters) needs "
                   f"{n_params * 16 / 1e9:,.1f} GB on cpu to train", "free there", "--n-layer")
    assert_refused(wide, "(2 layers, 1 heads, 65536 wide", "GB on cpu to train")
    assert not (tmp_path / "run0").exists() and not (tmp_path / "run1").exists()  # refused before the run began


def huge_sparse_model(tmp_path: Path) -> tuple[Path, GPTConfig]:
    """A model directory whose config.json and model.safetensors agree on a GPT-2 of 155 billion parameters (620 GB
    in float32): a real file of its full size, sparse, so that it takes no disk."""
    config = GPTConfig(n_layer=48, n_head=16, n_embd=16384, vocab_size=50257, block_size=1024)
    directory = tmp_path / "huge"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config_to_hf(config)))
    top, block = config.parameter_shapes()
    shapes = {**top, **{f"transformer.h.{i}.{name}": shape for i in range(config.n_layer)
                        for name, shape in block.items()}}
    header, offset = {}, 0
    for name, shape in shapes.items():
        if name.endswith(("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")):
            shape = shape[::-1]  # the file's Conv1D layout
        size = math.prod(shape) * 2
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(directory / "model.safetensors", "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        f.truncate(8 + len(text) + offset)
    return directory, config


def test_a_model_larger_than_the_free_memory_is_refused_before_its_weights_are_read(tmp_path):
    huge, config = huge_sparse_model(tmp_path)
    try:
        assert config.n_params * 4 > 4 * (available_memory(torch.device("cpu")) or 0), "a machine this large"
        ask, train, grpo = capped(["ask", "--model", huge, FEN],
                                  ["sft", "--model", huge, "--data", sft_data(tmp_path),
                                   "--output-dir", tmp_path / "run", "--device", "cpu"],
                                  ["train", "--model", huge, "--output-dir", tmp_path / "grpo", "--device", "cpu"],
                                  cwd=tmp_path)
        for refused in (ask, grpo):  # train hashes its KL reference's weights: only once they are checked
            assert_refused(refused, f"{huge} (48 layers, 16 heads, 16384 wide", f"{config.n_params:,} parameters) "
                           "needs", "GB on cpu to load (weights in float32)", "free there")
        assert_refused(train, f"needs {config.n_params * 16 / 1e9:,.1f} GB on cpu to train (weights, gradients and "
                              f"AdamW's moments in float32)")
    finally:
        (huge / "model.safetensors").unlink()  # 311 GB that the disk does not hold, but a reader of sizes would


def test_training_is_measured_with_its_gradients_and_moments_and_loading_with_its_weights():
    free = available_memory(torch.device("cpu"))
    assert free is not None  # Linux: /proc/meminfo
    # A model whose float32 weights take a quarter of the free memory: loading fits, training (16 bytes a
    # parameter) takes four times what is free.
    per_layer = GPTConfig(n_layer=1, n_head=16, n_embd=1024).n_params - GPTConfig(n_layer=0, n_head=16,
                                                                                  n_embd=1024).n_params
    config = GPTConfig(n_layer=max(1, free // 16 // per_layer), n_head=16, n_embd=1024)
    check_memory(config, "cpu", what="it", instead="less")
    with pytest.raises(NotEnoughMemory, match=r"needs .* GB on cpu to train .* free there: less"):
        check_memory(config, "cpu", what="it", instead="less", training=True)


@pytest.mark.parametrize("config", [GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=4364, block_size=64),
                                    GPTConfig(n_layer=3, n_head=4, n_embd=64)])
def test_a_config_s_parameter_shapes_are_those_of_the_model_it_builds(config):
    with torch.device("meta"):
        model = GPT(config)
    top, block = config.parameter_shapes()
    want = {**top, **{f"transformer.h.{i}.{name}": shape for i in range(config.n_layer) for name, shape in
                      block.items()}}
    got = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert got == want and config.n_params == model.num_params()


# -- item 8: weights that do not fit their config, in every command ------------------------------------------------

def test_another_model_s_weights_are_one_line_naming_the_file_and_the_first_tensor_in_every_command(tiny_dir,
                                                                                                 tmp_path):
    """`train --model` and `sft --model` on a directory holding another model's model.safetensors were RuntimeError
    tracebacks; ask, uci and eval said it only after the model was built."""
    mixed = model_dir(tmp_path, "mixed", tiny_dir, CHESS_MODEL / "model.safetensors")
    assert_refused_everywhere(mixed, tmp_path, f"{mixed / 'model.safetensors'} do not match",
                              "transformer.wte.weight is [4364, 128] where the config makes it [50257, 32]",
                              "the weights hold 12 layers, 128 wide, 4364 tokens")


def test_another_model_s_pickled_weights_and_a_header_that_lies_are_one_line(tiny_dir, tmp_path):
    from safetensors.torch import load_file

    pickled = model_dir(tmp_path, "pickled", tiny_dir)
    (pickled / "model.safetensors").unlink()
    torch.save(load_file(str(CHESS_MODEL / "model.safetensors")), pickled / "pytorch_model.bin")
    for name, args in every_command(pickled, tmp_path).items():
        if name in ("train", "ask"):
            assert_refused(run_cli(args, cwd=tmp_path), f"{pickled / 'pytorch_model.bin'} do not match",
                           "transformer.wte.weight is [4364, 128]")

    # A header whose tensor claims more bytes than its range holds: said before anything is read.
    lying = model_dir(tmp_path, "lying", tiny_dir)
    data = (lying / "model.safetensors").read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    name = next(k for k in header if k != "__metadata__")
    header[name]["shape"] = [s * 1000 for s in header[name]["shape"]]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (lying / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + data[8 + length :])
    for args in (["ask", "--model", lying, FEN], train_args(lying, tmp_path / "lying-run", "--steps", "1")):
        assert_refused(run_cli(args, cwd=tmp_path), f"{lying / 'model.safetensors'} cannot be read", name)


# -- item 7: the vocabulary and the weights are one model's --------------------------------------------------------

def test_another_model_s_vocabulary_beside_the_weights_is_one_line_in_every_command(tiny_dir, tmp_path):
    """The chess vocabulary beside a 50,257-row model: ask and train were KeyError tracebacks, and uci answered
    readyok, then bestmove 0000 to every go."""
    mixed = model_dir(tmp_path, "mixed", tiny_dir, CHESS_MODEL / "vocab.json", CHESS_MODEL / "merges.txt")
    assert_refused_everywhere(mixed, tmp_path, f"{mixed}: its vocabulary ({mixed / 'vocab.json'} and merges.txt) "
                              "has 4,364 tokens and its weights' embedding 50,257 rows")


def test_weights_without_their_vocabulary_are_refused_not_read_with_gpt2_s(tmp_path, monkeypatch):
    """chess-cpu-sft's weights without their vocabulary files, or with ROOKWORLD_TIKTOKEN_FILE set: IndexError."""
    bare = model_dir(tmp_path, "bare", CHESS_MODEL / "config.json", CHESS_MODEL / "model.safetensors")
    for args in (["ask", "--model", bare, FEN], ["sft", "--model", bare, "--data", sft_data(tmp_path),
                                                 "--output-dir", tmp_path / "run", "--steps", "1"]):
        assert_refused(run_cli(args, cwd=tmp_path), f"{bare}: its vocabulary (GPT-2's, shipped with rookworld) has "
                       "50,257 tokens and its weights' embedding 4,364 rows",
                       "put those saved with these weights in it")
    named = model_dir(tmp_path, "named", bare)
    monkeypatch.setenv(ENV_VAR, str(SHIPPED_VOCABULARY))
    assert_refused(run_cli(["ask", "--model", named, FEN], cwd=tmp_path),
                   f"its vocabulary ({ENV_VAR}={SHIPPED_VOCABULARY}) has 50,257 tokens")
    half = model_dir(tmp_path, "half", bare, CHESS_MODEL / "vocab.json")
    assert_refused(run_cli(["ask", "--model", half, FEN], cwd=tmp_path), f"{half} has vocab.json but no merges.txt")


def test_the_environment_variable_never_replaces_a_model_s_own_vocabulary(tmp_path, monkeypatch):
    chess = model_dir(tmp_path, "chess", CHESS_MODEL)
    monkeypatch.setenv(ENV_VAR, str(SHIPPED_VOCABULARY))
    proc = run_cli(["ask", "--model", chess, FEN, "--json"], cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"warning: {ENV_VAR}={SHIPPED_VOCABULARY} ignored: {chess} has its own vocabulary" in proc.stderr
    assert json.loads(proc.stdout)["policy"]["completion"].split()[0] == "M:"  # read with its own chess vocabulary


# -- issue 58, item 8: weights and config values a model cannot run with ---------------------------------------------

def with_weights(directory: Path, change) -> Path:
    """`directory`'s model.safetensors with each tensor replaced by `change(name, tensor)`."""
    weights = directory / "model.safetensors"
    state = {name: change(name, tensor) for name, tensor in load_file(str(weights)).items()}
    save_file(state, str(weights), metadata={"format": "pt"})
    return directory


def one_infinity(name: str, tensor: torch.Tensor) -> torch.Tensor:
    if name.endswith("h.1.mlp.c_fc.weight"):
        tensor = tensor.clone()
        tensor[3, 5] = math.inf
    return tensor


def one_huge(name: str, tensor: torch.Tensor) -> torch.Tensor:
    if name.endswith("h.1.mlp.c_fc.weight"):
        tensor = tensor.clone()
        tensor[3, 5] = 3e38
    return tensor


@pytest.mark.slow
def test_weights_that_are_not_finite_or_not_floats_are_one_line_naming_the_tensor(tiny_dir, tmp_path):
    """All-NaN weights loaded and answered `+++...` without a word; int8 weights of the right shapes were a
    RuntimeError traceback from load_state_dict in `ask`."""
    nan = with_weights(model_dir(tmp_path, "nan", tiny_dir), lambda name, t: torch.full_like(t, math.nan))
    inf = with_weights(model_dir(tmp_path, "inf", tiny_dir), one_infinity)
    int8 = with_weights(model_dir(tmp_path, "int8", tiny_dir), lambda name, t: t.to(torch.int8))
    half = with_weights(model_dir(tmp_path, "half", tiny_dir), lambda name, t: t.to(torch.float16))
    huge = with_weights(model_dir(tmp_path, "huge", tiny_dir), one_huge)
    asks = capped(*(["ask", "--model", d, FEN] for d in (nan, inf, int8, half, huge)), cwd=tmp_path, timeout=120)
    assert_refused(asks[0], f"{nan / 'model.safetensors'}: transformer.", "NaN or infinite values",
                   "every logit NaN")
    assert_refused(asks[1], f"{inf / 'model.safetensors'}: transformer.h.1.mlp.c_fc.weight holds 1 NaN or infinite "
                            f"value")
    assert_refused(asks[2], f"{int8 / 'model.safetensors'}: transformer.", "holds int8 weights",
                   "float32, bfloat16, float16, float64")
    assert asks[3].returncode == 0 and "Traceback" not in asks[3].stderr, asks[3].stderr  # float16 is a model's
    # finite, but past any trained weight: it loaded and answered `+++...` without a word (issue 71)
    assert_refused(asks[4], f"{huge / 'model.safetensors'}: transformer.h.1.mlp.c_fc.weight holds a weight of 3e+38",
                   "overflow the model's activations")


def test_a_pickle_of_integer_weights_is_refused_as_the_safetensors_file_is(tiny_dir, tmp_path):
    pickled = model_dir(tmp_path, "pickled", tiny_dir)
    state = load_file(str(pickled / "model.safetensors"))
    (pickled / "model.safetensors").unlink()
    torch.save({k: v.to(torch.uint8) if k.endswith("ln_f.bias") else v for k, v in state.items()},
               pickled / "pytorch_model.bin")
    assert_refused(run_cli(["ask", "--model", pickled, FEN], cwd=tmp_path),
                   f"{pickled / 'pytorch_model.bin'}: transformer.ln_f.bias holds uint8 weights")


def test_a_byte_order_mark_before_config_json_is_read_past(tiny_dir, tmp_path):
    """config.json written by a Windows editor was refused ("Unexpected UTF-8 BOM"), though data and TOML files
    with one are read."""
    marked = model_dir(tmp_path, "marked", tiny_dir)
    (marked / "config.json").write_bytes(b"\xef\xbb\xbf" + (marked / "config.json").read_bytes())
    proc = rookworld_process("ask", "--model", marked, FEN, "--json", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "policy" in json.loads(proc.stdout)


@pytest.mark.parametrize("key, value, said", [
    ("layer_norm_epsilon", -1, "layer_norm_epsilon must be a number above 0 and below 1 (GPT-2's is 1e-05), got -1"),
    ("layer_norm_epsilon", 0, "got 0"),
    ("layer_norm_epsilon", math.nan, "got NaN"),
    ("layer_norm_epsilon", math.inf, "got Infinity"),
    ("layer_norm_epsilon", "1e-5", 'got "1e-5"'),
    ("layer_norm_epsilon", True, "got true"),
    ("n_layer", 0, "n_layer must be a whole number from 1 to 2,147,483,647, got 0"),
    ("n_head", 0, "n_head must be a whole number"),
    ("n_embd", 32.0, "n_embd must be a whole number from 1 to 2,147,483,647, got 32.0"),
    ("n_positions", 2**40, "got 1099511627776"),
    ("vocab_size", "x" * 1000, 'got "xxxxxxxxx'),
    ("n_head", 3, "n_embd (32) must be a multiple of n_head (3)"),
])
def test_config_values_no_model_can_have_are_one_line_naming_the_key(tiny_dir, tmp_path, key, value, said):
    bad = with_config(model_dir(tmp_path, "bad", tiny_dir), **{key: value})
    proc = run_cli(["ask", "--model", bad, FEN], cwd=tmp_path)
    assert_refused(proc, f"{bad / 'config.json'}: ", said)
    assert len(proc.stderr) < 400, proc.stderr  # a value is quoted short, whatever its length


@pytest.mark.slow
def test_a_negative_layer_norm_epsilon_is_refused_at_once_not_answered_forever(tmp_path):
    """layer_norm_epsilon -1 in the chess model's config.json: `ask` gave no answer in 205 s."""
    negative = with_config(model_dir(tmp_path, "negative", CHESS_MODEL), layer_norm_epsilon=-1)
    proc = rookworld_process("ask", "--model", negative, FEN, cwd=tmp_path, timeout=60)
    assert_refused(proc, f"{negative / 'config.json'}: layer_norm_epsilon must be a number above 0")


def test_a_config_json_far_larger_than_a_config_is_refused_unread(tiny_dir, tmp_path):
    padded = model_dir(tmp_path, "padded", tiny_dir)
    text = (padded / "config.json").read_text()
    (padded / "config.json").write_text(text[:-1] + ', "notes": "' + "x" * (2 << 20) + '"}')
    assert_refused(run_cli(["ask", "--model", padded, FEN], cwd=tmp_path), f"{padded / 'config.json'} cannot be read",
                   "bytes, where a GPT-2 config takes about 1,000")


# -- a model's vocabulary files and a run's records, read as data (issue 71) ---------------------------------------

def _vocabulary_dir(tmp_path, name="chess") -> Path:
    d = tmp_path / name
    d.mkdir()
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(REPO / "models" / "chess-play-sft" / f, d / f)
    return d


@pytest.mark.parametrize("file", ["vocab.json", "merges.txt"])
def test_a_vocabulary_file_that_is_a_pipe_too_large_or_nested_is_one_line_never_a_hang(tmp_path, file):
    """A FIFO in vocab.json's place hung the load; deep nesting was a RecursionError and 3 GB a MemoryError."""
    import os

    from rookworld.net.tokenizer import TokenizerUnavailableError, read_hf_vocabulary

    cases = {"fifo": "not a regular file (a FIFO)", "large": "is over 16,777,216 bytes",
             "nested": "nested too deep" if file == "vocab.json" else "are not a GPT-2 vocabulary"}
    for case, said in cases.items():
        d = _vocabulary_dir(tmp_path, f"{file}-{case}")
        (d / file).unlink()
        if case == "fifo":
            os.mkfifo(d / file)
        elif case == "large":
            with open(d / file, "wb") as f:
                f.truncate(3 << 30)  # 3 GB, sparse: never read past its first 16 MB
        else:
            (d / file).write_text("[" * 100_000 + "]" * 100_000)
        with pytest.raises(TokenizerUnavailableError, match=re.escape(said)):
            read_hf_vocabulary(d)


def test_a_byte_order_mark_before_the_vocabulary_files_is_read_past_as_before_config_json(tmp_path):
    from rookworld.net.tokenizer import read_hf_vocabulary

    d = _vocabulary_dir(tmp_path)
    plain = read_hf_vocabulary(d)
    for f in ("vocab.json", "merges.txt"):
        (d / f).write_bytes(b"\xef\xbb\xbf" + (d / f).read_bytes())
    assert read_hf_vocabulary(d) == plain


def test_a_run_record_that_is_a_pipe_or_huge_says_nothing_and_holds_nothing_up(tmp_path):
    """run.json (which command made a run) was read whole: a FIFO hung --resume, 3 GB was a MemoryError."""
    import os

    from rookworld.harness import checkpoint

    os.mkfifo(tmp_path / checkpoint.RUN_FILE)
    assert checkpoint.recorded_command(tmp_path) is None
    (tmp_path / checkpoint.RUN_FILE).unlink()
    with open(tmp_path / checkpoint.RUN_FILE, "wb") as f:
        f.truncate(3 << 30)
    assert checkpoint.recorded_command(tmp_path) is None
    (tmp_path / checkpoint.RUN_FILE).write_text('{"command": "sft"}')
    assert checkpoint.recorded_command(tmp_path) == "sft"
