"""`rookworld uci` driven by real clients: python-chess's chess.engine playing whole games against Stockfish and
between two rookworld engines, Debian's polyglot asking for a move over the xboard protocol, and exact transcripts.
The move choice's last level (the likeliest legal move) is checked against transformers' GPT-2 as the oracle."""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import chess as pychess
import chess.engine
import pytest
import torch

from conftest import REPO, cli
from rookworld.chess import rules as rules
from rookworld.chess.rewards import policy_targets
from rookworld.lm.answers import GREEDY, RookWorldLM, read_policy_answers
from rookworld.lm.moves import BEST, LIKELIEST, ModelMove, choose_moves
from rookworld.lm.uci_protocol import info_lines, parse_go, uci_score

STOCKFISH = shutil.which("stockfish") or "/usr/games/stockfish"
POLYGLOT = shutil.which("polyglot") or "/usr/games/polyglot"
needs_stockfish = pytest.mark.skipif(not os.access(STOCKFISH, os.X_OK), reason="Stockfish is not installed")
SHIPPED = REPO / "models" / "chess-cpu-grpo"
#: python-chess's wait for each engine command: its 10 s default timed out in CI on two loaded cores.
ENGINE_TIMEOUT_S = 120
AFTER_E4 = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"
OPTIONS = ["option name Protocol type combo default greedy var greedy var rookworld",
           "option name Seed type spin default 0 min 0 max 2147483647",
           "option name Device type string default cpu",
           "option name MultiPV type spin default 5 min 1 max 5"]


def uci_argv(model, *extra) -> list[str]:
    """The engine command a GUI would run. The tiny random model writes no answer, so 8 tokens of it are enough."""
    tokens = ["--max-new-tokens", "8"] if Path(model) != SHIPPED else []
    return [sys.executable, "-m", "rookworld", "uci", "--model", str(model), "--device", "cpu", *tokens, *extra]


def likeliest_by_transformers(model_dir, context: str, moves: list[str]) -> tuple[str, dict[str, float]]:
    """The oracle of the third level: each move's log-prob after `context`, from transformers' own GPT-2, one
    sequence at a time."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2LMHeadModel.from_pretrained(model_dir).eval()
    tokenizer = RookWorldLM.load(str(model_dir), device="cpu").tokenizer
    prefix = tokenizer.encode(context, bos=True)
    scores = {}
    for move in moves:
        tail = tokenizer.encode(" " + move)
        with torch.no_grad():
            logp = torch.log_softmax(hf(torch.tensor([prefix + tail])).logits[0].double(), -1)
        scores[move] = sum(logp[len(prefix) - 1 + j, t].item() for j, t in enumerate(tail))
    return max(scores, key=scores.get), scores


class Engine:
    """A real `rookworld uci` process read line by line with timeouts, for what needs timing (infinite, stop)."""

    def __init__(self, argv):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1, cwd=REPO)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def send(self, *lines: str):
        self.proc.stdin.write("".join(line + "\n" for line in lines))
        self.proc.stdin.flush()

    def until(self, prefix: str, timeout: float = 120) -> list[str]:
        """The lines up to and including the first that starts with `prefix`."""
        out, deadline = [], time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            assert line is not None, f"the engine ended before {prefix!r}: {out}, {self.proc.stderr.read()}"
            out.append(line)
            if line.startswith(prefix):
                return out

    def silent_for(self, seconds: float) -> list[str]:
        """Lines that arrive within `seconds` (the caller checks what is absent)."""
        out, deadline = [], time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            out.append(line)
        return out

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


# -- the move choice ------------------------------------------------------------------------------------------------

def test_the_likeliest_legal_move_is_transformers_argmax(tiny_dir):
    """Without a legal B: move, every legal move's tokens are scored in one pass over the shared context; the oracle
    scores them one sequence at a time with transformers' GPT-2: same log-probs, same move."""
    lm = RookWorldLM.load(str(tiny_dir), device="cpu", max_new_tokens=8)
    for fen in (rules.START_FEN, AFTER_E4, "8/P6k/8/8/8/8/6K1/8 w - - 0 1"):
        (answer,) = lm.policy([fen])
        assert "B:" not in answer.text  # the random model writes no answer: the context is the prompt and "B:"
        legal = [m.uci() for m in pychess.Board(fen).legal_moves]
        context = f"P: {fen} B:"
        expected, scores = likeliest_by_transformers(tiny_dir, context, legal)
        ours = lm.continuation_logprobs(context, [" " + m for m in legal])
        assert ours == pytest.approx([scores[m] for m in legal], abs=1e-4)
        (chosen,) = choose_moves(lm, [fen])
        assert (chosen.move, chosen.source) == (expected, LIKELIEST)
        assert chosen.logprob == pytest.approx(scores[expected], abs=1e-4)
        assert chosen.note == f"its answer has no best move; played the legal move it finds most probable at its B:, " \
                              f"{expected}"


