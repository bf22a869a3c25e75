"""`rookworld ask` and `rookworld play` driven through the command line with a real (tiny, random) model, and the
loading and answering API the README shows."""

import json

import chess as pychess
import pytest

from conftest import cli
from rookworld.chess import rules
from rookworld.lm.answers import RookWorldLM, read_env_answers, read_policy_answers
from rookworld.lm.play import board_text
from rookworld.chess.rewards import policy_targets

FEN = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"


def run_cli(*args, input=None):
    """`rookworld ARGS` in this process, `input` its stdin (conftest.cli)."""
    return cli(*args, input=input)


def test_answers_are_read_as_the_scorer_reads_them():
    text = policy_targets([FEN], [["f1b5", "d2d4", "e9e9"]], [[0.45, 0.38, 0.1]], ["f1b5"])[0]
    (a,) = read_policy_answers([text])
    assert a.well_formed and a.moves == ("f1b5", "d2d4", "e9e9") and a.evals == (0.45, 0.38, 0.1)
    assert a.best == "f1b5"
    (bad,) = read_policy_answers(["M: e2e4 E: x"])
    assert not bad.well_formed and bad.best is None and bad.moves == ()
    target = rules.env_targets([rules.env_prompt(FEN, "f1b5")])[0]
    (e,) = read_env_answers([target])
    assert e.well_formed and e.fen == rules.env_steps([FEN], ["f1b5"])[0].fen
    assert (e.reward, e.terminated, e.truncated) == (0.001, False, False)
    (g,) = read_env_answers(["garbage"])
    assert not g.well_formed


def test_load_and_answer_in_python(tiny_dir):
    lm = RookWorldLM.load(str(tiny_dir), device="cpu", max_new_tokens=6)
    (p,) = lm.policy([FEN])
    assert isinstance(p.text, str) and p.best is None  # a random model writes no answer
    (e,) = lm.env([FEN], ["f1b5"])
    assert isinstance(e.text, str)
    assert lm.complete([f"P: {FEN}"]) == [p.text]  # greedy: the same text again


def test_board_text_from_both_sides():
    board = board_text(rules.START_FEN)
    assert board.splitlines()[0] == "8 r n b q k b n r" and board.splitlines()[-1] == "  a b c d e f g h"
    flipped = board_text(rules.START_FEN, flip=True)
    assert flipped.splitlines()[0] == "1 R N B K Q B N R" and flipped.splitlines()[-1] == "  h g f e d c b a"


def test_ask_with_a_move_json(tiny_dir):
    proc = run_cli("ask", FEN, "Bb5", "--model", str(tiny_dir), "--device", "cpu", "--json", "--stockfish-depth", "4")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["fen"] == FEN and got["protocol"] == "greedy"
    p = got["policy"]
    assert p["prompt"] == f"P: {FEN}" and p["well_formed"] is False and p["best"] is None
    assert len(p["stockfish"]) == 5 and p["score"]["reward"] == pytest.approx(-0.3)  # malformed: the floor
    assert rules.is_legal([FEN], [p["stockfish"][0]["move"]]) == [True]
    e = got["env"]
    assert e["prompt"] == rules.env_prompt(FEN, "f1b5")  # SAN read as the UCI move
    assert e["truth"]["fen"] == rules.env_steps([FEN], ["f1b5"])[0].fen and e["truth"]["reward"] == 0.001


def test_ask_prints_and_rejects_bad_input(tiny_dir):
    proc = run_cli("ask", rules.START_FEN, "--model", str(tiny_dir), "--device", "cpu", "--stockfish-depth", "2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"P: {rules.START_FEN}\n  completion") and "Stockfish" in proc.stdout
    assert "reward      -0.300 (malformed)" in proc.stdout
    for args, message in ((["8/8/8/8/8/8/8/8 w - - 0 1"], "king"),
                          ([rules.START_FEN, "Ke2"], "illegal move in this position"),
                          ([rules.START_FEN, "hello"], "not a move")):
        proc = run_cli("ask", *args, "--model", str(tiny_dir), "--device", "cpu")
        assert proc.returncode == 2 and message in proc.stderr.lower() and "Traceback" not in proc.stderr, args


def test_play_with_piped_moves(tiny_dir):
    """The user's bad moves are refused with the reason and asked again; the random model writes no answer, so it
    plays the legal move it finds most probable (as `rookworld uci` would), says so, and the counts end the game."""
    proc = run_cli("play", "--model", str(tiny_dir), "--device", "cpu", input="e5\nhello\ne4\n")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "8 r n b q k b n r" in out and "your move (white): e5" in out
    assert "illegal move in this position" in out and "not a move" in out
    note = "(the model: its answer has no best move; played the legal move it finds most probable at its B:, "
    reply = out.split(note, 1)[1].split(")", 1)[0]
    board = pychess.Board()
    board.push_uci("e2e4")
    assert pychess.Move.from_uci(reply) in board.legal_moves
    assert f"the model plays {reply} ({board.san(pychess.Move.from_uci(reply))})" in out
    assert "game over: 0-1 (white resigned) after 2 half-moves; the model's moves: 0 its own answer, 1 the legal " \
           "move it finds most probable (its answer was illegal)" in out
    assert f"moves: e2e4 {reply}" in out


def test_play_as_black_resigning_at_end_of_input(tiny_dir):
    proc = run_cli("play", "--model", str(tiny_dir), "--device", "cpu", "--colour", "black", "--fen",
                   "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1", input="")
    assert proc.returncode == 0, proc.stderr
    assert "1 R N B K Q B N R" in proc.stdout  # black's view
    assert "game over: 1-0 (black resigned)" in proc.stdout
