"""The legality loss of SFT (`rookworld.sft.legality`, `--legal-weight`) and the soft best move (`--soft-best-weight`):
their formulas against float64 by hand, value and gradient; their move slots against python-chess's legal moves,
spelled character by character; and SFT steps whose loss and gradient are the token mean NLL plus the weighted slot
means, computed from the full logits."""

from __future__ import annotations

import copy
import json
import os

import chess
import numpy as np
import pytest
import torch

from rookworld.net.tokenizer import EOS_ID, get_tokenizer, vocabulary
from rookworld.sft.legality import LegalTokens, legal_loss, move_shares, soft_loss

from test_sft import A_LINE, P_LINE, text_file

HELD_OUT = os.path.join(os.path.dirname(__file__), "..", "data", "chess-play-held-out.jsonl")


def test_soft_loss_move_shares_and_the_gradient_by_hand():
    """-sum_t q(t) log p(t) and its gradient p - q; q = softmax(eval / T) over the moves, in float64 by hand."""
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]], dtype=torch.float64, requires_grad=True)
    q = torch.tensor([[0.25, 0.0, 0.75, 0.0]], dtype=torch.float64)
    loss = soft_loss(logits, q)
    e = np.exp([2.0, -1.0, 0.5, 3.0])
    p = e / e.sum()
    assert float(loss.detach()) == pytest.approx(-(0.25 * np.log(p[0]) + 0.75 * np.log(p[2])), rel=1e-12)
    loss.sum().backward()
    torch.testing.assert_close(logits.grad[0], torch.tensor(p) - q[0], rtol=1e-12, atol=1e-12)
    shares = move_shares([("e2e4", 0.3), ("d2d4", 0.1), ("a2a3", -2.0)], 0.5)
    z = np.exp([0.0, -0.4, -4.6])
    assert [shares[m] for m in ("e2e4", "d2d4", "a2a3")] == pytest.approx(list(z / z.sum()), rel=1e-12)
    mate = move_shares([("h5f7", 1000.0), ("e2e4", 0.3)], 0.5)  # a mate's eval: no overflow, all on the mate
    assert mate["h5f7"] == pytest.approx(1.0) and mate["e2e4"] >= 0.0


@pytest.mark.parametrize("vocabulary_name", ["gpt2", "chess"])
def test_best_slots_chain_to_the_best_moves_share_over_python_chess_legal_moves(vocabulary_name):
    """At the B: move's first token the target is each first token's share of q over python-chess's legal moves; the
    targets of the B: move's own tokens, multiplied along it, give its q (the chain rule: no other move is spelled
    the same)."""
    tok = vocabulary(vocabulary_name)
    legal = LegalTokens(tok)
    line = json.loads(open(HELD_OUT).readlines()[40])
    board = chess.Board(line["fen"])
    moves = [m.uci() for m in board.legal_moves]
    evals = {m: 0.1 * (sum(map(ord, m)) % 17 - 8) for m in moves}  # any evals: the chain must hold for every q
    shares = move_shares(list(evals.items()), 0.5)
    best = line["p_target"].split("B: ")[1].strip()
    target = tok.encoding.encode_ordinary(line["p_target"])
    slots = legal.best_slots(target, shares)
    spelled = tok.encoding.encode_ordinary(" " + best)
    assert [i for i, _ in slots] == list(range(len(target) - len(spelled), len(target)))
    first: dict[int, float] = {}
    for m in moves:
        first[tok.encoding.encode_ordinary(" " + m)[0]] = first.get(tok.encoding.encode_ordinary(" " + m)[0], 0) + \
            shares[m]
    assert slots[0][1] == pytest.approx(first, rel=1e-12)
    chain = np.prod([dist[t] for (_, dist), t in zip(slots, spelled)])
    assert chain == pytest.approx(shares[best], rel=1e-9)
    assert all(sum(dist.values()) == pytest.approx(1.0) for _, dist in slots)
    # the first M: move instead (where a ranked target chooses): the same chain, at its own tokens
    first_move = line["p_target"].split("M: ")[1].split()[0]
    first = legal.best_slots(target, shares, at="first")
    at = len(tok.encoding.encode_ordinary(line["p_target"].split(" " + first_move)[0]))
    assert [i for i, _ in first] == list(range(at, at + len(tok.encoding.encode_ordinary(" " + first_move))))
    chain = np.prod([dist[t] for (_, dist), t in zip(first, tok.encoding.encode_ordinary(" " + first_move))])
    assert chain == pytest.approx(shares[first_move], rel=1e-9)


