"""Every setting of a training command in one dataclass: defaults, a TOML file, then flags, then checks.

`RunConfig` holds what every training command shares (model, output, device, optimiser, checkpoints,
evaluation); `TrainConfig` adds GRPO's settings. `rookworld train --config run.toml --lr 3e-6` reads the file
(keys are the field names, with `-` or `_`, at the top level or under [train]) and lets flags override it.
`validate()` turns a bad value into one clear message before any work.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rookworld.ground.rewards import SHAPINGS
from rookworld.settings import objective, presets
from rookworld.settings.base import ConfigError, flag, need
from rookworld.settings.hub import is_local_path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _f(default: Any, help: str, section: str, *, main: bool = False, **kw: Any) -> Any:
    """A setting: its default, its help, its section of `--help`; `main` lists it first, among the few that
    matter most."""
    meta = {"help": help, "section": section, "main": main, **kw}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


# The sections of `--help`, in order (the main settings come before them all).
RUN, DATA, SAMPLING, REWARDS, ADVANTAGES, KL, LOSS, CRITIC, OPTIM, LOGGING = (
    "run: device, precision, seed", "data", "sampling", "rewards", "advantages",
    "the KL leash to the frozen reference", "the loss", "the critic (--advantage gae only)", "optimisation",
    "logging, evaluation, checkpoints")
_SECTIONS = [RUN, DATA, SAMPLING, REWARDS, ADVANTAGES, KL, LOSS, CRITIC, OPTIM, LOGGING]

#: The evaluation suites, as --suite and --eval-suites name them.
SUITES = ("best-move", "mate-in-one", "selfplay", "vs-stockfish")


def parse_suites(text: str) -> list[str]:
    """`best-move,mate-in-one` -> the names, in the order given; ValueError naming the choices."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in SUITES]
    if not names or bad:
        raise ValueError(f"unknown suite {bad[0] if bad else text!r}: choose from {', '.join(SUITES)}")
    return list(dict.fromkeys(names))


#: What --report-to names, as TRL's report_to: where the figures go besides metrics.jsonl and samples.jsonl.
REPORTERS = ("tensorboard", "wandb", "none")


