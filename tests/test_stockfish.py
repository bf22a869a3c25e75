"""The Stockfish analysis service, against the real engine (and a scripted fake for failure paths)."""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor, wait

import pytest

from rookworld.chess import rules as rchess
from rookworld.chess.stockfish import (
    Analysis,
    Candidate,
    LazyPool,
    Role,
    StockfishError,
    StockfishNotFoundError,
    StockfishPool,
    find_stockfish,
    pool_for,
    pool_workers,
)
from rookworld.chess.stockfish.cache import DiskCache, MemoryCache
from rookworld.chess.stockfish import engine as stockfish_engine
from rookworld.chess.stockfish.engine import Engine, EngineFailure
from rookworld.chess.stockfish.reading import parse_info

try:
    STOCKFISH = find_stockfish()
except StockfishNotFoundError as exc:  # pragma: no cover - depends on the machine
    pytest.skip(f"no Stockfish binary to test against: {exc}", allow_module_level=True)

DEPTH = 8
START = rchess.START_FEN
MATE_IN_ONE = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1"  # Ra8#
MATED_IN_ONE = "7k/8/6K1/8/8/8/8/R7 b - - 0 1"  # Kg8 forced, then Ra8#
BLACK_UP_A_QUEEN = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNB1KBNR b KQkq - 0 1"
WHITE_DOWN_A_QUEEN = "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNB1KBNR w KQkq - 0 2"
STALEMATE = "7k/5Q2/6K1/8/8/8/8/8 b - - 0 1"
CHECKMATE = "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3"  # fool's mate
USUAL_FIRST_MOVES = {"e2e4", "d2d4", "g1f3", "c2c4", "e2e3", "b1c3", "g2g3", "d2d3", "c2c3", "b2b3", "f2f4", "a2a3"}


def positions(n: int, seed: int) -> list[str]:
    fens = list(dict.fromkeys(p.fen for p in rchess.generate_positions(n * 2, seed)))
    return fens[:n]


@pytest.fixture(scope="module")
def pool():
    with StockfishPool(STOCKFISH, workers=2, depth=DEPTH) as p:
        yield p


# ---- locating the binary -----------------------------------------------------------------------


def test_find_stockfish_explicit_and_default(tmp_path):
    assert os.access(STOCKFISH, os.X_OK)
    assert find_stockfish(STOCKFISH) == os.path.abspath(STOCKFISH)
    not_executable = tmp_path / "stockfish"
    not_executable.write_text("")
    with pytest.raises(StockfishNotFoundError, match="not executable"):
        find_stockfish(str(not_executable))


def test_missing_binary_names_the_option_and_how_to_install(tmp_path):
    missing = str(tmp_path / "no" / "stockfish")
    with pytest.raises(StockfishNotFoundError) as info:
        find_stockfish(missing)
    message = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    assert "--stockfish-path" in message and "apt-get install stockfish" in message
    assert "stockfishchess.org" in message and missing in message
    with pytest.raises(StockfishNotFoundError, match="--stockfish-path"):
        StockfishPool(missing)


def test_lookup_order_env_var_then_path_then_games(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no stockfish on PATH
    monkeypatch.setattr(stockfish_engine, "_FALLBACK_PATHS", (str(tmp_path / "games" / "stockfish"),))
    monkeypatch.delenv("ROOKWORLD_STOCKFISH", raising=False)
    with pytest.raises(StockfishNotFoundError, match="--stockfish-path"):
        find_stockfish()
    monkeypatch.setenv("ROOKWORLD_STOCKFISH", STOCKFISH)
    assert find_stockfish() == os.path.abspath(STOCKFISH)
    # The environment variable beats a stockfish on PATH; without it, PATH is used.
    link = tmp_path / "stockfish"
    link.symlink_to(STOCKFISH)
    assert find_stockfish() == os.path.abspath(STOCKFISH)
    monkeypatch.delenv("ROOKWORLD_STOCKFISH")
    assert find_stockfish() == str(link)
    monkeypatch.setenv("ROOKWORLD_STOCKFISH", str(tmp_path / "nope"))
    with pytest.raises(StockfishNotFoundError, match="ROOKWORLD_STOCKFISH"):
        find_stockfish()


def test_a_binary_that_is_no_uci_engine_fails_at_construction():
    with pytest.raises(StockfishError, match="could not start"):
        StockfishPool("/bin/true", workers=1, timeout_s=5)


# ---- scores and serialization ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("candidate", "pawns", "text"),
    [
        (Candidate("e2e4", -230, None), -2.3, "-2.3"),
        (Candidate("e2e4", 0, None), 0.0, "0.0"),
        (Candidate("e2e4", 475, None), 4.75, "4.75"),
        (Candidate("e2e4", 100, None), 1.0, "1.0"),
        (Candidate("a1a8", None, 1), 999.99, "999.99"),
        (Candidate("a1a8", None, 3), 999.97, "999.97"),
        (Candidate("a1a8", None, -3), -999.97, "-999.97"),
        (Candidate("a1a8", None, 0), -1000.0, "-1000.0"),
    ],
)
def test_pawns_and_eval_text(candidate, pawns, text):
    assert candidate.pawns == pawns
    assert candidate.eval_text == text


