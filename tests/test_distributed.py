"""Data parallelism and `--auto-batch`: the process group's settings; the search on two gloo ranks, where one rank
running out of memory in a trial step must not leave the other waiting in a collective forever; and, on CUDA, that
nothing the search compiled outlives it."""

from __future__ import annotations

import datetime
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import free_port

TESTS = Path(__file__).resolve().parent


# -- the process group ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, backend, device_id", [("cpu", "gloo", None), ("cuda", "nccl", torch.device("cuda", 1))])
def test_the_process_group_outlasts_an_evaluation_and_nccl_knows_its_gpu(monkeypatch, kind, backend, device_id):
    from rookworld.harness import distributed

    class Store:  # the ranks' meeting, which needs the other rank (tests/test_trust_io.py has it for real)
        def set_timeout(self, timeout):
            calls.append({"store_timeout": timeout})

    calls = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(distributed, "rendezvous", lambda info: Store())
    monkeypatch.setattr(distributed.torch.cuda, "set_device", lambda index: None)  # no GPU here
    monkeypatch.setattr(distributed.torch.cuda, "device_count", lambda: 2)
    for name, value in dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                            MASTER_PORT="29500").items():
        monkeypatch.setenv(name, value)
    info = distributed.init_distributed(kind)
    assert (info.rank, info.world, info.local_rank) == (1, 2, 1)
    kwargs, store = calls
    assert kwargs["backend"] == backend and kwargs.get("device_id") == device_id
    # The other ranks wait in a barrier while rank 0 evaluates: the default (10 minutes for NCCL) would end the run.
    assert kwargs["timeout"] == distributed.COLLECTIVE_TIMEOUT >= datetime.timedelta(hours=1)
    assert store["store_timeout"] == distributed.COLLECTIVE_TIMEOUT, "the start-up's bound is not the collectives'"


# -- --auto-batch on two ranks --------------------------------------------------------------------------------

OUT_OF_MEMORY_FROM = 8  # prompts per step from which rank 1's trial steps run out of memory


class ByPlace:
    """A reward with spread in every group that needs no engine: 1 for a group's first completion, 0 for its second."""

    def prefetch(self, prompts):
        pass

    def __call__(self, prompts, completions):
        from rookworld.chess.rewards import Scores

        r = (np.arange(len(completions)) % 2 == 0).astype(float)
        return Scores(r, np.array([p.task for p in prompts]), np.ones(len(r), dtype=bool))


def auto_batch_rank(out: str) -> None:
    """One rank of `test_auto_batch_agrees_when_one_rank_runs_out_of_memory` (RANK, WORLD_SIZE, MASTER_* set):
    the real search on the CPU, memory read as a fixed share (the CPU has no allocator statistics), and on rank 1
    an out-of-memory in the update of every trial from OUT_OF_MEMORY_FROM prompts on, after its rollout, while
    rank 0's update goes on. Writes what the rank chose, then what one real step left in its weights."""
    from conftest import tiny_gpt
    from rookworld.grpo import auto_batch, trainer as trainer_module
    from rookworld.grpo.prompts import PromptSource
    from rookworld.net.tokenizer import get_tokenizer
    from rookworld.settings.config import TrainConfig

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    real_update = trainer_module.update

    def update(settings, objective, models, optimizer, comm, rollout, step):
        if rank == 1 and len(rollout.prompts) * world >= OUT_OF_MEMORY_FROM:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected on rank 1)")
        return real_update(settings, objective, models, optimizer, comm, rollout, step)

    trainer_module.update = update
    auto_batch.peak_memory_share = lambda device: 0.25
    cfg = TrainConfig(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=3, beta=0.0, warmup_steps=0,
                      eval_every=0, save_every=0, sample_every=0, output_dir=f"{out}/run", compile=False,
                      device="cpu", auto_batch_max=64).validate()
    with open(f"{out}/log{rank}.txt", "w") as log:
        t = trainer_module.Trainer(cfg, policy=tiny_gpt(seed=1), tokenizer=get_tokenizer(),
                                   reward_fn=ByPlace(), prompts=PromptSource(cfg, None, rank, world),
                                   stream=log)
        chosen = t.auto_batch()
        trainer_module.update = real_update
        t.train_step()  # a real step after the search: collectives and DDP as before it
        digest = float(sum(p.double().sum() for p in t.run.policy.parameters()))
        Path(f"{out}/rank{rank}.json").write_text(json.dumps({"chosen": chosen, "digest": digest}))
        t.close()


