"""The GRPO objective's options as a user names them (`--kl-estimator`, `--kl-direction`, `--advantage`,
`--baseline`, `--std-scaling`, `--loss-aggregation`) and the checks of how they combine, without torch:
`TrainConfig.validate` calls `check` while flags are parsed; `rookworld.grpo.objective` builds the objective.
"""

from __future__ import annotations

import dataclasses

from rookworld.io.quote import quoted
from rookworld.settings.base import flag

#: KL to the reference: sampled per token (Schulman's k1, k2, k3), or exact over the vocabulary.
KL_ESTIMATORS = ("k1", "k2", "k3", "full")
#: The exact KL's direction, as the weights of KL(policy || reference) and KL(reference || policy).
KL_DIRECTIONS = {"forward": (1.0, 0.0), "reverse": (0.0, 1.0), "symmetric": (0.5, 0.5)}
ADVANTAGE_ESTIMATORS = ("grpo", "gae")
BASELINES = ("group", "ema")
STD_SCALINGS = ("group", "batch", "none")
AGGREGATIONS = ("token", "sequence", "constant")


def check(cfg, need) -> None:
    """Each objective setting of a `TrainConfig` and how they combine: `need(ok, message)` for each, so a setting
    that cannot work is one clear line."""
    default = {f.name: f.default for f in dataclasses.fields(cfg)}
    for name, choices in (("kl_estimator", KL_ESTIMATORS), ("kl_direction", tuple(KL_DIRECTIONS)),
                          ("advantage", ADVANTAGE_ESTIMATORS), ("baseline", BASELINES),
                          ("std_scaling", ("auto", *STD_SCALINGS)), ("loss_aggregation", AGGREGATIONS)):
        v = getattr(cfg, name)
        need(v in choices, f"--{flag(name)} must be one of {', '.join(choices)}, got {quoted(v)}")
    if cfg.kl_target is not None:
        need(cfg.beta > 0, "--kl-target adapts --beta from its starting value: give --beta > 0")
        need(cfg.beta_warmup_steps == 0, "--kl-target and --beta-warmup-steps both set beta: use one of them")
    need(cfg.kl_direction == "forward" or cfg.kl_estimator == "full",
         "--kl-direction applies to --kl-estimator full only")
    for name in ("gamma", "gae_lambda"):
        v = getattr(cfg, name)
        need(0.0 <= v <= 1.0, f"--{flag(name)} must lie in [0, 1], got {v}")
    need(0.0 <= cfg.ema_decay < 1.0, f"--ema-decay must lie in [0, 1), got {cfg.ema_decay}")
    need(cfg.vf_coef >= 0, f"--vf-coef must be >= 0, got {cfg.vf_coef}")
    need(cfg.value_clip > 0, f"--value-clip must be > 0, got {cfg.value_clip}")
    need(cfg.value_lr > 0, f"--value-lr must be > 0, got {cfg.value_lr}")
    if cfg.advantage == "gae":
        need(cfg.baseline == "group", "--advantage gae has its own baseline (the value head): drop --baseline")
        need(cfg.std_scaling != "group", "--std-scaling group has no meaning for per-token GAE advantages: "
                                         "use batch (whitening) or none")
    else:
        for name in ("gamma", "gae_lambda", "vf_coef", "value_clip", "value_lr"):
            need(getattr(cfg, name) == default[name], f"--{flag(name)} applies to --advantage gae only")
    if cfg.baseline != "group":
        need(cfg.std_scaling != "group", "--std-scaling group divides by each group's std, which is 0 for a "
                                         "group without spread: use batch or none with --baseline ema")
    else:
        need(cfg.ema_decay == default["ema_decay"], "--ema-decay applies to --baseline ema only")
    need(cfg.a_likelihood_weight == 0 or cfg.task_mix < 1.0,
         "--a-likelihood-weight is a term on A: prompts' targets: give --task-mix below 1 so that there are some")
    need(cfg.a_advantage_scale == 1.0 or cfg.advantage == "grpo",
         "--a-advantage-scale applies to --advantage grpo (GAE's advantages are per token, from the critic)")
