"""GRPO training: that it learns, and `rookworld train` end to end on the CPU with real chess tasks,
real Stockfish, checkpoints, resume, torchrun and bad input."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from types import SimpleNamespace
from pathlib import Path

import numpy as np
import pytest
import torch

from rookworld.settings.config import TrainConfig
from rookworld.grpo.prompts import Prompt
from rookworld.chess.rewards import Scores
from rookworld.grpo.trainer import Trainer, held_out_keys
from rookworld.grpo.prompts import PromptSource
from rookworld.chess.rules import generate_positions
from rookworld.chess.data import Record, assign_moves, position_key
from rookworld.lm.bestmove import heldout_records
from rookworld.net.tokenizer import get_tokenizer

from conftest import cli, fixed_lengths, generate_with, tiny_gpt, torchrun

REPO = Path(__file__).resolve().parents[1]


class Lines:
    """A stream that keeps what the run log writes."""

    def __init__(self):
        self.parts: list[str] = []

    def write(self, text):
        self.parts.append(text)

    def flush(self):
        pass

    def __str__(self):
        return "".join(self.parts)


# -- learning: the update moves the policy toward higher reward ----------------------------------------------

class FixedPrompts:
    def __init__(self, text: str, n: int):
        self.text, self.n = text, n

    def batch(self, step):
        return [Prompt("X", self.text)] * self.n


class StartsWith:
    """1 when the completion starts with `prefix`: a simple verifiable reward."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def prefetch(self, prompts):
        pass

    def __call__(self, prompts, completions):
        r = np.array([float(c.startswith(self.prefix)) for c in completions])
        return Scores(r, np.array(["X"] * len(r)), np.ones(len(r), dtype=bool))


def _learning_run(tmp_path, steps=12):
    tok = get_tokenizer()
    policy = tiny_gpt(seed=0, scale=4.0)
    prompt = "P: hello"
    ids = torch.tensor([tok.encode(prompt, bos=True)])
    with torch.no_grad():
        logits = policy(ids)[0, -1]
    top = logits.topk(8).indices.tolist()
    # A plausible but unlikely first token: chance is its share of the top 8.
    target = next(t for t in top[2:] if tok.decode([t]).strip() and tok.decode([t]).isprintable())
    chance = logits[top].softmax(-1)[top.index(target)].item()
    cfg = TrainConfig(steps=steps, prompts_per_step=8, group_size=8, max_new_tokens=2, top_k=8, lr=3e-3, beta=0.0,
                      warmup_steps=0, eval_every=0, save_every=0, sample_every=0, output_dir=str(tmp_path),
                      compile=False, log_every=100).validate()
    t = Trainer(cfg, policy=policy, tokenizer=tok, reward_fn=StartsWith(tok.decode([target])),
                prompts=FixedPrompts(prompt, 8), stream=open(os.devnull, "w"))
    t.train()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return chance, [r["reward/mean"] for r in rows]


def test_grpo_raises_a_simple_verifiable_reward(tmp_path):
    chance, rewards = _learning_run(tmp_path)
    assert chance < 0.25
    assert np.mean(rewards[-3:]) > chance + 0.4, (chance, rewards)


def test_the_learning_test_fails_when_the_advantage_sign_is_flipped(tmp_path, monkeypatch):
    from rookworld.grpo import formulas

    original = formulas.group_advantages
    monkeypatch.setattr(formulas, "group_advantages", lambda *a, **k: -original(*a, **k))
    chance, rewards = _learning_run(tmp_path)
    assert np.mean(rewards[-3:]) < chance, (chance, rewards)


# -- rookworld train on real chess tasks ----------------------------------------------------------------------

def train_args(model_dir, out, *extra):
    """A small run's flags; a flag in `extra` replaces the base's own (a flag given twice is warned of)."""
    base = {"--model": str(model_dir), "--output-dir": str(out), "--prompts-per-step": "4", "--group-size": "4",
            "--max-new-tokens": "12", "--stockfish-depth": "4", "--stockfish-workers": "1", "--eval-every": "0",
            "--sample-every": "1", "--device": "cpu", "--seed": "3"}
    kept = [word for flag, value in base.items() if flag not in extra for word in (flag, value)]
    return ["train", *kept, *extra]


def run_cli(args, cwd=None):
    """`rookworld ARGS`, run in this process (conftest.cli); rookworld_process starts a real one."""
    return cli(*args, cwd=cwd)


def metrics(out):
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def test_train_end_to_end_three_steps(tiny_dir, tmp_path):
    out = tmp_path / "run"
    # A random model writes no well-formed answer, so rewards have no spread; the entropy bonus still moves
    # the weights, which is what this test checks the whole path with.
    proc = run_cli(train_args(tiny_dir, out, "--steps", "3", "--save-every", "2", "--eval-every", "3",
                              "--eval-size", "4", "--entropy-coef", "0.01", "--lr", "1e-3"))
    assert proc.returncode == 0, proc.stderr
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # step 0: the evaluation before any update
    assert "eval/P/legal_best_move" in rows[0] and "reward/mean" not in rows[0]
    rows = rows[1:]
    for r in rows:
        assert -0.3 <= r["reward/mean"] <= 1.0
        assert r["samples_per_s"] > 0 and r["time/generate"] > 0
        assert r["kl/mean"] is not None and r["lr"] > 0
        # Each task's KL per token, of which the step's is the mean weighted by their tokens.
        per_task = [r[k] for k in ("kl/P", "kl/A") if r[k] is not None]
        assert per_task and min(per_task) - 1e-9 <= r["kl/mean"] <= max(per_task) + 1e-9, r
        assert all(r[f"advantage/abs/{t}"] is None or r[f"advantage/abs/{t}"] >= 0 for t in ("P", "A"))
    assert "eval/P/best_move_accuracy" in rows[-1] and "eval/A/next_state_exact" in rows[-1]
    assert "step 3/3 | reward" in proc.stderr
    assert (out / "samples.jsonl").read_text().count('"completion"') >= 3
    ckpt = out / "checkpoints" / "step-000003"
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-000003"
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2LMHeadModel.from_pretrained(ckpt)
    from rookworld.net.pretrained import from_pretrained

    ours = from_pretrained(ckpt)
    ids = torch.tensor([get_tokenizer().encode("P: 8/8/8/8/8/8/8/K6k w - - 0 1", bos=True)])
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, ours(ids), atol=1e-4)
    # The trained weights moved away from the start.
    start = from_pretrained(tiny_dir)
    assert any(not torch.equal(a, b) for a, b in zip(start.state_dict().values(), ours.state_dict().values()))


