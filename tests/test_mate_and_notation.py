"""Mating moves, mate-in-one puzzles and move notation, with python-chess as the oracle."""

from __future__ import annotations

import functools

import chess as pychess
import pytest

import rookworld.chess.rules as rc

START = pychess.STARTING_FEN
SCHOLAR = "r1bqkbnr/pppp1ppp/2n5/4p3/2B1P3/5Q2/PPPP1PPP/RNB1K1NR w KQkq - 2 3"
TWO_KNIGHTS = "4k3/8/8/8/8/5N2/8/1N2K3 w - - 0 1"


def oracle_mates(board: pychess.Board) -> set[str]:
    mates = set()
    for move in board.legal_moves:
        board.push(move)
        if board.is_checkmate():
            mates.add(move.uci())
        board.pop()
    return mates


@functools.lru_cache(maxsize=None)
def puzzles(n: int = 300, seed: int = 2024) -> tuple[rc.MateInOne, ...]:
    return tuple(rc.mate_in_one_positions(n, seed))


@functools.lru_cache(maxsize=None)
def generated_fens(n: int = 300, seed: int = 77) -> tuple[str, ...]:
    return tuple(p.fen for p in rc.generate_positions(n, seed))


# ---------------------------------------------------------------------------------------------
# Mate in one
# ---------------------------------------------------------------------------------------------


def test_known_mates():
    assert rc.mating_moves(SCHOLAR) == ["f3f7"]
    assert rc.mating_moves("6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1") == ["a1a8"]
    assert sorted(rc.mating_moves("8/8/8/8/8/k7/p4PPP/6K1 b - - 0 1")) == ["a2a1q", "a2a1r"]
    assert rc.mating_moves(START) == []
    assert rc.mating_moves("R5k1/5ppp/8/8/8/8/8/6K1 b - - 1 1") == []  # already mated


def test_puzzles_agree_with_python_chess():
    ps = puzzles()
    assert len(ps) == 300
    for p in ps:
        board = pychess.Board(p.fen)
        assert board.is_valid(), p.fen
        assert board.outcome(claim_draw=False) is None, p.fen
        assert p.mates and list(p.mates) == sorted(set(p.mates))
        assert set(p.mates) == oracle_mates(board), p.fen
        quiet = next(m for m in board.legal_moves if m.uci() not in p.mates)
        board.push(quiet)
        assert not board.is_checkmate()
        replay = pychess.Board()
        for uci in p.history:
            replay.push_uci(uci)
        assert replay.fen() == p.fen


def test_puzzles_vary():
    ps = puzzles()
    assert len({p.fen for p in ps}) == len(ps)
    turns = [pychess.Board(p.fen).turn for p in ps]
    assert 0.3 < sum(turns) / len(turns) < 0.7, "both colours to move"
    pieces = [len(pychess.Board(p.fen).piece_map()) for p in ps]
    assert sum(n < 14 for n in pieces) >= 30, "endgames"
    assert sum(n >= 22 for n in pieces) >= 30, "openings and middlegames"
    assert sum(len(p.mates) > 1 for p in ps) >= 10, "several mates"
    assert sum(len(p.history) < 40 for p in ps) >= 10, "early mates"


def test_puzzles_are_deterministic_whatever_the_chunking():
    whole = rc.mate_in_one_positions(30, 9)
    assert rc.mate_in_one_positions(10, 9) + rc.mate_in_one_positions(20, 9, start=10) == whole
    assert rc.mate_in_one_positions(30, 10) != whole
    assert rc.mate_in_one_positions(0, 9) == []
    for n, seed, start in [(-1, 0, 0), (1, -1, 0), (1, 2**64, 0), (1, 0, -1)]:
        with pytest.raises(ValueError):
            rc.mate_in_one_positions(n, seed, start=start)


def test_mating_moves_batch_agrees_with_python_chess():
    fens = list(generated_fens()) + [p.fen for p in puzzles()]
    got = rc.mating_moves_batch(fens)
    assert len(got) == len(fens)
    for fen, mates in zip(fens, got):
        assert set(mates) == oracle_mates(pychess.Board(fen)), fen
        assert len(mates) == len(set(mates))
    assert sum(map(bool, got[:300])) < 100, "ordinary positions rarely have a mate"


def test_mating_moves_bad_fen():
    with pytest.raises(ValueError, match="missing king.*'8/8/8/8/8/8/8/K7 w - - 0 1'"):
        rc.mating_moves_batch([START, "8/8/8/8/8/8/8/K7 w - - 0 1"])
    with pytest.raises(TypeError):
        rc.mating_moves_batch(START)


