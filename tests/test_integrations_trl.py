"""rookworld's rewards and positions in TRL's own GRPOTrainer (issue 46): the shipped chess model trains for a few
steps on rookworld's dataset, scored by rookworld's reward function, and TRL logs its rewards; TRL's policy and
reference score each completion at the positions it was sampled at (issue 60)."""

from __future__ import annotations

import json
import math

import pytest
import torch

trl = pytest.importorskip("trl", reason="pip install 'rookworld[trl]'")
transformers = pytest.importorskip("transformers")

from datasets import Dataset  # noqa: E402

from rookworld.integrations.trl import GRPOTrainer, chess_dataset, load_tokenizer, reward_funcs  # noqa: E402
from rookworld.net.pretrained import from_pretrained  # noqa: E402
from rookworld.net.tokenizer import get_tokenizer  # noqa: E402

from conftest import REPO  # noqa: E402

MODEL = REPO / "models" / "chess-cpu-sft"


def test_trl_trains_the_chess_model_on_rookworld_s_rewards(tmp_path):
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel.from_pretrained(MODEL, dtype=torch.float32)
    tokenizer = load_tokenizer(MODEL)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dataset = chess_dataset(str(REPO / "data" / "chess-cpu-held-out.jsonl"), count=16, seed=1, task_mix=0.5)
    rewards = reward_funcs("mixed")
    config = trl.GRPOConfig(output_dir=str(tmp_path), max_steps=2, learning_rate=1e-4, per_device_train_batch_size=4,
                            num_generations=4, max_completion_length=72, temperature=1.0, use_cpu=True, bf16=False,
                            gradient_checkpointing=False, logging_steps=1, report_to="none", save_strategy="no",
                            seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=rewards, args=config, train_dataset=dataset,
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
    tokenizer = load_tokenizer(MODEL)
    rows = chess_dataset(str(REPO / "data" / "chess-cpu-held-out.jsonl"), count=4, task_mix=1.0).to_list()
    spoiled = Dataset.from_list([r | {"truth_evals": [math.nan] + r["truth_evals"][1:]} for r in rows])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rewards = reward_funcs("policy")
    config = trl.GRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, num_generations=4,
                            max_completion_length=8, use_cpu=True, bf16=False, gradient_checkpointing=False,
                            report_to="none", save_strategy="no", seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=rewards, args=config, train_dataset=spoiled,
                              processing_class=tokenizer)
    with pytest.raises(ValueError, match=r"^row \d+: bad truth_moves / truth_evals: eval 1 \(NaN\) is not a finite "
                                         r"number: give Stockfish's analysis"):
        trainer.train()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_trl_scores_each_completion_where_it_was_sampled(tmp_path):
    """GPT-2 embeds absolute positions. TRL left-pads a batch's prompts and samples with `generate`, which numbers
    each row's positions from its first real token; its log-prob forwards passed no position ids, so a row padded
    by k tokens was scored and trained k positions further on: up to 22 nats a token off what it was sampled with,
    and TRL's KL ran away (issue 60). Policy and reference now give each completion of a left-padded batch the
    log-probs rookworld's own model gives it unpadded, at the sampling temperature."""
    temperature = 0.7
    model = transformers.GPT2LMHeadModel.from_pretrained(MODEL, dtype=torch.float32)
    tokenizer = load_tokenizer(MODEL)
    config = trl.GRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, num_generations=2,
                            max_completion_length=8, temperature=temperature, beta=0.04, use_cpu=True, bf16=False,
                            gradient_checkpointing=False, report_to="none", save_strategy="no", seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=reward_funcs("mixed"), args=config,
                          train_dataset=chess_dataset(count=4, seed=0), processing_class=tokenizer)
    assert trainer.ref_model is not None
    # A P: and an A: prompt of two positions, with the answers the data holds: P: prompts are the shorter.
    records = [json.loads(line) for line in (REPO / "data" / "chess-cpu-held-out.jsonl").open().readlines()[:2]]
    pairs = [(r[f"{t}_prompt"], r[f"{t}_target"]) for r in records for t in ("p", "a")]
    eos = tokenizer.eos_token
    prompts = [tokenizer(eos + p)["input_ids"] for p, _ in pairs]
    completions = [tokenizer(c + eos)["input_ids"] for _, c in pairs]
    width, length = max(map(len, prompts)), max(map(len, completions))
    pads = [width - len(p) for p in prompts]
    assert max(pads) >= 30, pads  # the shift this test is about
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p + c + [pad] * (length - len(c))
                        for p, c in zip(prompts, completions)])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * (len(p) + len(c)) + [0] * (length - len(c))
                         for p, c in zip(prompts, completions)])
    with torch.no_grad():
        policy = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, length)[0]
        reference = trainer._get_per_token_logps_and_entropies(trainer.ref_model, ids, mask, length)[0]
        ours = from_pretrained(MODEL)
        ours_tokenizer = get_tokenizer(MODEL)
        for row, ((p, c), prompt, completion) in enumerate(zip(pairs, prompts, completions)):
            tokens = torch.tensor([ours_tokenizer.encode(p + c, bos=True) + [ours_tokenizer.eos_id]])
            assert tokens[0].tolist() == prompt + completion
            logps = torch.log_softmax(ours(tokens)[0] / temperature, -1)[:-1].gather(-1, tokens[0, 1:, None])[:, 0]
            expected = logps[-len(completion):]
            for name, got in (("policy", policy), ("reference", reference)):
                off = (got[row, :len(completion)] - expected).abs().max().item()
                assert off < 1e-3, f"row {row} (padded by {pads[row]}): {name} log-probs {off:.3g} off rookworld's"


def test_load_tokenizer_of_a_directory_without_a_vocabulary_is_refused_not_a_tokenizer_of_nothing(tmp_path):
    """transformers gave a tokenizer of 0 tokens for a directory without vocab.json and merges.txt (issue 71)."""
    from rookworld.integrations.trl import load_tokenizer
    from rookworld.net.tokenizer import TokenizerUnavailableError

    with pytest.raises(TokenizerUnavailableError, match="has no vocab.json and merges.txt"):
        load_tokenizer(tmp_path)
    assert len(load_tokenizer(REPO / "models" / "chess-play-sft")) == 4364



def test_a_stray_tokenizer_file_beside_the_vocabulary_changes_nothing(tmp_path):
    """TRL's tokenizer is made from the two files every rookworld command reads: a tokenizer.json left in the
    directory was a KeyError (or, well formed, another tokenisation without a word); rookworld's own tokenizer
    and TRL's agree on a real prompt."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(MODEL, model)
    (model / "tokenizer.json").write_text('{"broken": true}')
    prompt = "P: r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"
    ours = get_tokenizer(str(MODEL))
    assert load_tokenizer(model)(prompt)["input_ids"] == ours.encode(prompt)


def test_a_dataset_source_may_be_a_path_of_any_kind_and_anything_else_is_named():
    """chess_dataset(Path(...)) was "'PosixPath' object is not iterable", a bytes path an AttributeError."""
    import os
    from pathlib import Path

    held_out = REPO / "data" / "chess-cpu-held-out.jsonl"
    as_str = chess_dataset(str(held_out), count=8, seed=1)
    for source in (held_out, os.fsencode(str(held_out))):
        assert chess_dataset(source, count=8, seed=1)["prompt"] == as_str["prompt"]
    for bad, name in ((3, "int"), ([1, 2], "list"), ({"fen": "x"}, "dict")):
        with pytest.raises(TypeError, match=f"a sequence of Records or None, not {name}"):
            chess_dataset(bad)
    assert isinstance(Path(held_out), os.PathLike)
