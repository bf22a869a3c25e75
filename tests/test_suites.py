"""The evaluation suites beyond best-move: mate-in-one, self-play, games against the real Stockfish, the Elo
interval, and the report; checked against python-chess as the oracle of the rules."""

import json
import math
import os
import random
import signal

import chess as pychess
import pytest

from conftest import cli, needs_stockfish
from rookworld.chess import rules
from rookworld.lm.games import BLACK, WHITE, Choice, Game, ModelPlayer, StockfishPlayer, elo_difference
from rookworld.lm.answers import GREEDY, RookWorldLM, read_policy_answers
from rookworld.chess.rewards import policy_targets
from rookworld.lm.suites import (SuiteResult, format_report, mate_in_one, mate_positions, parse_suites, selfplay,
                              vs_stockfish)



def answer_text(fen: str, moves: list[str], best: str) -> str:
    """A P: completion in the training layout, as a trained model writes it."""
    return policy_targets([fen], [moves], [[0.1] * len(moves)], [best])[0]


class ScriptedLM:
    """A policy that writes well-formed P: answers chosen by `pick(fen) -> (moves, best)`: the suites' logic is
    then checked on answers whose right score is known, through the same parser the model's answers go through."""

    def __init__(self, pick):
        self.pick, self.calls = pick, 0

    def policy(self, fens, *, decoding=GREEDY, seed=0, progress=None):
        self.calls += 1
        texts = [answer_text(f, *self.pick(f)) for f in fens]
        return read_policy_answers(texts)


def test_elo_difference_by_hand():
    """One virtual drawn game beside the real ones (add-half smoothing), and Wilson's 95% interval on that score:
    finite for every result. The figures were computed by hand at 40 digits (mpmath) from
      s = (W + D/2 + 1/2) / (n + 1), m = n + 1, z = 1.959963984540054 (the normal's 97.5% quantile),
      centre = (s + z^2 / 2m) / (1 + z^2 / m), half = z / (1 + z^2 / m) * sqrt(s (1 - s) / m + z^2 / 4m^2),
      Elo(p) = 400 log10(p / (1 - p)) of s, centre - half and centre + half."""
    # 0 wins in 4 games: s = 0.1 in 5; the interval of the score is 0.010529954359016619 to 0.53705601746752324.
    assert elo_difference(0, 0, 4) == pytest.approx((-381.69700377572995, -789.19046500033184, 25.796457448871939),
                                                    rel=1e-12)
    assert elo_difference(4, 0, 0) == pytest.approx((381.69700377572995, -25.796457448871939, 789.19046500033184),
                                                    rel=1e-12)
    assert elo_difference(0, 0, 1) == pytest.approx((-190.84850188786497, -624.84571074951113, 243.14870697378118),
                                                    rel=1e-12)
    # 6 wins, 2 draws, 2 losses: s = 7.5 / 11
    assert elo_difference(6, 2, 2) == pytest.approx((132.39728761656976, -75.397509402731367, 340.1920846358709),
                                                    rel=1e-12)
    assert elo_difference(5, 0, 5) == pytest.approx((0.0, -194.92883843406306, 194.92883843406306), abs=1e-9)
    # Every result of up to 12 games: finite, ordered, and the same from the other side.
    for n in range(1, 13):
        for wins in range(n + 1):
            for draws in range(n - wins + 1):
                elo, low, high = elo_difference(wins, draws, n - wins - draws)
                assert all(map(math.isfinite, (elo, low, high))) and low < elo < high
                assert elo_difference(n - wins - draws, draws, wins) == pytest.approx((-elo, -high, -low), abs=1e-9)
    # With many games the virtual one weighs nothing: the plain score's Elo (400 log10(0.7 / 0.3) = 147.19) and the
    # normal approximation's interval of a trial worth 0 or 1 (half width 1.96 sqrt(0.7 * 0.3 / 1000) = 0.0284),
    # which holds the narrower one of the games' own spread, draws counted (1.96 sqrt(0.16 / 1000) = 0.0248).
    elo, low, high = elo_difference(600, 200, 200)
    assert elo == pytest.approx(147.19, abs=0.3)
    assert low == pytest.approx(400 * math.log10(0.6716 / 0.3284), abs=1.5)
    assert high == pytest.approx(400 * math.log10(0.7284 / 0.2716), abs=1.5)
    assert low < 400 * math.log10(0.6752 / 0.3248) and high > 400 * math.log10(0.7248 / 0.2752)
    assert all(map(math.isnan, elo_difference(0, 0, 0)))


