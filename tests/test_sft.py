"""`rookworld sft`: RookWorld text samples, documents and rows, the loss against a direct computation, and the
command end to end (resume, DDP, a model rookworld train and transformers load), plus `rookworld plot`."""

from __future__ import annotations

import copy
import json
import math
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from rookworld.chess.data import DataError
from rookworld.chess.fields import field_starts, policy_fields
from rookworld.net.tokenizer import EOS_ID, get_tokenizer
from rookworld.sft.samples import Rows, eval_rows, positions, read_samples, relayout, tokenize

from conftest import cli, torchrun
from test_trainer import metrics, run_cli

HERE = Path(__file__).resolve().parent

# Real samples (ROOKWORLD.md): a P: line with its padding, an A: line, a game's first move.
P_LINE = ("P: 2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34                                    "
          "M: a4a3 c8f5 h7f6 h7g5 h7f8      E: -3.06 -2.82 -3.21 -3.16 -2.3            B: h7f6")
A_LINE = ("A: 8/2k2b2/R1p4r/3p1p2/P7/2P2B1P/5PPK/4R3 w - - 1 31+a6a5+f7e7 h5f3 e6f7 b1b6 h8h6 a1e1 e7d8 b6a6 d8c7 "
          "a6a5+8/2k2b2/2p4r/R2p1p2/P7/2P2B1P/5PPK/4R3 b - - 2 31+0.001+0+0")
FIRST = ("A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+"
         "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0")


def text_file(tmp_path, name, *lines) -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return path


# -- samples ----------------------------------------------------------------------------------------------------

def test_rookworld_text_lines_split_into_prompt_and_target(tmp_path):
    path = text_file(tmp_path, "rw.txt", P_LINE, "", "# a comment", A_LINE, FIRST)
    got = read_samples([str(path)])
    p, a, first = got.samples
    assert (p.task, p.prompt) == ("P", "P: 2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34")
    assert p.prompt + p.target == P_LINE and p.target.startswith(" " * 36 + "M: a4a3")
    assert a.prompt == A_LINE[: A_LINE.index("+8/2k2b2/2p4r") + 1] and a.prompt + a.target == A_LINE
    assert first.target == "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"
    assert (p.source, a.source) == (f"{path}:1", f"{path}:4")
    assert got.skipped == 0 and got.disagree == [] and got.report() == []


def test_an_a_target_that_disagrees_with_the_rules_is_left_out_and_reported(tmp_path):
    wrong_reward = FIRST.replace("+0.001+0+0", "+1.0+1+0")
    wrong_fen = FIRST.replace("4P3/8/PPPP1PPP", "8/4P3/PPPP1PPP")
    path = text_file(tmp_path, "rw.txt", FIRST, wrong_reward, P_LINE, wrong_fen)
    got = read_samples([str(path)])
    assert [s.source for s in got.samples] == [f"{path}:1", f"{path}:3"]
    assert [s.source for s in got.disagree] == [f"{path}:2", f"{path}:4"]
    assert got.report() == [f"left out 2 A: sample(s) whose target disagrees with the rules: {path}:2, {path}:4"]


def test_an_a_sample_whose_history_cannot_lead_to_its_position_is_left_out_and_reported(tmp_path):
    """RookWorld's history field is the recent moves ending with the move played: before it, the last move must be
    the other side's, onto a square it holds (issue 35: histories were never checked)."""
    wrong_side = A_LINE.replace("d8c7 a6a5+", "d8c7 a1a5 a6a5+")  # White moved last, yet White is to move
    not_its_move = A_LINE.replace("d8c7 a6a5+", "d8c7 a6a4+")
    path = text_file(tmp_path, "rw.txt", A_LINE, wrong_side, FIRST, not_its_move)
    got = read_samples([str(path)])
    assert [s.source for s in got.samples] == [f"{path}:1", f"{path}:3"] and got.disagree == []
    assert [(s.source, "a1a5" in why or "does not end with its move a6a5" in why) for s, why in got.bad_history] \
        == [(f"{path}:2", True), (f"{path}:4", True)]
    (line,) = got.report()
    assert line.startswith("left out 2 A: sample(s) whose history cannot lead to the position:")


@pytest.mark.parametrize("line, reason", [
    ("P: not a fen at all", "a P: sample is"),
    ("P: 8/8/8/8/8/8/8/K6k w - - 0 1  M: a1a2  E: 0.1 0.2  B: a1a2", "1 moves but 2 evals"),
    ("P: 8/8/8/8/8/8/8/K7 w - - 0 1  M: a1a2  E: 0.1  B: a1a2", "missing king"),
    ("P: 8/8/8/8/8/8/8/K6k w - - 0 1  E: 0.1  M: a1a2  B: a1a2", "'M:', 'E:' and 'B:'"),
    ("A: 8/8/8/8/8/8/8/K6k w - - 0 1+a1a2+a1a2", "an A: sample is"),
    ('{"fen": "8/8/8/8/8/8/8/K6k w - - 0 1"}', "rookworld positions --annotate"),
    ("Q: what", "expected a P: or A: sample"),
])
def test_a_malformed_line_names_file_and_line_or_is_skipped_and_counted(tmp_path, line, reason):
    path = text_file(tmp_path, "rw.txt", FIRST, line, P_LINE)
    with pytest.raises(DataError) as e:
        read_samples([str(path)])
    assert str(e.value).startswith(f"{path}:2: ") and reason in str(e.value) and str(e.value).endswith(line[:80])
    got = read_samples([str(path)], skip_bad=True)
    assert len(got.samples) == 2 and got.skipped == 1 and got.report() == ["skipped 1 malformed line(s)"]