@dataclass
class RunConfig:
    """What every training command shares."""

    model: str = _f("jrahn/RookWorld-LM-124M", "policy to start from: hub repo id or local directory", RUN,
                    main=True)
    revision: str | None = _f(None, "hub revision of --model (branch, tag or commit)", RUN)
    steps: int = _f(500, "optimizer steps", RUN, main=True)
    output_dir: str = _f("runs/rookworld", "directory for checkpoints, metrics.jsonl, samples and TensorBoard", RUN,
                         main=True)
    overwrite: bool = _f(False, "start afresh in an --output-dir that holds a run, deleting its metrics, samples "
                                "and checkpoints", RUN)
    resume: str | None = _f(None, "continue from a checkpoint directory, or an output directory's latest checkpoint",
                            RUN, main=True)
    seed: int = _f(0, "seed for data, sampling and initialisation", RUN)
    device: str = _f("auto", "cpu, cuda, cuda:N or auto (CUDA when available; under torchrun, the local rank's "
                             "GPU)", RUN)
    dtype: str = _f("auto", "compute dtype: auto (bf16 autocast on CUDA, fp32 on CPU), bf16 or fp32", RUN,
                    choices=("auto", "bf16", "fp32"))
    compile: bool = _f(True, "on CUDA, torch.compile the hot paths", RUN)

    micro_batch_size: int = _f(64, "rows per forward/backward (gradient accumulation within an optimizer step)",
                               OPTIM)
    lr: float = _f(3e-6, "peak learning rate (AdamW, betas 0.9/0.95)", OPTIM, main=True)
    min_lr_ratio: float = _f(0.1, "cosine decay ends at lr x this", OPTIM)
    warmup_steps: int = _f(10, "linear learning-rate warm-up steps", OPTIM)
    weight_decay: float = _f(0.0, "AdamW weight decay", OPTIM)
    max_grad_norm: float = _f(1.0, "gradient clipping norm (0: off)", OPTIM)

    log_every: int = _f(1, "print a summary line every N steps", LOGGING)
    eval_every: int = _f(50, "greedy evaluation on held-out positions every N steps (0: never)", LOGGING)
    eval_data: str | None = _f(None, "held-out positions for --eval-every's evaluation (default: generated, of a "
                                     "seed training never draws from)", LOGGING)
    eval_size: int = _f(128, "positions in --eval-every's evaluation", LOGGING)
    eval_suites: str = _f("best-move", "suites of --eval-every's evaluation, comma-separated: best-move, "
                                       "mate-in-one, selfplay, vs-stockfish (as rookworld eval --suite)", LOGGING)
    eval_games: int = _f(4, "games of the selfplay and vs-stockfish suites in --eval-every's evaluation", LOGGING)
    save_every: int = _f(50, "checkpoint every N steps (and always at the end)", LOGGING)
    report_to: str = _f("tensorboard", "where the figures go besides metrics.jsonl and samples.jsonl, a comma-"
                                       "separated list: tensorboard (event files in --output-dir, when it is "
                                       "installed), wandb (Weights & Biases: pip install 'rookworld[wandb]'; "
                                       "WANDB_MODE=offline keeps it local), or none", LOGGING)
    wandb_project: str = _f("rookworld", "W&B project of --report-to wandb; the run is named after --output-dir's "
                                         "last part, and --resume continues it", LOGGING)
    keep_checkpoints: int = _f(3, "checkpoints kept (oldest deleted)", LOGGING)
    max_new_tokens: int = _f(144, "completion length limit", SAMPLING)
    stockfish_path: str | None = _f(None, "Stockfish binary (default: ROOKWORLD_STOCKFISH, stockfish on PATH, "
                                          "then /usr/games/stockfish)", REWARDS)
    stockfish_depth: int = _f(10, "Stockfish analysis depth for P: rewards", REWARDS)
    stockfish_workers: int | None = _f(None, "Stockfish processes per rank (default: spare cores / ranks)", REWARDS)
    stockfish_cache: str | None = _f(None, "sqlite file that caches analyses across runs", REWARDS)

    def validate(self):
        self.check(need)
        return self

    def check_world(self, world: int) -> None:
        """What can only be checked once the number of ranks is known (before any model is loaded)."""

    def check(self, need) -> None:
        for name in ("steps", "micro_batch_size", "stockfish_depth", "log_every", "eval_size", "eval_games",
                     "keep_checkpoints", "max_new_tokens"):
            need(getattr(self, name) >= 1, f"--{flag(name)} must be >= 1, got {getattr(self, name)}")
        for name in ("seed", "warmup_steps", "eval_every", "save_every"):
            need(getattr(self, name) >= 0, f"--{flag(name)} must be >= 0, got {getattr(self, name)}")
        need(0.0 <= self.min_lr_ratio <= 1.0, f"--min-lr-ratio must lie in [0, 1], got {self.min_lr_ratio}")
        for name in ("lr", "weight_decay", "max_grad_norm"):
            v = getattr(self, name)
            need(v >= 0.0 and v == v, f"--{flag(name)} must be >= 0, got {v}")
        need(self.lr > 0, "--lr must be > 0")
        need(self.stockfish_workers is None or self.stockfish_workers >= 1, "--stockfish-workers must be >= 1")
        need(not (self.overwrite and self.resume), "--overwrite starts afresh and --resume continues: give one")
        for name, choices in (("dtype", ("auto", "bf16", "fp32")),):
            v = getattr(self, name)
            need(v in choices, f"--{flag(name)} must be one of {', '.join(choices)}, got {v!r}")
        need(bool(re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device)),
             f"--device must be cpu, cuda, cuda:N or auto, got {self.device!r}")
        need(self.eval_data is None or Path(self.eval_data).is_file(), f"--eval-data: no such file: {self.eval_data}")
        try:
            parse_suites(self.eval_suites)
        except ValueError as e:
            need(False, f"--eval-suites: {e}")
        names = [name.strip() for name in self.report_to.split(",")]
        unknown = [name for name in names if name not in REPORTERS]
        need(not unknown, f"--report-to: unknown {', '.join(map(repr, unknown))}: give a comma-separated list of "
                          f"{', '.join(REPORTERS)}")
        need("none" not in names or set(names) == {"none"}, f"--report-to none reports to nothing: give it alone, "
                                                             f"not with others ({self.report_to!r})")
        # Found, not imported: wandb is slow to import, and parsing flags must stay quick.
        need("wandb" not in names or importlib.util.find_spec("wandb") is not None,
             "--report-to wandb: wandb is not installed: pip install 'rookworld[wandb]'")
        need(bool(self.wandb_project.strip()), "--wandb-project must not be empty")
        if self.model is None:  # a fresh model (rookworld sft --init)
            return
        model = Path(self.model).expanduser()
        if is_local_path(self.model):
            need(model.is_dir(), f"--model: no such model directory: {self.model}")
            need((model / "config.json").is_file(), f"--model: {self.model} has no config.json")

    @property
    def reporters(self) -> tuple[str, ...]:
        """The names of --report-to, "none" left out."""
        return tuple(dict.fromkeys(n.strip() for n in self.report_to.split(",") if n.strip() not in ("", "none")))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict, source: str = "config"):
        known = {f.name for f in dataclasses.fields(cls)}
        clean = {}
        for key, value in values.items():
            name = key.replace("-", "_")
            if name not in known:
                raise ConfigError(f"{source}: unknown setting {key!r}")
            clean[name] = value
        cfg = cls(**clean)
        for f in dataclasses.fields(cls):  # TOML has no None; types are checked here, values in validate()
            v = getattr(cfg, f.name)
            if v is not None and not _type_ok(f, v):
                raise ConfigError(f"{source}: {f.name} = {v!r} is not a {_type_name(f)}")
        return cfg


