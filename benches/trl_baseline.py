"""The same GRPO work through TRL's GRPOTrainer, for a side-by-side with benches/grpo_step.py.

Same model (GPT-2 small, random weights, written in the Hugging Face layout by rookworld's save_pretrained),
same prompts (rookworld's generated positions, 80/20 P:/A:), same group size, same completion length (forced
with min_new_tokens = max_completion_length, since random weights would stop anywhere) and the same reward
(rookworld's Rust scorer with Stockfish, wrapped as a TRL reward function). Prints samples/s and generated
tokens/s per step after warm-up.

TRL generates with `transformers`' generate; one completion length applies to every prompt, so compare it with
`benches/grpo_step.py --uniform-length N` at the same N (default 64, near the 80/20 mean of 48 and 96).

    python benches/trl_baseline.py                             # one GPU; needs trl, datasets, transformers
    python benches/trl_baseline.py --device cpu --tiny --prompts 4 --group 4 --steps 1 --length 8   # smoke

The GPU machine has transformers but not trl or datasets: `pip download --no-deps trl datasets` here, carry
the wheels, `pip install --no-deps` them there (their other dependencies are already installed there).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

def hf_tokenizer(model_dir: Path):
    """transformers' GPT-2 tokenizer from the vocab.json and merges.txt rookworld writes beside a model (left
    padding, `<|endoftext|>` as the pad token)."""
    from rookworld.integrations.trl import load_tokenizer
    from rookworld.net.tokenizer import get_tokenizer

    get_tokenizer().save_pretrained(model_dir)
    return load_tokenizer(model_dir)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--length", type=int, default=64, help="completion tokens, for every prompt")
    ap.add_argument("--micro-batch-size", type=int, default=256, help="per_device_train_batch_size")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--stockfish-depth", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import transformers
    from datasets import Dataset
    from trl import GRPOConfig

    # TRL's GRPOTrainer with its log-prob passes at the positions generate sampled at (GPT-2's are absolute: issue 60)
    from rookworld.integrations.trl import GRPOTrainer

    from rookworld.chess.rules import generate_positions
    from rookworld.net.model import GPT, GPTConfig
    from rookworld.net.pretrained import save_pretrained
    from rookworld.chess.rewards import RewardScorer
    from rookworld.chess.stockfish import StockfishPool
    from rookworld.net.tokenizer import EOS_ID

    cuda = args.device.startswith("cuda")

    n_prompts = args.prompts * (args.warmup + args.steps)
    positions = generate_positions(n_prompts, 0)
    prompts = [(p.env_prompt if i % 5 == 4 else f"P: {p.fen}") for i, p in enumerate(positions)]
    # Pretraining documents began with <|endoftext|>; rookworld's trainer prepends it too.
    dataset = Dataset.from_dict({"prompt": ["<|endoftext|>" + p for p in prompts]})

    pool = StockfishPool(depth=args.stockfish_depth)
    scorer = RewardScorer(pool)

    def chess_reward(prompts, completions, **_):
        return scorer.score([p.removeprefix("<|endoftext|>") for p in prompts], completions)

    step_times: list[float] = []

    class Timer(transformers.TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            step_times.append(time.perf_counter() - self.t)

    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        mcfg = (GPTConfig(block_size=512, vocab_size=50257, n_layer=2, n_head=2, n_embd=64) if args.tiny
                else GPTConfig())
        save_pretrained(GPT(mcfg), Path(tmp) / "model")
        tok = hf_tokenizer(Path(tmp) / "model")
        assert tok.encode("Hello world") == [15496, 995], "the tokenizer must be GPT-2's"
        model = transformers.GPT2LMHeadModel.from_pretrained(Path(tmp) / "model", torch_dtype=torch.float32)
        model.generation_config.eos_token_id = EOS_ID
        model.generation_config.pad_token_id = EOS_ID
        samples = args.prompts * args.group
        config = GRPOConfig(
            output_dir=str(Path(tmp) / "out"), max_steps=args.warmup + args.steps, learning_rate=3e-6,
            per_device_train_batch_size=min(args.micro_batch_size, samples),
            gradient_accumulation_steps=max(1, samples // args.micro_batch_size),
            num_generations=args.group, max_completion_length=args.length,
            generation_kwargs={"min_new_tokens": args.length}, temperature=1.0, beta=args.beta,
            epsilon=0.2, epsilon_high=0.28, loss_type="dapo", bf16=cuda, use_cpu=not cuda,
            logging_steps=1, report_to="none", save_strategy="no", shuffle_dataset=False, seed=0,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=chess_reward, args=config, train_dataset=dataset,
                              processing_class=tok, callbacks=[Timer()])
        print(f"TRL {__import__('trl').__version__}: {args.prompts} prompts x group {args.group}, "
              f"{args.length} tokens each, on {args.device}", file=sys.stderr)
        try:
            trainer.train()
        finally:
            pool.close()

    measured = step_times[args.warmup:] or step_times
    step = statistics.median(measured)
    figures = {"device": torch.cuda.get_device_name() if cuda else "cpu", "trl": __import__("trl").__version__,
               "prompts": args.prompts, "group": args.group, "length": args.length, "step_s": step,
               "samples_per_s": args.prompts * args.group / step,
               "generated_tokens_per_s": args.prompts * args.group * args.length / step,
               "step_times": step_times}
    print(f"\n{'samples/s':<22}{figures['samples_per_s']:>12,.1f}")
    print(f"{'generated tokens/s':<22}{figures['generated_tokens_per_s']:>12,.0f}")
    print(f"{'step (s)':<22}{step:>12.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