@pytest.mark.parametrize("blanks", [150, 200_000])
def test_a_padded_p_line_without_a_best_move_is_refused_at_once_in_either_form(tmp_path, blanks):
    """Issue 71: the P: target's regex (lazy groups between runs of blanks) took 0.5 s a line at 40 blanks and never
    ended at 150, as text, as JSONL and with --skip-bad. Its fields are found in linear time now: refused at once,
    naming file and line, or skipped and counted."""
    pad = " " * blanks
    prompt, target = "P: 8/8/8/8/8/8/8/K6k w - - 0 1", f" M:{pad}a1a2{pad}E:{pad}0.1{pad}B:{pad}"
    text = text_file(tmp_path, "rw.txt", FIRST, prompt + target, P_LINE)
    jsonl = text_file(tmp_path, "rw.jsonl", json.dumps({"p_prompt": prompt, "p_target": target}),
                      json.dumps({"p_prompt": prompt, "p_target": " M: a1a2 E: 0.1 B: a1a2"}))
    started = time.monotonic()
    for path, line in ((text, 2), (jsonl, 1)):
        with pytest.raises(DataError, match="the P: target needs 'M:', 'E:' and 'B:'") as e:
            read_samples([str(path)])
        assert str(e.value).startswith(f"{path}:{line}: ")
        assert read_samples([str(path)], skip_bad=True).skipped == 1
    assert time.monotonic() - started < 10  # a bound on a hang, not a speed figure: 0.1 s here at 200,000 blanks


def test_a_p_target_s_fields_as_the_regex_read_them_on_short_texts():
    """`policy_fields` and `field_starts` against the regexes they replaced, which is exact on short texts (its time grows with the blank
    runs' lengths, not its answers): every text of labels, moves, evals and blanks drawn below reads the same."""
    old = re.compile(r"\s*M:\s*(.*?)\s*E:\s*(.*?)\s*B:\s*(\S+)\s*$", re.S)
    labels = re.compile(r"\s*\b([MEB]):")
    rng = random.Random(71)
    parts = ["M:", "E:", "B:", " ", "  ", "\t", "\n", "e2e4", "0.1", "-3", "B:x", "xE:", "h7h8q"]
    for _ in range(20_000):
        target = "".join(rng.choice(parts) for _ in range(rng.randint(0, 9)))
        m = old.match(target)
        assert policy_fields(target) == (None if m is None else (m.group(1).strip(), m.group(2).strip(), m.group(3))), \
            target
        # and where each field begins (`field_starts`), as the labels' regex with its leading blanks found them
        starts = [(x.start(), "MEB".index(x.group(1)) + 1) for x in labels.finditer(target)]
        assert field_starts("P", target) == (starts if starts and starts[0][0] == 0 else [(0, 1)] + starts), target


def test_the_jsonl_of_positions_annotate_gives_p_and_a_samples(tmp_path):
    out = tmp_path / "annotated.jsonl"
    proc = run_cli(["positions", "--count", "5", "--seed", "4", "--annotate", "--stockfish-depth", "4", "--out",
                    str(out), "--quiet"])
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    got = read_samples([str(out)])
    assert len(got.samples) == 10 and got.disagree == []
    for line, (p, a) in zip(lines, zip(got.samples[::2], got.samples[1::2])):
        assert p.prompt + p.target == line["p_prompt"] + line["p_target"] and p.prompt == line["p_prompt"]
        assert (a.prompt, a.target) == (line["a_prompt"], line["a_target"])
    # Their positions, for greedy evaluation: the analysis ranked by eval, the move and the history before it.
    records = positions(got.samples)
    assert [r.fen for r in records] == [line["fen"] for line in lines]
    for r, line in zip(records, lines):
        assert r.analysis["moves"][0] == line["analysis"]["moves"][0]
        assert r.move == line["move"] and list(r.history) == line["history"][-9:]


def test_p_text_in_the_compact_layout_when_written_or_read(tmp_path):
    """positions --layout compact writes a space between fields; sft's relayout rewrites a file's P: targets in
    either layout with the same moves, evals and best move, and leaves A: samples alone."""
    out = tmp_path / "compact.jsonl"
    proc = run_cli(["positions", "--count", "4", "--seed", "4", "--annotate", "--stockfish-depth", "4", "--out",
                    str(out), "--quiet", "--layout", "compact"])
    assert proc.returncode == 0, proc.stderr
    for line in map(json.loads, out.read_text().splitlines()):
        a = line["analysis"]
        assert line["p_target"].startswith(" M: ") and "  " not in line["p_target"]
        assert sorted(line["p_target"].split(" E: ")[0][4:].split()) == sorted(a["moves"])
    samples = read_samples([str(text_file(tmp_path, "rw.txt", P_LINE, A_LINE))]).samples
    compact = relayout(samples, "compact")
    assert compact[0].prompt + compact[0].target == ("P: 2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34 M: a4a3 "
                                                     "c8f5 h7f6 h7g5 h7f8 E: -3.06 -2.82 -3.21 -3.16 -2.3 B: h7f6")
    assert compact[1] == samples[1]
    padded = relayout(compact, "rookworld")[0]
    assert (padded.prompt + padded.target).split() == P_LINE.split()
    assert (padded.prompt + padded.target).index("M:") == len("P: ") + 90  # the FEN padded to 90 columns
    tok = get_tokenizer()
    assert len(tok.encode(compact[0].target)) < len(tok.encode(samples[0].target)) - 25


