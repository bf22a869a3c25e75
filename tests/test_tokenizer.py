"""GPT-2 tokenizer: known ids, exact round trips of real RookWorld samples, left-padded batches."""

from __future__ import annotations

import pytest
import tiktoken
import tiktoken.load
import torch

from rookworld.net import tokenizer as tok_module
from rookworld.net.tokenizer import (
    ENV_VAR,
    EOS_ID,
    Tokenizer,
    TokenizerUnavailableError,
    get_tokenizer,
    load_encoding,
    pad_left,
)

# Real samples from docs/ROOKWORLD.md, spaces kept.
P_SAMPLE = (
    "P: 2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34                                    "
    "M: a4a3 c8f5 h7f6 h7g5 h7f8      E: -3.06 -2.82 -3.21 -3.16 -2.3            B: h7f6"
)
P_PROMPT = "P: 2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34"
P_COMPLETION = "M: d7d6 d7d5 e7e5 g7g6 e7e6      E: -0.62 -0.45 -0.62 -0.7 -0.73            B: e7e6"
A_PROMPT = (
    "A: 8/2k2b2/R1p4r/3p1p2/P7/2P2B1P/5PPK/4R3 w - - 1 31+a6a5+f7e7 h5f3 e6f7 b1b6 h8h6 a1e1 e7d8 b6a6 d8c7 a6a5+"
)
A_TARGET = "8/2k2b2/2p4r/R2p1p2/P7/2P2B1P/5PPK/4R3 b - - 2 31+0.001+0+0"
A_FIRST = "A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return get_tokenizer()


def test_known_ids(tok):
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode(" the") == [262]
    assert tok.vocab_size == 50257
    assert tok.eos_id == tok.pad_id == EOS_ID == 50256
    assert tok.decode([EOS_ID]) == "<|endoftext|>"
    # Prompts are ordinary text: the special token's spelling is not turned into 50256.
    assert EOS_ID not in tok.encode("<|endoftext|>")