class Scripted(RookWorldLM):
    """The tiny model with its P: answers written by the test: the rule is then checked on answers whose right move
    is known, while the likeliest legal move is still scored with the real model."""

    def __init__(self, lm, answers: dict[str, str]):
        super().__init__(lm.model, lm.tokenizer, max_new_tokens=8)
        self.answers = answers

    def policy(self, fens, *, decoding=GREEDY, seed=0, progress=None):
        return read_policy_answers([self.answers[f] for f in fens])


def test_its_own_legal_b_move_else_its_likeliest_legal_move_never_its_candidates(tiny_dir):
    """One rule: the B: move when legal; otherwise the legal move the model finds most probable at its B: slot (as
    transformers' GPT-2 scores each one), even where a candidate of its M: list is legal: the list is no guide."""
    lm = RookWorldLM.load(str(tiny_dir), device="cpu")
    legal_b, illegal_b, none_legal = rules.START_FEN, AFTER_E4, "8/P6k/8/8/8/8/6K1/8 w - - 0 1"
    text = {legal_b: policy_targets([legal_b], [["e2e4", "d2d4"]], [[0.3, 0.2]], ["d2d4"])[0],
            illegal_b: policy_targets([illegal_b], [["e2e5", "a1a2", "c7c5"]], [[1.0, 0.5, 0.1]], ["e2e5"])[0],
            none_legal: policy_targets([none_legal], [["a7a8", "h1h2"]], [[9.0, 0.0]], ["a7a8"])[0]}
    scripted = Scripted(lm, text)
    best, overruled, likeliest = choose_moves(scripted, [legal_b, illegal_b, none_legal])
    assert (best.move, best.source, best.note) == ("d2d4", BEST, None)
    for fen, chosen in ((illegal_b, overruled), (none_legal, likeliest)):  # e2e5 and a7a8 are no moves here
        context = f"P: {fen}" + text[fen][: text[fen].index("B:")] + "B:"
        legal = [m.uci() for m in pychess.Board(fen).legal_moves]
        expected, scores = likeliest_by_transformers(tiny_dir, context, legal)
        assert (chosen.move, chosen.source) == (expected, LIKELIEST)
        assert chosen.logprob == pytest.approx(scores[expected], abs=1e-4)
        assert chosen.note == f"its best move {text[fen].split('B: ')[1].split()[0]!r} is illegal; played the legal " \
                              f"move it finds most probable at its B:, {expected}"
    # searchmoves: only the allowed moves count, the B: move among them or not
    (restricted,) = choose_moves(scripted, [legal_b], allowed=[["e2e4", "g1f3"]])
    context = f"P: {legal_b}" + text[legal_b][: text[legal_b].index("B:")] + "B:"
    assert (restricted.move, restricted.source) == (likeliest_by_transformers(tiny_dir, context, ["e2e4", "g1f3"])[0],
                                                    LIKELIEST)