def test_mate_scores_match_python_chess():
    engine = pytest.importorskip("chess.engine")
    for n in (-12, -3, -1, 0, 1, 2, 7):
        assert Candidate("a1a8", None, n).pawns == engine.Mate(n).score(mate_score=100000) / 100
    for cp in (-1234, -230, -5, 0, 17, 475):
        assert Candidate("e2e4", cp, None).pawns == engine.Cp(cp).score(mate_score=100000) / 100


def test_analysis_json_round_trip():
    a = Analysis(START, (Candidate("e2e4", 30, None), Candidate("d2d4", None, -2)), 10)
    assert Analysis.from_dict(json.loads(json.dumps(a.to_dict()))) == a
    assert a.best_move == "e2e4" and a.moves == ("e2e4", "d2d4") and a.evals == (0.3, -999.98)
    assert a.candidate("d2d4") == Candidate("d2d4", None, -2) and a.candidate("a2a3") is None
    assert Analysis(STALEMATE, (), 0).best_move is None


def test_parse_info_lines():
    parse = parse_info
    line = "info depth 10 seldepth 14 multipv 2 score cp -31 nodes 9000 nps 1 hashfull 3 tbhits 0 time 9 pv d2d4 d7d5"
    assert parse(line) == (2, 10, 14, -31, None, "d2d4")
    assert parse("info depth 3 seldepth 3 multipv 1 score mate -2 nodes 5 pv e8d8 a1a8")[3:] == (None, -2, "e8d8")
    assert parse("info depth 5 multipv 1 score cp 12 wdl 500 400 100 pv g1f3")[:4] == (1, 5, 0, 12)
    assert parse("info depth 4 seldepth 4 multipv 1 score cp 20 lowerbound nodes 1 pv e2e4") is None
    assert parse("info depth 4 seldepth 4 multipv 1 score cp 20 upperbound nodes 1 pv e2e4") is None
    assert parse("info string NNUE evaluation using nn-ad9b42354671.nnue enabled") is None
    assert parse("info depth 12 currmove e2e4 currmovenumber 1") is None
    assert parse("info depth 1 seldepth 1 multipv 1 score cp 20 nodes 20") is None  # no pv
    assert parse("bestmove e2e4 ponder e7e5") is None


# ---- real analyses -----------------------------------------------------------------------------


def test_mate_in_one(pool):
    (a,) = pool.analyse([MATE_IN_ONE])
    best = a.candidates[0]
    assert a.best_move == "a1a8" and best.mate == 1 and best.cp is None
    assert best.pawns == 999.99 and best.eval_text == "999.99"
    assert a.depth >= 1


def test_being_mated_is_negative(pool):
    (a,) = pool.analyse([MATED_IN_ONE])
    assert a.moves == ("h8g8",)  # the only legal move: one candidate, not five
    assert a.candidates[0].mate == -1 and a.candidates[0].pawns == -999.99


def test_start_position(pool):
    (a,) = pool.analyse([START])
    assert a.fen == START and a.depth == DEPTH
    assert a.best_move in USUAL_FIRST_MOVES
    assert len(a.candidates) == 5 and len(set(a.moves)) == 5
    assert set(a.moves) <= set(rchess.legal_moves(START))
    assert all(c.cp is not None and abs(c.cp) < 150 for c in a.candidates)


def test_candidates_are_legal_per_python_chess(pool):
    chess = pytest.importorskip("chess")
    fens = positions(12, seed=5)
    for fen, a in zip(fens, pool.analyse(fens)):
        board = chess.Board(fen)
        legal = {m.uci() for m in board.legal_moves}
        assert a.fen == board.fen()
        assert len(a.candidates) == min(5, len(legal))
        assert len(set(a.moves)) == len(a.moves) and set(a.moves) <= legal