# ---------------------------------------------------------------------------------------------
# Notation
# ---------------------------------------------------------------------------------------------


def test_every_legal_move_in_san_both_ways():
    fens = list(generated_fens(200, 5)) + [p.fen for p in puzzles()[:50]]
    checked = 0
    for fen in fens:
        board = pychess.Board(fen)
        for move in board.legal_moves:
            uci, written = move.uci(), board.san(move)
            assert rc.san(fen, uci) == written, (fen, uci)
            assert rc.parse_move(fen, written) == uci, (fen, written)
            assert rc.parse_move(fen, uci) == uci
            assert rc.parse_move(fen, board.lan(move)) == uci, (fen, board.lan(move))
            checked += 1
    assert checked > 5000


@pytest.mark.parametrize(
    "fen, text, uci",
    [
        (START, "Nf3", "g1f3"),
        (START, " e4 ", "e2e4"),
        (START, "Ng1f3", "g1f3"),
        (START, "Nxf3", "g1f3"),  # python-chess ignores a wrong capture mark too
        ("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "O-O", "e1g1"),
        ("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "0-0", "e1g1"),
        ("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "0-0-0", "e1c1"),
        ("r3k2r/8/8/8/8/8/8/R3K2R b KQkq - 0 1", "O-O-O", "e8c8"),
        ("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "e1h1", "e1g1"),
        ("8/4P3/8/8/8/8/k7/4K3 w - - 0 1", "e8=Q", "e7e8q"),
        ("8/4P3/8/8/8/8/k7/4K3 w - - 0 1", "e8Q", "e7e8q"),
        ("8/4P3/8/8/8/8/k7/4K3 w - - 0 1", "e8=N", "e7e8n"),
        ("8/4P3/8/8/8/8/k7/4K3 w - - 0 1", "e7e8Q", "e7e8q"),
        (SCHOLAR, "Qxf7#", "f3f7"),
        (SCHOLAR, "Qxf7+", "f3f7"),
        (SCHOLAR, "Qxf7", "f3f7"),
        (TWO_KNIGHTS, "Nbd2", "b1d2"),
        (TWO_KNIGHTS, "N1d2", "b1d2"),
    ],
)
def test_parse_move_spellings(fen, text, uci):
    assert rc.parse_move(fen, text) == uci
    if text == text.strip():
        assert pychess.Board(fen).parse_san(text).uci() == uci  # python-chess reads it the same


def test_parse_move_errors_say_why():
    for text in ["hello", "", "0000", "Nf9", "e4!!", "N@f3"]:
        with pytest.raises(ValueError, match=r"^not a move in UCI or SAN: "):
            rc.parse_move(START, text)
    with pytest.raises(ValueError) as err:
        rc.parse_move(START, "Ke2")
    assert str(err.value) == "illegal move in this position: 'Ke2'"
    for text in ["e5", "e2e5", "O-O", "Qxd7", "g1g3"]:
        with pytest.raises(ValueError, match=r"^illegal move in this position: "):
            rc.parse_move(START, text)
    with pytest.raises(ValueError) as err:
        rc.parse_move(TWO_KNIGHTS, "Nd2")
    assert str(err.value) == "ambiguous move (Nbd2, Nfd2): 'Nd2'"
    with pytest.raises(pychess.AmbiguousMoveError):
        pychess.Board(TWO_KNIGHTS).parse_san("Nd2")
    with pytest.raises(ValueError, match="missing king"):
        rc.parse_move("8/8/8/8/8/8/8/K7 w - - 0 1", "Ka2")
    with pytest.raises(ValueError, match="'not a fen'"):
        rc.parse_move("not a fen", "e4")


def test_san_errors():
    assert rc.san(SCHOLAR, "f3f7") == "Qxf7#"
    assert rc.san(SCHOLAR, "c4f7") == "Bxf7+"
    assert rc.san("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "e1c1") == "O-O-O"
    with pytest.raises(ValueError) as err:
        rc.san(START, "e2e5")
    assert str(err.value) == "illegal move in this position: 'e2e5'"
    with pytest.raises(ValueError, match=r"^not a move in UCI: 'Nf3'"):
        rc.san(START, "Nf3")
    with pytest.raises(ValueError, match="missing king"):
        rc.san("8/8/8/8/8/8/8/K7 w - - 0 1", "a1a2")