def test_legal_loss_and_its_gradient_by_hand():
    """-log(sum_A e^l / sum e^l) and its gradient p - 1[A] p / p(A), worked out in float64 by hand."""
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    allowed = torch.tensor([[True, False, True, False], [False, False, False, True]])
    loss = legal_loss(logits, allowed)
    e = np.exp([[2.0, -1.0, 0.5, 3.0], [0.0, 0.0, 0.0, 0.0]])
    want = [-np.log((e[0, 0] + e[0, 2]) / e[0].sum()), -np.log(0.25)]
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    loss.sum().backward()
    p = e / e.sum(1, keepdims=True)
    mass = (p * allowed.numpy()).sum(1, keepdims=True)
    grad = p - allowed.numpy() * p / mass
    torch.testing.assert_close(logits.grad, torch.tensor(grad), rtol=1e-12, atol=1e-12)
    # All the mass on legal tokens: nothing to learn.
    sure = torch.tensor([[0.0, -1e4, -1e4]], requires_grad=True)
    assert float(legal_loss(sure.detach(), torch.tensor([[True, False, False]]))) == pytest.approx(0.0, abs=1e-6)


def _pieces(move: str) -> list[str]:
    """A UCI move as it is tokenized: the space and the file, then a character a token."""
    return [" " + move[0], *move[1:]]


def _by_characters(board: chess.Board, move: str) -> list[set[str]]:
    """What python-chess's legal moves allow at each token of `move`, while its tokens so far begin a legal move."""
    legal = [_pieces(m.uci()) for m in board.legal_moves]
    written = _pieces(move)
    out = []
    for k in range(len(written)):
        allowed = {m[k] for m in legal if len(m) > k and m[:k] == written[:k]}
        if not allowed:
            break
        out.append(allowed)
    return out


@pytest.mark.parametrize("vocab", ["chess", "gpt2"])
@pytest.mark.parametrize("layout", ["compact", "rookworld"])
def test_move_slots_match_python_chess(vocab, layout):
    """On 60 held-out positions of real play, with targets of legal, illegal and promotion moves, every slot's
    allowed tokens are python-chess's legal continuations, character by character, and a slot stops where the
    written move leaves every legal move."""
    from rookworld.chess.rewards import policy_targets

    tokenizer = vocabulary("chess") if vocab == "chess" else get_tokenizer()
    legal = LegalTokens(tokenizer)
    records = [json.loads(line) for line in open(HELD_OUT)][:60]
    records.append({"fen": "8/4P3/8/8/8/8/k7/4K3 w - - 0 1"})  # promotions: a fifth token
    checked = 0
    for r in records:
        board = chess.Board(r["fen"])
        moves = [m.uci() for m in board.legal_moves][:3] + ["e2e5", "a1a1"]
        if r["fen"].startswith("8/4P3"):
            moves = ["e7e8q", "e7e8", "e7d8n"]
        target = policy_targets([r["fen"]], [moves], [[0.1] * len(moves)], [moves[0]], layout)[0]
        ids = tokenizer.encoding.encode_ordinary(target)
        slots = legal.slots(r["fen"], ids)
        pieces = [tokenizer.encoding.decode([ids[i]]) for i, _ in slots]
        want = [a for m in moves + [moves[0]] for a in _by_characters(board, m)]
        got = [{tokenizer.encoding.decode([t]) for t in allowed} for _, allowed in slots]
        assert got == want, (r["fen"], target, pieces)
        checked += len(slots)
    assert checked > 60 * 14


def test_legal_weight_needs_one_document_a_row(tmp_path):
    from rookworld.settings.base import ConfigError
    from rookworld.settings.config import SFTConfig

    data = str(text_file(tmp_path, "rw.txt", P_LINE))
    SFTConfig(init="tiny", data=[data], legal_weight=0.5).validate()
    with pytest.raises(ConfigError, match="--legal-weight"):
        SFTConfig(init="tiny", data=[data], pack=True, legal_weight=0.5).validate()