@dataclass
class TrainConfig(RunConfig):
    """`rookworld train`: GRPO."""

    steps: int = _f(500, "GRPO steps", RUN, main=True)

    data: str | None = _f(None, "positions file (JSONL, FEN or EPD a line); default: the built-in generator", DATA,
                          main=True)
    prompts_per_step: int = _f(32, "prompts per GRPO step (over all ranks)", DATA, main=True)
    group_size: int = _f(16, "completions sampled per prompt (at least 2: GRPO compares them)", DATA, main=True)
    shared_prompt: bool = _f(True, "compute each group's prompt once, in sampling and in every log-prob pass "
                                   "(--no-shared-prompt computes it for every completion, as a check)", DATA)
    task_mix: float = _f(0.8, "share of P: prompts, exact in every step (one prompt either way); the rest are A:",
                         DATA)
    auto_batch: bool = _f(False, "on CUDA, probe real steps at doubling --prompts-per-step (from "
                                 "--prompts-per-step) and keep the largest whose peak memory stays under "
                                 "--memory-target", DATA)
    memory_target: float = _f(0.85, "share of GPU memory --auto-batch may use", DATA)
    auto_batch_max: int = _f(1024, "largest --prompts-per-step --auto-batch tries", DATA)
    illegal_share: float = _f(0.01, "share of generated A: moves that are illegal", DATA)
    overfit_single_batch: bool = _f(False, "reuse the first batch of prompts every step (debugging)", DATA)

    temperature: float = _f(1.0, "sampling temperature (also used for the log-probs of the update)", SAMPLING)
    top_k: int = _f(0, "sample from the k most likely tokens (0: no limit)", SAMPLING)
    top_p: float = _f(1.0, "nucleus sampling threshold (1: no limit)", SAMPLING)

    reward_shaping: str = _f("continuous", "continuous (0.2 + 0.8 q) or graduated (steps of 0.2)", REWARDS,
                             choices=SHAPINGS)

    advantage: str = _f("grpo", "grpo (group-relative, no critic) or gae (PPO: a value head on the policy's trunk, "
                                "per-token advantages by GAE; see the critic's settings)", ADVANTAGES)
    baseline: str = _f("group", "what a reward is compared with (grpo): its group's mean, or ema, a moving average "
                                "of its task's reward over steps", ADVANTAGES)
    ema_decay: float = _f(0.9, "decay of the --baseline ema average per step (--baseline ema only)", ADVANTAGES)
    std_scaling: str = _f("auto", "advantage scaling: group std, batch std over all ranks (with gae: whitening), "
                                  "none (Dr. GRPO), or auto (group with the group baseline, else batch)", ADVANTAGES)

    beta: float = _f(0.04, "weight of the KL penalty to the frozen reference (0: no reference pass)", KL, main=True)
    kl_estimator: str = _f("k3", "KL to the reference: k1 (a per-token penalty folded into the advantages), k2 or "
                                 "k3 (loss terms with the gradient of KL(policy||ref), resp. KL(ref||policy)), "
                                 "full (exact over the vocabulary, see --kl-direction)", KL)
    kl_direction: str = _f("forward", "direction of --kl-estimator full (only): forward KL(policy||ref), reverse "
                                      "KL(ref||policy) or symmetric (their mean)", KL)
    beta_warmup_steps: int = _f(0, "ramp beta linearly from 0 over this many steps", KL)
    kl_target: float | None = _f(None, "adapt beta toward this KL per token (default: fixed beta)", KL)
    kl_horizon: int = _f(10, "steps over which the adaptive beta reacts (with --kl-target)", KL)

    loss_aggregation: str = _f("token", "token (DAPO), sequence (GRPO) or constant (Dr. GRPO)", LOSS)
    clip_low: float = _f(0.2, "lower clip range of the importance ratio (1 - clip_low)", LOSS)
    clip_high: float = _f(0.28, "upper clip range (1 + clip_high); above clip_low is clip-higher (DAPO)", LOSS)
    entropy_coef: float = _f(0.0, "weight of an entropy bonus", LOSS)
    drop_zero_spread: bool = _f(False, "leave out groups whose rewards do not vary", LOSS)
    mask_truncated: bool = _f(False, "leave out completions cut off at max_new_tokens", LOSS)

    gamma: float = _f(1.0, "discount per token", CRITIC)
    gae_lambda: float = _f(0.95, "GAE lambda", CRITIC)
    vf_coef: float = _f(0.1, "weight of the value loss beside the policy loss", CRITIC)
    value_clip: float = _f(0.2, "clip range of the value loss around the rollout's values", CRITIC)
    value_lr: float = _f(1e-4, "peak learning rate of the value head", CRITIC)

    mu: int = _f(1, "update epochs over each rollout", OPTIM)
    minibatches: int = _f(1, "optimizer steps per epoch (the rollout is split into this many minibatches)", OPTIM)

    sample_every: int = _f(10, "write example completions with their rewards every N steps (0: never)", LOGGING)
    kl_warn: float = _f(1.0, "warn when the mean KL per token exceeds this", LOGGING)
    clip_warn: float = _f(0.2, "warn when the clip fraction exceeds this", LOGGING)

    def check(self, need) -> None:
        need(self.group_size >= 2, f"--group-size must be >= 2 (GRPO compares completions), got {self.group_size}")
        super().check(need)
        for name in ("prompts_per_step", "mu", "minibatches", "kl_horizon"):
            need(getattr(self, name) >= 1, f"--{flag(name)} must be >= 1, got {getattr(self, name)}")
        for name in ("beta_warmup_steps", "sample_every", "top_k"):
            need(getattr(self, name) >= 0, f"--{flag(name)} must be >= 0, got {getattr(self, name)}")
        need(0.0 < self.memory_target <= 1.0, f"--memory-target must lie in (0, 1], got {self.memory_target}")
        need(self.auto_batch_max >= 1, f"--auto-batch-max must be >= 1, got {self.auto_batch_max}")
        for name in ("task_mix", "illegal_share"):
            v = getattr(self, name)
            need(0.0 <= v <= 1.0, f"--{flag(name)} must lie in [0, 1], got {v}")
        for name in ("beta", "clip_low", "clip_high", "entropy_coef", "temperature", "kl_warn", "clip_warn"):
            v = getattr(self, name)
            need(v >= 0.0 and v == v, f"--{flag(name)} must be >= 0, got {v}")
        need(self.temperature > 0, "--temperature must be > 0 for training (the update's log-probs are taken at "
                                   "the sampling temperature); greedy decoding is for evaluation")
        need(0.0 < self.top_p <= 1.0, f"--top-p must lie in (0, 1], got {self.top_p}")
        need(self.clip_low < 1.0, f"--clip-low must be < 1, got {self.clip_low}")
        need(self.kl_target is None or self.kl_target > 0, "--kl-target must be > 0")
        need(self.reward_shaping in SHAPINGS,
             f"--reward-shaping must be one of {', '.join(SHAPINGS)}, got {self.reward_shaping!r}")
        need(self.data is None or Path(self.data).is_file(), f"--data: no such file: {self.data}")
        objective.check(self, need)

    def check_world(self, world: int) -> None:
        need(self.prompts_per_step % world == 0,
              f"--prompts-per-step ({self.prompts_per_step}) must divide over {world} ranks")
        groups = self.prompts_per_step // world
        need(groups % self.minibatches == 0, f"each rank's {groups} prompts (--prompts-per-step / ranks), whose "
                                              f"groups stay whole, must split into --minibatches ({self.minibatches})")