# Each round: a DDP module's backward and a reduction through Comm, then the trainers' close: the wrapper let go
# (`unwrapped`), then the process group (`Comm.close`). The other order hung: the wrapper's reducer, dropped last,
# destroyed the group while holding the GIL, joining a gloo thread that waited for the GIL to free the reduction's
# tensor (torch 2.8 within 70-130 rounds, torch 2.11 too). A group of one, which Comm is told holds two ranks so
# that it reduces through the backend and destroys the group.
DEADLOCK_ROUNDS = """
import sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from rookworld.harness.distributed import Comm, DistInfo, unwrapped
torch.set_num_threads(1)
for _ in range(int(sys.argv[1])):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    comm = Comm(DistInfo(rank=0, world=2, local_world=2), torch.device("cpu"))
    model = DDP(torch.nn.Linear(4, 4))
    model(torch.randn(2, 4)).sum().backward()
    assert comm.sum([1.0, 2.5]) == [1.0, 2.5]
    model = unwrapped(model)
    comm.close()
"""


@pytest.mark.slow
def test_a_reduction_just_before_the_process_group_goes_never_hangs_the_teardown():
    try:
        proc = subprocess.run([sys.executable, "-c", DEADLOCK_ROUNDS, "500"], capture_output=True, text=True,
                              timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    except subprocess.TimeoutExpired:
        pytest.fail("a teardown after a reduction hung: the backend's thread waits for the GIL its joiner holds")
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_auto_batch_agrees_when_one_rank_runs_out_of_memory(tmp_path):
    env = dict(os.environ, WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    code = f"import test_distributed; test_distributed.auto_batch_rank({str(tmp_path)!r})"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    deadline = time.monotonic() + 90  # it takes about 15 s: a hang is a failure, not a stuck suite
    try:
        errors = [p.communicate(timeout=max(1.0, deadline - time.monotonic()))[1] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
            p.wait()
        logs = "\n".join(f.read_text()[-1500:] for f in sorted(tmp_path.glob("log*.txt")))
        pytest.fail(f"the ranks did not finish: one waits in a collective the other never joins\n{logs}")
    # Every rank's words: the first to fail is often not the one whose error comes first.
    said = "\n".join(f"rank {r} (exit {p.returncode}): {err[-2000:]}"
                     for r, (p, err) in enumerate(zip(procs, errors, strict=True)))
    assert all(p.returncode == 0 for p in procs), said
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["chosen"] for r in ranks] == [4, 4], "both ranks keep the largest size that fit on every rank"
    assert ranks[0]["digest"] == ranks[1]["digest"], "the real step after the search kept the ranks in sync"
    log = (tmp_path / "log0.txt").read_text()
    assert f"{OUT_OF_MEMORY_FROM} prompts x 2 = 16 completions: out of memory" in log, log
    assert "training with 4 prompts per step" in log


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_after_auto_batch_no_graph_of_the_search_holds_memory_or_a_compiled_entry(tmp_path):
    from conftest import tiny_gpt
    from rookworld.grpo.auto_batch import BatchSearch
    from rookworld.grpo.prompts import PromptSource
    from rookworld.grpo.trainer import Trainer
    from rookworld.net import compiling
    from rookworld.net.decoding import decode_step
    from rookworld.net.tokenizer import get_tokenizer
    from rookworld.settings.config import TrainConfig

    def graph_pool_bytes() -> int:  # segments of a private pool: a CUDA graph's
        return sum(s["total_size"] for s in torch.cuda.memory_snapshot()
                   if tuple(s.get("segment_pool_id", (0, 0))) != (0, 0))

    def decode_entries() -> int:
        return len(torch._dynamo.eval_frame._debug_get_cache_entry_list(decode_step))

    cfg = TrainConfig(steps=1, prompts_per_step=2, group_size=4, max_new_tokens=8, beta=0.0, warmup_steps=0,
                      eval_every=0, save_every=0, sample_every=0, output_dir=str(tmp_path), device="cuda",
                      auto_batch=True, auto_batch_max=8).validate()
    t = Trainer(cfg, policy=tiny_gpt(seed=1), tokenizer=get_tokenizer(), reward_fn=ByPlace(),
                prompts=PromptSource(cfg), stream=io.StringIO())
    try:
        BatchSearch(t).probe(2)
        assert not compiling.FALLBACKS, compiling.FALLBACKS
        assert decode_entries() > 0 and graph_pool_bytes() > 0, "a trial decodes through CUDA graphs"
        assert t.auto_batch() == 8
        assert decode_entries() == 0, "the search's compiled shapes count toward no recompile limit"
        assert graph_pool_bytes() == 0, "the search's CUDA graphs hold no memory"
        t.train_step()
        assert not compiling.FALLBACKS and decode_entries() > 0, "training compiles its own shapes again"
    finally:
        t.close()
