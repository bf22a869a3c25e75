"""Hypothesis property tests: rookworld.chess.rules on any text.

Every function gives a result or the documented ``ValueError``: never another exception, never a
crash. Where python-chess reads the same FEN as a valid position (``board.is_valid()``), results
equal python-chess's (tests/oracle.py).
"""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import chess
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import rookworld.chess.rules as rc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle  # noqa: E402

START = chess.STARTING_FEN
REWARDS = set(oracle.REWARD_VALUES)
TARGET_RE = re.compile(r"(?P<fen>[^+]+)\+(?P<reward>0\.001|1\.0|0\.5|-1\.0)\+(?P<term>[01])\+(?P<trunc>[01])")

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MANY = settings(FAST, max_examples=1200)


def _seed_fens() -> list[str]:
    fens = [
        START,
        "8/2k2b2/R1p4r/3p1p2/P7/2P2B1P/5PPK/4R3 w - - 1 31",
        "r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1",
        "r3k2r/8/8/8/8/8/8/R3K2R b KQkq - 0 1",
        "1n2k3/P7/8/8/8/8/8/4K3 w - - 0 1",
        "4k3/8/8/8/8/8/p7/1N2K3 b - - 0 1",
        "4k3/8/8/3pP3/8/8/8/4K3 w - d6 0 1",
        "rnbqkbnr/ppp1pppp/8/8/3pP3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 3",
        "6k1/5ppp/8/8/8/8/8/R5K1 w - - 149 100",
        "7k/8/5K2/6Q1/8/8/8/8 w - - 0 1",
        "4k3/8/8/8/8/8/4n3/4K3 w - - 0 1",
        "rnbqkbnr/pppp1ppp/8/4p3/6P1/5P2/PPPPP2P/RNBQKBNR b KQkq - 0 2",
        "8/8/8/8/8/8/8/K6k w - - 0 1",
    ]
    rng = random.Random(4)
    for _ in range(12):
        board = chess.Board()
        for _ in range(rng.randrange(1, 120)):
            moves = list(board.legal_moves)
            if not moves:
                break
            board.push(rng.choice(moves))
        if board.outcome(claim_draw=False) is None:
            fens.append(board.fen())
    return fens


SEED_FENS = _seed_fens()
FEN_ALPHABET = "pnbrqkPNBRQK123456780/ wb-KQkqabcdefghAH9+~_[]\t\n\r\x0b\x0c\x1f\xa0\u3000"
WS_CHARS = " \t\n\r\x0b\x0c\x1c\x1f\x85\xa0\u2003\u3000"

chars = st.one_of(
    st.characters(codec=None, exclude_categories=()),
    st.characters(categories=["Cs"]),  # lone surrogates
    st.sampled_from(FEN_ALPHABET),
)
any_text = st.text(chars, max_size=40)


@st.composite
def mutated(draw, base: st.SearchStrategy[str]) -> str:
    """A real FEN (or move) with a few characters inserted, deleted or replaced."""
    text = draw(base)
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from("idr"))
        i = draw(st.integers(0, len(text)))
        c = draw(chars)
        if op == "i":
            text = text[:i] + c + text[i:]
        elif op == "d":
            text = text[:i] + text[i + 1 :]
        else:
            text = text[:i] + c + text[i + 1 :]
    return text


@st.composite
def played_fen(draw) -> str:
    """A seed FEN after a few random legal moves: many distinct valid positions."""
    board = chess.Board(draw(st.sampled_from(SEED_FENS)))
    rng = random.Random(draw(st.integers(0, 2**32)))
    for _ in range(draw(st.integers(0, 30))):
        moves = list(board.legal_moves)
        if not moves or board.outcome(claim_draw=False) is not None:
            break
        board.push(rng.choice(moves))
    return board.fen()


@st.composite
def placed_fen(draw) -> str:
    """Pieces on random squares (often invalid: no king, pawns on the back rank, checks)."""
    board = chess.Board(None)
    pieces = draw(st.dictionaries(st.integers(0, 63), st.sampled_from("KkKkPpNnBbRrQq"), min_size=1, max_size=8))
    for sq, sym in pieces.items():
        board.set_piece_at(sq, chess.Piece.from_symbol(sym))
    board.turn = draw(st.booleans())
    fields = board.fen().split()
    fields[2] = draw(st.sampled_from(["-", "-", "KQkq", "K", "q"]))
    fields[3] = draw(st.sampled_from(["-", "-", "-", "e3", "d6", "a6", "h3"]))
    fields[4] = str(draw(st.sampled_from([0, 1, 149, 150])))
    return " ".join(fields)


seed_fen = st.sampled_from(SEED_FENS)
valid_fen = st.one_of(seed_fen, played_fen())
fenish = st.one_of(valid_fen, played_fen(), mutated(valid_fen), placed_fen(), any_text)


def legal_of(fen: str) -> list[str]:
    try:
        return [m.uci() for m in chess.Board(fen).legal_moves]
    except ValueError:
        return []


uci_like = st.text(st.sampled_from("abcdefgh12345678qrbnkpQ0@ "), min_size=0, max_size=6)