def test_mate_in_one_positions_and_scores_against_python_chess():
    positions = mate_positions(40, seed=5)
    for fen, mates in positions:
        board = pychess.Board(fen)
        oracle = {m.uci() for m in board.legal_moves if _mates(board, m)}
        assert oracle and set(mates) == oracle, fen
    non_mating = {fen: next(m.uci() for m in pychess.Board(fen).legal_moves if m.uci() not in mates)
                  for fen, mates in positions if len(mates) < pychess.Board(fen).legal_moves.count()}
    by_fen = dict(positions)
    # Half the answers mate (with a mating move that is not the first, as any mate counts), half do not.
    pick_mate = {fen: i % 2 == 0 or fen not in non_mating for i, (fen, _) in enumerate(positions)}

    def pick(fen):
        best = by_fen[fen][-1] if pick_mate[fen] else non_mating[fen]
        return [best, *rules.legal_moves(fen)[:4]], best

    result = mate_in_one(ScriptedLM(pick), positions)
    m = result.sections["mate-in-one"]
    for item in result.items:
        board = pychess.Board(item["fen"])
        assert item["mate"] == _mates(board, pychess.Move.from_uci(item["best"]))  # the oracle's verdict
    assert m["n"] == 40 and m["format_valid"] == 1.0 and m["legal_best_move"] == 1.0
    assert m["mate_rate"] == pytest.approx(sum(pick_mate.values()) / 40)
    assert m["stockfish_match"] is None  # no engine given: no such column


def _mates(board: pychess.Board, move: pychess.Move) -> bool:
    board = board.copy()
    board.push(move)
    return board.is_checkmate()


@needs_stockfish
def test_mate_in_one_beside_stockfish_first_move():
    from rookworld.chess.stockfish import StockfishPool

    positions = mate_positions(6, seed=1)
    with StockfishPool(depth=4, workers=1) as pool:
        first = {fen: pool.analyse_one(fen).candidates[0].move for fen, _ in positions}
        result = mate_in_one(ScriptedLM(lambda fen: ([first[fen]], first[fen])), positions, stockfish=pool)
    m = result.sections["mate-in-one"]
    assert m["stockfish_match"] == 1.0 and m["mate_rate"] == 1.0  # Stockfish's first move mates


def test_selfplay_counts_replayed_in_python_chess():
    """A player that plays random legal moves and, in some games, an illegal one at a given ply: the counts the
    suite reports are the ones a replay of each game in python-chess gives."""
    rng = random.Random(3)
    fail_at = {}  # start fen -> ply of the illegal move

    def pick(fen):
        board = pychess.Board(fen)
        moves = [m.uci() for m in board.legal_moves]
        plies_here = board.ply()
        if fail_at.get("ply") is not None and plies_here >= fail_at["ply"]:
            illegal = next(m for m in ("e1e5", "a1a8", "h8h1", "e8e4") if m not in moves)
            return [illegal], illegal
        best = rng.choice(moves)
        return [best], best

    fail_at["ply"] = 9
    lm = ScriptedLM(pick)
    result = selfplay(lm, games=3, seed=2, max_plies=60, decodings=(GREEDY,))
    m = result.sections["selfplay/greedy"]
    assert m["n"] == 3
    illegal = 0
    for item in result.items:
        board = pychess.Board(item["start_fen"])
        for move in item["moves"]:
            assert pychess.Move.from_uci(move) in board.legal_moves
            board.push_uci(move)
        assert board.fen() == item["fen"]
        if item["illegal_by"] is not None:
            illegal += 1
            bad = read_policy_answers([item["answers"][-1]])[0].best
            assert pychess.Move.from_uci(bad) not in board.legal_moves
            assert item["illegal_by"] == ("w" if board.turn else "b")
        elif item["result"] is not None:
            assert board.is_game_over(claim_draw=True)
    legal = [len(i["moves"]) for i in result.items]
    assert m["legal_half_moves"] == pytest.approx(sum(legal) / 3)
    assert m["illegal_share"] == pytest.approx(illegal / (sum(legal) + illegal))
    assert m["ended_by_illegal"] == pytest.approx(illegal / 3)


