"""A game against Stockfish as an RL environment (rookworld.integrations.game, issue 46), with python-chess as the
oracle of the rules: moves in UCI, SAN or a whole P: answer, rewards per move and for the result, an illegal or
unreadable move losing, Stockfish moving first for Black, the ply limit, whole games whose histories replay
in python-chess to the position reported, and the opponent's move bounded in time whatever its node limit (issue
58): real Stockfish told to search 10^20 nodes, and a scripted engine that talks on and never says `bestmove`."""

from __future__ import annotations

import random
import time

import chess as pychess
import pytest

from rookworld.chess import rules
from rookworld.chess.rewards import RewardScorer, policy_prompt
from rookworld.chess.stockfish import StockfishPool
from rookworld.integrations.game import ILLEGAL, RESULT, ChessGame, GameStep, OpponentError

from test_trust_engine import fake_engine

MATE_IN_ONE = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1"  # Ra8# (a1a8)
#: Endgames that end within a few dozen plies of random play against Stockfish, or reach the ply limit.
ENDGAMES = ["8/8/4k3/8/8/3QK3/8/8 w - - 0 1", "8/5k2/8/8/8/2R5/4K3/8 b - - 0 1", "8/p4k2/8/8/8/8/1P2K3/8 w - - 0 1",
            "4k3/8/8/8/8/8/4P3/4K3 b - - 0 1"]


@pytest.fixture(scope="module")
def pool():
    with StockfishPool(workers=1, depth=4) as pool:
        yield pool


@pytest.fixture
def game(pool):
    with ChessGame(opponent_skill=0, opponent_nodes=200, analysis=pool) as game:
        yield game


def replayed(step: GameStep, start: str) -> pychess.Board:
    """The board python-chess reaches by playing the reported moves from `start`: every one legal, and the
    position the one reported."""
    board = pychess.Board(start)
    for move in step.moves:
        assert pychess.Move.from_uci(move) in board.legal_moves, (move, board.fen())
        board.push_uci(move)
    assert board.fen() == step.fen
    assert sorted(step.legal_moves) == ([] if step.done else sorted(m.uci() for m in board.legal_moves))
    assert step.prompt == policy_prompt(step.fen)
    return board


def test_a_legal_move_is_played_and_answered(game):
    start = game.reset()
    assert start.fen == rules.START_FEN and not start.done and start.reward == 0.0 and start.opponent_move is None
    step = game.step("e2e4")
    assert step.legal and step.move == "e2e4" and not step.done and step.outcome is None
    assert step.moves == ["e2e4", step.opponent_move]
    replayed(step, rules.START_FEN)
    assert step.reward == step.move_reward and step.result_reward == 0.0
    assert 0.05 <= step.move_reward <= 1.0


ITALIAN = "r1bqk1nr/pppp1ppp/2n5/2b1p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 4"


@pytest.mark.parametrize("fen, action, move", [
    (rules.START_FEN, "Nf3", "g1f3"), (rules.START_FEN, "g1f3", "g1f3"), (ITALIAN, "O-O", "e1g1"),
    (ITALIAN, "e1g1", "e1g1"), (ITALIAN, " Bxf7+ ", "c4f7"), ("8/P6k/8/8/8/8/8/K7 w - - 0 1", "a8=Q", "a7a8q")])
def test_san_and_uci_name_the_same_move(game, fen, action, move):
    game.reset(fen)
    step = game.step(action)
    assert step.legal and step.move == move and step.moves[0] == move
    replayed(step, fen)


def test_a_move_s_reward_is_its_rank_among_stockfish_s_and_a_whole_answer_gets_the_p_reward(game, pool):
    fen = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"
    best = pool.analyse_one(fen).candidates[0].move
    game.reset(fen)
    assert game.step(best).move_reward == 1.0
    outside = [m for m in rules.legal_moves(fen) if m not in {c.move for c in pool.analyse_one(fen).candidates}]
    game.reset(fen)
    assert game.step(outside[0]).move_reward == 0.05
    answer = f"M: {best} d2d4 E: 0.3 0.2 B: {best}"
    game.reset(fen)
    step = game.step(answer)
    assert step.move == best and step.legal
    assert step.move_reward == RewardScorer(pool).score([policy_prompt(fen)], [answer])[0]


def test_mate_in_one_wins_with_the_move_s_reward_and_the_result_s(game):
    game.reset(MATE_IN_ONE)
    step = game.step("Ra8#")
    assert step.done and step.outcome == "win" and step.reason == "checkmate" and step.opponent_move is None
    assert (step.move_reward, step.result_reward, step.reward) == (1.0, RESULT["win"], 2.0)
    assert replayed(step, MATE_IN_ONE).is_checkmate()
    with pytest.raises(RuntimeError, match="the game is over"):
        game.step("g8h8")


@pytest.mark.parametrize("action, reason", [
    ("e2e5", "illegal move 'e2e5'"), ("e7e5", "illegal move 'e7e5'"), ("Ke3", "illegal move 'Ke3'"),
    ("hello", "illegal move 'hello'"), ("", "no move in its answer"), ("play e4 please", "no move in its answer"),
    ("M: e2e4 E: 0.1 B: e2e5", "illegal move 'e2e5'"), ("\x00🙂" * 40, "illegal move")])
def test_an_illegal_or_unreadable_move_loses_the_game(game, action, reason):
    game.reset()
    step = game.step(action)
    assert step.done and not step.legal and step.move is None and step.outcome == "loss"
    assert (step.move_reward, step.result_reward, step.reward) == (ILLEGAL, RESULT["loss"], -2.0)
    assert step.fen == rules.START_FEN and step.moves == [] and step.legal_moves == []
    assert step.reason.startswith(reason) and step.reason.endswith("by white"), step.reason