@st.composite
def fen_and_move(draw) -> tuple[str, str]:
    fen = draw(fenish)
    legal = legal_of(fen)
    options = [any_text, uci_like, mutated(st.just("e2e4"))]
    if legal:
        options += [st.sampled_from(legal)] * 3 + [mutated(st.sampled_from(legal))]
    move = draw(st.one_of(*options))
    if draw(st.integers(0, 9)) == 0:
        move = draw(st.sampled_from(WS_CHARS)) + move + draw(st.sampled_from(WS_CHARS))
    return fen, move


@st.composite
def promptish(draw) -> str:
    fen, move = draw(fen_and_move())
    history = draw(st.one_of(st.just(move), st.just(f"e2e4 {move}"), any_text))
    prompt = f"A: {fen}+{move}+{history}+"
    if draw(st.integers(0, 3)) == 0:
        prompt = draw(mutated(st.just(prompt)))
    return draw(st.sampled_from(["{}", " {} ", "{}\n", "{}+"])).format(prompt) if draw(st.booleans()) else prompt


# --- oracle helpers -------------------------------------------------------------------------


def python_chess_board(fen: str) -> chess.Board | None:
    """python-chess's reading of ``fen`` when it accepts it and calls it valid, else None."""
    try:
        board = chess.Board(fen)
    except ValueError:
        return None
    return board if board.is_valid() else None


PLAIN_FEN = re.compile(
    r"[ \t\n\r\x0c]*[pnbrqkPNBRQK1-8/]+"
    r"(?:[ \t\n\r\x0c]+[wb](?:[ \t\n\r\x0c]+(?:-|K?Q?k?q?)(?:[ \t\n\r\x0c]+(?:-|[a-h][36])"
    r"(?:[ \t\n\r\x0c]+[0-9]{1,9}(?:[ \t\n\r\x0c]+[0-9]{1,9})?)?)?)?)?[ \t\n\r\x0c]*"
)


def must_be_accepted(fen: str, board: chess.Board | None) -> bool:
    """A FEN in plain standard syntax that python-chess calls valid: rookworld must read it.

    (Outside plain syntax, such as ``-0`` clocks, ``1_0``, Unicode digits or non-ASCII
    whitespace, python-chess is more lenient and a ``ValueError`` is fine.) The one known
    exception: checks by two knights/pawns, which rookworld rejects as impossible.
    """
    if board is None or not PLAIN_FEN.fullmatch(fen):
        return False
    steppers = board.checkers() & (board.pawns | board.knights | board.kings)
    return len(steppers) < 2


def king_takes_rook(board: chess.Board, move: str) -> bool:
    """The known discrepancy tested in test_env_oracle.py: python-chess castles on ``e1h1``."""
    return oracle.legal_move(board, move) is not None and move not in {m.uci() for m in board.legal_moves}


# --- properties -----------------------------------------------------------------------------


@FAST
@given(st.lists(fenish, max_size=6))
@example(["\ud800", "", " ", START + "\udfff"])
@example(["8/8/8/8/8/8/8/K6k w - - 0 1 extra", "8/8/8/8/8/8/8/K6k\u00a0w"])
def test_normalize_fens_and_normalize_fen(fens):
    batch = rc.normalize_fens(fens)
    assert isinstance(batch, list) and len(batch) == len(fens)
    for fen, got in zip(fens, batch):
        assert got is None or isinstance(got, str)
        try:
            single = rc.normalize_fen(fen)
        except ValueError:
            single = None
        assert single == got
        board = python_chess_board(fen)
        if got is not None and board is not None:
            assert got == board.fen(), fen
        if must_be_accepted(fen, board):
            assert got is not None, f"rookworld rejects a valid FEN: {fen!r}"


@MANY
@given(fenish)
@example("\ud800")
@example("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1")
def test_legal_moves(fen):
    try:
        moves = rc.legal_moves(fen)
    except ValueError:
        assert rc.normalize_fens([fen]) == [None]
        return
    assert isinstance(moves, list) and all(isinstance(m, str) for m in moves)
    assert len(moves) == len(set(moves))
    board = python_chess_board(fen)
    if board is not None:
        assert set(moves) == {m.uci() for m in board.legal_moves}


@FAST
@given(st.lists(promptish(), min_size=2, max_size=4))
def test_env_targets_batches(prompts):
    """A batch answers like its items one by one, or raises ValueError when one of them does."""
    singles = []
    for p in prompts:
        try:
            singles.append(rc.env_targets([p])[0])
        except ValueError:
            singles.append(None)
    try:
        assert rc.env_targets(prompts) == singles
    except ValueError:
        assert None in singles


