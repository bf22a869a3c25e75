"""The settings every training run shares, beside the model and Stockfish's: how long it runs and where it writes
(`RunSettings`), its optimizer and schedule, its logging and checkpoints, and its periodic evaluation. `config`
composes them into `RunConfig`, which `rookworld train` and `rookworld sft` extend."""

from __future__ import annotations

import importlib.util
from typing import Any

from rookworld.io.quote import quoted
from rookworld.settings.base import existing_files, learning_rate, non_negative, positive, share
from rookworld.settings.declare import LOGGING, OPTIM, RUN, group, setting
from rookworld.settings.groups import suites

#: What --report-to names, as TRL's report_to: where the figures go besides metrics.jsonl and samples.jsonl.
REPORTERS = ("tensorboard", "wandb", "none")


def reporters(option: str, value: Any) -> str | None:
    names = [name.strip() for name in value.split(",")]
    unknown = [name for name in names if name not in REPORTERS]
    if unknown:
        return f"{option}: unknown {', '.join(map(repr, unknown))}: give a comma-separated list of {', '.join(REPORTERS)}"
    if "none" in names and set(names) != {"none"}:
        return f"{option} none reports to nothing: give it alone, not with others ({quoted(value)})"
    # Found, not imported: wandb is slow to import, and parsing flags must stay quick.
    if "wandb" in names and importlib.util.find_spec("wandb") is None:
        return f"{option} wandb: wandb is not installed: pip install 'rookworld[wandb]'"
    return None


def not_empty(option: str, value: Any) -> str | None:
    return None if value.strip() else f"{option} must not be empty"


@group
class RunSettings:
    """A training run: how long, where it writes, and how it computes."""

    steps: int = setting(500, "training steps", RUN, main=True, check=positive)
    output_dir: str = setting("runs/rookworld", "directory for checkpoints, metrics.jsonl, samples, TensorBoard and "
                                                "the latest model (a --model for the next command)", RUN, main=True)
    overwrite: bool = setting(False, "start afresh in an --output-dir that holds a run, deleting its metrics, samples "
                                     "and checkpoints", RUN)
    resume: str | None = setting(None, "continue from a checkpoint directory, or an output directory's latest "
                                       "checkpoint", RUN, main=True)
    dtype: str = setting("auto", "compute dtype: auto (bf16 autocast on CUDA and on a CPU with AMX; else fp32), bf16 "
                                 "or fp32", RUN, choices=("auto", "bf16", "fp32"))
    compile: bool = setting(True, "on CUDA, torch.compile the hot paths", RUN)
    compile_logprobs: bool = setting(False, "with --compile, the log-prob passes too: one transformer block, "
                                            "compiled once for every layer, and the vocabulary passes. Off by "
                                            "default, decoding alone compiled: the configuration a GPU has "
                                            "measured fastest (BENCHMARKS.md)", RUN)
    trust_compile_cache: bool = setting(False, "on --resume, load the compile cache the run directory holds "
                                               "(compile_cache.bin, written by a compiling run): torch's cache "
                                               "artifacts are pickles, which run code as they load, so give it only "
                                               "for a run directory you made yourself; without it a resumed run "
                                               "compiles again", RUN)

    def check_together(self, need) -> None:
        need(not (self.overwrite and self.resume), "--overwrite starts afresh and --resume continues: give one")


@group
class OptimizerSettings:
    micro_batch_size: int = setting(64, "rows per forward/backward (gradient accumulation within an optimizer step)",
                                    OPTIM, check=positive)
    lr: float = setting(3e-6, "peak learning rate (AdamW, betas 0.9/0.95)", OPTIM, main=True,
                        check=learning_rate)
    min_lr_ratio: float = setting(0.1, "the decay (cosine, or the cooldown) ends at lr x this", OPTIM, check=share)
    warmup_steps: int = setting(10, "linear learning-rate warm-up steps", OPTIM, check=non_negative)
    cooldown_steps: int = setting(0, "0: cosine decay from the warm-up to the last step; N: the peak rate held "
                                     "constant, then a linear cooldown to lr x --min-lr-ratio over the last N steps "
                                     "(a run extended with --resume --steps keeps its rate until the new cooldown)",
                                  OPTIM, check=non_negative)
    weight_decay: float = setting(0.0, "AdamW weight decay (of weight matrices only)", OPTIM, check=non_negative)
    optimizer: str = setting("adamw", "adamw, or muon: the blocks' weight matrices by Muon (their momentum "
                                      "orthogonalised, scaled to AdamW's update size so that --lr and "
                                      "--weight-decay mean the same), the embeddings, biases and norms by AdamW",
                             OPTIM, choices=("adamw", "muon"))
    max_grad_norm: float = setting(1.0, "gradient clipping norm (0: off)", OPTIM, check=non_negative)


@group
class EvaluationSettings:
    """The evaluation a training run makes every --eval-every steps."""

    eval_every: int = setting(50, "every N steps (0: never): greedy evaluation on held-out positions", LOGGING,
                              check=non_negative)
    eval_data: str | None = setting(None, "held-out positions of --eval-every's evaluation, a positions file (JSONL "
                                          "of rookworld positions, FEN or EPD a line); default: generated, of a seed "
                                          "training never draws from", LOGGING, check=existing_files)
    eval_suites: str = setting("best-move", "suites of --eval-every's evaluation, comma-separated: best-move, "
                                            "mate-in-one, selfplay, vs-stockfish (as rookworld eval --suite)", LOGGING,
                               check=suites)
    eval_games: int = setting(4, "games of the selfplay and vs-stockfish suites in --eval-every's evaluation",
                              LOGGING, check=positive)


@group
class LoggingSettings:
    log_every: int = setting(1, "print a summary line every N steps", LOGGING, check=positive)
    save_every: int = setting(50, "checkpoint every N steps (and always at the end)", LOGGING, check=non_negative)
    report_to: str = setting("tensorboard", "where the figures go besides metrics.jsonl and samples.jsonl, a comma-"
                                            "separated list: tensorboard (event files in --output-dir, when it is "
                                            "installed), wandb (Weights & Biases: pip install 'rookworld[wandb]'; "
                                            "WANDB_MODE=offline keeps it local), or none", LOGGING, check=reporters)
    wandb_project: str = setting("rookworld", "W&B project of --report-to wandb; the run is named after "
                                              "--output-dir's last part, and --resume continues it", LOGGING,
                                 check=not_empty)
    keep_checkpoints: int = setting(3, "checkpoints kept (oldest deleted)", LOGGING, check=positive)
    keep_every: int = setting(0, "also keep the checkpoint of every Nth step, beyond --keep-checkpoints (a multiple "
                                 "of --save-every; 0: none): a long run's stages, so that the one its held-out curve "
                                 "chooses can be evaluated afterwards", LOGGING, check=non_negative)

    def check_together(self, need) -> None:
        need(not self.keep_every or (self.save_every > 0 and self.keep_every % self.save_every == 0),
             f"--keep-every ({self.keep_every}) must be a multiple of --save-every ({self.save_every}): only the steps "
             f"a run saves can be kept")