def test_evals_are_from_the_side_to_move(pool):
    black, white = pool.analyse([BLACK_UP_A_QUEEN, WHITE_DOWN_A_QUEEN])
    assert black.candidates[0].pawns > 5  # Black to move, a queen up
    assert white.candidates[0].pawns < -5  # White to move, a queen down
    assert all(float(c.eval_text) > 3 for c in black.candidates)


def test_no_legal_moves_skip_the_engine(pool):
    before = pool.stats
    futures = pool.submit([STALEMATE, CHECKMATE])
    assert all(f.done() for f in futures)  # answered at once, no engine involved
    stalemate, mate = (f.result() for f in futures)
    assert stalemate == Analysis(STALEMATE, (), 0) and mate == Analysis(CHECKMATE, (), 0)
    assert stalemate.best_move is None
    after = pool.stats
    assert after.engine_analyses == before.engine_analyses
    assert after.no_legal_moves == before.no_legal_moves + 2


def test_cache_hits_skip_the_engine(pool):
    fen = positions(1, seed=11)[0]
    (first,) = pool.analyse([fen])
    before = pool.stats
    (again,) = pool.analyse([fen])
    after = pool.stats
    assert again is first
    assert after.engine_analyses == before.engine_analyses and after.restarts == before.restarts
    assert after.cache_hits == before.cache_hits + 1
    assert pool.cached(fen) is first


def test_equivalent_fens_share_the_cache(pool):
    # the en-passant square is dropped when no capture is possible: same position, same key
    raw = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1"
    norm = rchess.normalize_fen(raw)
    assert norm != raw
    a, b = pool.analyse([raw, norm])
    assert a is b and a.fen == norm


def test_duplicates_in_flight_are_analysed_once(pool):
    fens = [f for f in positions(12, seed=12) if pool.cached(f) is None][:3]
    assert len(fens) == 3
    before = pool.stats
    futures = pool.submit(fens + fens[::-1] + fens)
    results = [f.result() for f in futures]
    after = pool.stats
    assert after.engine_analyses - before.engine_analyses == 3
    assert after.deduplicated - before.deduplicated + after.cache_hits - before.cache_hits == 6
    assert results[0] is results[5] is results[6]


def test_analysis_is_deterministic_across_pools(pool):
    fens = positions(4, seed=13)
    ours = pool.analyse(fens)
    with StockfishPool(STOCKFISH, workers=1, depth=DEPTH) as other:
        assert other.analyse(fens[::-1]) == ours[::-1]


def test_bad_fen_raises_from_its_future_only(pool):
    bad = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR x KQkq - 0 1"
    kings_missing = "8/8/8/8/8/8/8/8 w - - 0 1"
    before = pool.stats
    futures = pool.submit([START, bad, kings_missing, MATE_IN_ONE])
    with pytest.raises(ValueError, match="bad FEN") as info:
        futures[1].result()
    assert bad in str(info.value)
    with pytest.raises(ValueError, match="8/8/8/8/8/8/8/8"):
        futures[2].result()
    assert futures[0].result().best_move in USUAL_FIRST_MOVES
    assert futures[3].result().best_move == "a1a8"
    assert pool.stats.errors == before.errors + 2
    with pytest.raises(TypeError):
        pool.submit([None])


def test_submit_returns_before_the_analysis():
    with StockfishPool(STOCKFISH, workers=1, depth=14) as deep:
        fens = positions(6, seed=14)
        t0 = time.perf_counter()
        futures = deep.submit(fens)
        elapsed = time.perf_counter() - t0
        assert elapsed < 0.5
        assert not all(f.done() for f in futures)
        assert deep.pending >= 1
        deep.close(cancel_pending=True)
        done, not_done = wait(futures, timeout=30)
        assert not not_done
        assert any(f.cancelled() for f in futures)
        with pytest.raises(RuntimeError, match="closed"):
            deep.submit([START])


def test_nodes_limit():
    with StockfishPool(STOCKFISH, workers=1, nodes=3000) as p:
        assert p.search.go == "go nodes 3000" and p.depth is None
        (a,) = p.analyse([MATE_IN_ONE])
        assert a.best_move == "a1a8" and a.candidates[0].mate == 1


