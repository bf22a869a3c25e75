"""Every setting of `rookworld train` in one dataclass: defaults, a TOML file, then flags, then checks.

`rookworld train --config run.toml --lr 3e-6` reads the file (keys are the field names, with `-` or `_`) and
lets flags override it. `TrainConfig.validate()` turns a bad value into one clear message before any work.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rookworld.grpo import ADVANTAGE_ESTIMATORS, AGGREGATIONS, BASELINES, KL_DIRECTIONS, KL_ESTIMATORS, STD_SCALINGS
from rookworld.rewards import SHAPINGS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(ValueError):
    """A setting that cannot work, said in one line."""


def _f(default: Any, help: str, **kw: Any) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class TrainConfig:
    # What to train, where, for how long
    model: str = _f("jrahn/RookWorld-LM-124M", "policy to start from: hub repo id or local directory")
    revision: str | None = _f(None, "hub revision of --model (branch, tag or commit)")
    steps: int = _f(500, "GRPO steps")
    output_dir: str = _f("runs/rookworld", "directory for checkpoints, metrics.jsonl, samples and TensorBoard")
    seed: int = _f(0, "seed for prompts, sampling and initialisation")
    device: str = _f("auto", "cpu, cuda, cuda:N or auto (CUDA when available; under torchrun, the local rank's GPU)")
    dtype: str = _f("auto", "compute dtype: auto (bf16 autocast on CUDA, fp32 on CPU), bf16 or fp32",
                    choices=("auto", "bf16", "fp32"))
    compile: bool = _f(True, "on CUDA, torch.compile the decode step (CUDA graphs) and the log-probs' softmax")
    resume: str | None = _f(None, "continue from a checkpoint directory, or an output directory's latest checkpoint")

    # Prompts
    data: str | None = _f(None, "positions file (JSONL, FEN or EPD a line); default: the built-in generator")
    task_mix: float = _f(0.8, "share of P: prompts, exact in every step (one prompt either way); the rest are A:")
    prompts_per_step: int = _f(32, "prompts per GRPO step (over all ranks)")
    group_size: int = _f(16, "completions sampled per prompt")
    auto_batch: bool = _f(False, "on CUDA, probe real steps at doubling --prompts-per-step (from --prompts-per-step) "
                                 "and keep the largest whose peak memory stays under --memory-target")
    memory_target: float = _f(0.85, "share of GPU memory --auto-batch may use")
    auto_batch_max: int = _f(1024, "largest --prompts-per-step --auto-batch tries")
    illegal_share: float = _f(0.01, "share of generated A: moves that are illegal")
    overfit_single_batch: bool = _f(False, "reuse the first batch of prompts every step (debugging)")

    # Sampling
    max_new_tokens: int = _f(144, "completion length limit")
    temperature: float = _f(1.0, "sampling temperature (also used for the log-probs of the update)")
    top_k: int = _f(0, "sample from the k most likely tokens (0: no limit)")
    top_p: float = _f(1.0, "nucleus sampling threshold (1: no limit)")

    # Rewards
    reward_shaping: str = _f("continuous", "continuous (0.2 + 0.8 q) or graduated (steps of 0.2)", choices=SHAPINGS)
    stockfish_path: str | None = _f(None, "Stockfish binary (default: stockfish on PATH, then /usr/games/stockfish)")
    stockfish_depth: int = _f(10, "Stockfish analysis depth for P: rewards")
    stockfish_workers: int | None = _f(None, "Stockfish processes per rank (default: spare cores / ranks)")
    stockfish_cache: str | None = _f(None, "sqlite file that caches analyses across runs")

    # GRPO objective
    advantage: str = _f("grpo", "grpo (group-relative, no critic) or gae (PPO: a value head on the policy's trunk, "
                                "per-token advantages by GAE)", choices=ADVANTAGE_ESTIMATORS)
    baseline: str = _f("group", "what a reward is compared with (grpo): its group's mean, or ema, a moving average "
                                "of its task's reward over steps", choices=BASELINES)
    ema_decay: float = _f(0.9, "decay of the --baseline ema average per step")
    std_scaling: str = _f("auto", "advantage scaling: group std, batch std over all ranks (with gae: whitening), "
                                  "none (Dr. GRPO), or auto (group with the group baseline, else batch)",
                          choices=("auto", *STD_SCALINGS))
    gamma: float = _f(1.0, "discount per token (--advantage gae)")
    gae_lambda: float = _f(0.95, "GAE lambda (--advantage gae)")
    vf_coef: float = _f(0.1, "weight of the value loss beside the policy loss (--advantage gae)")
    value_clip: float = _f(0.2, "clip range of the value loss around the rollout's values (--advantage gae)")
    value_lr: float = _f(1e-4, "peak learning rate of the value head (--advantage gae)")
    loss_aggregation: str = _f("token", "token (DAPO), sequence (GRPO) or constant (Dr. GRPO)", choices=AGGREGATIONS)
    clip_low: float = _f(0.2, "lower clip range of the importance ratio (1 - clip_low)")
    clip_high: float = _f(0.28, "upper clip range (1 + clip_high); above clip_low is clip-higher (DAPO)")
    beta: float = _f(0.04, "weight of the KL penalty to the frozen reference (0: no reference pass)")
    kl_estimator: str = _f("k3", "KL to the reference: k1 (a per-token penalty folded into the advantages), k2 or "
                                 "k3 (loss terms with the gradient of KL(policy||ref), resp. KL(ref||policy)), "
                                 "full (exact over the vocabulary, see --kl-direction)", choices=KL_ESTIMATORS)
    kl_direction: str = _f("forward", "direction of --kl-estimator full: forward KL(policy||ref), reverse "
                                      "KL(ref||policy) or symmetric (their mean)", choices=KL_DIRECTIONS)
    beta_warmup_steps: int = _f(0, "ramp beta linearly from 0 over this many steps")
    kl_target: float | None = _f(None, "adapt beta toward this KL per token (default: fixed beta)")
    kl_horizon: int = _f(10, "steps over which the adaptive beta reacts")
    entropy_coef: float = _f(0.0, "weight of an entropy bonus")
    drop_zero_spread: bool = _f(False, "leave out groups whose rewards do not vary")
    mask_truncated: bool = _f(False, "leave out completions cut off at max_new_tokens")

    # Optimisation
    mu: int = _f(1, "update epochs over each rollout")
    minibatches: int = _f(1, "optimizer steps per epoch (the rollout is split into this many minibatches)")
    micro_batch_size: int = _f(64, "completions per forward/backward (gradient accumulation within a minibatch)")
    lr: float = _f(3e-6, "peak learning rate (AdamW, betas 0.9/0.95)")
    min_lr_ratio: float = _f(0.1, "cosine decay ends at lr x this")
    warmup_steps: int = _f(10, "linear learning-rate warm-up steps")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    max_grad_norm: float = _f(1.0, "gradient clipping norm (0: off)")

    # Logging, evaluation, checkpoints
    log_every: int = _f(1, "print a summary line every N steps")
    sample_every: int = _f(10, "write example completions with their rewards every N steps (0: never)")
    eval_every: int = _f(50, "greedy evaluation on held-out positions every N steps (0: never)")
    eval_data: str | None = _f(None, "held-out positions for evaluation (default: generated, disjoint seed)")
    eval_size: int = _f(128, "positions in the held-out evaluation")
    save_every: int = _f(50, "checkpoint every N steps (and always at the end)")
    keep_checkpoints: int = _f(3, "checkpoints kept (oldest deleted)")
    kl_warn: float = _f(1.0, "warn when the mean KL per token exceeds this")
    clip_warn: float = _f(0.2, "warn when the clip fraction exceeds this")

    def validate(self) -> "TrainConfig":
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ConfigError(message)

        for name in ("steps", "prompts_per_step", "group_size", "max_new_tokens", "mu", "minibatches",
                     "micro_batch_size", "stockfish_depth", "log_every", "eval_size", "keep_checkpoints",
                     "kl_horizon"):
            need(getattr(self, name) >= 1, f"--{_flag(name)} must be >= 1, got {getattr(self, name)}")
        for name in ("seed", "warmup_steps", "beta_warmup_steps", "sample_every", "eval_every", "save_every",
                     "top_k"):
            need(getattr(self, name) >= 0, f"--{_flag(name)} must be >= 0, got {getattr(self, name)}")
        need(0.0 < self.memory_target <= 1.0, f"--memory-target must lie in (0, 1], got {self.memory_target}")
        need(self.auto_batch_max >= 1, f"--auto-batch-max must be >= 1, got {self.auto_batch_max}")
        for name in ("task_mix", "illegal_share", "min_lr_ratio"):
            v = getattr(self, name)
            need(0.0 <= v <= 1.0, f"--{_flag(name)} must lie in [0, 1], got {v}")
        for name in ("lr", "beta", "clip_low", "clip_high", "entropy_coef", "weight_decay", "max_grad_norm",
                     "temperature", "kl_warn", "clip_warn"):
            v = getattr(self, name)
            need(v >= 0.0 and v == v, f"--{_flag(name)} must be >= 0, got {v}")
        need(self.lr > 0, "--lr must be > 0")
        need(self.temperature > 0, "--temperature must be > 0 for training (the update's log-probs are taken at "
                                   "the sampling temperature); greedy decoding is for evaluation")
        if self.kl_target is not None:
            need(self.beta > 0, "--kl-target adapts --beta from its starting value: give --beta > 0")
            need(self.beta_warmup_steps == 0, "--kl-target and --beta-warmup-steps both set beta: use one of them")
        need(self.kl_direction == "forward" or self.kl_estimator == "full",
             "--kl-direction applies to --kl-estimator full only")
        for name in ("gamma", "gae_lambda"):
            v = getattr(self, name)
            need(0.0 <= v <= 1.0, f"--{_flag(name)} must lie in [0, 1], got {v}")
        need(0.0 <= self.ema_decay < 1.0, f"--ema-decay must lie in [0, 1), got {self.ema_decay}")
        need(self.vf_coef >= 0, f"--vf-coef must be >= 0, got {self.vf_coef}")
        need(self.value_clip > 0, f"--value-clip must be > 0, got {self.value_clip}")
        need(self.value_lr > 0, f"--value-lr must be > 0, got {self.value_lr}")
        if self.advantage == "gae":
            need(self.baseline == "group", "--advantage gae has its own baseline (the value head): drop --baseline")
        else:
            for name in ("gamma", "gae_lambda", "vf_coef", "value_clip", "value_lr"):
                need(getattr(self, name) == _default(name), f"--{_flag(name)} applies to --advantage gae only")
        if self.baseline != "group":
            need(self.std_scaling != "group", "--std-scaling group divides by each group's std, which is 0 for a "
                                              "group without spread: use batch or none with --baseline ema")
        else:
            need(self.ema_decay == _default("ema_decay"), "--ema-decay applies to --baseline ema only")
        if self.advantage == "gae":
            need(self.std_scaling != "group", "--std-scaling group has no meaning for per-token GAE advantages: "
                                              "use batch (whitening) or none")
        need(self.group_size >= 2, f"--group-size must be >= 2 (GRPO compares completions), got {self.group_size}")
        need(0.0 < self.top_p <= 1.0, f"--top-p must lie in (0, 1], got {self.top_p}")
        need(self.clip_low < 1.0, f"--clip-low must be < 1, got {self.clip_low}")
        need(self.kl_target is None or self.kl_target > 0, "--kl-target must be > 0")
        need(self.stockfish_workers is None or self.stockfish_workers >= 1, "--stockfish-workers must be >= 1")
        samples = self.prompts_per_step * self.group_size
        need(samples % self.minibatches == 0,
             f"prompts-per-step x group-size ({samples}) must split into --minibatches ({self.minibatches})")
        for name, choices in (("reward_shaping", SHAPINGS), ("std_scaling", ("auto", *STD_SCALINGS)),
                              ("loss_aggregation", AGGREGATIONS), ("kl_estimator", KL_ESTIMATORS),
                              ("kl_direction", KL_DIRECTIONS), ("baseline", BASELINES),
                              ("advantage", ADVANTAGE_ESTIMATORS),
                              ("dtype", ("auto", "bf16", "fp32"))):
            v = getattr(self, name)
            need(v in choices, f"--{_flag(name)} must be one of {', '.join(choices)}, got {v!r}")
        need(bool(re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device)),
             f"--device must be cpu, cuda, cuda:N or auto, got {self.device!r}")
        for name in ("data", "eval_data"):
            path = getattr(self, name)
            need(path is None or Path(path).is_file(), f"--{_flag(name)}: no such file: {path}")
        model = Path(self.model).expanduser()
        looks_local = model.exists() or self.model.startswith((".", "/", "~")) or self.model.count("/") != 1
        if looks_local:
            need(model.is_dir(), f"--model: no such model directory: {self.model}")
            need((model / "config.json").is_file(), f"--model: {self.model} has no config.json")
        return self

    @property
    def advantage_scaling(self) -> str:
        """--std-scaling with auto resolved: group for GRPO's group baseline, batch otherwise."""
        if self.std_scaling != "auto":
            return self.std_scaling
        return "group" if self.advantage == "grpo" and self.baseline == "group" else "batch"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict, source: str = "config") -> "TrainConfig":
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


