"""What a Stockfish process says, read and checked as a data file is before it is trusted: its scored PV lines
(`parse_info`), the candidates they rank, and why an answer cannot stand (scores out of range, a mate that does
not fit the position, moves that are not legal). `engine.Engine` raises `BadAnswer` with the reason."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from rookworld.chess import rules
from rookworld.chess.stockfish.analysis import Candidate

#: The largest centipawn score taken from an engine: the data files' range (`rules.MAX_EVAL` pawns, a mate in 1).
MAX_CP = round(rules.MAX_EVAL * 100)
#: The longest mate taken from an engine, in moves: past any engine's horizon (Stockfish's is 246 plies), and short
#: enough that a mate's eval stays on its side's end of the scale.
MAX_MATE = 250
#: The deepest search depth taken from an engine (Stockfish stops at 245).
MAX_DEPTH = 1000


def parse_info(line: str) -> tuple[int, int, int, int | None, int | None, str] | None:
    """``(multipv, depth, seldepth, cp, mate, first_move)`` of a scored PV line, else ``None``.

    ``info string`` lines, bound-only scores (``lowerbound``/``upperbound``) and lines without a
    score or PV are ignored.
    """
    tokens = line.split()
    if len(tokens) < 2 or tokens[0] != "info":
        return None
    multipv, depth, seldepth = 1, None, 0
    cp = mate = None
    move = None
    i, n = 1, len(tokens)
    try:
        while i < n:
            tok = tokens[i]
            if tok == "string":
                return None
            if tok == "score":
                kind, value = tokens[i + 1], int(tokens[i + 2])
                if kind == "cp":
                    cp = value
                elif kind == "mate":
                    mate = value
                else:
                    return None
                i += 3
                if i < n and tokens[i] in ("lowerbound", "upperbound"):
                    return None
                continue
            if tok == "pv":
                if i + 1 < n:
                    move = tokens[i + 1]
                break
            if tok == "multipv":
                multipv = int(tokens[i + 1])
            elif tok == "depth":
                depth = int(tokens[i + 1])
            elif tok == "seldepth":
                seldepth = int(tokens[i + 1])
            elif tok == "wdl":
                i += 4
                continue
            elif tok in ("lowerbound", "upperbound"):
                return None
            i += 2
    except (IndexError, ValueError):
        return None
    if depth is None or move is None or (cp is None and mate is None):
        return None
    return multipv, depth, seldepth, cp, mate, move


def ranked_candidates(lines: dict[int, tuple[int, int, int | None, int | None, str]], legal: Sequence[str],
                      k: int) -> tuple[tuple[Candidate, ...], int]:
    """Candidates ranked by MultiPV index: distinct, legal, at most ``k``; and the best line's depth."""
    legal_set = set(legal)
    out: list[Candidate] = []
    seen: set[str] = set()
    for index in sorted(lines):
        depth, _sel, cp, mate, move = lines[index]
        if move in seen or move not in legal_set:
            continue
        seen.add(move)
        out.append(Candidate(move, cp, mate))
        if len(out) == k:
            break
    best_depth = lines[min(lines)][0] if lines else 0
    return tuple(out), best_depth


def score_problem(cp: int | None, mate: int | None) -> str | None:
    """What is wrong with a score an engine gave a move, in a position with a legal move, or ``None``."""
    if (cp is None) == (mate is None):
        return "two scores" if cp is not None else "no score"
    if mate == 0:  # mated already: only a position without a legal move is, and those never reach an engine
        return "mate 0 where there is a legal move"
    if mate is not None and abs(mate) > MAX_MATE:
        return f"mate {mate}, longer than any engine sees ({MAX_MATE} moves)"
    if cp is not None and abs(cp) > MAX_CP:
        return f"cp {cp}, outside -{MAX_CP}..{MAX_CP}"
    return None


def answer_problem(lines: dict[int, tuple[int, int, int | None, int | None, str]], bestmove: str,
                   legal: Collection[str]) -> str | None:
    """What is wrong with an engine's answer in a position whose legal moves are ``legal``, or ``None``.

    Every line's score and depth must be in range, and the best line's first move and ``bestmove`` legal. A lower
    line that repeats a move or names an illegal one is only left out (`ranked_candidates`): a search that a node
    limit cuts short repeats moves across its lines."""
    if not lines:
        return "no scored line"
    for index in sorted(lines):
        depth, _sel, cp, mate, move = lines[index]
        problem = score_problem(cp, mate)
        if problem is None and not 1 <= depth <= MAX_DEPTH:
            problem = f"depth {depth}"
        if problem is not None:
            return f"line {index} ({move}) has {problem}"
    best = lines[min(lines)][4]
    if best not in legal:
        return f"its best line starts with {best!r}, not a legal move here"
    if bestmove not in legal:
        return f"bestmove {bestmove!r} is not a legal move here"
    return None


def position_after(fen: str, moves: Sequence[str]) -> str:
    """The position of a game from ``fen`` after its ``moves``."""
    for move in moves:
        fen = rules.env_steps([fen], [move])[0].fen
    return fen


def mate_problem(fen: str, candidates: Sequence[Candidate]) -> str | None:
    """What is wrong with the mates in one the candidates claim, the mates the rules check at once, or ``None``: a
    mate in 1 must be a move that mates, a mated-in-1 a move after which the other side has one."""
    for c in candidates:
        if c.mate == 1 and c.move not in rules.mating_moves(fen):
            return f"it scores {c.move} a mate in 1, which does not mate"
        if c.mate == -1 and not rules.mating_moves(position_after(fen, [c.move])):
            return f"it scores {c.move} mated in 1, though no mate in 1 follows it"
    return None