def final_weights(out):
    from rookworld.harness.checkpoint import resolve_checkpoint
    from rookworld.net.pretrained import from_pretrained

    return from_pretrained(resolve_checkpoint(out)).state_dict()


@pytest.mark.slow
def test_resume_gives_the_same_weights_as_an_unbroken_run(tiny_dir, tmp_path):
    # The entropy bonus makes every step change the weights (the random model's rewards have no spread).
    common = ["--save-every", "2", "--mu", "2", "--minibatches", "2", "--micro-batch-size", "4", "--lr", "1e-3",
              "--entropy-coef", "0.01"]
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    assert run_cli(train_args(tiny_dir, straight, "--steps", "4", *common)).returncode == 0
    first = run_cli(train_args(tiny_dir, broken, "--steps", "2", *common))
    assert first.returncode == 0, first.stderr
    second = run_cli(["train", "--resume", str(broken), "--steps", "4"])
    assert second.returncode == 0, second.stderr
    assert "resumed from" in second.stderr
    a, b = final_weights(straight), final_weights(broken)
    from rookworld.net.pretrained import from_pretrained

    start = from_pretrained(tiny_dir).state_dict()
    assert any(not torch.equal(a[k], start[k]) for k in a), "training must have changed the weights"
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert [r["step"] for r in metrics(broken)] == [1, 2, 3, 4]
    assert [r["reward/mean"] for r in metrics(broken)] == [r["reward/mean"] for r in metrics(straight)]


def test_each_prompt_once_trains_as_computing_every_row_s_prompt_does(tiny_dir, tmp_path):
    """Two steps with each group's prompt computed once (the default) and with --no-shared-prompt, on P: and A:
    prompts, two epochs of two minibatches and the exact KL: the same samples, losses and weights within fp32
    rounding."""
    common = ["--steps", "2", "--save-every", "2", "--mu", "2", "--minibatches", "2", "--lr", "1e-3",
              "--entropy-coef", "0.01", "--kl-estimator", "full", "--task-mix", "0.5", "--dtype", "fp32"]
    once, each = tmp_path / "once", tmp_path / "each"
    proc = run_cli(train_args(tiny_dir, once, *common))
    assert proc.returncode == 0, proc.stderr
    proc = run_cli(train_args(tiny_dir, each, *common, "--no-shared-prompt"))
    assert proc.returncode == 0, proc.stderr
    for a, b in zip(metrics(once), metrics(each), strict=True):
        assert a["reward/mean"] == b["reward/mean"] and a["completion_len"] == b["completion_len"]
        for key in ("loss", "kl/mean", "entropy", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-7), key
    wa, wb = final_weights(once), final_weights(each)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-6, msg=k)


