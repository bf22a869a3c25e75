"""Shared fixtures: the GPT-2 vocabulary file, tiny GPT-2 models (ours and transformers'), and `cli`, which runs
the `rookworld` command in this process."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
import warnings
from pathlib import Path

# What `rookworld.cli` sets on import, set before torch first calls MKL (it is read then): the CLI's runs in this
# process are then as reproducible bit for bit as in a fresh `rookworld` process (resume tests compare weights).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
# One thread a test process, through the setting a user has: runs take every core
# (`harness.process.settle_process`) unless OMP_NUM_THREADS says otherwise, and beside pytest-xdist's other workers
# every core is oversubscription.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# What the tests, the libraries they load and the processes they start write to the system's temp folder (pytest's
# own folders, torch.compile's cache, torchrun's logs, W&B's staging, the benches' run directories) goes into one
# folder of the run's, made by its first process before anything is imported (pytest-xdist's workers inherit it)
# and removed when the run passes: the suite leaves nothing behind.
OWN_TEMP_DIR = None
if "ROOKWORLD_TEST_TMPDIR" not in os.environ:
    OWN_TEMP_DIR = tempfile.mkdtemp(prefix="rookworld-tests-")
    os.environ["ROOKWORLD_TEST_TMPDIR"] = os.environ["TMPDIR"] = OWN_TEMP_DIR
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again

import pytest  # noqa: E402
import torch  # noqa: E402

with contextlib.suppress(ImportError):  # hypothesis's cache, else .hypothesis/ in the working directory
    from hypothesis import configuration

    configuration.set_hypothesis_home_dir(Path(os.environ["ROOKWORLD_TEST_TMPDIR"], "hypothesis"))

REPO = Path(__file__).resolve().parents[1]


def _have_stockfish() -> bool:
    from rookworld.chess.stockfish import find_stockfish

    try:
        find_stockfish()
        return True
    except Exception:
        return False


#: The tests that play or ask the real engine (.ci/run installs it).
needs_stockfish = pytest.mark.skipif(not _have_stockfish(), reason="Stockfish is not installed")

# The test models are tiny, so intra-op threads buy nothing; on a busy 2-core machine their OpenMP spin-waiting
# made the sampling tests 3x slower.
torch.set_num_threads(1)

# A GPT-2 small enough for CPU tests, with the real vocabulary so token ids mean the same as in production.
TINY = dict(n_layer=2, n_head=2, n_embd=64, vocab_size=50257, n_positions=128)


def tiny_gpt(seed: int = 0, scale: float = 1.0, vocab_size: int = TINY["vocab_size"]):
    """A random rookworld GPT in eval mode. scale > 1 sharpens its next-token distributions (GPT-2's init gives
    nearly uniform ones), so that sampling and greedy decoding depend visibly on the context."""
    from rookworld.net.model import GPT, GPTConfig

    torch.manual_seed(seed)
    model = GPT(
        GPTConfig(
            block_size=TINY["n_positions"],
            vocab_size=vocab_size,
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
    model = tiny_gpt(vocab_size=len(logits))
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
        def generate(self, model, ids, mask, tasks, generator, rows_per_prompt, memo=None):
            limits = torch.tensor([lengths[t] for t in tasks]).repeat_interleave(rows_per_prompt)
            options = dataclasses.replace(self.options, max_new_tokens=limits, stop_at_eos=False)
            return generate(model, ids, mask, options, generator=generator, rows_per_prompt=rows_per_prompt,
                            memo=memo)

    trainer.sampler = FixedLengths(trainer.models, trainer.cfg, trainer.run.tokenizer.eos_id)
    return trainer


#: The suite's two tiers: `python -m pytest` runs the fast one (every test without the `slow` marker), `--tier slow`
#: the slow one (compile, the 124M-shaped graph test, training and SFT as processes, real servers and games),
#: `--tier all` both (the floor leg of .ci/run runs its files so).
TIERS = ("fast", "slow", "all")


def pytest_addoption(parser):
    parser.addoption("--tier", choices=TIERS, default="fast",
                     help="fast: the tests without the slow marker (the default); slow: only those; all: both")
    parser.addoption("--as-amx", action="store_true",
                     help="run as on a CPU with AMX, where --dtype auto picks bf16 autocast, in this process and in "
                          "the processes the tests start (tests/as_amx/sitecustomize.py): a machine without AMX "
                          "then tests that route")


def pytest_configure(config):
    if config.getoption("--as-amx"):
        folder = str(REPO / "tests" / "as_amx")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (folder, os.environ.get("PYTHONPATH")) if p)
        if "rookworld_as_amx" not in sys.modules:  # the patch in this process too (its startup ran without it)
            spec = importlib.util.spec_from_file_location("rookworld_as_amx", Path(folder) / "sitecustomize.py")
            sys.modules[spec.name] = module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)


def pytest_collection_modifyitems(config, items):
    tier = config.getoption("--tier")
    if tier == "all":
        return
    wanted = tier == "slow"
    kept, dropped = [], []
    for item in items:
        (kept if (item.get_closest_marker("slow") is not None) == wanted else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_report_header(config):
    tier = config.getoption("--tier")
    other = {"fast": "--tier slow runs the slow tests, --tier all both", "slow": "--tier fast (the default) runs "
             "the others", "all": "both tiers"}[tier]
    amx = "; as on a CPU with AMX (--dtype auto: bf16 autocast)" if config.getoption("--as-amx") else ""
    return f"rookworld tier: {tier} ({other}){amx}"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if OWN_TEMP_DIR is not None and exitstatus == 0:  # a failed run keeps its failed tests' folders there
        shutil.rmtree(OWN_TEMP_DIR, ignore_errors=True)


def pytest_terminal_summary(terminalreporter, exitstatus):
    if OWN_TEMP_DIR is not None and os.path.isdir(OWN_TEMP_DIR):
        terminalreporter.write_line(f"the failed tests' files are kept in {OWN_TEMP_DIR}")


def _show_warning(message, category, filename, lineno, file=None, line=None):
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def stockfish_children() -> int:
    """Stockfish processes this test process has running."""
    count = 0
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == os.getpid() and "stockfish" in (status.parent / "cmdline").read_text():
                count += 1
        except (OSError, IndexError, ValueError):  # a process that ended while being read
            continue
    return count


def one_line_error(result, *parts: str) -> str:
    """The stderr of a refused command: exit 2, one line, no traceback, holding each of `parts`."""
    err = result.stderr.strip()
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for part in parts:
        assert part in err, (part, err)
    return err


def cli(*args, input: str | None = None, cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """`rookworld ARGS` run in this process, as `subprocess.run([sys.executable, "-m", "rookworld", *args],
    capture_output=True, text=True, input=input, cwd=cwd)` runs it, without importing torch anew each time.

    It calls rookworld.cli.main(argv) with its own stdin (`input`, or nothing), stdout and stderr, and gives back a
    CompletedProcess: an exit through SystemExit (--help, a bad flag) is its code, an uncaught exception a traceback
    on stderr and status 1, as Python's own exit would be. What a run changes in the process is put back after it:
    the working directory, the environment, torch's thread count and RNG, SIGINT/SIGTERM handlers and the warning
    filters. Tests of the process itself (the entry point, signals, torchrun, a terminal, environment variables read
    on import, what gets imported) start a real `python -m rookworld` instead.
    """
    from rookworld.cli import main

    argv = [os.fspath(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    env, cwd_before = dict(os.environ), os.getcwd()
    threads, rng = torch.get_num_threads(), torch.random.get_rng_state()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    stdin = sys.stdin
    try:
        sys.stdin = io.StringIO(input or "")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            # A fresh interpreter's warning filters, shown on stderr (pytest would otherwise record them).
            warnings.resetwarnings()
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", category)
            warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
            warnings.showwarning = _show_warning
            if cwd is not None:
                os.chdir(cwd)
            try:
                code = main(argv)
                code = 0 if code is None else code
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
                    code = 1
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        sys.stdin = stdin
        os.chdir(cwd_before)
        if dict(os.environ) != env:
            os.environ.clear()
            os.environ.update(env)
        torch.set_num_threads(threads)
        torch.random.set_rng_state(rng)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return subprocess.CompletedProcess(["rookworld", *argv], code, out.getvalue(), err.getvalue())


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
    return transformers_gpt2(tmp_path_factory.mktemp("tiny"), n_positions=256)


def transformers_gpt2(directory, n_positions: int):
    """A random 2-layer, 32-wide GPT-2 with GPT-2's vocabulary, saved by transformers into `directory`."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=50257, n_positions=n_positions,
                                     activation_function="gelu_new")
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