def test_model_player_plays_its_likeliest_legal_move_when_its_own_is_illegal_and_says_so(tiny_dir):
    """Its B: e2e5 is no move at the start: the legal move the model finds most probable at its B: slot is played
    (scored by the real tiny model after the answer's text), not the first legal candidate of its list (g1f3)."""
    game = Game()
    lm = ScriptedLM(lambda fen: (["e2e5", "a7a6", "g1f3", "d2d4"], "e2e5"))
    lm.continuation_logprobs = RookWorldLM.load(str(tiny_dir), device="cpu").continuation_logprobs
    (choice,) = ModelPlayer(lm, GREEDY, fallback=True).choose([game])
    text = answer_text(rules.START_FEN, ["e2e5", "a7a6", "g1f3", "d2d4"], "e2e5")
    legal = rules.legal_moves(rules.START_FEN)
    scores = lm.continuation_logprobs(f"P: {rules.START_FEN}" + text[: text.index("B:")] + "B:",
                                      [" " + m for m in legal])
    assert choice.move == legal[max(range(len(legal)), key=scores.__getitem__)] and choice.source == "likeliest"
    assert "e2e5" in choice.note and choice.move in choice.note
    (strict,) = ModelPlayer(lm, GREEDY).choose([game])
    assert strict.move == "e2e5" and strict.note is None
    assert not game.play(strict) and game.result == "0-1" and game.illegal_by == WHITE


def test_games_end_by_the_rules():
    # Fool's mate: black mates on move 2.
    game = Game()
    for move in ("f2f3", "e7e5", "g2g4", "d8h4"):
        assert game.play(Choice(move))
    assert game.ended and game.result == "0-1" and game.reason == "checkmate"
    # Knights back and forth: the start position a third time is a draw.
    game = Game()
    for move in ("g1f3", "g8f6", "f3g1", "f6g8", "g1f3", "g8f6", "f3g1", "f6g8"):
        game.play(Choice(move))
    assert game.result == "1/2-1/2" and game.reason == "threefold repetition" and len(game.moves) == 8
    board = pychess.Board()
    for move in game.moves:
        board.push_uci(move)
    assert board.can_claim_threefold_repetition()
    # Stalemate.
    game = Game(start_fen="k7/8/1QK5/8/8/8/8/8 w - - 0 1")
    game.play(Choice("c6c7"))
    assert game.result == "1/2-1/2" and game.reason == "stalemate"


@needs_stockfish
def test_stockfish_own_move_does_not_lose_to_stockfish_at_its_weakest():
    games = 2
    with StockfishPlayer(nodes=20_000) as strong, StockfishPlayer(skill=0, nodes=2_000) as weak:
        result = vs_stockfish(strong, weak, games=games, max_plies=160)
    m = result.sections["vs-stockfish"]
    assert m["n"] == games and m["losses"] == 0 and m["lost_by_illegal"] == 0
    assert m["wins"] + m["draws"] == games and m["score"] >= 0.5
    for item in result.items:  # colours alternate, and every game replays in python-chess
        board = pychess.Board(item["start_fen"])
        for move in item["moves"]:
            board.push_uci(move)
        assert board.fen() == item["fen"]
        if item["reason"] == "checkmate":
            assert board.is_checkmate()
    assert [i["model_colour"] for i in result.items] == [WHITE, BLACK]