def test_ranked_candidates_are_written_best_first_with_their_evals(tmp_path):
    """--candidate-order ranked: the M: moves sorted by their E: evals, best first, each eval beside its move, the
    B: move as the data gives it (this line's B: is RookWorld's known Black-to-move label), in either layout."""
    samples = read_samples([str(text_file(tmp_path, "rw.txt", P_LINE, A_LINE))]).samples
    ranked = relayout(samples, "compact", ranked=True)
    assert ranked[0].target == " M: h7f8 c8f5 a4a3 h7g5 h7f6 E: -2.3 -2.82 -3.06 -3.16 -3.21 B: h7f6"
    assert ranked[1] == samples[1]
    padded = relayout(samples, "rookworld", ranked=True)[0]
    assert padded.target.split() == ranked[0].target.split()
    assert relayout(samples, "compact")[0].target.split()[1:6] == ["a4a3", "c8f5", "h7f6", "h7g5", "h7f8"]


@pytest.mark.parametrize("vocabulary", ["gpt2", "chess"])
def test_each_target_token_weighs_its_fields_weight(tmp_path, vocabulary):
    """Each token of a target is in the field its first character is in: M: up to the whitespace before E:, E: up
    to the whitespace before B:, B: to the end; an A: target's state up to its first '+', then the reward and its
    flags. Cut by hand from the text here, and compared with the tokens of each weight."""
    from rookworld.net.tokenizer import vocabulary as load_vocabulary

    tok = load_vocabulary(vocabulary)
    samples = read_samples([str(text_file(tmp_path, "rw.txt", P_LINE, A_LINE))]).samples
    samples = samples + relayout(samples[:1], "compact")
    weights = {"M": 2.0, "E": 0.5, "B": 3.0, "state": 4.0, "reward": 5.0}
    docs = tokenize(samples, tok, "target", weights)
    for s, ids, w in zip(samples, docs.ids, docs.weights):
        if s.task == "P":
            e, b = s.target.index("E:"), s.target.index("B:")
            e, b = len(s.target[:e].rstrip()), len(s.target[:b].rstrip())
            parts = {"M": s.target[:e], "E": s.target[e:b], "B": s.target[b:]}
        else:
            plus = s.target.index("+")
            parts = {"state": s.target[:plus], "reward": s.target[plus:]}
        for name, text in parts.items():
            assert tok.encoding.decode(ids[w == weights[name]].tolist()) == text, (vocabulary, name)
        assert (w[: 1 + len(tok.encode(s.prompt))] == [1.0] + [0.0] * len(tok.encode(s.prompt))).all()


@pytest.mark.parametrize("text, problem", [("X=1", "not FIELD=WEIGHT"), ("B=-1", "0 or more"), ("E=nan", "0 or more"),
                                           ("B", "not FIELD=WEIGHT"), ("M=0,E=0,B=0,state=0,reward=0", "count nothing"),
                                           ("B=two", "must be a number")])
def test_bad_field_weights_are_refused_before_any_work(tmp_path, text, problem):
    from rookworld.settings.config import ConfigError, SFTConfig

    data = [str(text_file(tmp_path, "rw.txt", P_LINE))]
    with pytest.raises(ConfigError, match=problem):
        SFTConfig(init="tiny", data=data, field_weights=text).validate()
    with pytest.raises(ConfigError, match="--layout"):
        SFTConfig(init="tiny", data=data, candidate_order="ranked").validate()


# -- documents and rows -----------------------------------------------------------------------------------------

def test_documents_and_the_target_loss_mask(tmp_path):
    tok = get_tokenizer()
    path_samples = read_samples([str(text_file(tmp_path, "rw.txt", P_LINE, A_LINE))]).samples
    docs = tokenize(path_samples, tok, "target")
    for s, ids, weights in zip(path_samples, docs.ids, docs.weights):
        mask = weights > 0
        assert ids[0] == EOS_ID and tok.decode(ids[1:]) == s.prompt + s.target
        n_prompt = len(tok.encode(s.prompt))
        assert tok.decode(ids[1 : 1 + n_prompt]) == s.prompt  # tokenized apart, as the sampler sees the prompt
        assert mask[0] and not mask[1 : 1 + n_prompt].any() and mask[1 + n_prompt :].all()
        assert tok.decode(ids[mask][1:]) == s.target
        assert set(weights[mask].tolist()) == {1.0}, "no --field-weights: every counted token weighs 1"
    everything = tokenize(path_samples, tok, "all")
    assert all((w == 1).all() for w in everything.weights)


def test_a_document_longer_than_a_row_names_its_file_and_line(tmp_path):
    """One document a row: the longest sample that does not fit --seq-len is named by its file and line (a 1 MB A:
    move was said with neither, issue 71)."""
    path = text_file(tmp_path, "rw.txt", P_LINE, A_LINE)
    docs = tokenize(read_samples([str(path)]).samples, get_tokenizer(), "target")
    longest = max(range(2), key=lambda i: len(docs.ids[i]))
    with pytest.raises(DataError, match=rf"^{path}:{longest + 1}: a document of {len(docs.ids[longest]) + 1} tokens "
                                        r"does not fit --seq-len 40"):
        Rows(docs, 40, pack=False)