def test_scores_as_python_chess_reads_them():
    for n in (1, 3, 12, 250):  # mate in n as the data writes it, back to UCI's mate
        pawns = chess.engine.Mate(n).score(mate_score=100_000) / 100
        assert uci_score(pawns) == f"mate {n}" and uci_score(-pawns) == f"mate {-n}"
    assert uci_score(999.97) == "mate 3" and uci_score(-999.97) == "mate -3"
    assert [uci_score(p) for p in (0.35, -2.3, 0.0, -0.0, 4.75)] == ["cp 35", "cp -230", "cp 0", "cp 0", "cp 475"]
    text = policy_targets([AFTER_E4], [["e7e5", "e2e5", "c7c5", "g8f6", "c7c5"]],
                          [[0.1, 3.0, -0.25, 999.98, 0.5]], ["c7c5"])[0]
    (answer,) = read_policy_answers([text])
    chosen = ModelMove("c7c5", BEST, answer)
    # the played move first, with its own eval; the illegal candidate left out; the rest best first
    assert info_lines(AFTER_E4, chosen) == ["info multipv 1 score cp -25 pv c7c5",
                                            "info multipv 2 score mate 2 pv g8f6",
                                            "info multipv 3 score cp 10 pv e7e5"]
    assert info_lines(AFTER_E4, chosen, multipv=1) == ["info multipv 1 score cp -25 pv c7c5"]


def test_go_parameters_are_read_and_checked():
    go, problems = parse_go("wtime 300000 btime -20 winc 2000 binc 2000 movestogo 40".split())
    assert go.limits == {"wtime": 300000, "btime": -20, "winc": 2000, "binc": 2000, "movestogo": 40} and not problems
    go, problems = parse_go("searchmoves e2e4 d2d4 infinite".split())
    assert go.searchmoves == ("e2e4", "d2d4") and go.infinite and go.waits and not problems
    go, problems = parse_go("depth x movetime -5 nodes 10 sideways ponder mate".split())
    assert go.limits == {"nodes": 10} and go.ponder
    assert problems == ["depth needs a whole number, got 'x'", "movetime must not be negative, got -5",
                        "unknown parameter 'sideways'", "mate needs a whole number, got nothing"]


# -- transcripts ----------------------------------------------------------------------------------------------------

def test_transcript_of_uci_isready_position_go(tiny_dir):
    """The exact lines of a session, from a real process: the handshake, then the model's move for the position
    after 1. e4 with the info lines saying how it was chosen; a line that is not even text is ignored."""
    expected, _ = likeliest_by_transformers(tiny_dir, f"P: {AFTER_E4} B:",
                                            [m.uci() for m in pychess.Board(AFTER_E4).legal_moves])
    session = b"uci\n\xff\xfe not UTF-8\nisready\nposition startpos moves e2e4\ngo movetime 10000\n"
    # quit once the bestmove is out, as a GUI does: piped in at once, it would give a search slowed by a loaded
    # machine only QUIT_WAIT_S to answer.
    lines, code, err = session_until_bestmove(uci_argv(tiny_dir), session)
    assert code == 0, err
    assert lines == [
        f"id name rookworld {tiny_dir}", "id author rookworld", *OPTIONS, "uciok", "readyok",
        f"info multipv 1 pv {expected}",
        "info string the model: its answer has no best move; played the legal move it finds most probable at its "
        f"B:, {expected}; this game: B: move 0, likeliest legal move 1",
        f"bestmove {expected}"]


