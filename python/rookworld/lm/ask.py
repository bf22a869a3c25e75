"""`rookworld ask`: one position put to the model. Its P: answer with every move checked and, when Stockfish is
there, the reward it would get in training; with a move, its A: answer next to the true transition."""

from __future__ import annotations

from collections.abc import Sequence

from rookworld.chess import rules
from rookworld.chess.rewards import RewardScorer, policy_prompt
from rookworld.lm.answers import GREEDY, Decoding, RookWorldLM


def _san(fen: str, move: str) -> str | None:
    try:
        return rules.san(fen, move)
    except ValueError:
        return None


def ask_policy(lm: RookWorldLM, fen: str, *, decoding: Decoding = GREEDY, seed: int = 0,
               stockfish=None) -> dict:
    """The model's P: answer for `fen`, each move marked legal or not; with a StockfishPool, Stockfish's five and
    the answer's reward and its parts."""
    (answer,) = lm.policy([fen], decoding=decoding, seed=seed)
    moves = list(answer.moves)
    legal = rules.is_legal([fen] * len(moves), moves) if moves else []
    out = {"prompt": policy_prompt(fen), "completion": answer.text, "well_formed": answer.well_formed,
           "candidates": [{"move": m, "san": _san(fen, m), "legal": ok,
                           "eval": answer.evals[i] if i < len(answer.evals) else None}
                          for i, (m, ok) in enumerate(zip(moves, legal))],
           "best": answer.best, "best_san": _san(fen, answer.best) if answer.best else None,
           "best_legal": bool(answer.best) and rules.is_legal([fen], [answer.best])[0]}
    if stockfish is not None:
        scorer = RewardScorer(stockfish)
        (truth,) = scorer.ground_truth([out["prompt"]])
        scores = scorer.score_batch([out["prompt"]], [answer.text], ground_truth=[truth])
        out["stockfish"] = [{"move": m, "san": _san(fen, m), "eval": e} for m, e in zip(*truth)]
        out["score"] = scores.breakdown(0)
    return out


def ask_env(lm: RookWorldLM, fen: str, move: str, history: Sequence[str] = (), *, decoding: Decoding = GREEDY,
            seed: int = 0) -> dict:
    """The model's A: answer for playing `move` (UCI) in `fen` after `history`, beside the true transition."""
    prompt = rules.env_prompt(fen, move, history)
    (answer,) = lm.env([fen], [move], [history], decoding=decoding, seed=seed)
    (truth,) = rules.env_steps([fen], [move])
    scores = RewardScorer().score_batch([prompt], [answer.text])
    return {"prompt": prompt, "completion": answer.text,
            "model": {"fen": answer.fen, "reward": answer.reward, "terminated": answer.terminated,
                      "truncated": answer.truncated},
            "truth": {"fen": truth.fen, "reward": truth.reward, "terminated": truth.terminated,
                      "truncated": truth.truncated},
            "score": scores.breakdown(0)}


def _yes(flag) -> str:
    return "-" if flag is None else "yes" if flag else "no"


def format_policy(fen: str, p: dict) -> str:
    lines = [f"P: {fen}", f"  completion  {p['completion'].strip()!r}"]
    if not p["well_formed"]:
        lines.append("  the answer has no M: ... E: ... B: structure")
    for c in p["candidates"]:
        ev = "" if c["eval"] is None else f"{c['eval']:+.2f}"
        mark = f"{c['san'] or '':<8} legal" if c["legal"] else "         ILLEGAL"
        lines.append(f"  candidate   {c['move']:<6} {ev:>7}  {mark}")
    if p["best"] is not None:
        mark = f"{p['best_san']}, legal" if p["best_legal"] else "ILLEGAL"
        lines.append(f"  best move   {p['best']} ({mark})")
    if "stockfish" in p:
        five = ", ".join(f"{c['san'] or c['move']} {c['eval']:+.2f}" for c in p["stockfish"]) or "no legal move"
        lines.append(f"  Stockfish   {five}")
        s = p["score"]
        lines.append(f"  reward      {s['reward']:.3f}" + (
            f" (best move ranks {s['best_rank']} of Stockfish's five; {s['hits']} candidate(s) among them)"
            if s["well_formed"] and s.get("best_rank") else " (best move not among Stockfish's five)"
            if s["well_formed"] else " (malformed)"))
    return "\n".join(lines)


def format_env(e: dict) -> str:
    m, t, s = e["model"], e["truth"], e["score"]

    def row(x: dict) -> str:
        if x["fen"] is None:
            return "(no answer in the A: format)"
        reward = "-" if x["reward"] is None else repr(x["reward"])
        return f"{x['fen']}  reward {reward}  terminated {_yes(x['terminated'])}  truncated {_yes(x['truncated'])}"

    return "\n".join([e["prompt"], f"  completion  {e['completion'].strip()!r}", f"  model       {row(m)}",
                      f"  truth       {row(t)}",
                      f"  next state {'exact' if s.get('fen_exact') else 'wrong'}; reward {s['reward']:.3f}"])