def test_rows_are_a_pure_function_of_seed_and_index_and_each_pass_covers_every_token():
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 40, 30)
    from rookworld.sft.samples import Documents

    docs = Documents([rng.integers(0, 50000, n) for n in lengths],
                     [(rng.random(n) < 0.7).astype(np.float32) for n in lengths], EOS_ID)
    rows = Rows(docs, seq_len=16, pack=True, seed=3)
    assert rows.per_pass == int(lengths.sum()) // 16
    everything = np.sort(np.concatenate(docs.ids))
    passed = np.sort(np.concatenate([rows.row(i)[0] for i in range(rows.per_pass)]))
    assert len(everything) - len(passed) < 16 and np.isin(passed, everything).all()
    fresh = Rows(docs, seq_len=16, pack=True, seed=3)
    for i in (0, 5, rows.per_pass + 2, 3 * rows.per_pass + 1, 4):  # any order, across passes
        assert np.array_equal(fresh.row(i)[0], rows.row(i)[0]) and np.array_equal(fresh.row(i)[1], rows.row(i)[1])
    assert not np.array_equal(rows.row(0)[0], rows.row(rows.per_pass)[0]), "each pass its own order"
    assert not np.array_equal(Rows(docs, 16, True, seed=4).row(0)[0], rows.row(0)[0])
    one = Rows(docs, seq_len=64, pack=False, seed=3)
    ids, mask = one.row(2)
    assert ids[-1] == EOS_ID and mask[-1] and one.per_pass == 30
    assert sorted(len(one.row(i)[0]) for i in range(30)) == sorted((lengths + 1).tolist())
    evaluated = eval_rows(docs, 16, pack=True)
    predicted = np.concatenate([evaluated[0][0]] + [i[1:] for i, _ in evaluated[1:]])
    assert np.array_equal(predicted, np.concatenate(docs.ids)), "every token but the first is predicted once"


# -- the loss of a step against a direct computation ----------------------------------------------------------------

@pytest.mark.parametrize("pack, seq_len, field_weights", [(True, 48, ""), (False, 256, ""),
                                                          (False, 256, "M=0.5,E=0,B=3,state=2,reward=0.25")])
def test_an_sft_step_gives_the_token_mean_nll_and_its_gradient(tmp_path, pack, seq_len, field_weights):
    """Micro-batches, packing or right-padded rows of a document each, and the loss weights together: the step's
    loss and gradient equal the weighted mean NLL of the counted tokens of its rows (each token's weight its
    field's, `test_each_target_token_weighs_its_fields_weight`), computed from the full logits in float64 with the
    pads masked out."""
    from rookworld.settings.config import SFTConfig
    from rookworld.sft.samples import collate
    from rookworld.sft.trainer import SFTTrainer

    data = text_file(tmp_path, "rw.txt", P_LINE, A_LINE, FIRST, P_LINE.replace("h7f6", "h7g5"))
    cfg = SFTConfig(init="tiny", n_embd=32, n_head=2, data=[str(data)], output_dir=str(tmp_path / "out"), steps=1,
                    seq_len=seq_len, pack=pack, rows_per_step=5, micro_batch_size=2, loss_on="target",
                    max_grad_norm=0.0, eval_every=0, warmup_steps=0, compile=False, device="cpu",
                    dtype="fp32", field_weights=field_weights).validate()  # float32's numerics against float64
    t = SFTTrainer(cfg, stream=open(os.devnull, "w"))
    import copy

    model = copy.deepcopy(t.run.policy).double()
    rows = [t.rows.row(i) for i in range(5)]
    m = t.train_step()
    ids, loss = (torch.from_numpy(a) for a in collate(rows, EOS_ID))
    attn = torch.arange(ids.shape[1]) < torch.tensor([len(i) for i, _ in rows])[:, None]  # the pads masked out
    logp = model(ids, attn).log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    counted = loss[:, 1:].double()
    assert set(counted.unique().tolist()) == ({0.0, 1.0} if not field_weights else {0.0, 0.25, 0.5, 1.0, 2.0, 3.0})
    want = -(logp * counted).sum() / counted.sum()
    assert m["loss"] == pytest.approx(float(want.detach()), rel=1e-5)
    want.backward()
    for (name, p), (_, q) in zip(t.run.policy.named_parameters(), model.named_parameters()):
        torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-4, atol=1e-7, msg=name)
    t.close()


def test_the_held_out_loss_of_each_field_against_a_direct_computation(tmp_path):
    """eval/field_loss/F is the mean NLL of field F's tokens of the held-out targets, and eval/loss the mean over
    every counted token, each token at weight 1 whatever --field-weights trains with: from the full logits in
    float64, the fields cut from the text by hand (`test_each_target_token_weighs_its_fields_weight`)."""
    from rookworld.settings.config import SFTConfig
    from rookworld.sft.trainer import SFTTrainer

    data = text_file(tmp_path, "rw.txt", P_LINE, A_LINE)
    held_out = text_file(tmp_path, "held.txt", P_LINE.replace("h7f6", "h7g5"), FIRST, A_LINE)
    cfg = SFTConfig(init="tiny", n_embd=32, n_head=2, data=[str(data)], eval_data=str(held_out),
                    output_dir=str(tmp_path / "out"), steps=1, seq_len=256, micro_batch_size=2, loss_on="target",
                    compile=False, device="cpu", dtype="fp32", field_weights="E=0,B=9").validate()
    t = SFTTrainer(cfg, stream=open(os.devnull, "w"))
    with torch.no_grad():
        got = t._heldout_loss()
    model, tok = copy.deepcopy(t.run.policy).double(), t.run.tokenizer
    sums: dict[str, list[float]] = {}
    for s in read_samples([str(held_out)]).samples:
        if s.task == "P":  # where each field begins: at the whitespace before its label
            e, b = (len(s.target[: s.target.index(label)].rstrip()) for label in ("E:", "B:"))
            starts = [(0, "M"), (e, "E"), (b, "B")]
        else:
            starts = [(0, "state"), (s.target.index("+"), "reward")]
        prompt, target = tok.encode(s.prompt), tok.encoding.encode_ordinary(s.target)
        row = torch.tensor([[EOS_ID, *prompt, *target, EOS_ID]])
        logp = model(row).log_softmax(-1)[0, :-1].gather(-1, row[0, 1:, None]).squeeze(-1).tolist()
        at = 0
        for k, token in enumerate(target):  # logp[j - 1] is token j's; the target's k-th is token 1 + |prompt| + k
            name = [n for begin, n in starts if begin <= at][-1]
            sums.setdefault(name, []).append(-logp[len(prompt) + k])
            at += len(tok.encoding.decode([token]))
        sums.setdefault("all", []).extend(-x for x in logp[len(prompt):])  # the target and its closing EOS
    for name in ("M", "E", "B", "state", "reward"):
        assert got[f"eval/field_loss/{name}"] == pytest.approx(np.mean(sums[name]), rel=1e-5), name
    assert got["eval/loss"] == pytest.approx(np.mean(sums["all"]), rel=1e-5)
    t.close()