def test_black_is_answered_after_stockfish_moves_first(game):
    start = game.reset(colour="b")
    assert start.opponent_move is not None and start.moves == [start.opponent_move]
    assert start.fen.split()[1] == "b" and game.colour == "b"
    board = replayed(start, rules.START_FEN)
    reply = random.Random(0).choice(sorted(m.uci() for m in board.legal_moves))
    step = game.step(reply)
    assert step.legal and step.moves[:2] == [start.opponent_move, reply] and len(step.moves) == 3
    replayed(step, rules.START_FEN)


def test_the_side_to_move_is_played_unless_told(game):
    fen = "4k3/8/8/8/8/8/4P3/4K3 b - - 0 1"
    assert game.reset(fen).opponent_move is None and game.colour == "b"
    white = game.reset(fen, "w")
    assert white.opponent_move is not None and game.colour == "w" and white.fen.split()[1] == "w"


def test_the_ply_limit_ends_a_game_unfinished(pool):
    with ChessGame(opponent_skill=0, opponent_nodes=200, analysis=pool, max_plies=3) as game:
        game.reset()
        assert not game.step("e2e4").done
        step = game.step("d2d4")  # the third ply: Stockfish does not answer it
        assert step.done and step.outcome == "unfinished" and step.reason == "ply limit"
        assert step.result_reward == RESULT["unfinished"] == 0.0 and step.opponent_move is None
        assert len(step.moves) == 3
        replayed(step, rules.START_FEN)


def test_bad_requests_raise_and_leave_the_game_usable(game):
    with pytest.raises(RuntimeError, match="reset"):
        game.step("e2e4")
    with pytest.raises(ValueError):
        game.reset("not a fen")
    with pytest.raises(ValueError, match="over"):
        game.reset("R5k1/5ppp/8/8/8/8/8/6K1 b - - 1 1")  # checkmated
    with pytest.raises(ValueError, match="colour"):
        game.reset(colour="white")
    game.reset()
    assert game.step("e2e4").legal


@pytest.mark.parametrize("seed", range(6))
def test_whole_games_of_random_moves_end_as_python_chess_says(pool, seed):
    rng = random.Random(seed)
    start = rules.START_FEN if seed == 0 else ENDGAMES[seed % len(ENDGAMES)]
    with ChessGame(opponent_skill=0, opponent_nodes=200, analysis=pool, max_plies=80) as game:
        step = game.reset(start, colour=rng.choice("wb"))
        total = 0.0
        while not step.done:
            replayed(step, start)
            step = game.step(rng.choice(step.legal_moves))
            assert step.legal and 0.05 <= step.move_reward <= 1.0
            total += step.reward
        board = replayed(step, start)
        mine = pychess.WHITE if game.colour == "w" else pychess.BLACK
        if step.outcome == "unfinished":
            assert len(step.moves) >= 80 and step.reason == "ply limit"
        elif step.outcome == "draw":
            assert (board.is_stalemate() or board.is_insufficient_material() or board.is_seventyfive_moves()
                    or board.is_repetition(3)), step.reason
        else:
            assert board.is_checkmate() and (board.turn != mine) == (step.outcome == "win")
        assert step.result_reward == RESULT[step.outcome]


#: A UCI engine that answers `go` with info lines, one each 50 ms, for ever, and never `bestmove`, nor reads `stop`.
TALKS_ON = ('[print(f"info depth 1 score cp 0 nodes 1 pv {legal[0]}", flush=True) or __import__("time").sleep(0.05) '
            'for _ in iter(int, 1)]')


def timed(call):
    started = time.monotonic()
    value = call()
    return value, time.monotonic() - started


def test_the_opponent_s_move_is_bounded_in_time_whatever_its_node_limit(pool):
    # 10^20 nodes: hours of search, and past what Stockfish's `go` can read (2^64), which would leave no limit.
    with ChessGame(opponent_skill=0, opponent_nodes=10**20, analysis=pool, opponent_move_s=1) as game:
        start, took = timed(lambda: game.reset(colour="b"))  # Stockfish moves first
        assert start.opponent_move is not None and took < 4, took
        step, took = timed(lambda: game.step(start.legal_moves[0]))
        assert step.legal and step.opponent_move is not None and took < 4, took
        replayed(step, rules.START_FEN)


@pytest.mark.slow
def test_an_opponent_that_talks_on_without_a_move_is_cut_off_and_the_game_stopped(pool, tmp_path):
    with ChessGame(stockfish_path=fake_engine(tmp_path, TALKS_ON), analysis=pool, opponent_move_s=1) as game:
        started = time.monotonic()
        with pytest.raises(OpponentError) as failed:
            game.reset(colour="b")
        assert time.monotonic() - started < 12  # 1 s to think, 5 s more to answer, a restart
        said = str(failed.value)
        assert "\n" not in said and len(said) < 400, said
        assert said.startswith("Stockfish (Skill Level 0, 20000 nodes) gave no move within 6 s") and \
            "`bestmove`" in said and said.endswith("the game is stopped; reset to play another"), said
        assert game.game.ended and game.game.reason == "the opponent gave no move"
        with pytest.raises(RuntimeError, match="the game is over"):
            game.step("e7e5")
        # The engine was started again: a game where the user moves first goes on to the opponent's turn.
        assert game.reset(colour="w").opponent_move is None
        with pytest.raises(OpponentError):
            game.step("e2e4")