@needs_stockfish
def test_a_killed_opponent_is_restarted_and_the_suite_goes_on():
    """The opponent's Stockfish process is killed for real in the middle of the suite: it is started again, the move
    asked again, the games finish, and the report counts the restart (issue 35: no traceback)."""
    rng = random.Random(5)
    killed = []

    def pick(fen):
        if len(killed) == 0 and lm.calls == 3:
            killed.append(opponent.engine.pid)
            os.kill(opponent.engine.pid, signal.SIGKILL)
        move = rng.choice([m.uci() for m in pychess.Board(fen).legal_moves])
        return [move], move

    lm = ScriptedLM(pick)
    with StockfishPlayer(skill=0, nodes=500) as opponent:
        result = vs_stockfish(ModelPlayer(lm, GREEDY, fallback=True), opponent, games=2, max_plies=16)
        assert opponent.restarts == 1 and opponent.engine.pid != killed[0] and opponent.engine.alive()
    m = result.sections["vs-stockfish"]
    assert m["opponent_restarts"] == 1 and m["n"] == 2 and m["own_move_illegal"] == 0.0 and m["games_all_own"] == 1.0
    for item in result.items:
        board = pychess.Board(item["start_fen"])
        for move in item["moves"]:
            board.push_uci(move)
        assert item["reason"] == "ply limit" or board.is_game_over(claim_draw=True)


def test_parse_suites_and_the_report():
    assert parse_suites("mate-in-one, best-move,mate-in-one") == ["mate-in-one", "best-move"]
    with pytest.raises(ValueError, match="choose from best-move, mate-in-one, selfplay, vs-stockfish"):
        parse_suites("mate-in-two")
    r = SuiteResult("vs-stockfish", "rookworld", {"vs-stockfish": {"n": 4, "wins": 0, "draws": 0, "losses": 4,
                                                                  "elo_difference": -math.inf}}, [], "against X")
    table = format_report([r])
    assert "vs-stockfish (4 games, rookworld): against X" in table and "-inf" in table
    assert json.loads(json.dumps(r.to_dict()))["sections"]["vs-stockfish"]["elo_difference"] is None


# -- the command --------------------------------------------------------------------------------------------------

def run_cli(*args, input=None):
    """`rookworld ARGS` in this process, `input` its stdin (conftest.cli)."""
    return cli(*args, input=input)