def test_step_flops_counts_the_lm_head_only_on_the_scored_tokens():
    """nanoGPT's 6N + 12·L·d·T per token, with the GPT-2 parameter count worked out from the config by hand, and
    the tied lm_head (V·d) charged only for the tokens that go through it."""
    from rookworld.net.model import GPT, GPTConfig
    from rookworld.sft.trainer import step_flops

    L, d, V, ctx = 3, 16, 50257, 40
    model = GPT(GPTConfig(n_layer=L, n_head=2, n_embd=d, block_size=64))
    per_layer = 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * 4 * d + 4 * d) + (4 * d * d + d)
    trunk = L * per_layer + 2 * d  # blocks and the final layer norm; wte is the lm_head, wpe is a lookup
    tokens, counted = 1000.0, 300.0
    want = tokens * (6 * trunk + 12 * L * d * ctx) + counted * 6 * V * d
    assert step_flops(model, tokens, counted, ctx) == pytest.approx(want, rel=1e-12)


@pytest.mark.slow
def test_a_tiny_model_learns_its_samples(tmp_path):
    data = text_file(tmp_path, "rw.txt", P_LINE, A_LINE, FIRST)
    out = tmp_path / "out"
    proc = run_cli(["sft", "--init", "tiny", "--n-embd", "64", "--data", str(data), "--output-dir", str(out),
                    "--steps", "40", "--lr", "3e-3", "--warmup-steps", "5", "--pack", "--seq-len", "64",
                    "--rows-per-step", "4", "--eval-every", "0", "--log-every", "20", "--device", "cpu"])
    assert proc.returncode == 0, proc.stderr
    losses = [r["loss"] for r in metrics(out)]
    assert losses[-1] < 0.5 * losses[0], losses


# -- the command end to end -------------------------------------------------------------------------------------------

def sft_args(data, held_out, out, *extra):
    return ["sft", "--init", "tiny", "--n-embd", "32", "--data", str(data), "--eval-data", str(held_out),
            "--output-dir", str(out), "--seq-len", "256", "--rows-per-step", "4", "--micro-batch-size", "2",
            "--eval-size", "3", "--max-new-tokens", "12", "--device", "cpu", "--stockfish-depth", "4", *extra]


def test_sft_in_bf16_on_the_cpu_trains_evaluates_and_saves(tmp_path):
    """`--dtype bf16` on the CPU: the loss's pass under autocast (the fused head in bf16), the held-out evaluation
    and the save, with finite figures that fall as float32's do."""
    data = text_file(tmp_path, "train.txt", P_LINE, A_LINE, FIRST, P_LINE)
    held_out = text_file(tmp_path, "held_out.txt", A_LINE, P_LINE)
    losses = {}
    for dtype in ("bf16", "fp32"):
        out = tmp_path / dtype
        proc = run_cli(sft_args(data, held_out, out, "--steps", "6", "--eval-every", "6", "--lr", "3e-3",
                                "--dtype", dtype))
        assert proc.returncode == 0, proc.stderr
        rows = metrics(out)[1:]  # after the evaluation at step 0
        assert all(math.isfinite(r["loss"]) for r in rows) and rows[-1]["eval/loss"] > 0
        losses[dtype] = [r["loss"] for r in rows]
    assert losses["bf16"][-1] < losses["bf16"][0]
    assert max(abs(a - b) for a, b in zip(losses["bf16"], losses["fp32"])) < 0.05 * losses["fp32"][0]


def test_sft_end_to_end_gives_a_model_that_train_and_transformers_load(tmp_path):
    data = text_file(tmp_path, "train.txt", P_LINE, A_LINE, FIRST, P_LINE)
    held_out = text_file(tmp_path, "held_out.txt", A_LINE, P_LINE)
    out = tmp_path / "sft"
    proc = run_cli(sft_args(data, held_out, out, "--steps", "3", "--eval-every", "3"))
    assert proc.returncode == 0, proc.stderr
    assert "model: a fresh GPT-2 tiny: 2 layers, 2 heads, 32 wide (" in proc.stderr
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and rows[0]["eval/loss"] > 0  # the fresh model's evaluation
    rows = rows[1:]
    assert all(r["loss"] > 0 and r["tokens_per_s"] > 0 for r in rows)
    assert rows[-1]["eval/loss"] > 0 and "eval/P/format_valid" in rows[-1] and "eval/A/next_state_exact" in rows[-1]
    transformers = pytest.importorskip("transformers")
    from rookworld.net.pretrained import from_pretrained

    hf = transformers.GPT2LMHeadModel.from_pretrained(out)
    ours = from_pretrained(out)
    ids = torch.tensor([get_tokenizer().encode(FIRST, bos=True)])
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, ours(ids), atol=1e-4)
    grpo = run_cli(["train", "--model", str(out), "--output-dir", str(tmp_path / "grpo"), "--steps", "1",
                    "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "8", "--stockfish-depth", "4",
                    "--stockfish-workers", "1", "--eval-every", "0", "--device", "cpu"])
    assert grpo.returncode == 0, grpo.stderr
    more = run_cli(["sft", "--model", str(out), "--data", str(data), "--output-dir", str(tmp_path / "more"), "--steps",
                    "1", "--seq-len", "256", "--rows-per-step", "2", "--eval-every", "0", "--device", "cpu"])
    assert more.returncode == 0, more.stderr
    assert f"model: {out} (" in more.stderr  # continues the checkpoint, not a fresh model
    assert metrics(tmp_path / "more")[0]["loss"] < rows[0]["loss"]
    bad = run_cli(sft_args(tmp_path / "nope.txt", held_out, tmp_path / "x", "--steps", "1"))
    assert bad.returncode == 2 and "--data: no such file" in bad.stderr
    both = run_cli(sft_args(data, held_out, tmp_path / "y", "--steps", "1", "--model", str(out)))
    assert both.returncode == 2 and "give one" in both.stderr


