"""--report-to, as TRL's report_to: TensorBoard (the default), Weights & Biases, or none beside metrics.jsonl.

W&B runs offline here (WANDB_MODE=offline: no network, no account); what it logged is read back from its .wandb
file, a LevelDB-style log of protobuf records, and compared with metrics.jsonl and samples.jsonl."""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import pytest

from conftest import rookworld_process
from rookworld.settings.config import ConfigError, SFTConfig, TrainConfig
from test_sft import A_LINE, FIRST, P_LINE, sft_args, text_file
from test_trainer import metrics, run_cli, train_args


def test_report_to_names_are_checked_before_any_work(tmp_path, monkeypatch):
    assert TrainConfig().report_to == "tensorboard" and TrainConfig().reporters == ("tensorboard",)
    assert TrainConfig(report_to="none").validate().reporters == ()
    assert TrainConfig(report_to=" tensorboard ,tensorboard").validate().reporters == ("tensorboard",)
    with pytest.raises(ConfigError, match="unknown 'tb': give a comma-separated list of tensorboard, wandb, none"):
        TrainConfig(report_to="tensorboard,tb").validate()
    with pytest.raises(ConfigError, match="give it alone"):
        TrainConfig(report_to="none,tensorboard").validate()
    with pytest.raises(ConfigError, match="--wandb-project must not be empty"):
        TrainConfig(wandb_project=" ").validate()
    # wandb asked for but not installed: said in validation, before any model loads (found, not imported).
    monkeypatch.setitem(sys.modules, "wandb", None)
    data = text_file(tmp_path, "train.txt", P_LINE)
    with pytest.raises(ConfigError, match=r"wandb is not installed: pip install 'rookworld\[wandb\]'"):
        SFTConfig(init="tiny", data=[str(data)], report_to="tensorboard,wandb").validate()


def test_an_unknown_reporter_is_one_line_naming_the_choices(tmp_path):
    data = text_file(tmp_path, "train.txt", P_LINE)
    out = tmp_path / "out"
    proc = run_cli(sft_args(data, data, out, "--steps", "1", "--report-to", "bogus"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "rookworld sft: error: --report-to: unknown 'bogus': give a comma-separated list of tensorboard, wandb, none"]
    assert not out.exists()


def test_report_to_none_writes_metrics_jsonl_alone(tmp_path):
    data = text_file(tmp_path, "train.txt", P_LINE, A_LINE, FIRST)
    out = tmp_path / "out"
    proc = run_cli(sft_args(data, data, out, "--steps", "2", "--eval-every", "0", "--report-to", "none"))
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in metrics(out)] == [1, 2]
    assert not (out / "tensorboard").exists() and not (out / "wandb").exists() and not (out / "wandb_id").exists()
    assert "TensorBoard" not in proc.stderr  # not asked for, so no note that it is missing either


# -- Weights & Biases, offline ----------------------------------------------------------------------------------------

def wandb_records(path: Path):
    """The protobuf records of a .wandb file: a 7-byte header (':W&B', magic, version), then 32 KiB blocks of
    chunks, each a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) and its bytes."""
    from wandb.proto import wandb_internal_pb2 as pb

    buf = path.read_bytes()
    assert buf[:4] == b":W&B", buf[:7]
    pos, block, part = 7, 32768, b""
    while pos + 7 <= len(buf):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", buf[pos:pos + 7])
        if kind == 0:
            break
        part += buf[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(part)
            part = b""
            yield record


def _value(item):
    if item.value_json:
        return json.loads(item.value_json)
    kind = item.WhichOneof("value")
    return None if kind in (None, "none") else json.loads(item.json) if kind == "json" else getattr(item, kind)


def read_wandb_run(path: Path) -> tuple[dict, dict, dict[int, dict]]:
    """(the run record's fields, the config, the history by step) of one offline run's .wandb file."""
    run, config, history = {}, {}, {}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run = {"id": r.run_id, "name": r.display_name, "project": r.project, "job_type": r.job_type}
            config.update({i.key: json.loads(i.value_json) for i in r.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            row = {(i.key or "/".join(i.nested_key)): _value(i) for i in record.history.item}
            history.setdefault(row.get("_step", record.history.step.num), {}).update(row)
    return run, config, history


def offline_runs(out: Path, run_id: str) -> list[Path]:
    return sorted((out / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))


@pytest.mark.slow
def test_wandb_offline_logs_every_step_the_config_and_samples_and_resume_continues_the_run(tiny_dir, tmp_path):
    pytest.importorskip("wandb", reason="W&B reporting is optional (pip install 'rookworld[wandb]')")
    home = tmp_path / "wandb-home"  # W&B's own settings, cache and staged artifacts stay in the test's directory
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": str(home / "config"),
           "WANDB_CACHE_DIR": str(home / "cache"), "WANDB_DATA_DIR": str(home / "data"), "WANDB_DIR": str(home)}
    out = tmp_path / "grpo-run"
    # Real processes: W&B reads its settings from the environment once a process, and runs a service beside it.
    proc = rookworld_process(*train_args(tiny_dir, out, "--steps", "2", "--save-every", "2", "--report-to",
                                         "wandb,tensorboard", "--wandb-project", "rookworld-test"), env=env)
    assert proc.returncode == 0, proc.stderr
    assert (out / "tensorboard").is_dir(), "both sinks at once"
    run_id = (out / "wandb_id").read_text().strip()
    assert run_id
    [first] = offline_runs(out, run_id)
    run, config, history = read_wandb_run(first)
    assert run == {"id": run_id, "name": "grpo-run", "project": "rookworld-test", "job_type": "train"}
    assert config["report_to"] == "wandb,tensorboard" and config["group_size"] == 4 and config["steps"] == 2
    assert config["output_dir"] == str(out)

    rows = metrics(out)
    assert sorted(history) == [r["step"] for r in rows] == [1, 2]
    for row in rows:
        logged = history[row["step"]]
        numbers = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                   and k != "step"}
        assert "loss" in numbers and "reward/mean" in numbers
        assert {k: logged.get(k) for k in numbers} == pytest.approx(numbers, rel=1e-12, abs=0)

    # Every step's samples as a table, its columns those of samples.jsonl.
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    for step in (1, 2):
        table = history[step]
        assert table["samples/_type"] == "table-file"
        data = json.loads((first.parent / "files" / table["samples/path"]).read_text())
        assert data["columns"] == ["step", "task", "prompt", "completion", "reward"]
        want = [[r[c] for c in data["columns"]] for r in samples if r["step"] == step]
        assert data["data"] == want and want

    # --resume continues the same W&B run (its settings, --report-to included, come from the checkpoint).
    proc = rookworld_process("train", "--resume", str(out), "--steps", "3", env=env)
    assert proc.returncode == 0, proc.stderr
    assert (out / "wandb_id").read_text().strip() == run_id
    runs = offline_runs(out, run_id)
    assert len(runs) == 2
    run, _, history = read_wandb_run(next(r for r in runs if r != first))
    assert run["id"] == run_id and run["name"] == "grpo-run"
    assert sorted(history) == [3]
    assert history[3]["loss"] == pytest.approx(metrics(out)[-1]["loss"], rel=1e-12)

    # --overwrite starts a new run: the old W&B run's id and files go with the rest.
    proc = rookworld_process(*train_args(tiny_dir, out, "--steps", "1", "--overwrite", "--report-to", "none"),
                             env=env)
    assert proc.returncode == 0, proc.stderr
    assert not (out / "wandb_id").exists() and not (out / "wandb").exists() and not (out / "tensorboard").exists()