@pytest.mark.slow
@pytest.mark.parametrize("soft, order", [(0.0, "as-written"), (0.5, "as-written"), (0.5, "ranked")])
def test_an_sft_step_adds_the_weighted_slot_means_of_the_legality_and_soft_best_losses(tmp_path, soft, order):
    """Micro-batches of one document a row: the step's loss is the token mean NLL, and its gradient that of
    NLL + w_legal x (the mean legality loss over the step's move slots) + w_soft x (the mean soft cross-entropy over
    the chosen moves' tokens: B:'s, or the first M: move's when ranked), all from the full logits in float64. With
    --soft-best-weight, Stockfish (depth 3) analyses every legal move of each P: position, and soft_best_loss is that
    mean."""
    from rookworld.settings.config import SFTConfig
    from rookworld.sft.samples import collate
    from rookworld.sft.trainer import SFTTrainer

    other = P_LINE.replace("B: h7f6", "B: h7g5")
    data = text_file(tmp_path, "rw.txt", P_LINE, A_LINE, other, P_LINE.replace("a4a3", "a4b3"))
    cfg = SFTConfig(init="tiny", n_embd=32, n_head=2, data=[str(data)], output_dir=str(tmp_path / "out"), steps=1,
                    seq_len=256, rows_per_step=4, micro_batch_size=3, loss_on="target", max_grad_norm=0.0,
                    eval_every=0, warmup_steps=0, compile=False, device="cpu", dtype="fp32", legal_weight=0.7,
                    soft_best_weight=soft, soft_best_temperature=0.3, stockfish_depth=3, stockfish_workers=1,
                    candidate_order=order, layout="compact" if order == "ranked" else None).validate()
    t = SFTTrainer(cfg, stream=open(os.devnull, "w"))
    if soft:
        fen = P_LINE[3:].split("  ")[0].strip()
        board = chess.Board(fen)
        assert sorted(t.shares[fen]) == sorted(m.uci() for m in board.legal_moves)  # every legal move, from Stockfish
    model = copy.deepcopy(t.run.policy).double()
    rows = [t.rows.row(i) for i in range(4)]
    docs = [t.rows.document(i) for i in range(4)]
    m = t.train_step()
    ids, loss = (torch.from_numpy(a) for a in collate(rows, EOS_ID))
    attn = torch.arange(ids.shape[1]) < torch.tensor([len(i) for i, _ in rows])[:, None]
    logits = model(ids, attn)
    logp = logits.log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    counted = loss[:, 1:].double()
    nll = -(logp * counted).sum() / counted.sum()
    legal_terms, soft_terms = [], []
    for r, d in enumerate(docs):
        if t.docs.policy[d] is None:
            continue
        fen, offset = t.docs.policy[d]
        target = rows[r][0][offset:].tolist()
        target = target[: target.index(EOS_ID)]
        for index, allowed in t.legal.slots(fen, target):
            logit = logits[r, offset + index - 1]
            legal_terms.append(logit.logsumexp(-1) - logit[allowed].logsumexp(-1))
        if not soft:
            continue
        chosen = t.legal.best_slots(target, t.shares[fen], t.cfg.choice_slot)
        text = t.run.tokenizer.encoding.decode(target)
        move = text.split("M: ")[1].split()[0] if order == "ranked" else text.split("B: ")[1].split()[0]
        assert t.run.tokenizer.encoding.decode([target[i] for i, _ in chosen]) == " " + move
        for index, dist in chosen:
            lp = logits[r, offset + index - 1].log_softmax(-1)
            soft_terms.append(-sum(q * lp[token] for token, q in dist.items()))
    assert len(legal_terms) >= 3 * 6 * 3  # three P: rows, six moves each, most of their tokens
    legal = torch.stack(legal_terms).mean()
    assert m["loss"] == pytest.approx(float(nll.detach()), rel=1e-5)
    assert m["legal_loss"] == pytest.approx(float(legal.detach()), rel=1e-5)
    total = nll + 0.7 * legal
    if soft:
        assert len(soft_terms) >= 3 * 2  # three P: rows, their chosen move's tokens
        mean_soft = torch.stack(soft_terms).mean()
        assert m["soft_best_loss"] == pytest.approx(float(mean_soft.detach()), rel=1e-5)
        total = total + soft * mean_soft
    else:
        assert "soft_best_loss" not in m and t.shares == {}  # no Stockfish started for it
    total.backward()
    for (name, p), (_, q) in zip(t.run.policy.named_parameters(), model.named_parameters()):
        torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-4, atol=1e-7, msg=name)
    t.close()
