"""Where a run's figures go besides metrics.jsonl (`--report-to`): TensorBoard event files when it is installed,
Weights & Biases; `Reporting` opens the sinks a run asks for and writes each step's numbers to all of them."""

from __future__ import annotations

import dataclasses
import math
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rookworld.harness.rundir import WANDB_ID
from rookworld.settings.config import ConfigError


def scalars(m: dict[str, Any]) -> dict[str, float]:
    """What a step reports to TensorBoard and W&B: its finite numbers, but the step itself."""
    return {k: v for k, v in m.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and k != "step"}


class TensorBoardSink:
    """Event files in OUTPUT_DIR/tensorboard; a resumed run purges the steps after its checkpoint."""

    def __init__(self, directory: Path, resume_step: int):
        from torch.utils.tensorboard import SummaryWriter  # ImportError when tensorboard is not installed

        self.writer = SummaryWriter(str(directory / "tensorboard"), purge_step=resume_step + 1)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        pass  # samples.jsonl has them

    def close(self) -> None:
        self.writer.close()




class WandbSink:
    """A Weights & Biases run named after the output directory, with its files in OUTPUT_DIR/wandb. Its id is kept
    in OUTPUT_DIR/wandb_id, so a resumed run continues it. (W&B keeps a run's steps increasing: the steps a resumed
    run replays after its checkpoint, which the crashed run had logged already, are not logged again.)"""

    def __init__(self, directory: Path, project: str, config: dict[str, Any] | None, command: str | None):
        import wandb


        id_file = directory / WANDB_ID
        run_id = id_file.read_text().strip() if id_file.is_file() else ""
        if not run_id:
            run_id = secrets.token_hex(4)
            id_file.write_text(run_id + "\n")
        self.wandb = wandb
        try:
            self.run = wandb.init(project=project, name=directory.resolve().name, dir=str(directory), id=run_id,
                                  resume="allow", config=config, job_type=command)
        except wandb.errors.Error as e:
            raise ConfigError(f"--report-to wandb: W&B did not start: {e} (or run offline: WANDB_MODE=offline, "
                              "then wandb sync)") from None

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        columns = ["step", *dict.fromkeys(k for row in rows for k in row)]
        data = [[step, *(row.get(c) for c in columns[1:])] for row in rows]
        self.run.log({"samples": self.wandb.Table(columns=columns, data=data)}, step=step)

    def close(self) -> None:
        self.run.finish()


@dataclasses.dataclass(frozen=True)
class Reporting:
    """Where a run's figures go besides metrics.jsonl and samples.jsonl (`report_to`: tensorboard, wandb), and
    what describes the run there: its settings (`config`) and its command."""

    report_to: Sequence[str] = ("tensorboard",)
    wandb_project: str = "rookworld"
    config: dict[str, Any] | None = None
    command: str | None = None