@needs_stockfish
def test_eval_every_suite_with_a_tiny_model(tiny_dir, tmp_path):
    """A random model writes nothing legal: every suite says so in its own figures, the JSON holds each position's
    and game's record, and the protocol is named."""
    data = tmp_path / "mates.fen"
    fens = [fen for fen, _ in mate_positions(3, seed=9)]
    data.write_text("\n".join([*fens, rules.START_FEN]) + "\n")
    out = tmp_path / "r.json"
    proc = run_cli("eval", "--model", str(tiny_dir), "--suite", "mate-in-one,selfplay,vs-stockfish", "--data",
                   str(data), "--games", "2", "--max-new-tokens", "8", "--device", "cpu", "--stockfish-depth", "2",
                   "--opponent-skill", "0", "--opponent-nodes", "500", "--protocol", "rookworld", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "mate-in-one (3 positions, rookworld): from a file; 1 position(s) without a mate in one left out" \
        in proc.stdout
    assert "selfplay/greedy (2 games, greedy)" in proc.stdout and "selfplay/rookworld (2 games, rookworld)" \
        in proc.stdout
    assert "vs-stockfish (2 games, rookworld): against Stockfish (Skill Level 0, 500 nodes)" in proc.stdout
    got = json.loads(out.read_text())
    assert got["protocol"] == "rookworld" and got["decoding"] == {"temperature": 0.6, "top_k": 5}
    mate = got["suites"]["mate-in-one"]
    assert mate["sections"]["mate-in-one"]["mate_rate"] == 0.0 and len(mate["items"]) == 3
    assert all(i["mates"] and i["stockfish"] in i["mates"] for i in mate["items"])
    # vs-stockfish plays the model's moves as `rookworld uci` chooses them: never illegal, while the report still
    # says that every one of its own B: moves was (the random model writes none)
    vs = got["suites"]["vs-stockfish"]["sections"]["vs-stockfish"]
    assert vs["lost_by_illegal"] == 0 and vs["wins"] + vs["draws"] + vs["losses"] == 2
    assert vs["model_moves"] > 0 and vs["own_move_illegal"] == 1.0 and vs["opponent_restarts"] == 0
    assert vs["games_all_own"] == 0.0  # every game had a fall-back move
    assert "its own B: move illegal" in proc.stdout
    for item in got["suites"]["vs-stockfish"]["items"]:
        board = pychess.Board(item["start_fen"])
        for move in item["moves"]:
            assert pychess.Move.from_uci(move) in board.legal_moves
            board.push_uci(move)
        assert item["reason"] == "ply limit" or board.is_game_over(claim_draw=True)
        model_moves = len(item["moves"][0 if item["model_colour"] == WHITE else 1 :: 2])
        assert item["move_sources"] == {"best": 0, "likeliest": model_moves}
    sp = got["suites"]["selfplay"]["sections"]["selfplay/greedy"]
    assert sp["legal_half_moves"] == 0.0 and sp["illegal_share"] == 1.0


def test_eval_rejects_an_unknown_suite(tiny_dir):
    proc = run_cli("eval", "--model", str(tiny_dir), "--suite", "best-move,mate-in-2")
    assert proc.returncode == 2 and "--suite: unknown suite 'mate-in-2'" in proc.stderr
    proc = run_cli("eval", "--model", str(tiny_dir), "--samples", "3")
    assert proc.returncode == 2 and "--samples is gone: --out holds every completion" in proc.stderr


def test_training_evaluates_the_suites_it_is_given(tiny_dir, tmp_path):
    """--eval-suites: the periodic evaluation's figures of each suite land in metrics.jsonl (so the curves show
    them) and the evaluation line names them; an unknown suite is refused before any work."""
    from test_trainer import metrics, train_args

    out = tmp_path / "run"
    proc = run_cli(*train_args(tiny_dir, out, "--steps", "1", "--eval-every", "1", "--eval-size", "2",
                               "--eval-suites", "best-move,mate-in-one,selfplay", "--eval-games", "1"))
    assert proc.returncode == 0, proc.stderr
    row = metrics(out)[-1]
    assert row["eval/P/n"] == 2 and row["eval/mate-in-one/n"] == 2 and row["eval/mate-in-one/mate_rate"] == 0.0
    assert row["eval/selfplay/greedy/legal_half_moves"] == 0.0 and row["eval/selfplay/rookworld/n"] == 1
    assert "mate-in-one 0%" in proc.stderr and "selfplay 0.0 legal half-moves" in proc.stderr
    bad = run_cli(*train_args(tiny_dir, tmp_path / "bad", "--eval-suites", "mate-in-9"))
    assert bad.returncode == 2 and "--eval-suites: unknown suite 'mate-in-9'" in bad.stderr


def test_a_training_runs_evaluation_decodes_in_batches_of_decode_batch_size():
    """--micro-batch-size is rows per forward/backward; a training run's evaluation decodes --decode-batch-size
    prompts at once."""
    from conftest import tiny_gpt
    from rookworld.chess.rewards import RewardScorer
    from rookworld.chess.stockfish import StockfishPool
    from rookworld.lm.bestmove import heldout_records
    from rookworld.lm.suites import training_metrics
    from rookworld.net.tokenizer import get_tokenizer
    from rookworld.settings.config import TrainConfig

    model = tiny_gpt(scale=4.0)
    rows = []
    model.transformer.wte.register_forward_pre_hook(lambda m, args: rows.append(args[0].shape[0]))
    cfg = TrainConfig(micro_batch_size=64, decode_batch_size=3, eval_size=7, max_new_tokens=4, eval_suites="best-move")
    with StockfishPool(workers=1, depth=2) as pool:
        metrics = training_metrics(model, get_tokenizer(None), cfg, heldout_records(7), RewardScorer(pool))
    assert rows and max(rows) == 3 and "eval/P/format_valid" in metrics and "eval/A/format_valid" in metrics