def rookworld_process(*args, input: str | None = None, cwd=None, env=None, timeout: float = 600):
    """A real `python -m rookworld ARGS`, for what only a fresh process shows: the entry point, environment
    variables read when a library is imported, a process's own settings."""
    return subprocess.run([sys.executable, "-m", "rookworld", *map(os.fspath, args)], capture_output=True, text=True,
                          input=input, cwd=cwd, env=env, timeout=timeout)


def free_port() -> int:
    """A TCP port no process listens on now (the OS's choice), for a rendezvous: fixed ports collide with a run that
    another leg or another checkout left, or one still in TIME_WAIT."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: A 2-rank test takes about 10 s alone and under a minute on a busy machine: past this, a rank waits for one that
#: will not come, and the test fails with every process's stacks rather than hanging the suite to its timeout.
TORCHRUN_BOUND_S = 180.0


def torchrun(*args) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --nproc_per_node 2 ARGS` on a free port, one thread a rank, bounded. A run
    still going after TORCHRUN_BOUND_S is sent SIGABRT, torchrun and its ranks alike: faulthandler prints where each
    Python thread stood, and the test fails with that output."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           *map(os.fspath, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=TORCHRUN_BOUND_S)
    except subprocess.TimeoutExpired:
        family = _descendants(proc.pid)
        # torchrun held still, so that it does not stop the other ranks when the first dies; one at a time, so
        # that the stacks do not interleave
        os.kill(proc.pid, signal.SIGSTOP)
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGABRT)
            time.sleep(1.0)
        os.kill(proc.pid, signal.SIGCONT)
        os.kill(proc.pid, signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pytest.fail(f"torchrun did not end in {TORCHRUN_BOUND_S:.0f} s; the stacks of {len(family)} ranks and torchrun "
                    f"at that moment:\n{err[-12000:]}\n{out[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from /proc (torchrun starts its ranks in sessions of their own, so a
    process group does not reach them)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # the command name may hold spaces and parentheses: the parent's pid is the 2nd field after the last ")"
            ppid = int(entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def check_teardown_order() -> list:
    """For a rank under torchrun: destroying the process group fails while a DDP wrapper whose weak reference is in
    the returned list is alive, since its reducer would destroy the group later, holding the GIL, and can hang the
    rank (`Comm.close`)."""
    wrappers = []
    destroy = torch.distributed.destroy_process_group

    def destroy_after_the_wrappers(*args, **kwargs):
        alive = sum(w() is not None for w in wrappers)
        assert alive == 0, f"{alive} DDP wrappers still alive when the process group is destroyed"
        destroy(*args, **kwargs)

    torch.distributed.destroy_process_group = destroy_after_the_wrappers
    return wrappers



def generate_with(model, ids, mask=None, **kw):
    """`generate` with its sampling options given as keywords beside the others (the tests' shorthand)."""
    from rookworld.net.sampling import SamplingOptions, generate

    fields = SamplingOptions.__dataclass_fields__
    options = SamplingOptions(**{k: kw.pop(k) for k in list(kw) if k in fields})
    return generate(model, ids, mask, options, **kw)