def _default(name: str) -> Any:
    return TrainConfig.__dataclass_fields__[name].default


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _base_type(f: dataclasses.Field) -> type:
    t = str(f.type)
    for name, typ in (("bool", bool), ("int", int), ("float", float), ("str", str)):
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
    return isinstance(v, t)


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per field; defaults are SUPPRESSed so that only flags actually given override the file."""
    parser.add_argument("--config", metavar="FILE.toml", help="read settings from a TOML file; flags override it")
    for f in dataclasses.fields(TrainConfig):
        help_text = f.metadata["help"]
        default = f.default
        typ = _base_type(f)
        kwargs: dict[str, Any] = {"default": argparse.SUPPRESS, "dest": f.name}
        if typ is bool:
            kwargs.update(action=argparse.BooleanOptionalAction)
        else:
            kwargs.update(type=typ, metavar=f.name.upper().replace("_", "-") if typ is str else typ.__name__.upper())
            if "choices" in f.metadata:
                kwargs.update(choices=f.metadata["choices"], metavar=None)
        kwargs["help"] = f"{help_text} (default: {default})"
        parser.add_argument(f"--{_flag(f.name)}", **kwargs)


def from_args(args: argparse.Namespace) -> TrainConfig:
    values: dict = {}
    if getattr(args, "config", None):
        path = Path(args.config)
        try:
            values = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"--config: no such file: {path}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"--config {path}: {e}") from None
        values = dict(values.get("train", values))  # settings at the top level or under [train]
        source = str(path)
    else:
        source = "config"
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    for name in names:
        if hasattr(args, name):
            if _flag(name) != name:
                values.pop(_flag(name), None)
            values[name] = getattr(args, name)
    return TrainConfig.from_dict(values, source).validate()