def test_a_fresh_model_with_the_chess_vocabulary_trains_evaluates_and_loads_in_transformers(tmp_path):
    """sft --vocabulary chess: a 4,364-row head; train, eval and ask read the model's own vocabulary from its
    directory, and transformers' Auto classes load model and tokenizer as they are."""
    data = text_file(tmp_path, "train.txt", P_LINE, A_LINE, FIRST, P_LINE)
    held_out = text_file(tmp_path, "held_out.txt", A_LINE, P_LINE)
    out = tmp_path / "sft"
    proc = run_cli(sft_args(data, held_out, out, "--steps", "2", "--eval-every", "2", "--vocabulary", "chess"))
    assert proc.returncode == 0, proc.stderr
    assert "model: a fresh GPT-2 tiny: 2 layers, 2 heads, 32 wide, the chess vocabulary (" in proc.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == 4364 and config["eos_token_id"] == config["bos_token_id"] == 4363
    assert "eval/P/format_valid" in metrics(out)[-1]
    chess = get_tokenizer(out)
    assert chess.vocab_size == 4364 and chess.eos_id == 4363
    transformers = pytest.importorskip("transformers")
    from rookworld.net.pretrained import from_pretrained

    hf = transformers.AutoModelForCausalLM.from_pretrained(out)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = chess.encode(FIRST, bos=True)
    assert hf_tok("<|endoftext|>" + FIRST)["input_ids"] == ids and hf_tok.eos_token_id == 4363
    with torch.no_grad():
        assert torch.allclose(hf(torch.tensor([ids])).logits, from_pretrained(out)(torch.tensor([ids])), atol=1e-4)
    grpo = run_cli(["train", "--model", str(out), "--output-dir", str(tmp_path / "grpo"), "--steps", "1",
                    "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "8", "--stockfish-depth", "4",
                    "--stockfish-workers", "1", "--eval-every", "0", "--device", "cpu"])
    assert grpo.returncode == 0, grpo.stderr
    assert get_tokenizer(tmp_path / "grpo").vocab_size == 4364
    ask = run_cli(["ask", "--model", str(tmp_path / "grpo"), "--device", "cpu", "--stockfish-depth", "4",
                   "8/8/8/8/8/8/8/K6k w - - 0 1"])
    assert ask.returncode == 0 and "completion" in ask.stdout, ask.stderr
    again = run_cli(["sft", "--model", str(out), "--data", str(data), "--vocabulary", "chess", "--output-dir",
                     str(tmp_path / "x")])
    assert again.returncode == 2 and "--vocabulary is a fresh model's" in again.stderr
    typo = text_file(tmp_path, "typo.txt", P_LINE, P_LINE.replace("M: ", "M: x", 1))
    bad = run_cli(sft_args(typo, held_out, tmp_path / "y", "--steps", "1", "--vocabulary", "chess"))
    assert bad.returncode != 0 and "typo.txt:2: 'x'" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_an_sft_run_of_a_preset_points_on_to_the_preset_s_grpo(tmp_path, monkeypatch):
    """Its closing hint is the preset's [train] (its learning rate and steps), not a bare --model run at the
    defaults (3e-6, 500 steps: nothing moves in a day), from this run's model where the preset's GRPO starts from
    another (chess-cpu's starts from the shipped one); any other run gets the --model form."""
    monkeypatch.chdir(tmp_path)
    data = text_file(tmp_path, "train.txt", P_LINE, A_LINE, FIRST)
    held_out = text_file(tmp_path, "held_out.txt", FIRST)
    for out, hint in (("runs/cpu-demo-sft", "rookworld train --config cpu-demo"),
                      ("runs/chess-cpu-sft", "rookworld train --config chess-cpu --model runs/chess-cpu-sft"),
                      ("mine", "rookworld train --model mine --output-dir mine-grpo")):
        proc = run_cli(sft_args(data, held_out, out, "--steps", "1", "--eval-every", "0"))
        assert proc.returncode == 0, proc.stderr
        assert f"train it with GRPO: {hint}\n" in proc.stderr


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_sft_resume_gives_the_same_weights_as_an_unbroken_run(tmp_path, optimizer):
    data = text_file(tmp_path, "train.txt", P_LINE, A_LINE, FIRST, P_LINE, A_LINE)
    held_out = text_file(tmp_path, "held_out.txt", FIRST)
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    common = ["--eval-every", "0", "--save-every", "2", "--lr", "1e-3", "--optimizer", optimizer]
    assert run_cli(sft_args(data, held_out, straight, "--steps", "4", *common)).returncode == 0
    assert run_cli(sft_args(data, held_out, broken, "--steps", "2", *common)).returncode == 0
    second = run_cli(["sft", "--resume", str(broken), "--steps", "4"])
    assert second.returncode == 0, second.stderr
    from safetensors.torch import load_file

    a, b = load_file(str(straight / "model.safetensors")), load_file(str(broken / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["loss"] for r in metrics(straight)] == [r["loss"] for r in metrics(broken)]
    other = "adamw" if optimizer == "muon" else "muon"  # its state has another shape: refused, saying why
    refused = run_cli(["sft", "--resume", str(broken), "--steps", "6", "--optimizer", other])
    assert refused.returncode == 2 and f"it was trained with --optimizer {optimizer}," in refused.stderr


def test_a_run_extended_with_more_steps_follows_the_longer_schedule_from_its_first_resumed_step(tmp_path):
    data = text_file(tmp_path, "train.txt", P_LINE, A_LINE, FIRST)
    held_out = text_file(tmp_path, "held_out.txt", FIRST)
    short, long = tmp_path / "short", tmp_path / "long"
    common = ["--eval-every", "0", "--save-every", "2", "--lr", "1e-3", "--warmup-steps", "0"]
    assert run_cli(sft_args(data, held_out, long, "--steps", "4", *common)).returncode == 0
    assert run_cli(sft_args(data, held_out, short, "--steps", "2", *common)).returncode == 0
    extended = run_cli(["sft", "--resume", str(short), "--steps", "4"])
    assert extended.returncode == 0, extended.stderr
    # cosine to 0.1 x peak: 2 steps end at 1e-4, 4 steps pass through 5.5e-4 at their third
    assert [r["lr"] for r in metrics(short)][2:] == pytest.approx([r["lr"] for r in metrics(long)][2:], rel=1e-12)
    assert metrics(short)[2]["lr"] == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * 2 / 4))))