@pytest.mark.slow
def test_torchrun_two_processes_on_gloo(tiny_dir, tmp_path):
    out = tmp_path / "ddp"
    proc = torchrun(REPO / "tests" / "ddp_train.py", tmp_path / "digest",
                    *train_args(tiny_dir, out, "--steps", "2", "--save-every", "0", "--lr", "1e-3", "--entropy-coef",
                                "0.01"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    digests = sorted((tmp_path / "digest").glob("rank*.txt"))
    assert [d.name for d in digests] == ["rank0.txt", "rank1.txt"]
    assert digests[0].read_text() == digests[1].read_text(), "parameters differ between ranks"
    assert [r["step"] for r in metrics(out)] == [1, 2], "one set of metrics, written by rank 0"
    assert len(list((out / "checkpoints").glob("step-*"))) == 1
    assert proc.stderr.count("step 2/2 | reward") == 1


@pytest.mark.parametrize("extra, message", [
    (["--loss-aggregation", "mean"], "--loss-aggregation must be one of token, sequence, constant, got 'mean'"),
    (["--group-size", "1"], "--group-size must be >= 2"),
    (["--task-mix", "1.5"], "--task-mix must lie in [0, 1]"),
    (["--prompts-per-step", "3", "--group-size", "3", "--minibatches", "2"], "must split into --minibatches"),
    (["--stockfish-path", "/nonexistent/stockfish"], "--stockfish-path"),
    (["--resume", "/nonexistent/run"], "no checkpoint"),
])
def test_bad_settings_are_one_clear_line(tiny_dir, tmp_path, extra, message):
    proc = run_cli(train_args(tiny_dir, tmp_path / "x", "--steps", "1", *extra))
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_model_and_corrupt_data_are_clear_errors(tiny_dir, tmp_path):
    proc = run_cli(train_args(tmp_path / "no-such-model", tmp_path / "x", "--steps", "1"))
    assert proc.returncode == 2 and "no such model directory" in proc.stderr and "Traceback" not in proc.stderr
    data = tmp_path / "positions.jsonl"
    data.write_text('{"fen": "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"}\n{"fen": "garbage"}\n')
    proc = run_cli(train_args(tiny_dir, tmp_path / "x", "--steps", "1", "--data", str(data)))
    assert proc.returncode == 2 and f"{data}:2:" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x" / "metrics.jsonl").exists(), "no work before the error"


def test_config_file_and_flags(tiny_dir, tmp_path):
    from rookworld.settings.config import ConfigError, TrainConfig

    toml = tmp_path / "run.toml"
    toml.write_text('steps = 7\nlr = 1e-5\n[ignored]\n')
    proc = run_cli(["train", "--config", str(toml), "--help"])
    assert proc.returncode == 0
    toml.write_text('steps = 1\ngroup-size = 4\nprompts_per_step = 4\nmax_new_tokens = 8\nlr = 1e-5\n'
                    f'model = "{tiny_dir}"\noutput_dir = "{tmp_path / "cfg"}"\nstockfish_depth = 4\n'
                    'eval_every = 0\n')
    proc = run_cli(["train", "--config", str(toml), "--lr", "2e-5", "--device", "cpu"])
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((tmp_path / "cfg" / "checkpoints" / "step-000001" / "train_config.json").read_text())
    assert saved["lr"] == 2e-5 and saved["group_size"] == 4 and saved["steps"] == 1
    with pytest.raises(ConfigError, match="unknown setting"):
        TrainConfig.from_dict({"learning_rate": 1.0})
    with pytest.raises(ConfigError, match="steps = .ten. is not an integer"):
        TrainConfig.from_dict({"steps": "ten"})
    toml.write_text("steps = [broken")
    proc = run_cli(["train", "--config", str(toml)])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_auto_batch_keeps_the_largest_batch_under_the_target_and_a_trial_step_restores_the_model(tmp_path):
    from rookworld.grpo.auto_batch import BatchSearch, largest_batch
    from rookworld.grpo.prompts import PromptSource

    # Peak memory modelled as proportional to the batch: 2 -> 5%, 4 -> 10%, ..., 32 -> 80%, 64 -> 160%.
    tried = []

    def fits(p):
        tried.append(p)
        return p / 40 <= 0.85

    assert largest_batch(2, 1024, lambda p: True, fits) == 32 and tried == [2, 4, 8, 16, 32, 64]
    tried.clear()
    assert largest_batch(2, 1024, lambda p: p != 8, fits) == 32 and 8 not in tried  # sizes that cannot split
    assert largest_batch(2, 16, lambda p: True, fits) == 16  # the limit holds
    assert largest_batch(2, 1024, lambda p: True, lambda p: False) is None

    tok = get_tokenizer()
    policy = tiny_gpt(seed=1)
    cfg = TrainConfig(steps=2, prompts_per_step=2, group_size=2, max_new_tokens=2, beta=0.0, warmup_steps=0,
                      eval_every=0, save_every=0, sample_every=0, output_dir=str(tmp_path), compile=False,
                      lr=1e-2, entropy_coef=0.1).validate()
    t = Trainer(cfg, policy=policy, tokenizer=tok, reward_fn=StartsWith(" M"), prompts=PromptSource(cfg),
                stream=Lines())
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    m = BatchSearch(t).trial_step(8)
    assert m["step"] == 1 and m["grad_norm"] > 0, "a real step was taken"
    assert t.run.step == 0 and t.best_reward == -math.inf and t.run.scheduler.last_epoch == 0
    assert not t.run.optimizer.state, "AdamW's moments are as before the step"
    for k, v in policy.state_dict().items():
        assert torch.equal(v, before[k]), f"the trial step changed {k}"
    assert round(m["samples_per_s"] * m["time/step"]) == 8 * 2, "the trial sampled 8 prompts x 2"
    # Its parts were its own: the run's prompts, collectives and DDP-less module are as they were.
    assert t.cfg.prompts_per_step == 2 and len(t.prompts.batch(0)) == 2
    assert t.models.policy_pass is t.models.trained and t.run.comm.info.world == 1


def test_auto_batch_needs_cuda(tmp_path):
    from rookworld.settings.config import ConfigError

    cfg = TrainConfig(auto_batch=True, device="cpu", output_dir=str(tmp_path)).validate()
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        Trainer(cfg, policy=tiny_gpt(), tokenizer=get_tokenizer(), reward_fn=StartsWith("x"),
                prompts=FixedPrompts("x", 2))


@pytest.mark.slow
def test_ctrl_c_finishes_the_step_saves_and_exits(tiny_dir, tmp_path):
    import signal
    import time

    out = tmp_path / "interrupted"
    proc = subprocess.Popen([sys.executable, "-m", "rookworld", *train_args(tiny_dir, out, "--steps", "500",
                                                                           "--save-every", "0")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text()):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr
    assert "stopping after step" in stderr and "--resume" in stderr and "Traceback" not in stderr
    done = [r["step"] for r in metrics(out)]
    assert done and done[-1] < 500
    saved = out / "checkpoints" / f"step-{done[-1]:06d}"
    assert (saved / "trainer_state.pt").is_file() and (saved / "model.safetensors").is_file()


def test_prompts_from_a_file_are_deterministic_and_cover_every_record(tmp_path):
    from rookworld.chess.rules import generate_positions
    from rookworld.chess.data import Record, assign_moves
    from rookworld.grpo.prompts import PromptSource

    records = assign_moves([Record(fen=p.fen) for p in generate_positions(10, 5)], seed=0)
    cfg = TrainConfig(prompts_per_step=4, task_mix=0.5, output_dir=str(tmp_path)).validate()
    a, b = PromptSource(cfg, records), PromptSource(cfg, records)
    steps = [a.batch(s) for s in range(5)]
    assert steps == [b.batch(s) for s in range(5)], "a pure function of (seed, step)"
    assert steps[3] == PromptSource(cfg, records).batch(3), "no hidden state: a resumed run sees the same prompts"
    first_pass = {p.text.split("+")[0].removeprefix("A: ").removeprefix("P: ") for s in steps[:2] for p in s}
    first_pass |= {p.text.split("+")[0].removeprefix("A: ").removeprefix("P: ") for p in steps[2][:2]}
    assert first_pass == {r.fen for r in records}, "each pass visits every record once"
    tasks = [p.task for s in steps for p in s]
    assert 0 < tasks.count("P") < len(tasks)
    # Two ranks split a step's prompts between them.
    r0, r1 = PromptSource(cfg, records, rank=0, world=2), PromptSource(cfg, records, rank=1, world=2)
    assert r0.batch(1) + r1.batch(1) == a.batch(1)


def _prompt_key(prompt: Prompt) -> str:
    return position_key(prompt.text.removeprefix("A: ").removeprefix("P: ").split("+")[0])


def test_no_training_prompt_is_a_held_out_position(tmp_path):
    """Generated openings recur across seeds: a held-out set of 2,000 generated positions shares positions with any
    training stream. Training leaves them out (a generated one is replaced, a file's dropped), and the stream
    stays a pure function of (seed, step, rank)."""
    held_out = frozenset(position_key(p.fen) for p in generate_positions(2000, 1001))
    cfg = TrainConfig(prompts_per_step=16, output_dir=str(tmp_path)).validate()
    plain = [PromptSource(cfg).batch(s) for s in range(40)]
    assert sum(_prompt_key(p) in held_out for b in plain for p in b) > 40, "the stream without exclusion hits them"
    a = PromptSource(cfg, held_out=held_out)
    steps = [a.batch(s) for s in range(40)]
    assert not any(_prompt_key(p) in held_out for b in steps for p in b)
    assert steps[7] == PromptSource(cfg, held_out=held_out).batch(7), "no hidden state: a resume sees the same"
    kept = sum(p == q for b, c in zip(plain, steps) for p, q in zip(b, c))
    assert kept > 0.5 * 16 * 40, "only the held-out positions are replaced"
    assert sum(p.task == "A" for b in steps for p in b) == sum(p.task == "A" for b in plain for p in b)
    # A file's held-out records are left out; every other record stays.
    records = assign_moves([Record(fen=p.fen) for p in generate_positions(300, 5)], seed=0)
    source = PromptSource(cfg, records, held_out=held_out)
    assert source.left_out == sum(position_key(r.fen) in held_out for r in records) > 0
    assert not any(_prompt_key(p) in held_out for s in range(30) for p in source.batch(s))


def test_a_training_run_leaves_out_its_eval_data(tmp_path):
    held = tmp_path / "held_out.jsonl"
    held.write_text("".join(json.dumps({"fen": p.fen}) + "\n" for p in generate_positions(500, 1001)))
    cfg = TrainConfig(eval_data=str(held), output_dir=str(tmp_path)).validate()
    assert held_out_keys(cfg) == {position_key(p.fen) for p in generate_positions(500, 1001)}
    generated = TrainConfig(eval_size=64, seed=3, output_dir=str(tmp_path)).validate()
    assert held_out_keys(generated) == {position_key(r.fen) for r in heldout_records(64, 3)}
    # A --data file made only of held-out positions leaves nothing to train on: one line, before any model loads.
    only_held = tmp_path / "only_held.fen"
    only_held.write_text("".join(p.fen + "\n" for p in generate_positions(20, 1001)))
    proc = run_cli(["train", "--data", str(only_held), "--eval-data", str(held), "--output-dir",
                    str(tmp_path / "run"), "--device", "cpu"])
    assert proc.returncode != 0 and "every position is among the held-out ones" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def test_train_reads_every_data_file_given(tiny_dir, tmp_path):
    """--data repeats, as sft's does: a second one silently replaced the first (LEARNING.md's long runs read one of
    their two files). A run saved when it took one file (its setting a string) still resumes."""
    fens = ["rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1",
            "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"]
    files = [tmp_path / "a.fen", tmp_path / "b.fen"]
    for path, fen in zip(files, fens):
        path.write_text(fen + "\n")
    out = tmp_path / "run"
    proc = run_cli(train_args(tiny_dir, out, "--steps", "2", "--data", files[0], "--data", files[1]))
    assert proc.returncode == 0, proc.stderr
    assert f"from {files[0]}, {files[1]}" in proc.stderr
    prompts = [json.loads(line)["prompt"] for line in (out / "samples.jsonl").read_text().splitlines()]
    assert all(any(fen in p for p in prompts) for fen in fens), prompts
    saved = out / "checkpoints" / "step-000002" / "train_config.json"
    old = json.loads(saved.read_text())
    assert old["data"] == [str(f) for f in files]
    saved.write_text(json.dumps({**old, "data": str(files[1])}))
    again = run_cli(["train", "--resume", str(out), "--steps", "3"])
    assert again.returncode == 0 and f"from {files[1]}\n" in again.stderr, again.stderr


def test_tensorboard_event_files_when_tensorboard_is_installed(tmp_path):
    pytest.importorskip("tensorboard", reason="TensorBoard logging is optional (pip install '.[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _learning_run(tmp_path, steps=3)
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events, "no event file written"
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    rewards = acc.Scalars("reward/mean")
    assert [e.step for e in rewards] == [1, 2, 3]
    rows = metrics(tmp_path)
    assert [pytest.approx(e.value, abs=1e-6) for e in rewards] == [r["reward/mean"] for r in rows]
    assert "time/generate" in acc.Tags()["scalars"]


def test_a_position_stockfish_cannot_analyse_is_left_out_and_training_goes_on(fake_engine, tmp_path):
    from rookworld.chess.rewards import RewardScorer
    from rookworld.chess.stockfish import StockfishPool
    from rookworld.grpo.rollout import RolloutReward

    crashing = "6k1/5ppp/8/8/8/8/5PPP/6K1 w - - 0 1"  # the scripted engine dies on this one, every time
    fine = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"

    class Prompts:
        def batch(self, step):
            return [Prompt("P", f"P: {crashing}"), Prompt("P", f"P: {fine}")]

    lines = Lines()

    cfg = TrainConfig(steps=2, prompts_per_step=2, group_size=2, max_new_tokens=4, beta=0.0, warmup_steps=0,
                      eval_every=0, save_every=0, sample_every=0, output_dir=str(tmp_path), compile=False,
                      lr=1e-3, entropy_coef=0.01).validate()
    with StockfishPool(fake_engine, workers=1, depth=2, retries=1) as pool:
        reward = RolloutReward(RewardScorer(pool))
        result = reward([Prompt("P", f"P: {crashing}")] * 2 + [Prompt("P", f"P: {fine}")] * 2, ["x"] * 4)
        assert result.valid.tolist() == [False, False, True, True]
        assert result.rewards.tolist()[2:] == [-0.3, -0.3]
        t = Trainer(cfg, policy=tiny_gpt(), tokenizer=get_tokenizer(), reward_fn=reward, prompts=Prompts(),
                    stream=lines)
        t.train()
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2], "the run went on"
    assert all(r["unscored"] == 0.5 and r["reward/mean"] == pytest.approx(-0.3) for r in rows)
    assert "could not be scored" in str(lines)


def test_the_next_step_s_analyses_asked_for_early_are_what_its_rewards_read():
    """On CUDA the trainer asks Stockfish for the next step's P: positions while the GPU samples (`prefetch`):
    real Stockfish, three positions; their rewards then come from the pool's cache, equal to the rewards of a pool
    that was not asked early. A: prompts and P: prompts whose data carries the analysis ask for nothing."""
    from rookworld.chess.rewards import RewardScorer
    from rookworld.chess.stockfish import StockfishPool
    from rookworld.grpo.rollout import RolloutReward

    fens = ["rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1",
            "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
            "6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1"]
    prompts = [Prompt("P", f"P: {fen}") for fen in fens]
    prompts += [Prompt("A", f"A: {fens[0]}+e7e5+e2e4 e7e5+"), Prompt("P", f"P: {fens[1]}", truth=(["g1f3"], [0.3]))]
    completions = ["M: e7e5 d7d5 g8f6 c7c5 e7e6  E: 0.3 0.4 0.2 0.5 0.1  B: e7e5", "M: f1b5", "M: a1a8 B: a1a8",
                   "r", "M: f1b5"]
    with StockfishPool(workers=1, depth=4) as early, StockfishPool(workers=1, depth=4) as late:
        reward = RolloutReward(RewardScorer(early))
        reward.prefetch(prompts)
        deadline = time.monotonic() + 60
        while early.stats.engine_analyses < len(fens) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert early.stats.engine_analyses == len(fens), "one analysis for each P: prompt without one"
        got = reward(prompts, completions)
        assert early.stats.engine_analyses == len(fens) and early.stats.cache_hits >= len(fens)
        want = RolloutReward(RewardScorer(late))(prompts, completions)
    assert got.rewards.tolist() == want.rewards.tolist() and got.valid.all()


# -- length-grouped micro-batches -----------------------------------------------------------------------------

class ByteSum:
    """A reward with spread in every group: the byte sum of the completion, mod 7."""

    def prefetch(self, prompts):
        pass

    def __call__(self, prompts, completions):
        r = np.array([float(sum(c.encode("utf-8", "surrogatepass")) % 7) for c in completions])
        return Scores(r, np.array([p.task for p in prompts]), np.ones(len(r), dtype=bool))


def test_micro_batches_cover_every_row_once_and_cut_only_padding():
    from rookworld.grpo.rollout import micro_batches

    rng = np.random.default_rng(0)
    n, P = 203, 110
    prompt_lens = np.where(rng.random(n) < 0.8, rng.integers(36, 63, n), rng.integers(52, P + 1, n))
    completion_lens = np.where(prompt_lens < 63, rng.integers(1, 49, n), rng.integers(40, 97, n))
    rows = rng.permutation(n)[:150]
    batches = micro_batches(rows, prompt_lens, completion_lens, P, 16)
    assert sorted(np.concatenate([b.rows for b in batches]).tolist()) == sorted(rows.tolist())
    assert all(1 <= len(b.rows) <= 16 for b in batches) and len(batches) == -(-150 // 16)
    slots = 0
    for b in batches:
        # Every real token of every row stays inside the block, and the block is no wider than that.
        assert (P - prompt_lens[b.rows] >= b.left).all() and (completion_lens[b.rows] <= b.width).all()
        assert (P - prompt_lens[b.rows] == b.left).any() and (completion_lens[b.rows] == b.width).any()
        slots += len(b.rows) * (P - b.left + b.width)
    real = int(prompt_lens[rows].sum() + completion_lens[rows].sum())
    unsorted = len(rows) * (P + int(completion_lens[rows].max()))
    # Lengths drawn independently here (in GRPO a group shares its prompt, which packs better still).
    assert 1 - real / slots < 0.5 * (1 - real / unsorted)


def _cut_step(tmp_path, micro_batch_size, reference):
    """One step over real P:/A: prompts of different widths and completions of different lengths; the
    learning rate is negligible (1e-30) so that the second minibatch's gradients do not depend on the first's update."""
    from rookworld.grpo.prompts import PromptSource

    cfg = TrainConfig(steps=1, prompts_per_step=6, group_size=3, max_new_tokens=9, lr=1e-30, beta=0.1, mu=1,
                      minibatches=2, micro_batch_size=micro_batch_size, warmup_steps=0, eval_every=0,
                      save_every=0, sample_every=0, output_dir=str(tmp_path), compile=False, seed=5,
                      task_mix=0.5, dtype="fp32").validate()  # the tests compare to float32's rounding
    t = fixed_lengths(Trainer(cfg, policy=tiny_gpt(seed=2, scale=3.0), reference=reference, tokenizer=get_tokenizer(),
                              reward_fn=ByteSum(), prompts=PromptSource(cfg), stream=open(os.devnull, "w")),
                      {"P": 4, "A": 9})
    m = t.train_step()
    grads = {k: p.grad.clone() for k, p in t.run.policy.named_parameters()}
    return m, grads, t


def test_cut_micro_batches_give_the_same_losses_and_gradients_as_one_padded_block(tmp_path):
    reference = tiny_gpt(seed=3, scale=3.0).requires_grad_(False)
    whole, g_whole, _ = _cut_step(tmp_path / "a", 18, reference)
    cut, g_cut, t = _cut_step(tmp_path / "b", 1, reference)
    prompts = t.prompts.batch(0)
    assert {p.task for p in prompts} == {"P", "A"}  # rows of different widths were in the step
    assert cut["padding"] == 0.0 < whole["padding"]
    for key in ("loss", "kl/mean", "entropy", "clip_fraction", "reward/mean"):
        assert cut[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-7), key
    assert g_whole["transformer.wte.weight"].abs().sum() > 0
    for k in g_whole:
        torch.testing.assert_close(g_cut[k], g_whole[k], rtol=1e-4, atol=1e-6, msg=k)


def test_rollout_logprobs_of_cut_micro_batches_equal_the_padded_pass(tmp_path):
    """Groups of 3 completions of 6 prompts of both tasks (different widths), cut into micro-batches of whole
    groups, each prompt computed once: the log-probs of one padded pass over every row."""
    from rookworld.net.logprobs import PassOptions, token_logprobs
    from rookworld.grpo.rollout import micro_batches, rollout_logprobs

    _, _, t = _cut_step(tmp_path, 4, tiny_gpt(seed=3))
    assert t.models.rows_per_prompt == 3
    ids, pmask = t.run.tokenizer.encode_batch([p.text for p in t.prompts.batch(0)], bos=True)
    ids, pmask = ids.repeat_interleave(3, 0), pmask.repeat_interleave(3, 0)
    torch.manual_seed(0)
    comp_lens = torch.randint(1, 10, (len(ids),))
    comp = torch.randint(0, 50000, (len(ids), 9))
    cmask = torch.arange(9)[None, :] < comp_lens[:, None]
    full_ids, full_mask, P = torch.cat([ids, comp], 1), torch.cat([pmask, cmask], 1), ids.shape[1]
    with torch.no_grad():
        expected = token_logprobs(t.run.policy, full_ids, full_mask, PassOptions(start=P)).logprobs * cmask
        for size in (1, 3, 6, 18):
            batches = micro_batches(np.arange(len(ids)), pmask.sum(1).numpy(), comp_lens.numpy(), P, size, 3)
            assert all(len(b.rows) == max(3, size // 3 * 3) or b is batches[-1] for b in batches)
            rows = SimpleNamespace(ids=full_ids, mask=full_mask, prompt_width=P)  # what it reads of a rollout
            got = rollout_logprobs(t.models, t.run.policy, rows, batches, t.cfg.temperature)[0]
            torch.testing.assert_close(got * cmask, expected, rtol=1e-5, atol=1e-5)  # the loss masks the rest


# -- the task mix and sampling per task -----------------------------------------------------------------------

@pytest.mark.parametrize("mix", [0.8, 0.75, 0.5, 0.33, 0.0, 1.0])
def test_a_prompts_come_at_an_exact_rate(mix):
    from rookworld.grpo.prompts import a_prompt_at

    flags = np.array([a_prompt_at(i, mix) for i in range(5000)])
    assert abs(flags.mean() - (1 - mix)) < 1e-3
    for n in (7, 16, 128):  # any n consecutive prompts: floor or ceil of n x (1 - mix) are A:
        counts = {int(flags[s : s + n].sum()) for s in range(0, 5000 - n, 13)}
        assert counts <= {math.floor(n * (1 - mix) + 1e-9), math.ceil(n * (1 - mix) - 1e-9)}, (n, counts)


@pytest.mark.parametrize("compile", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_tasks_are_sampled_together_when_decoding_eagerly_and_apart_when_compiled(tmp_path, monkeypatch, compile):
    """Eager decoding drops finished groups, so every task goes in one batch, each row with its task's length;
    compiled decoding (static shapes) samples each task in its own batch, so that P: rows are neither padded to
    A: prompts' width nor decoded for A:'s length. Either way rows come back where they were."""
    from rookworld.grpo.prompts import PromptSource

    cfg = TrainConfig(steps=1, prompts_per_step=5, group_size=2, max_new_tokens=9, task_mix=0.6, beta=0.0,
                      warmup_steps=0, eval_every=0, save_every=0, sample_every=0, output_dir=str(tmp_path),
                      compile=False).validate()
    t = Trainer(cfg, policy=tiny_gpt(seed=4, scale=3.0), tokenizer=get_tokenizer(), reward_fn=ByteSum(),
                prompts=PromptSource(cfg), stream=open(os.devnull, "w"))
    limits = {"P": 3, "A": 7}
    fixed_lengths(t, limits)
    # A run compiles on CUDA alone; the sampler's choice is the same here.
    t.sampler.options = dataclasses.replace(t.sampler.options, compile=compile)
    calls = []
    real_generate = t.sampler.generate

    def spy(model, ids, mask, tasks, generator, rows_per_prompt, memo=None):
        out = real_generate(model, ids, mask, tasks, generator, rows_per_prompt, memo)
        calls.append((ids.clone(), mask.clone(), tasks.copy(), out))
        return out

    monkeypatch.setattr(t.sampler, "generate", spy)
    prompts = t.prompts.batch(0)
    ids, pmask = t.run.tokenizer.encode_batch([p.text for p in prompts], bos=True)
    prompt_tasks = np.array([p.task for p in prompts])
    tasks = np.repeat(prompt_tasks, 2)
    assert (tasks == "P").sum() == 6 and (tasks == "A").sum() == 4  # 3 P: and 2 A: prompts: the exact mix
    out, _ = t.sampler(ids, pmask, prompt_tasks, 2, torch.Generator().manual_seed(0))
    # Each prompt goes once (the shared prompt), its completions come back in groups of 2.
    if compile:
        assert [c[2].tolist() for c in calls] == [["P"] * 3, ["A"] * 2]
    else:
        assert len(calls) == 1 and calls[0][2].tolist() == prompt_tasks.tolist()
    for c_ids, c_mask, c_tasks, c_out in calls:
        rows = np.concatenate([np.flatnonzero(prompt_tasks == task) for task in dict.fromkeys(c_tasks)])
        rows = np.sort(rows)[:, None] * 2 + np.arange(2)
        assert c_ids.shape[1] == int(pmask[rows[:, 0] // 2].sum(1).max())  # no column that is padding everywhere
        assert torch.equal(out.tokens[rows.reshape(-1), : c_out.tokens.shape[1]], c_out.tokens)
    for task, limit in limits.items():
        rows = np.flatnonzero(tasks == task)
        assert (out.lengths[rows] == limit).all() and not out.mask[rows, limit:].any()
    assert out.tokens.shape[1] == 7


def test_under_bf16_autocast_the_trainer_samples_and_scores_through_autocast_copies(tmp_path):
    """`--dtype bf16`: sampling reads a bf16 copy of the policy, refreshed after each update, and the reference pass
    a bf16 copy of the reference; both give exactly what the fp32 models give under autocast."""
    from rookworld.grpo.prompts import PromptSource
    from rookworld.grpo.rollout import micro_batches, rollout_logprobs

    cfg = TrainConfig(steps=2, prompts_per_step=4, group_size=2, max_new_tokens=8, lr=1e-2, beta=0.1, dtype="bf16",
                      warmup_steps=0, eval_every=0, save_every=0, sample_every=0, output_dir=str(tmp_path),
                      compile=False, task_mix=0.5).validate()
    reference = tiny_gpt(seed=3, scale=3.0).requires_grad_(False)
    before = {k: v.clone() for k, v in reference.state_dict().items()}
    t = Trainer(cfg, policy=tiny_gpt(seed=2, scale=3.0), reference=reference, tokenizer=get_tokenizer(),
                reward_fn=ByteSum(), prompts=PromptSource(cfg), stream=open(os.devnull, "w"))
    assert t.models.amp_dtype == torch.bfloat16
    assert t.models.reference is not reference and t.models.reference.lm_head.weight.dtype == torch.bfloat16
    t.train_step()
    t.train_step()
    assert all(torch.equal(v, before[k]) for k, v in reference.state_dict().items())  # the caller's is untouched

    ids, mask = t.run.tokenizer.encode_batch([p.text for p in t.prompts.batch(0)], bos=True)
    kw = dict(max_new_tokens=8, temperature=1.0, seed=1, stop_at_eos=False, dtype=torch.bfloat16, rows_per_prompt=2)
    sampled = generate_with(t.models.sampling_model(), ids, mask, **kw)  # the copy, brought up to the updated weights
    expected = generate_with(t.run.policy, ids, mask, **kw)
    assert torch.equal(sampled.tokens, expected.tokens) and torch.equal(sampled.logprobs, expected.logprobs)

    ids, mask = ids.repeat_interleave(2, 0), mask.repeat_interleave(2, 0)  # groups of 2, as the trainer's rows
    full_ids, full_mask = torch.cat([ids, sampled.tokens], 1), torch.cat([mask, sampled.mask], 1)
    P, n = ids.shape[1], len(ids)
    batches = micro_batches(np.arange(n), mask.sum(1).numpy(), np.full(n, 8), P, 3, 2)
    rows = SimpleNamespace(ids=full_ids, mask=full_mask, prompt_width=P)  # what it reads of a rollout
    got, _ = rollout_logprobs(t.models, t.models.reference, rows, batches, 1.0)
    want, _ = rollout_logprobs(t.models, reference, rows, batches, 1.0)
    assert torch.equal(got, want)


def test_bf16_on_the_cpu_runs_every_phase_of_a_run(tiny_dir, tmp_path):
    """`--dtype bf16` on the CPU, through every phase a CUDA run takes in bf16: autocast copies for sampling and the
    reference, the fused head under autocast in the update, a held-out evaluation, a checkpoint and a resume. No
    product memo (it serves float32 eager passes only), and finite figures throughout."""
    out = tmp_path / "bf16"
    proc = run_cli(train_args(tiny_dir, out, "--steps", "2", "--dtype", "bf16", "--beta", "0.1", "--eval-every", "2",
                              "--eval-size", "4", "--save-every", "1", "--entropy-coef", "0.01"))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "torch.compile" not in proc.stderr
    rows = metrics(out)
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]
    for r in rows:
        assert all(math.isfinite(v) for k, v in r.items() if isinstance(v, float)), r
    assert any(k.startswith("eval/") for r in rows for k in r)  # the held-out evaluation ran
    more = run_cli(["train", "--resume", str(out), "--steps", "3"])
    assert more.returncode == 0, more.stderr
    assert [r["step"] for r in metrics(out) if "loss" in r] == [1, 2, 3]


@pytest.mark.parametrize("fused", [False, True])
def test_resumed_adamw_moments_take_their_parameter_s_layout(fused):
    """Moments saved beside a contiguous parameter, loaded for a transposed one (a model read from a Hugging Face
    file by an earlier rookworld): the next step is AdamW's, computed here in float64, for the fused kernel too
    (which pairs elements by memory order)."""
    from rookworld.harness.checkpoint import load_optimizer_state

    g = torch.Generator().manual_seed(0)
    w0, grads = torch.randn(8, 6, generator=g), [torch.randn(8, 6, generator=g) for _ in range(2)]
    lr, b1, b2, eps, wd = 1e-2, 0.9, 0.95, 1e-8, 0.1
    saved = torch.nn.Parameter(w0.clone())
    first = torch.optim.AdamW([saved], lr=lr, betas=(b1, b2), weight_decay=wd, fused=fused)
    saved.grad = grads[0].clone()
    first.step()
    resumed = torch.nn.Parameter(saved.detach().t().contiguous().t())  # the same values, transposed in memory
    second = torch.optim.AdamW([resumed], lr=lr, betas=(b1, b2), weight_decay=wd, fused=fused)
    load_optimizer_state(second, first.state_dict())
    assert all(v.stride() == resumed.stride() for v in second.state[resumed].values() if v.dim() == 2)
    resumed.grad = grads[1].t().contiguous().t()  # autograd gives a gradient its parameter's layout
    second.step()

    p, m, v = w0.double(), torch.zeros(8, 6, dtype=torch.float64), torch.zeros(8, 6, dtype=torch.float64)
    for t, grad in enumerate(grads, start=1):
        grad = grad.double()
        p = p * (1 - lr * wd)
        m, v = b1 * m + (1 - b1) * grad, b2 * v + (1 - b2) * grad**2
        p = p - lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
    assert torch.allclose(resumed.detach().double(), p, atol=1e-6)


# -- the update's first pass takes sampling's products ---------------------------------------------------------

class MixedPrompts:
    """P: and A: prompts of different lengths, so that micro-batches cut their prompts at different columns."""

    def __init__(self, tok):
        self.prompts = [Prompt("P" if i % 3 else "A", "P: " + " ".join(["e4"] * (2 + 3 * i))) for i in range(6)]

    def batch(self, step):
        return self.prompts


class HashReward:
    """A reward with spread: a fixed function of each completion's text."""

    def prefetch(self, prompts):
        pass

    def __call__(self, prompts, completions):
        r = np.array([(sum(map(ord, c)) % 7) / 7 for c in completions])
        return Scores(r, np.array([p.task for p in prompts]), np.ones(len(r), dtype=bool))


def _update_grads(trainer, rollout):
    """The update's gradients over `rollout` (one minibatch, one epoch), the weights left as they were."""
    from rookworld.grpo.update import update

    frozen = torch.optim.SGD(trainer.models.policy.parameters(), lr=0.0)
    update(trainer.update_settings, trainer.objective, trainer.models, frozen, trainer.run.comm, rollout, 0)
    return {name: p.grad.clone() for name, p in trainer.models.policy.named_parameters()}


@pytest.mark.parametrize("lengths", [{"P": 4, "A": 9}, {"P": 9, "A": 9}, {"P": 1, "A": 1}])
def test_the_updates_first_pass_takes_samplings_products_and_gets_the_same_gradients(tmp_path, lengths):
    """Eager decoding keeps the trunk's Linear products (`ProductMemo`), and the update's first pass takes them
    instead of making them again. Its gradients are those of the pass that makes every product, to float32's
    rounding: prompts of six widths, micro-batches of two groups (each cut to its own prompt columns), P: rows that
    stop early so that their groups leave the decoding batch, or every row ending at its first token (decoding
    feeds none, so no completion product is kept), the k3 KL and the entropy in the loss."""
    from rookworld.grpo.rollout import RolloutParts, collect_rollout

    tok = get_tokenizer()
    cfg = TrainConfig(steps=2, prompts_per_step=6, group_size=4, max_new_tokens=9, beta=0.1, entropy_coef=0.01,
                      micro_batch_size=8, warmup_steps=0, eval_every=0, save_every=0, sample_every=0,
                      output_dir=str(tmp_path), compile=False, log_every=100,
                      dtype="fp32").validate()  # the memo is float32's: under autocast the products are made again
    policy = tiny_gpt(seed=1, scale=4.0)
    trainer = Trainer(cfg, policy=policy, reference=tiny_gpt(seed=2, scale=4.0), tokenizer=tok,
                      reward_fn=HashReward(), prompts=MixedPrompts(tok), stream=open(os.devnull, "w"))
    fixed_lengths(trainer, lengths)
    parts = RolloutParts(trainer.objective, trainer.models, trainer.sampler, trainer.reward_fn, tok, trainer.run.log)
    rollout = collect_rollout(trainer.rollout_settings, parts, trainer.run.comm, trainer.prompts.batch(0), 0)
    memo = rollout.memo
    assert memo is not None and len(memo.prompts) == 4 * 2  # every Linear of both blocks
    assert len(memo.completions) == (0 if lengths["A"] == 1 else 4 * 2)
    assert len(rollout.micro_batches(np.arange(24), 8, 4)) == 3
    replayed = _update_grads(trainer, rollout)
    assert rollout.memo is None  # used by the first optimizer step only
    made = _update_grads(trainer, rollout)
    for name, grad in made.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(replayed[name], grad, rtol=1e-4, atol=1e-6, msg=name)

    # What the test would catch: products of the wrong prompts.
    rollout.memo = memo
    for key, kept in memo.prompts.items():
        memo.prompts[key] = kept.roll(1, 0)
    wrong = _update_grads(trainer, rollout)
    assert not torch.allclose(wrong["transformer.h.0.mlp.c_fc.weight"], made["transformer.h.0.mlp.c_fc.weight"],
                              rtol=1e-3, atol=1e-5)
    trainer.close()


# -- what a run changes in its process ----------------------------------------------------------------------------

def _process_state():
    return (torch.get_num_threads(), torch.random.get_rng_state(), torch.initial_seed(),
            torch.get_float32_matmul_precision())


def test_a_trainer_made_from_python_changes_no_process_setting_unless_asked(tmp_path):
    """A library user's threads, torch's generator and matmul precision stand through a whole run; with
    process_settings=True the run sets them, and its header says which."""
    tok = get_tokenizer()
    outputs = {}
    for asked in (False, True):
        cfg = TrainConfig(steps=2, prompts_per_step=2, group_size=2, max_new_tokens=2, beta=0.0, warmup_steps=0,
                          eval_every=0, save_every=1, sample_every=0, output_dir=str(tmp_path / str(asked)),
                          compile=False, log_every=100, seed=99, dtype="fp32").validate()
        policy, lines = tiny_gpt(seed=1), Lines()  # tiny_gpt seeds torch itself: before the run's start
        before = _process_state()
        t = Trainer(cfg, policy=policy, tokenizer=tok, reward_fn=StartsWith("a"),
                    prompts=FixedPrompts("P: x", 2), stream=lines, process_settings=asked)
        t.train()
        t.close()
        after, outputs[asked] = _process_state(), str(lines)
        if not asked:
            assert after[0] == before[0] and torch.equal(after[1], before[1]) and after[2:] == before[2:]
        else:
            assert after[2] == 99, "the run's --seed seeded torch"
    assert "process:" not in outputs[False]
    assert "process: torch's seed 99" in outputs[True]