@MANY
@given(promptish().map(lambda p: [p]))
@example(["A: " + START + "+e2e4\ud800+\udc00+"])
@example(["A: " + START + "+\u3000e2e4\x1f+x+"])
def test_env_targets(prompts):
    try:
        targets = rc.env_targets(prompts)
    except ValueError as e:
        event(f"ValueError: {str(e).split(':')[0]}")
        # the documented error: some prompt cannot be parsed; each one alone tells which
        singles = []
        for p in prompts:
            try:
                singles.append(rc.env_targets([p]))
            except ValueError:
                singles.append(None)
        assert None in singles
        return
    assert len(targets) == len(prompts)
    for prompt, target in zip(prompts, targets):
        m = TARGET_RE.fullmatch(target)
        assert m, target
        assert (m["term"], m["trunc"]) == {"0.001": ("0", "0"), "1.0": ("1", "0"), "0.5": ("1", "0"), "-1.0": ("0", "1")}[m["reward"]]
        fen, move, _ = oracle.parse_prompt(prompt)  # rookworld parsed it: so does the oracle
        board = python_chess_board(fen)
        if board is not None and not king_takes_rook(board, move):
            assert target == oracle.reference_target(prompt), prompt
            event(f"compared with python-chess: reward {m['reward']}")
        else:
            event("not comparable")


@MANY
@given(st.lists(fen_and_move(), min_size=1, max_size=3))
@example([(START, "\ud800"), ("\udfff", "e2e4")])
@example([("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "e1h1")])
def test_env_steps_and_is_legal(pairs):
    fens = [f for f, _ in pairs]
    moves = [m for _, m in pairs]
    legal = rc.is_legal(fens, moves)
    assert len(legal) == len(pairs) and all(type(x) is bool for x in legal)
    singles = []
    for fen, move in pairs:
        try:
            singles.append(rc.env_steps([fen], [move])[0])
        except ValueError:
            singles.append(None)
    try:
        assert rc.env_steps(fens, moves) == singles
    except ValueError:
        assert None in singles
    for (fen, move), ok, s in zip(pairs, legal, singles):
        if s is None:
            assert not ok and rc.normalize_fens([fen]) == [None]
            continue
        assert ok == (s.reward != -1.0)
        board = python_chess_board(fen)
        if board is None or king_takes_rook(board, move):
            event("not comparable")
            continue
        want = oracle.step(fen, move)
        assert ok == (oracle.legal_move(board, move) is not None)
        assert (s.fen, s.reward, s.terminated, s.truncated) == (want[0], oracle.REWARD_VALUES[want[1]], want[2], want[3])
        assert s.target == oracle.format_target(*want)
        event(f"compared with python-chess: reward {want[1]}")


def python_chess_perft(board: chess.Board, depth: int) -> int:
    if depth == 0:
        return 1
    total = 0
    for m in board.legal_moves:
        if depth == 1:
            total += 1
        else:
            board.push(m)
            total += python_chess_perft(board, depth - 1)
            board.pop()
    return total


@MANY
@given(fenish, st.integers(-2, 2))
@example("\ud800", 1)
def test_perft(fen, depth):
    try:
        n = rc.perft(fen, depth)
    except ValueError:
        assert depth < 0 or rc.normalize_fens([fen]) == [None]
        return
    assert depth >= 0 and isinstance(n, int)
    board = python_chess_board(fen)
    if board is not None:
        assert n == python_chess_perft(board, depth)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 12), st.integers(0, 2**64 - 1), st.integers(0, 10**9))
def test_generate_positions_small(n, seed, start):
    positions = rc.generate_positions(n, seed, start=start)
    assert len(positions) == n
    for p in positions:
        board = chess.Board(p.fen)
        assert board.is_valid() and board.outcome(claim_draw=False) is None
        assert board.fen() == p.fen
        replay = chess.Board()
        for u in p.history:
            replay.push_uci(u)
        assert replay.fen() == p.fen
        assert p.phase in {"opening", "middlegame", "endgame"}
    assert rc.generate_positions(n, seed, start=start) == positions
    if n >= 2:
        assert rc.generate_positions(1, seed, start=start + 1) == positions[1:2]


def test_oracle_comparison_can_fail():
    """The helpers above would notice a wrong answer."""
    prompt = oracle.build_prompt("6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1", "a1a8")
    target = rc.env_targets([prompt])[0]
    assert target == oracle.reference_target(prompt)
    assert TARGET_RE.fullmatch(target)["reward"] == "1.0"
    assert not TARGET_RE.fullmatch(target.replace("+1.0+", "+1+"))
    assert target.replace("+1.0+", "+0.5+") != oracle.reference_target(prompt)


def lossy(text: str) -> str:
    """What rookworld makes of a str: UTF-8 with each bad byte sequence replaced by U+FFFD."""
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


@pytest.mark.parametrize(
    ("fen", "move", "history"),
    [
        (START, "e2e4", ["\ud800"]),  # a lone surrogate in the history
        (START, "e2e4", ["e7e5", "g1f3\udc00"]),
    ],
)
def test_env_prompt_lone_surrogates_become_replacement_characters(fen, move, history):
    """BUG (fails): surrogates in fen and move become U+FFFD, in the history they raise
    ``UnicodeEncodeError`` (python.rs takes the histories as ``Vec<Vec<String>>``, not via ``texts``)."""
    assert rc.env_prompt(fen, "e2\ud800", []) == oracle.build_prompt(fen, lossy("e2\ud800"), [])
    prompt = rc.env_prompt(fen, move, history)
    assert prompt == oracle.build_prompt(fen, move, [lossy(h) for h in history])