def session_until_bestmove(argv: list[str], session: bytes) -> tuple[list[str], int, str]:
    """(the engine's lines, its exit code, its stderr) for `session`, then `quit` once it said its bestmove; the
    engine is killed after 300 s."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    timer = threading.Timer(300, proc.kill)
    timer.start()
    try:
        proc.stdin.write(session)
        proc.stdin.flush()
        lines = []
        while not lines or not lines[-1].startswith("bestmove"):
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.decode().rstrip("\n"))
        rest, err = proc.communicate(b"quit\n", timeout=300)
    finally:
        timer.cancel()
    return lines + rest.decode().splitlines(), proc.returncode, err.decode()


def test_bad_input_is_an_info_string_never_a_crash(tiny_dir):
    """Malformed position and go lines, unknown commands and options, a finished game, and the end of the input
    without quit: each answered or ignored, the engine exits 0."""
    lines = ["hello there", "uci", "debug on", "isready",
             "position", "go",                                     # no position given: nothing to play
             "position startpos moves e2e4 e7e5 e1e3", "go",        # an illegal move in the history
             "position fen 8/8/8/8/8/8/8/8 w - - 0 1", "go",        # no kings
             "position fen 7k/5Q2/6K1/8/8/8/8/8 b - - 0 1", "go",   # stalemate: no legal move
             "position startpos", "go wtime abc nodes -3 bogus",  # bad go parameters: said, and the move played
             "setoption name Threads value 4", "setoption name MultiPV value 0", "setoption name Protocol value hot",
             "setoption name Device value gpu", "setoption", "xyzzy position startpos moves g1f3", "go depth 1",
             "register later", "ponderhit", "stop"]
    proc = cli(*uci_argv(tiny_dir)[3:], input="\n".join(lines) + "\n")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    out = proc.stdout.splitlines()
    assert out[out.index("uciok") + 1] == "readyok"
    said = [line for line in out if line.startswith("info string")]
    assert said[:2] == ["info string position needs 'startpos' or 'fen FEN' first; no position until a good one",
                        "info string no position to play: the last position line was malformed"]
    assert "info string move 3 of the moves, 'e1e3', is not legal in " \
           "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2; no position until a good one" in said
    assert any("bad FEN '8/8/8/8/8/8/8/8 w - - 0 1'" in s and "missing king" in s for s in said)
    assert "info string no legal move: the game is over" in said
    assert "info string go: wtime needs a whole number, got 'abc'; nodes must not be negative, got -3; unknown " \
           "parameter 'bogus' (ignored)" in said
    assert "info string no option 'Threads': the options are Protocol, Seed, Device, MultiPV" in said
    assert "info string MultiPV must lie in 1..5, got 0; MultiPV stays 5" in said
    assert "info string Protocol must be one of greedy, rookworld, got 'hot'; Protocol stays greedy" in said
    assert any(s.startswith("info string Device must be cpu, cuda, cuda:N or auto, got 'gpu'") for s in said)
    assert "info string setoption needs 'name NAME [value VALUE]'" in said
    best = [line.split()[1] for line in out if line.startswith("bestmove")]
    assert best[:4] == ["0000", "0000", "0000", "(none)"] and len(best) == 6
    assert pychess.Move.from_uci(best[4]) in pychess.Board().legal_moves
    after_nf3 = pychess.Board()
    after_nf3.push_uci("g1f3")  # the words before a command were skipped, the command read
    assert pychess.Move.from_uci(best[5]) in after_nf3.legal_moves


@pytest.mark.slow
def test_go_infinite_waits_for_stop_and_reads_meanwhile(tiny_dir):
    engine = Engine(uci_argv(tiny_dir))
    try:
        engine.send("uci")
        engine.until("uciok")
        engine.send("isready")
        engine.until("readyok")
        engine.send("position startpos", "go infinite")
        thinking = engine.until("info string")  # the model's answer is shown at once...
        assert any(line.startswith("info multipv 1 pv ") for line in thinking)
        engine.send("isready")
        assert engine.until("readyok", timeout=30)[-1] == "readyok"  # ...while the search waits
        assert not any(line.startswith("bestmove") for line in engine.silent_for(1.0))  # ...for stop
        engine.send("stop")
        move = engine.until("bestmove")[-1].split()[1]
        assert pychess.Move.from_uci(move) in pychess.Board().legal_moves
        engine.send("go ponder")
        engine.until("info string")
        engine.send("ponderhit")
        engine.until("bestmove")
        engine.send("go infinite")
        engine.until("info string")
        engine.send("quit")  # quit ends a waiting search too
        assert engine.proc.wait(timeout=60) == 0
    finally:
        engine.close()


@pytest.mark.slow
def test_options_are_set_and_their_defaults_come_from_the_flags(tmp_path):
    """The shipped model writes real answers: MultiPV cuts the lines; a seed gives the same sampled answer again;
    a device that is not here is refused and the model stays where it is."""
    argv = uci_argv(SHIPPED, "--protocol", "rookworld", "--seed", "7")
    go = "go movetime 10000"  # time enough for the model's own answer
    session = ["uci", "isready", "position startpos moves e2e4", go, "setoption name multipv value 1", go,
               "setoption name Seed value 8", "setoption name Seed value 7", go]
    if not torch.cuda.is_available():
        session += ["setoption name Device value cuda", "isready"]
    proc = subprocess.run(argv, input="\n".join(session) + "\nquit\n", capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert "option name Protocol type combo default rookworld var greedy var rookworld" in out
    assert "option name Seed type spin default 7 min 0 max 2147483647" in out
    searches, current = [], []
    for line in out:
        if line.startswith("info multipv") or line.startswith("bestmove"):
            current.append(line)
        if line.startswith("bestmove"):
            searches.append(current)
            current = []
    first, one_line, again = searches
    assert [line.split()[2] for line in first if line.startswith("info multipv")] == \
        [str(k) for k in range(1, len(first))]
    assert one_line == first[:1] + first[-1:]  # the same seed and position: the same answer, one line of it
    assert again == one_line
    if not torch.cuda.is_available():
        assert any(line.startswith("info string cannot load the model on cuda: ") and line.endswith("it runs on cpu")
                   for line in out)
        assert out[-1] == "readyok"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has the device")
def test_a_device_that_is_not_here_is_said_and_the_model_runs_on_the_commands(tiny_dir):
    proc = cli(*uci_argv(tiny_dir)[3:], input="setoption name Device value cuda\nisready\nposition startpos\ngo\nstop\n")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0].startswith("info string cannot load the model on cuda: ") and out[0].endswith("; it runs on cpu")
    assert out[1] == "readyok" and pychess.Move.from_uci(out[-1].split()[1]) in pychess.Board().legal_moves


@pytest.mark.slow
@pytest.mark.skipif(not SHIPPED.is_dir(), reason="the shipped model is not in this checkout")
def test_python_chess_reads_the_models_candidates_as_multipv_lines():
    """The shipped model's P: answer, as python-chess's analysis of the engine shows it: one PV per legal candidate,
    the played move first, each with the answer's own eval in centipawns."""
    lm = RookWorldLM.load(str(SHIPPED), device="cpu")
    board = pychess.Board(AFTER_E4)
    (answer,) = lm.policy([AFTER_E4])
    (chosen,) = choose_moves(lm, [AFTER_E4])
    with chess.engine.SimpleEngine.popen_uci(uci_argv(SHIPPED), cwd=REPO, timeout=ENGINE_TIMEOUT_S) as engine:
        infos = engine.analyse(board, chess.engine.Limit(time=10), multipv=5)  # within its time: whole
    legal = {m.uci() for m in board.legal_moves}
    evals = {}
    for move, pawns in zip(answer.moves, answer.evals):
        if move in legal:
            evals.setdefault(move, pawns)
    assert infos[0]["pv"][0].uci() == chosen.move
    assert {i["pv"][0].uci() for i in infos} == set(evals) | {chosen.move}
    for info in infos:
        pawns = evals.get(info["pv"][0].uci())
        if pawns is not None:
            assert info["score"].relative == chess.engine.Cp(round(100 * pawns))