def test_warm_up_stable_cooldown_rates_by_hand_and_an_extended_run_keeps_its_stable_phase():
    """--cooldown-steps 4 of 10 with 2 of warm-up and min ratio 0.1: 1/3, 2/3, the peak four times, then a linear
    cooldown ending at 0.1 on the last step. Extended to 20 steps, every rate before the new cooldown is the
    peak's: what a shorter run took of its stable phase is what the longer one takes."""
    from rookworld.harness.optimizer import lr_factor
    from rookworld.settings.config import ConfigError, SFTConfig

    def factors(steps):
        cfg = SFTConfig(init="tiny", data=[], steps=steps, warmup_steps=2, cooldown_steps=4, min_lr_ratio=0.1)
        return [lr_factor(s, cfg) for s in range(steps)]

    assert factors(10) == pytest.approx([1 / 3, 2 / 3, 1, 1, 1, 1, 0.775, 0.55, 0.325, 0.1], rel=1e-12)
    assert factors(20)[:16] == pytest.approx([1 / 3, 2 / 3] + [1.0] * 14, rel=1e-12)
    assert factors(20)[16:] == pytest.approx(factors(10)[6:], rel=1e-12)
    with pytest.raises(ConfigError, match="--cooldown-steps"):
        SFTConfig(init="tiny", data=[__file__], steps=5, warmup_steps=2, cooldown_steps=4).validate()


@pytest.mark.slow
def test_sft_under_torchrun_gives_the_gradient_of_one_process(tmp_path):
    """Rows of very different numbers of counted tokens on the two ranks (the token mean is global)."""
    data = text_file(tmp_path, "train.txt", P_LINE, A_LINE, FIRST, P_LINE, A_LINE, FIRST, A_LINE, P_LINE)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    one = subprocess.run([sys.executable, str(HERE / "ddp_sft.py"), str(data), str(tmp_path / "one")],
                         capture_output=True, text=True, env=env, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    two = torchrun(HERE / "ddp_sft.py", data, tmp_path / "two")
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = torch.load(tmp_path / "one" / "grads.pt"), torch.load(tmp_path / "two" / "grads.pt")
    for k in a:
        assert a[k].abs().sum() > 0 and float((b[k] - a[k]).abs().max()) < 1e-4 * float(a[k].abs().max()), k
    ma, mb = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("one", "two"))
    assert mb["loss"] == pytest.approx(ma["loss"], rel=1e-5)


# -- rookworld plot -------------------------------------------------------------------------------------------------

def test_overlaid_runs_are_named_by_the_shortest_path_tail_that_tells_them_apart(tmp_path, monkeypatch):
    from rookworld.harness.plot import run_names

    monkeypatch.chdir(tmp_path)
    assert run_names(["runs/L7/grpo_seed0", "runs/L8/grpo_seed0", "other/sft"]) == \
        ["L7/grpo_seed0", "L8/grpo_seed0", "sft"]
    assert run_names(["a/x/run", "b/x/run"]) == ["a/x/run", "b/x/run"]
    assert run_names(["runs/one", "./runs/one/", str(tmp_path / "runs/two")]) == ["one", "one", "two"]