def test_disk_cache_persists_across_pools(tmp_path):
    db = tmp_path / "cache" / "stockfish.sqlite"
    fens = positions(3, seed=21)
    with StockfishPool(STOCKFISH, workers=1, depth=6, cache_path=db) as first:
        results = first.analyse(fens)
        assert first.stats.engine_analyses == 3
    assert db.exists()
    with StockfishPool(STOCKFISH, workers=1, depth=6, cache_path=db) as second:
        again = second.analyse(fens)
        stats = second.stats
        assert again == results
        assert stats.engine_analyses == 0 and stats.disk_hits == 3 and stats.cache_hits == 3
        assert second.cached(fens[0]) == results[0]
    with StockfishPool(STOCKFISH, workers=1, depth=7, cache_path=db) as deeper:  # other limits: other key
        assert deeper.cached(fens[0]) is None
        deeper.analyse(fens[:1])
        assert deeper.stats.engine_analyses == 1 and deeper.stats.disk_hits == 0


# ---- robustness --------------------------------------------------------------------------------


def test_killed_engine_is_restarted_and_nothing_is_lost():
    fens = positions(40, seed=31)
    with StockfishPool(STOCKFISH, workers=1, depth=DEPTH) as p:
        (pid,) = p.engine_pids()
        futures = p.submit(fens)
        futures[0].result(timeout=30)
        os.kill(pid, signal.SIGKILL)
        results = [f.result(timeout=60) for f in futures]
        stats = p.stats
        assert len(results) == len(fens) and all(r.candidates for r in results)
        assert [r.fen for r in results] == [rchess.normalize_fen(f) for f in fens]
        assert stats.restarts >= 1 and stats.errors == 0 and stats.engine_analyses == len(fens)
        assert p.engine_pids() != [pid]


def test_hung_engine_is_killed_and_restarted():
    fens = positions(12, seed=32)
    with StockfishPool(STOCKFISH, workers=1, depth=6, timeout_s=1.0) as p:
        (pid,) = p.engine_pids()
        futures = p.submit(fens)
        futures[0].result(timeout=30)
        os.kill(pid, signal.SIGSTOP)  # alive but silent
        try:
            results = [f.result(timeout=60) for f in futures]
        finally:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        stats = p.stats
        assert all(r.candidates for r in results)
        assert stats.timeouts >= 1 and stats.restarts >= 1 and stats.errors == 0
        assert pid not in p.engine_pids()


def test_parsing_keeps_the_deepest_legal_distinct_lines(fake_engine):
    with StockfishPool(fake_engine, workers=1, depth=2) as p:
        (a,) = p.analyse([START])
    assert a == Analysis(START, (Candidate("e2e4", 20, None), Candidate("g1f3", None, -3)), 2)


def test_a_position_that_always_kills_the_engine_fails_alone(fake_engine):
    other = "rnbqkbnr/pppp1ppp/8/4p3/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 2"  # where the fake's e2e4 is legal
    with StockfishPool(fake_engine, workers=1, depth=2, retries=2) as p:
        futures = p.submit([START, MATE_IN_ONE, other])
        with pytest.raises(StockfishError, match="3 times"):
            futures[1].result(timeout=30)
        assert futures[0].result().best_move == "e2e4"
        assert futures[2].result().fen == other
        stats = p.stats
        assert stats.restarts == 3 and stats.errors == 1 and stats.engine_analyses == 2
        assert p.cached(MATE_IN_ONE) is None  # failures are not cached
        later = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 5"
        assert p.analyse([later])[0].best_move == "e2e4"  # the pool goes on


def test_a_position_that_always_hangs_times_out(fake_engine):
    with StockfishPool(fake_engine, workers=1, depth=2, timeout_s=0.3, retries=1) as p:
        futures = p.submit([MATED_IN_ONE, START])
        with pytest.raises(StockfishError, match="2 times"):
            futures[0].result(timeout=30)
        assert futures[1].result().best_move == "e2e4"
        assert p.stats.timeouts == 2 and p.stats.restarts == 2


# -- the pieces on their own -------------------------------------------------------------------------------------

def test_one_engine_analyses_and_fails_cleanly_when_killed():
    engine = Engine(STOCKFISH, {"Threads": 1, "Hash": 16, "MultiPV": 3}, startup_timeout=30)
    try:
        lines = engine.analyse(START, "go depth 6", timeout=30)
        assert sorted(lines) == [1, 2, 3]
        assert all(depth == 6 and move in rchess.legal_moves(START) for depth, _, _, _, move in lines.values())
        engine.kill()
        assert not engine.alive()
        with pytest.raises(EngineFailure):
            engine.analyse(START, "go depth 6", timeout=5)
    finally:
        engine.kill()