# -- real clients ---------------------------------------------------------------------------------------------------

def play_out(board: pychess.Board, white, black, limit, max_plies: int = 600) -> pychess.Outcome:
    while not board.is_game_over() and board.ply() < max_plies:
        result = (white if board.turn == pychess.WHITE else black).play(board, limit)
        assert result.move in board.legal_moves, (board.fen(), result.move)
        board.push(result.move)
    outcome = board.outcome()
    assert outcome is not None, f"no end by the rules in {max_plies} plies"
    return outcome


@pytest.mark.slow
@needs_stockfish
def test_python_chess_plays_a_whole_game_against_stockfish(tiny_dir):
    with chess.engine.SimpleEngine.popen_uci(uci_argv(tiny_dir), cwd=REPO, timeout=ENGINE_TIMEOUT_S) as model, \
            chess.engine.SimpleEngine.popen_uci(STOCKFISH) as stockfish:
        assert model.id["name"] == f"rookworld {tiny_dir}"
        stockfish.configure({"Threads": 1, "Hash": 16})
        for model_white in (True, False):
            board = pychess.Board()
            outcome = play_out(board, *((model, stockfish) if model_white else (stockfish, model)),
                               chess.engine.Limit(nodes=2000, time=1))
            assert outcome.termination == pychess.Termination.CHECKMATE and outcome.winner == (not model_white)


@pytest.mark.slow
def test_two_rookworld_engines_play_a_whole_game(tiny_dir):
    with chess.engine.SimpleEngine.popen_uci(uci_argv(tiny_dir), cwd=REPO, timeout=ENGINE_TIMEOUT_S) as white, \
            chess.engine.SimpleEngine.popen_uci(uci_argv(tiny_dir, "--protocol", "rookworld"), cwd=REPO,
                                                 timeout=ENGINE_TIMEOUT_S) as black:
        board = pychess.Board()
        outcome = play_out(board, white, black, chess.engine.Limit(white_clock=60, black_clock=60, white_inc=1,
                                                                  black_inc=1))
        assert board.ply() > 10 and outcome.termination in set(pychess.Termination)