#: Fresh GPT-2 sizes for `rookworld sft --init`: (layers, heads, width).
MODEL_SIZES = {"tiny": (2, 2, 128), "mini": (4, 4, 256), "small": (12, 12, 768)}


@dataclass
class SFTConfig(RunConfig):
    """`rookworld sft`: supervised training on P:/A: text, as RookWorld-LM itself was made."""

    model: str | None = _f(None, "continue this GPT-2 checkpoint (hub repo id or directory); or start fresh with "
                                 "--init", RUN, main=True)
    init: str | None = _f(None, "start from a fresh random GPT-2 of this size: tiny (2 layers, 128 wide), mini "
                                "(4, 256) or small (12, 768: GPT-2 small); --n-layer/--n-head/--n-embd override",
                          RUN, main=True, choices=tuple(MODEL_SIZES))
    n_layer: int | None = _f(None, "layers of a fresh model (with --init)", RUN)
    n_head: int | None = _f(None, "attention heads of a fresh model (with --init)", RUN)
    n_embd: int | None = _f(None, "width of a fresh model (with --init)", RUN)
    steps: int = _f(1000, "optimizer steps", RUN, main=True)
    output_dir: str = _f("runs/sft", "directory for checkpoints, metrics.jsonl, TensorBoard, and the latest model "
                                     "itself (a --model for rookworld train)", RUN, main=True)

    data: list = _f([], "training samples: RookWorld text (one P: or A: sample a line) or the JSONL of rookworld "
                        "positions --annotate; repeat for several files", DATA, main=True)
    skip_bad: bool = _f(False, "skip (and count) malformed lines instead of stopping at the first", DATA)
    seq_len: int = _f(512, "tokens per training row: the longest document it takes, or with --pack the length of "
                           "the packed rows", DATA)
    pack: bool = _f(False, "pack documents ([EOS] + text) into full rows of --seq-len, as RookWorld-LM's "
                           "pretraining did: no padding, but a document sees the ones before it in its row and may "
                           "be cut in two; the default is one document a row, starting at position 0 as the "
                           "sampler sees a prompt", DATA)
    loss_on: str = _f("all", "tokens the loss counts: all, or target (the completion after each prompt, and the EOS "
                             "that ends it)", DATA, choices=("all", "target"))
    rows_per_step: int = _f(32, "rows per optimizer step (over all ranks)", DATA)

    micro_batch_size: int = _f(16, "rows per forward/backward (gradient accumulation within an optimizer step)",
                               OPTIM)
    lr: float = _f(3e-4, "peak learning rate (AdamW, betas 0.9/0.95)", OPTIM, main=True)
    warmup_steps: int = _f(50, "linear learning-rate warm-up steps", OPTIM)
    weight_decay: float = _f(0.1, "AdamW weight decay (matrices only)", OPTIM)

    log_every: int = _f(10, "print a summary line every N steps", LOGGING)
    eval_every: int = _f(100, "every N steps: loss on --eval-data and greedy evaluation on its positions "
                              "(0: never)", LOGGING)
    eval_data: str | None = _f(None, "held-out samples (as --data): eval loss, and the positions of the greedy "
                                     "evaluation (default: generated held-out positions, no eval loss)", LOGGING)
    save_every: int = _f(200, "checkpoint every N steps (and always at the end)", LOGGING)

    def check(self, need) -> None:
        need(self.model is None or self.init is None, "--model continues a checkpoint and --init starts afresh: "
                                                      "give one")
        need(self.model is not None or self.init is not None, "give --model DIR (continue a checkpoint) or --init "
                                                              "tiny|mini|small (a fresh GPT-2)")
        for name in ("n_layer", "n_head", "n_embd"):
            v = getattr(self, name)
            need(v is None or self.init is not None, f"--{flag(name)} shapes a fresh model: use it with --init")
            need(v is None or v >= 1, f"--{flag(name)} must be >= 1, got {v}")
        if self.init is not None:
            need(self.init in MODEL_SIZES, f"--init must be one of {', '.join(MODEL_SIZES)}, got {self.init!r}")
            _, heads, width = self.model_shape
            need(width % heads == 0, f"--n-embd ({width}) must be a multiple of --n-head ({heads})")
        super().check(need)
        need(len(self.data) >= 1, "give training samples with --data FILE (repeat for several files)")
        for path in self.data:
            need(Path(path).is_file(), f"--data: no such file: {path}")
        for name in ("seq_len", "rows_per_step"):
            need(getattr(self, name) >= 1, f"--{flag(name)} must be >= 1, got {getattr(self, name)}")
        need(self.seq_len >= 2, f"--seq-len must be >= 2, got {self.seq_len}")
        need(self.loss_on in ("all", "target"), f"--loss-on must be all or target, got {self.loss_on!r}")

    def check_world(self, world: int) -> None:
        need(self.rows_per_step % world == 0, f"--rows-per-step ({self.rows_per_step}) must divide over {world} ranks")

    @property
    def model_shape(self) -> tuple[int, int, int]:
        """(layers, heads, width) of a fresh model."""
        layers, heads, width = MODEL_SIZES[self.init]
        return self.n_layer or layers, self.n_head or heads, self.n_embd or width