def test_memory_cache_keeps_the_most_recently_used():
    cache = MemoryCache(max_entries=2)
    a, b, c = (Analysis(f"fen{i}", (Candidate("e2e4", i, None),), 1) for i in range(3))
    cache.put(("a",), a)
    cache.put(("b",), b)
    assert cache.get(("a",)) is a  # now the most recent
    cache.put(("c",), c)
    assert ("b",) not in cache and cache.get(("a",)) is a and cache.get(("c",)) is c and len(cache) == 2


def test_disk_cache_survives_reopening_and_ignores_a_corrupt_row(tmp_path):
    path = tmp_path / "sub" / "cache.sqlite"
    key = (START, 8, None, 5)
    analysis = Analysis(START, (Candidate("e2e4", 30, None), Candidate("d2d4", None, 3)), 8)
    first = DiskCache(path)
    first.put(key, analysis)
    first.close()
    second = DiskCache(path)
    assert second.get_many([key, (START, 9, None, 5)]) == {key: analysis} and len(second) == 1
    second.close()
    import sqlite3

    with sqlite3.connect(path) as db:  # another process writing garbage into the file
        db.execute("UPDATE analyses SET result = 'not json'")
    third = DiskCache(path)
    assert third.get_many([key]) == {}
    third.close()


def test_a_lazy_pool_starts_one_pool_for_every_thread_and_none_after_its_last_close():
    """Eight threads ask at once: one pool, one set of engines; close ends it, a later get starts another unless the
    close was final."""
    lazy = LazyPool(Role.ANALYSIS, workers=1, depth=2)
    assert not lazy.started
    with ThreadPoolExecutor(8) as ex:
        pools = list(ex.map(lambda _: lazy.get(), range(8)))
    assert len({id(p) for p in pools}) == 1 and lazy.started
    assert pools[0].analyse([rchess.START_FEN])[0].candidates
    lazy.close()
    assert not lazy.started and lazy.get() is not pools[0]
    lazy.close(final=True)
    with pytest.raises(StockfishError, match="closed"):
        lazy.get()


def test_one_rule_decides_how_many_engines_a_pool_runs():
    """pool_workers: as many as asked; one for a game; one a core otherwise, but a GRPO run's rewards beside a GPU
    leave the core that drives it (never fewer than one); and pool_for builds pools by it."""
    assert pool_workers(Role.ANALYSIS, 3, cores=16) == 3 and pool_workers(Role.GAME, 2) == 2
    assert pool_workers(Role.GAME, cores=16) == 1
    assert pool_workers(Role.REWARDS, cores=16, beside_gpu=True) == 15
    assert pool_workers(Role.REWARDS, cores=16) == 16 and pool_workers(Role.ANALYSIS, cores=16, beside_gpu=True) == 16
    assert pool_workers(Role.REWARDS, cores=1, beside_gpu=True) == 1
    with pool_for(Role.GAME, depth=2) as pool:
        assert pool.workers == 1 and pool.analyse([rchess.START_FEN])[0].candidates


def test_a_stockfish_path_is_quoted_back_cut_whether_a_flag_or_the_environment_gave_it(monkeypatch):
    """--stockfish-path and ROOKWORLD_STOCKFISH were quoted back whole: a 100 KB line (issue 71). A name is said
    whole up to PATH_MAX (4,096), the longest the system opens."""
    from rookworld.chess.stockfish import StockfishNotFoundError

    long = "/no/such/" + "x" * 100_000
    with pytest.raises(StockfishNotFoundError) as given:
        find_stockfish(long)
    monkeypatch.setenv("ROOKWORLD_STOCKFISH", long)
    with pytest.raises(StockfishNotFoundError) as named:
        find_stockfish()
    for e in (given, named):
        assert len(str(e.value)) < 4096 + 600 and "'/no/such/xxx" in str(e.value) and "xxx...'" in str(e.value)


def test_the_eval_command_a_run_suggests_names_each_suite_once():
    """A setting of 50,000 repeated suites was taken (each suite runs once) and printed back whole (issue 71)."""
    from rookworld.harness.runlog import eval_command

    command = eval_command("runs/x", {"eval_suites": ",".join(["best-move", "selfplay"] * 25_000), "eval_games": 4})
    assert command == "rookworld eval --model runs/x --suite best-move,selfplay --games 4"