@pytest.mark.skipif(not os.access(POLYGLOT, os.X_OK), reason="polyglot is not installed")
def test_polyglot_gets_a_move_over_the_xboard_protocol(tiny_dir, tmp_path):
    """Debian's polyglot, the adapter xboard runs UCI engines through: xboard in, the model's move out."""
    ini = tmp_path / "rookworld.ini"
    ini.write_text(f"[PolyGlot]\nEngineDir = {REPO}\nEngineCommand = {' '.join(uci_argv(tiny_dir))}\nBook = false\n"
                   "[Engine]\n")
    adapter = Engine([POLYGLOT, str(ini)])
    try:
        adapter.send("xboard", "protover 2")
        features = adapter.until("feature done=1")
        # the engine's id name, which polyglot shortens (at the first '-' of the model's path)
        assert any(f.startswith('feature myname="rookworld ') for f in features)
        assert 'feature option="MultiPV -spin 5 1 5"' in features
        adapter.send("new", "usermove e2e4")
        move = adapter.until("move ")[-1].split()[1]
        assert pychess.Move.from_uci(move) in pychess.Board(AFTER_E4).legal_moves
        adapter.send("quit")
        assert adapter.proc.wait(timeout=60) == 0
    finally:
        adapter.close()


def test_a_line_without_end_and_counters_at_their_limit_are_answered_and_the_game_goes_on(tiny_dir):
    """Three megabytes without a newline are read past, not held, and said in one short info string; a game set up
    at the largest fullmove number a FEN may give is played on (one near 2^32 was taken, and its position a few moves
    later refused with a ValueError traceback)."""
    near_end = "position fen 7k/8/8/8/8/8/8/K7 w - - 0 1000000 moves a1a2 h8h7 a2a1 h7h8 a1a2"
    proc = subprocess.Popen(uci_argv(tiny_dir), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    feed = "uci\n" + "x" * 3_000_000 + "\nisready\n" + near_end + "\ngo\nisready\nquit\n"
    out, err = proc.communicate(feed, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in err, err
    said = [line for line in out.splitlines() if line.startswith("info string")]
    assert said[0] == f"info string a line over 1,048,576 characters, ignored: '{'x' * 80}...'", said
    assert not [s for s in said[1:] if "FEN" in s or "line" in s], said  # the rest: the random model's fall-back
    best = [line.split()[1] for line in out.splitlines() if line.startswith("bestmove")]
    board = pychess.Board("7k/8/8/8/8/8/8/K7 w - - 0 1000000")
    for move in near_end.split()[9:]:
        board.push_uci(move)
    assert len(best) == 1 and pychess.Move.from_uci(best[0]) in board.legal_moves


def test_a_move_s_time_is_its_movetime_or_its_share_of_the_clock():
    """The most an answer may take, from the `go` line: movetime less the margin kept for the answer to travel; else
    a twentieth of the side to move's clock (or movestogo's share) plus half its increment, never past the clock;
    nothing when the search waits for stop or no time is given."""
    from rookworld.lm.uci_protocol import MARGIN_MS

    def budget(line: str, white: bool = True):
        return parse_go(line.split())[0].budget_s(white)

    assert budget("movetime 1000") == pytest.approx((1000 - MARGIN_MS) / 1000)
    assert budget("movetime 1") == 0.0
    assert budget("wtime 60000 btime 30000") == pytest.approx(3.0)
    assert budget("wtime 60000 btime 30000", white=False) == pytest.approx(1.5)
    assert budget("wtime 60000 winc 2000 btime 60000 movestogo 10") == pytest.approx(7.0)
    assert budget("wtime 40 btime 40") == 0.0  # under the margin: answer at once
    assert budget("wtime -500 btime 100") == 0.0  # a flag fallen already
    for waits in ("infinite", "ponder wtime 60000", "depth 5", "nodes 1000", ""):
        assert budget(waits) is None, waits
