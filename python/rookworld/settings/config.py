"""The settings of the training commands, composed of groups: `RunConfig` holds what train and sft share (model,
run, optimiser, logging and evaluation, Stockfish); `TrainConfig` adds GRPO's groups, `SFTConfig` supervised
training's, each with its own defaults where they differ. `rookworld train --config run.toml --lr 3e-6` reads the
file (keys are the setting names, with `-` or `_`, at the top level or under [train]) and lets flags override it.
`validate()` turns a bad value into one clear message before any work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rookworld.chess.fields import parse_weights
from rookworld.chess.rewards import P_REWARDS, SHAPINGS
from rookworld.settings import objective
from rookworld.settings.base import ConfigError, above_zero, flag, learning_rate, need, non_negative, positive, share
from rookworld.settings.declare import (ADVANTAGES, CRITIC, DATA, KL, LOGGING, LOSS, MODEL, OPTIM, REWARDS, SAMPLING, Meaning, Settings, composed, default, group, setting)
from rookworld.settings.flags import from_args
from rookworld.settings.groups import (BadLinesSettings, CompletionSettings, DataSettings, DecodeBatchSettings,
                                       EvalSizeSettings, IllegalShareSettings, LayoutSettings, ModelSettings,
                                       SeedSettings, StockfishSettings)
from rookworld.settings.hub import is_local_path
from rookworld.settings.run import (REPORTERS, EvaluationSettings, LoggingSettings, OptimizerSettings, RunSettings)

# Named here too, where the training code and its tests have always found them.
__all__ = ["MODEL_SIZES", "REPORTERS", "ConfigError", "RunConfig", "SFTConfig", "TrainConfig", "default", "from_args"]

#: Fresh GPT-2 sizes for `rookworld sft --init`: (layers, heads, width).
MODEL_SIZES = {"tiny": (2, 2, 128), "mini": (4, 4, 256), "small": (12, 12, 768)}


def field_weights(option: str, value: Any) -> str | None:
    try:
        parse_weights(value)
    except ValueError as e:
        return f"{option}: {e}"
    return None


@composed(decode_batch_size=Meaning("prompts decoded at once in --eval-every's evaluation"))
class RunConfig(ModelSettings, RunSettings, SeedSettings, OptimizerSettings, LoggingSettings, EvaluationSettings,
                EvalSizeSettings, DecodeBatchSettings, CompletionSettings, StockfishSettings, Settings):
    """What every training command shares."""

    def check_together(self, need) -> None:
        need(self.cooldown_steps == 0 or self.warmup_steps + self.cooldown_steps <= self.steps,
             f"--warmup-steps ({self.warmup_steps}) and --cooldown-steps ({self.cooldown_steps}) together must fit "
             f"in --steps ({self.steps})")
        # Training starts from a model directory itself, not a run directory (eval and ask take those).
        if self.model is not None and is_local_path(self.model) and Path(self.model).expanduser().is_dir():
            need((Path(self.model).expanduser() / "config.json").is_file(),
                 f"--model: {self.model} has no config.json")

    def check_world(self, world: int) -> None:
        """What can only be checked once the number of ranks is known (before any model is loaded)."""

    @property
    def reporters(self) -> tuple[str, ...]:
        """The names of --report-to, "none" left out."""
        return tuple(dict.fromkeys(n.strip() for n in self.report_to.split(",") if n.strip() not in ("", "none")))


#: The most prompts a GRPO step takes, and completions a prompt: a million prompts, or 4,096 completions of one, are
#: more than any GPU's step holds, and the positions generator (at most 100 million a call) and the sampler can
#: take every step they allow. Checked with the settings, on every route, not mid-run by the layer below.
MAX_PROMPTS_PER_STEP, MAX_GROUP_SIZE = 1_000_000, 4096


@group
class GRPODataSettings:
    prompts_per_step: int = setting(32, "prompts per GRPO step (over all ranks)", DATA, main=True, check=positive,
                                    most=MAX_PROMPTS_PER_STEP)
    group_size: int = setting(16, "completions sampled per prompt (at least 2: GRPO compares them)", DATA, main=True,
                              most=MAX_GROUP_SIZE)
    shared_prompt: bool = setting(True, "compute each group's prompt once, in sampling and in every log-prob pass "
                                        "(--no-shared-prompt computes it for every completion, as a check)", DATA)
    task_mix: float = setting(0.8, "share of P: prompts, exact in every step (one prompt either way); the rest are "
                                   "A:", DATA, check=share)
    auto_batch: bool = setting(False, "on CUDA, probe real steps at doubling --prompts-per-step (from "
                                      "--prompts-per-step) and keep the largest whose peak memory stays under "
                                      "--memory-target", DATA)
    memory_target: float = setting(0.85, "share of GPU memory --auto-batch may use", DATA)
    auto_batch_max: int = setting(1024, "largest --prompts-per-step --auto-batch tries", DATA, check=positive)
    overfit_single_batch: bool = setting(False, "reuse the first batch of prompts every step (debugging)", DATA)

    def check_together(self, need) -> None:
        need(self.group_size >= 2, f"--group-size must be >= 2 (GRPO compares completions), got {self.group_size}")
        need(0.0 < self.memory_target <= 1.0, f"--memory-target must lie in (0, 1], got {self.memory_target}")


@group
class SamplingSettings:
    temperature: float = setting(1.0, "sampling temperature (also used for the log-probs of the update)", SAMPLING,
                                 check=non_negative)
    top_k: int = setting(0, "sample from the k most likely tokens (0: no limit)", SAMPLING, check=non_negative)
    top_p: float = setting(1.0, "nucleus sampling threshold (1: no limit)", SAMPLING)

    def check_together(self, need) -> None:
        need(self.temperature > 0, "--temperature must be > 0 for training (the update's log-probs are taken at "
                                   "the sampling temperature); greedy decoding is for evaluation")
        need(0.0 < self.top_p <= 1.0, f"--top-p must lie in (0, 1], got {self.top_p}")


@group
class RewardSettings:
    reward_shaping: str = setting("continuous", "continuous (0.2 + 0.8 q) or graduated (steps of 0.2)", REWARDS,
                                  choices=SHAPINGS)
    p_reward: str = setting("rank", "how a P: answer's best move earns credit: rank (its rank in Stockfish's five; "
                                    "any other legal move 0.05) or cp-loss (by the pawns it loses against "
                                    "Stockfish's best, every legal move evaluated)", REWARDS, choices=P_REWARDS)


@group
class AdvantageSettings:
    advantage: str = setting("grpo", "grpo (group-relative, no critic) or gae (PPO: a value head on the policy's "
                                     "trunk, per-token advantages by GAE; see the critic's settings)", ADVANTAGES)
    baseline: str = setting("group", "what a reward is compared with (grpo): its group's mean, or ema, a moving "
                                     "average of its task's reward over steps", ADVANTAGES)
    ema_decay: float = setting(0.9, "decay of the --baseline ema average per step (--baseline ema only)", ADVANTAGES)
    a_advantage_scale: float = setting(1.0, "the advantages of A: completions as a multiple of their own (below 1 "
                                            "pushes the environment task less than the policy task; 0: the "
                                            "rewards do not move it, only the leash and --a-likelihood-weight)",
                                       ADVANTAGES, check=non_negative)
    std_scaling: str = setting("auto", "advantage scaling: group std, batch std over all ranks (with gae: "
                                       "whitening), none (Dr. GRPO), or auto (group with the group baseline, else "
                                       "batch)", ADVANTAGES)


@group
class KLSettings:
    beta: float = setting(0.04, "weight of the KL penalty to the frozen reference (0: no reference pass)", KL,
                          main=True, check=non_negative)
    kl_estimator: str = setting("k3", "KL to the reference: k1 (a per-token penalty folded into the advantages), k2 "
                                      "or k3 (loss terms with the gradient of KL(policy||ref), resp. KL(ref||policy)), "
                                      "full (exact over the vocabulary, see --kl-direction)", KL)
    kl_direction: str = setting("forward", "direction of --kl-estimator full (only): forward KL(policy||ref), "
                                           "reverse KL(ref||policy) or symmetric (their mean)", KL)
    a_beta_scale: float = setting(1.0, "the KL weight of A: completions as a multiple of beta (above 1 holds the "
                                       "environment task nearer the reference while P: moves)", KL,
                                  check=non_negative)
    beta_warmup_steps: int = setting(0, "ramp beta linearly from 0 over this many steps", KL, check=non_negative)
    kl_target: float | None = setting(None, "adapt beta toward this KL per token (default: fixed beta)", KL,
                                      check=lambda option, v: None if v > 0 else f"{option} must be > 0")
    kl_horizon: int = setting(10, "steps over which the adaptive beta reacts (with --kl-target)", KL, check=positive)


@group
class LossSettings:
    loss_aggregation: str = setting("token", "token (DAPO), sequence (GRPO) or constant (Dr. GRPO)", LOSS)
    clip_low: float = setting(0.2, "lower clip range of the importance ratio (1 - clip_low)", LOSS,
                              check=non_negative)
    clip_high: float = setting(0.28, "upper clip range (1 + clip_high); above clip_low is clip-higher (DAPO)", LOSS,
                               check=non_negative)
    entropy_coef: float = setting(0.0, "weight of an entropy bonus", LOSS, check=non_negative)
    a_likelihood_weight: float = setting(0.0, "weight of the likelihood of each A: prompt's exact target (the next "
                                              "state the rules give) beside GRPO's loss: its mean NLL per token, as "
                                              "SFT's (InstructGPT's PPO-ptx, the rules as its data; 0: none)", LOSS,
                                         check=non_negative)
    drop_zero_spread: bool = setting(False, "leave out groups whose rewards do not vary", LOSS)
    mask_truncated: bool = setting(False, "leave out completions cut off at max_new_tokens", LOSS)

    def check_together(self, need) -> None:
        need(self.clip_low < 1.0, f"--clip-low must be < 1, got {self.clip_low}")


@group
class CriticSettings:
    gamma: float = setting(1.0, "discount per token", CRITIC)
    gae_lambda: float = setting(0.95, "GAE lambda", CRITIC)
    vf_coef: float = setting(0.1, "weight of the value loss beside the policy loss", CRITIC)
    value_clip: float = setting(0.2, "clip range of the value loss around the rollout's values", CRITIC)
    value_lr: float = setting(1e-4, "peak learning rate of the value head", CRITIC, check=learning_rate)


@group
class EpochSettings:
    """How often a GRPO rollout is learnt from: epochs, and optimizer steps each."""

    mu: int = setting(1, "update epochs over each rollout", OPTIM, check=positive)
    minibatches: int = setting(1, "optimizer steps per epoch (the rollout is split into this many minibatches)",
                               OPTIM, check=positive)


@group
class GRPOLoggingSettings:
    sample_every: int = setting(10, "write example completions with their rewards every N steps (0: never)", LOGGING,
                                check=non_negative)
    kl_warn: float = setting(1.0, "warn when the mean KL per token exceeds this", LOGGING, check=non_negative)
    clip_warn: float = setting(0.2, "warn when the clip fraction exceeds this", LOGGING, check=non_negative)


@composed(steps=Meaning("GRPO steps, each one rollout and the updates on it"),
          seed=Meaning("random seed: of generated positions and A: moves, and of sampling"),
          data=Meaning("positions to train on: a positions file (JSONL of rookworld positions, FEN or EPD a line); "
                       "repeat for several files", shown="generated positions", default=[]),
          stockfish_workers=Meaning("Stockfish processes (default: one per core; on CUDA one fewer, for the process "
                                    "driving the GPU; under torchrun, a rank's share of the cores)"))
class TrainConfig(RunConfig, DataSettings, GRPODataSettings, IllegalShareSettings, SamplingSettings, RewardSettings,
                  AdvantageSettings, KLSettings, LossSettings, CriticSettings, EpochSettings, GRPOLoggingSettings):
    """`rookworld train`: GRPO."""

    config_section = "train"

    def check_together(self, need) -> None:
        objective.check(self, need)

    def check_world(self, world: int) -> None:
        need(self.prompts_per_step % world == 0,
             f"--prompts-per-step ({self.prompts_per_step}) must divide over {world} ranks")
        groups = self.prompts_per_step // world
        need(groups % self.minibatches == 0, f"each rank's {groups} prompts (--prompts-per-step / ranks), whose "
                                             f"groups stay whole, must split into --minibatches ({self.minibatches})")


@group
class FreshModelSettings:
    """A fresh GPT-2 to train from scratch."""

    init: str | None = setting(None, "start from a fresh random GPT-2 of this size: tiny (2 layers, 128 wide), mini "
                                     "(4, 256) or small (12, 768: GPT-2 small); --n-layer/--n-head/--n-embd override",
                               MODEL, main=True, choices=tuple(MODEL_SIZES))
    n_layer: int | None = setting(None, "layers of a fresh model (with --init)", MODEL, check=positive)
    n_head: int | None = setting(None, "attention heads of a fresh model (with --init)", MODEL, check=positive)
    n_embd: int | None = setting(None, "width of a fresh model (with --init)", MODEL, check=positive)
    vocabulary: str = setting("gpt2", "vocabulary of a fresh model (with --init): gpt2 (GPT-2's 50,257 tokens, as "
                                      "RookWorld-LM has) or chess (GPT-2's tokens made only of P: and A: characters, "
                                      "4,364: a head a twelfth the size; the same tokens for any P: or A: text)",
                              MODEL, choices=("gpt2", "chess"))

    @property
    def model_shape(self) -> tuple[int, int, int]:
        """(layers, heads, width) of a fresh model."""
        layers, heads, width = MODEL_SIZES[self.init]
        return self.n_layer or layers, self.n_head or heads, self.n_embd or width

    def check_together(self, need) -> None:
        for name in ("n_layer", "n_head", "n_embd"):
            need(getattr(self, name) is None or self.init is not None,
                 f"--{flag(name)} shapes a fresh model: use it with --init")
        need(self.vocabulary == "gpt2" or self.init is not None,
             "--vocabulary is a fresh model's (with --init): a --model keeps the vocabulary of its directory")
        if self.init is not None:
            _, heads, width = self.model_shape
            need(width % heads == 0, f"--n-embd ({width}) must be a multiple of --n-head ({heads})")


@group
class RowSettings:
    """How supervised samples become training rows."""

    seq_len: int = setting(512, "tokens per training row: the longest document it takes, or with --pack the length "
                                "of the packed rows", DATA,
                           check=lambda option, v: None if v >= 2 else f"{option} must be >= 2, got {v}")
    pack: bool = setting(False, "pack documents ([EOS] + text) into full rows of --seq-len, as RookWorld-LM's "
                                "pretraining did: no padding, but a document sees the ones before it in its row and "
                                "may be cut in two; the default is one document a row, starting at position 0 as "
                                "the sampler sees a prompt", DATA)
    loss_on: str = setting("all", "tokens the loss counts: all, or target (the completion after each prompt, and the "
                                  "EOS that ends it)", DATA, choices=("all", "target"))
    rows_per_step: int = setting(32, "rows per optimizer step (over all ranks)", DATA, check=positive)
    legal_weight: float = setting(0.0, "weight of the legality loss added to SFT's: at every token of the moves a P: "
                                       "target writes, -log of the probability on tokens that continue a legal move "
                                       "(0: none; needs one document a row)", DATA, check=non_negative)
    field_weights: str = setting("", "weights of the target's fields in the loss, e.g. M=1,E=0.25,B=4 (fields: "
                                     "M, E and B of P:, state and reward of A:; one not named weighs 1): the loss is "
                                     "the weighted token mean", DATA, check=field_weights, metavar="FIELD=W,...")
    soft_best_weight: float = setting(0.0, "weight of the soft best move loss added to SFT's: at the tokens of the "
                                           "move where a P: target chooses (B:, or with --candidate-order ranked the "
                                           "first M: move), the cross-entropy against softmax(Stockfish's eval of "
                                           "every legal move / --soft-best-temperature), analysed at "
                                           "--stockfish-depth before the first step (0: none; needs one document a "
                                           "row)", DATA, check=non_negative)
    soft_best_temperature: float = setting(0.5, "temperature in pawns of the soft best move's softmax: lower puts "
                                                "more of the target on the best move", DATA, check=above_zero)
    candidate_order: str = setting("as-written", "order of a P: target's M: candidates (and their E: evals): as the "
                                                 "data writes them (RookWorld's are shuffled), or ranked by "
                                                 "Stockfish's eval, best first (needs --layout, which rewrites the "
                                                 "targets)", DATA, choices=("as-written", "ranked"))

    @property
    def choice_slot(self) -> str:
        """Where a P: target chooses its move, for the soft best move: the first M: move when the candidates are
        ranked best first (B: then copies it), else B:."""
        return "first" if self.candidate_order == "ranked" else "B"

    def check_together(self, need) -> None:
        need(not (self.pack and self.legal_weight > 0), "--legal-weight reads each row's P: target: it needs one "
                                                        "document a row, not --pack")
        need(not (self.pack and self.soft_best_weight > 0), "--soft-best-weight reads each row's P: target: it "
                                                            "needs one document a row, not --pack")


@composed(model=None, output_dir="runs/sft", micro_batch_size=16, decode_batch_size=16, lr=3e-4, warmup_steps=50,
          weight_decay=0.1, log_every=10, save_every=200,
          steps=Meaning("optimizer steps", default=1000),
          seed=Meaning("random seed: of the order of the rows, of a fresh model's weights (--init), and of the "
                       "evaluation's generated positions"),
          data=Meaning("samples to train on: RookWorld text, or JSONL of rookworld positions --annotate; repeat for "
                       "several files", default=[]),
          layout=Meaning(shown="each file's own"),
          eval_every=Meaning("every N steps (0: never): greedy evaluation on held-out positions, and the loss on "
                             "--eval-data", default=100),
          eval_data=Meaning("held-out samples of --eval-every's evaluation, as --data reads them: its loss, and the "
                            "greedy evaluation on their positions; default: generated positions of a seed training "
                            "never draws from, and no loss"))
class SFTConfig(RunConfig, FreshModelSettings, DataSettings, BadLinesSettings, LayoutSettings, RowSettings):
    """`rookworld sft`: supervised training on P:/A: text, as RookWorld-LM itself was made."""

    config_section = "sft"

    def check_together(self, need) -> None:
        need(self.model is None or self.init is None, "--model continues a checkpoint and --init starts afresh: "
                                                      "give one")
        need(self.model is not None or self.init is not None, "give --model DIR (continue a checkpoint) or --init "
                                                              "tiny|mini|small (a fresh GPT-2)")
        need(len(self.data) >= 1, "give training samples with --data FILE (repeat for several files)")
        need(self.candidate_order == "as-written" or self.layout is not None,
             "--candidate-order ranked rewrites each P: target: give the --layout to write it in")

    def check_world(self, world: int) -> None:
        need(self.rows_per_step % world == 0, f"--rows-per-step ({self.rows_per_step}) must divide over {world} ranks")

