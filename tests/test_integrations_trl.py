"""rookworld's rewards and positions in TRL's own GRPOTrainer (issue 46): the shipped chess model trains for a few
steps on rookworld's dataset, scored by rookworld's reward function, and TRL logs its rewards."""

from __future__ import annotations

import math

import pytest
import torch

trl = pytest.importorskip("trl", reason="pip install 'rookworld[trl]'")
transformers = pytest.importorskip("transformers")

from datasets import Dataset  # noqa: E402

from rookworld.integrations.trl import chess_dataset, reward_funcs  # noqa: E402

from conftest import REPO  # noqa: E402

MODEL = REPO / "models" / "chess-cpu-sft"


def test_trl_trains_the_chess_model_on_rookworld_s_rewards(tmp_path):
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel.from_pretrained(MODEL, dtype=torch.float32)
    tokenizer = transformers.GPT2TokenizerFast.from_pretrained(MODEL)
    tokenizer.pad_token, tokenizer.padding_side = tokenizer.eos_token, "left"
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dataset = chess_dataset(str(REPO / "data" / "chess-cpu-held-out.jsonl"), count=16, seed=1, task_mix=0.5)
    rewards = reward_funcs("mixed")
    config = trl.GRPOConfig(output_dir=str(tmp_path), max_steps=2, learning_rate=1e-4, per_device_train_batch_size=4,
                            num_generations=4, max_completion_length=72, temperature=1.0, use_cpu=True, bf16=False,
                            gradient_checkpointing=False, logging_steps=1, report_to="none", save_strategy="no",
                            seed=0)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=rewards, args=config, train_dataset=dataset,
                              processing_class=tokenizer)
    try:
        trainer.train()
    finally:
        for r in rewards:
            r.close()
    logged = [row for row in trainer.state.log_history if "rewards/rookworld_mixed/mean" in row]
    assert len(logged) == 2
    for row in logged:
        mean = row["rewards/rookworld_mixed/mean"]
        # The SFT model writes well-formed answers: the reward sees its completions and the prompts' truths.
        assert math.isfinite(mean) and 0.0 < mean <= 1.0, row
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items()), "no weight moved"


def test_trl_stops_at_a_dataset_row_whose_analysis_data_would_refuse(tmp_path):
    """NaN in truth_evals was a NaN reward, which TRL trained on (issue 58): now the first step stops, naming the
    batch's row and what is wrong with it, before any weight moves."""
    model = transformers.GPT2LMHeadModel.from_pretrained(MODEL, dtype=torch.float32)
    tokenizer = transformers.GPT2TokenizerFast.from_pretrained(MODEL)
    tokenizer.pad_token, tokenizer.padding_side = tokenizer.eos_token, "left"
    rows = chess_dataset(str(REPO / "data" / "chess-cpu-held-out.jsonl"), count=4, task_mix=1.0).to_list()
    spoiled = Dataset.from_list([r | {"truth_evals": [math.nan] + r["truth_evals"][1:]} for r in rows])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rewards = reward_funcs("policy")
    config = trl.GRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, num_generations=4,
                            max_completion_length=8, use_cpu=True, bf16=False, gradient_checkpointing=False,
                            report_to="none", save_strategy="no", seed=0)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=rewards, args=config, train_dataset=spoiled,
                              processing_class=tokenizer)
    with pytest.raises(ValueError, match=r"^row \d+: bad truth_moves / truth_evals: eval 1 \(NaN\) is not a finite "
                                         r"number: give Stockfish's analysis"):
        trainer.train()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