def default(cls: type, name: str) -> Any:
    """The default of setting `name` of a config class."""
    return cls.__dataclass_fields__[name].default


def _base_type(f: dataclasses.Field) -> type:
    t = str(f.type)
    for name, typ in (("bool", bool), ("int", int), ("float", float), ("str", str), ("list", list)):
        if t.startswith(name):
            return typ
    raise TypeError(t)


def _type_name(f: dataclasses.Field) -> str:
    return _base_type(f).__name__


def _type_ok(f: dataclasses.Field, v: Any) -> bool:
    t = _base_type(f)
    if t is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if t is list:
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    return isinstance(v, t)


def add_arguments(parser: argparse.ArgumentParser, cls: type[RunConfig] = TrainConfig) -> None:
    """One flag per field: the main settings first, then the rest section by section. Defaults are SUPPRESSed so
    that only flags actually given override the file."""
    main = parser.add_argument_group("main settings (the rest below, by section)")
    main.add_argument("--config", metavar="FILE.toml|PRESET",
                      help="read settings from a TOML file, or a preset shipped with rookworld "
                           f"({', '.join(presets.names())}); flags override it")
    groups: dict[str, argparse._ArgumentGroup] = {}
    fields = sorted(dataclasses.fields(cls), key=lambda f: (not f.metadata["main"],
                                                            _SECTIONS.index(f.metadata["section"])))
    for f in fields:
        section = f.metadata["section"]
        group = main if f.metadata["main"] else groups.setdefault(section, parser.add_argument_group(section))
        help_text = f.metadata["help"]
        typ = _base_type(f)
        kwargs: dict[str, Any] = {"default": argparse.SUPPRESS, "dest": f.name}
        if typ is bool:
            kwargs.update(action=argparse.BooleanOptionalAction)
        elif typ is list:
            kwargs.update(action="append", metavar="FILE")
        else:
            kwargs.update(type=typ, metavar=f.name.upper().replace("_", "-") if typ is str else typ.__name__.upper())
            if "choices" in f.metadata:
                kwargs.update(choices=f.metadata["choices"], metavar=None)
        # A default of None is said in the help text itself ("default: the built-in generator").
        shown = f.default is not None and f.default is not dataclasses.MISSING and "default" not in help_text
        kwargs["help"] = f"{help_text} (default: {_shown(f.default)})" if shown else help_text
        group.add_argument(f"--{flag(f.name)}", **kwargs)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def from_args(args: argparse.Namespace, cls: type[RunConfig] = TrainConfig):
    values: dict = {}
    if getattr(args, "config", None):
        section = "train" if cls is TrainConfig else cls.__name__.removesuffix("Config").lower()
        preset = presets.path(args.config) if not Path(args.config).exists() else None
        path = preset or Path(args.config)
        try:
            values = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"--config: no such file or preset: {path} (presets: {', '.join(presets.names())})"
                              ) from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"--config {path}: {e}") from None
        if preset is not None and section not in values:
            raise ConfigError(f"--config {args.config}: the preset has no settings for rookworld {section} (it has "
                              f"{', '.join('rookworld ' + k for k in values)})")
        values = dict(values.get(section, values))  # settings at the top level or under [train] / [sft]
        source = f"preset {args.config}" if preset else str(path)
    else:
        source = "config"
    names = {f.name for f in dataclasses.fields(cls)}
    for name in names:
        if hasattr(args, name):
            if flag(name) != name:
                values.pop(flag(name), None)
            values[name] = getattr(args, name)
    return cls.from_dict(values, source).validate()