@pytest.mark.parametrize("text", [P_SAMPLE, P_PROMPT, P_PROMPT + " ", P_COMPLETION, A_PROMPT, A_TARGET, A_FIRST])
def test_real_samples_round_trip(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode(tok.encode(text, bos=True)) == "<|endoftext|>" + text


def test_prompt_lengths_match_the_documented_ranges(tok):
    assert 42 <= len(tok.encode(P_PROMPT)) <= 50
    assert len(tok.encode(A_PROMPT)) == 91


def test_left_padded_batch(tok):
    texts = [P_PROMPT, "Hello world", A_PROMPT]
    ids, mask = tok.encode_batch(texts)
    lengths = [len(tok.encode(t)) for t in texts]
    assert ids.shape == mask.shape == (3, max(lengths))
    assert ids.dtype == torch.long and mask.dtype == torch.bool
    for row, (text, n) in enumerate(zip(texts, lengths)):
        assert mask[row].sum().item() == n
        assert not mask[row, : ids.shape[1] - n].any() and mask[row, ids.shape[1] - n :].all()  # padding on the left
        assert (ids[row, : ids.shape[1] - n] == EOS_ID).all()
        assert ids[row, mask[row]].tolist() == tok.encode(text)

    ids, mask = tok.encode_batch(["Hello world"], bos=True, length=5)
    assert ids.tolist() == [[EOS_ID, EOS_ID, EOS_ID, 15496, 995]]
    assert mask.tolist() == [[False, False, True, True, True]]
    with pytest.raises(ValueError, match="shorter"):
        tok.encode_batch(["Hello world"], length=1)
    with pytest.raises(ValueError, match="empty"):
        pad_left([])


def test_decode_completion_stops_at_eos(tok):
    ids = tok.encode(P_COMPLETION) + [EOS_ID] + tok.encode("garbage")
    assert tok.decode_completion(ids) == P_COMPLETION
    assert tok.decode_completion(torch.tensor(ids)) == P_COMPLETION
    tokens = torch.tensor([ids, tok.encode("Hello world") + [EOS_ID] * (len(ids) - 2)])
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[1, 2:] = False
    assert tok.decode_batch(tokens, mask) == [P_COMPLETION, "Hello world"]


def test_file_encoding_matches_tiktoken_gpt2_behaviour(tok):
    enc = tok.encoding
    assert enc.n_vocab == 50257 and enc.eot_token == EOS_ID
    assert enc.encode("<|endoftext|>", allowed_special="all") == [EOS_ID]
    # GPT-2's split pattern: contractions and digit runs split as in the original encoder.
    assert [enc.decode([t]) for t in enc.encode_ordinary("don't 1234")] == ["don", "'t", " 12", "34"]


def test_missing_file_named_by_env_var_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nope.tiktoken"))
    with pytest.raises(TokenizerUnavailableError, match=ENV_VAR):
        load_encoding()


def test_without_env_var_the_shipped_copy_is_used_and_no_download_is_tried(monkeypatch, tok):
    monkeypatch.delenv(ENV_VAR, raising=False)

    def offline(*args, **kwargs):
        raise AssertionError("tiktoken asked to download or read its cache")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    monkeypatch.setattr(tiktoken.load, "read_file_cached", offline)
    encoding = load_encoding()
    assert encoding.encode("Hello world") == [15496, 995] and encoding.encode(" the") == [262]
    # The same vocabulary, rank for rank, as the one the rest of the suite uses.
    assert encoding._mergeable_ranks == tok.encoding._mergeable_ranks


def test_the_shipped_copy_is_installed_with_the_package_and_checked():
    import hashlib
    import importlib.resources

    shipped = importlib.resources.files("rookworld.net") / "gpt2.tiktoken"
    assert shipped.is_file(), "gpt2.tiktoken is missing from the installed package"
    assert hashlib.sha256(shipped.read_bytes()).hexdigest() == tok_module.SHIPPED_SHA256
    assert (importlib.resources.files("rookworld.net") / "gpt2.tiktoken.LICENSE").is_file()


def test_a_damaged_shipped_copy_is_a_clear_error(monkeypatch, tmp_path):
    damaged = tmp_path / "gpt2.tiktoken"
    damaged.write_bytes(tok_module.SHIPPED_VOCABULARY.read_bytes()[:-100])
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(tok_module, "SHIPPED_VOCABULARY", damaged)
    with pytest.raises(TokenizerUnavailableError, match="damaged"):
        load_encoding()
    monkeypatch.setattr(tok_module, "SHIPPED_VOCABULARY", tmp_path / "gone.tiktoken")
    with pytest.raises(TokenizerUnavailableError, match="missing"):
        load_encoding()


def test_a_file_that_is_not_gpt2_is_rejected(monkeypatch, tmp_path):
    small = tmp_path / "small.tiktoken"
    small.write_text("IQ== 0\nIg== 1\n")
    monkeypatch.setenv(ENV_VAR, str(small))
    with pytest.raises(TokenizerUnavailableError, match="ranks"):
        tok_module.load_encoding()
    small.write_text("IQ== 0\nnot base64! 1\n")
    with pytest.raises(TokenizerUnavailableError, match="cannot be read"):
        tok_module.load_encoding()


# -- the chess vocabulary ------------------------------------------------------------------------------------


def chess_texts(n: int, seed: int) -> list[str]:
    """P: lines of `n` generated positions in RookWorld's padded layout and unpadded (candidates among the legal
    moves, evaluations as Python prints floats), and their A: prompts with targets from the Rust core."""
    import random

    from rookworld.chess.rules import env_targets, generate_positions, legal_moves_batch

    positions = generate_positions(n, seed)
    fens = [p.fen for p in positions]
    prompts = [p.env_prompt for p in positions]
    rng, texts = random.Random(seed), []
    for fen, legal, prompt, target in zip(fens, legal_moves_batch(fens), prompts, env_targets(prompts)):
        moves = rng.sample(legal, min(5, len(legal)))
        evals = " ".join(str(round(rng.uniform(-15, 15), rng.choice((0, 1, 2)))) for _ in moves)
        texts.append("P: " + fen.ljust(90) + "M: " + " ".join(moves).ljust(30) + "E: " + evals.ljust(40) + "B: "
                     + moves[0])
        texts.append(f"P: {fen} M: {' '.join(moves)} E: {evals} B: {moves[0]}\n")
        texts.append(prompt + target)
    return texts


@pytest.mark.slow
def test_the_chess_vocabulary_splits_p_and_a_text_into_gpt2_s_tokens():
    """120,000 texts of both layouts and both tasks, and the real samples: the same token strings as GPT-2's."""
    import numpy as np

    from rookworld.net.tokenizer import CHESS_ALPHABET, chess_tokenizer

    gpt2, chess = get_tokenizer(), chess_tokenizer()
    assert chess.vocab_size == 4364 and chess.eos_id == chess.pad_id == 4363 and chess.alphabet == CHESS_ALPHABET
    # Each chess id's GPT-2 id: the same bytes, ranked in the same order.
    to_gpt2 = np.array([gpt2.encoding.encode_single_token(chess.encoding.decode_single_token_bytes(i))
                        for i in range(chess.eos_id)])
    assert (np.diff(to_gpt2) > 0).all()
    texts = chess_texts(40_000, seed=11) + [P_SAMPLE, P_PROMPT, P_PROMPT + " ", P_COMPLETION, A_PROMPT, A_TARGET,
                                            A_FIRST]
    want, got = gpt2.encoding.encode_ordinary_batch(texts), chess.encoding.encode_ordinary_batch(texts)
    assert [len(w) for w in want] == [len(g) for g in got]
    assert np.array_equal(np.concatenate(want), to_gpt2[np.concatenate(got)])
    assert chess.decode(chess.encode(texts[0], bos=True)) == "<|endoftext|>" + texts[0]
    assert len({t for w in want for t in w}) > 200  # the texts used much of what P: and A: text can use


def test_the_chess_vocabulary_round_trips_through_its_files_and_transformers(tmp_path):
    from transformers import GPT2TokenizerFast

    from rookworld.net.tokenizer import chess_tokenizer

    chess = chess_tokenizer()
    chess.save_pretrained(tmp_path)
    again = get_tokenizer(tmp_path)
    assert again.vocab_size == 4364 and again.eos_id == 4363 and again.alphabet == chess.alphabet
    hf = GPT2TokenizerFast.from_pretrained(tmp_path)  # a model's directory: AutoTokenizer (test_sft.py)
    assert len(hf) == 4364 and hf.convert_tokens_to_ids("<|endoftext|>") == 4363
    for text in chess_texts(200, seed=3):
        ids = chess.encode(text)
        assert again.encode(text) == ids and hf(text)["input_ids"] == ids and hf.decode(ids) == text


def test_text_outside_the_chess_vocabulary_is_a_clear_error(tok):
    from rookworld.net.tokenizer import OutsideVocabularyError, chess_tokenizer

    chess = chess_tokenizer()
    with pytest.raises(OutsideVocabularyError, match=r"'x' \(column 6 of 'P: 8/x"):
        chess.encode("P: 8/x")
    with pytest.raises(OutsideVocabularyError, match="spells only P: and A: text"):
        chess.encode_batch([P_PROMPT, "P: Hello world"])
    assert tok.alphabet is None and tok.encode("P: Hello world")  # GPT-2's vocabulary spells any text