def test_plot_draws_several_runs_and_says_what_is_missing(tmp_path):
    pytest.importorskip("matplotlib")
    runs = []
    for name, shift in (("a", 0.0), ("b", 0.1)):
        run = tmp_path / name
        run.mkdir()
        rows = [{"step": s, "reward/P/mean": 0.2 + shift + 0.01 * s, "reward/A/mean": 0.5, "kl/mean": 0.001 * s,
                 "eval/P/best_move_accuracy": 0.1 + shift} for s in range(1, 6)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 6, "rew')
        runs.append(str(run))
    out = tmp_path / "curves.png"
    proc = run_cli(["plot", *runs, "--out", str(out), "--title", "two runs"])
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "3 panels, 2 run(s)" in proc.stderr
    missing = run_cli(["plot", str(tmp_path / "nothing"), "--out", str(out)])
    assert missing.returncode == 2 and "no metrics.jsonl" in missing.stderr and "Traceback" not in missing.stderr
    bare = tmp_path / "bare"  # a name without .png: written as given, as the closing line says
    proc = run_cli(["plot", *runs, "--out", str(bare)])
    assert bare.read_bytes()[:4] == b"\x89PNG" and not bare.with_suffix(".png").exists()
    assert f"wrote {bare} (" in proc.stderr
    # Without --out: beside the first run's own files, not in the directory the command was typed in.
    typed_in = tmp_path / "elsewhere"
    typed_in.mkdir()
    proc = cli("plot", *runs, cwd=typed_in)
    assert proc.returncode == 0 and f"wrote {runs[0]}/curves.png (" in proc.stderr, proc.stderr
    assert (Path(runs[0]) / "curves.png").read_bytes()[:4] == b"\x89PNG" and not any(typed_in.iterdir())


def test_plot_tells_runs_and_tasks_apart_and_keeps_losses_apart(tmp_path):
    pytest.importorskip("matplotlib")
    from rookworld.harness.plot import figure

    sft, grpo = tmp_path / "sft", tmp_path / "grpo"
    for run, rows in ((sft, [{"step": s, "loss": 10.0 - s, "eval/P/format_valid": 0.1 * s,
                              "eval/A/format_valid": 0.05 * s} for s in range(1, 41)]),
                      (grpo, [{"step": s, "loss": 1e-4 * (-1) ** s, "kl/mean": 1e-3, "reward/mean": 0.1,
                               "entropy": 10.79 + 1e-4 * s} for s in range(1, 4)]
                       + [{"step": 3, "eval/P/format_valid": 0.9, "eval/A/format_valid": 1.0}])):
        run.mkdir()
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fig, n = figure([sft, grpo])
    axes = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    # SFT's cross-entropy and GRPO's loss on their own axes (a raw curve drawn faint behind its smoothed one has
    # no legend entry).
    def labels(ax):
        return [line.get_label() for line in ax.lines if not line.get_label().startswith("_")]

    assert labels(axes["SFT loss (cross-entropy per token)"]) == ["sft: loss"]
    assert labels(axes["GRPO loss"]) == ["grpo: loss"]
    # Format validity: P: and A: differ in colour, the two runs in line style, and the legend says which.
    lines = {line.get_label(): line for line in axes["held-out format validity"].lines}
    assert set(lines) == {"sft: P:", "sft: A:", "grpo: P:", "grpo: A:"}
    assert lines["sft: P:"].get_color() == lines["grpo: P:"].get_color() != lines["sft: A:"].get_color()
    assert lines["sft: P:"].get_linestyle() == lines["sft: A:"].get_linestyle() != lines["grpo: P:"].get_linestyle()
    # A panel spans the runs it draws (grpo's own panels are not squeezed into sft's 40 steps, and its one-point
    # evaluation is not zoomed: it spans grpo's steps); integer steps, no offset.
    fig.canvas.draw()
    assert axes["SFT loss (cross-entropy per token)"].get_xlim() == axes["held-out format validity"].get_xlim()
    low, high = axes["GRPO loss"].get_xlim()
    assert low < 1 and 3 < high < 4 and axes["entropy per token"].get_xlim() == (low, high)
    for ax in axes.values():
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert all(float(t).is_integer() for t in ticks), ticks
        assert ax.yaxis.get_offset_text().get_text() == "", ax.get_title()
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_plot_draws_a_run_started_from_another_s_model_after_it(tmp_path, monkeypatch):
    """GRPO from an SFT run (its checkpoints' --model): its steps follow the SFT run's last on the x-axis."""
    pytest.importorskip("matplotlib")
    from rookworld.harness.plot import figure

    monkeypatch.chdir(tmp_path)
    sft, grpo = tmp_path / "sft", tmp_path / "grpo"
    for run, rows in ((sft, [{"step": s, "loss": 10.0 - s, "eval/P/format_valid": 0.01 * s} for s in range(1, 401)]),
                      (grpo, [{"step": s, "loss": 0.0, "kl/mean": 1e-3 * s, "reward/mean": 0.1} for s in range(1, 21)]
                       + [{"step": 20, "eval/P/format_valid": 0.9}])):
        run.mkdir()
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (grpo / "checkpoints" / "step-000020").mkdir(parents=True)
    (grpo / "checkpoints" / "step-000020" / "train_config.json").write_text(json.dumps({"model": "sft"}))
    fig, _ = figure([sft, grpo])
    axes = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    (kl,) = [line for line in axes["KL to the reference per token"].lines if line.get_label() == "grpo: mean"]
    assert list(kl.get_xdata()) == list(range(401, 421))
    low, high = axes["KL to the reference per token"].get_xlim()
    assert 400 < low < 401 and 420 < high < 421  # its own panel spans its 20 steps, not 420
    (after,) = [line for line in axes["held-out format validity"].lines if line.get_label() == "grpo: P:"]
    assert list(after.get_xdata()) == [420] and axes["held-out format validity"].get_xlim()[1] > 420
    assert "follows it" in axes["held-out format validity"].get_xlabel()
    import matplotlib.pyplot as plt

    plt.close(fig)


@pytest.mark.slow
def test_periodic_evaluation_says_it_is_running_on_a_terminal(tmp_path):
    import pty

    data = text_file(tmp_path, "train.txt", P_LINE, A_LINE, FIRST)
    out = tmp_path / "sft"
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "rookworld", *sft_args(data, data, out, "--steps", "2",
                                                                            "--eval-every", "2")],
                            stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=600) == 0, b"".join(chunks).decode(errors="replace")
    text = b"".join(chunks).decode(errors="replace")
    assert "step 2/2 | evaluating on held-out positions ..." in text, text
    assert text.index("evaluating on held-out positions") < text.index("eval at step 2")
