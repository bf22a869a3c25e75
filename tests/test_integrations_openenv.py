"""rookworld's chess as an OpenEnv server (rookworld.integrations.openenv, `rookworld serve`, issue 46), tested as
its users meet it: a real server on localhost, OpenEnv's own client, real Stockfish. Whole games, several sessions
at once; single-turn P: and A: tasks scored as rookworld's scorer scores them; bad actions and bad requests
answered as penalties or errors while the server goes on serving; engines ended with their sessions and at
shutdown; `rookworld serve` itself started, used and stopped with SIGTERM. And what the server promises whoever
reaches its port (issue 58, docs/reliability.md): no HTTP request makes or reaches a session, an idle WebSocket
loses its place, input is quoted back cut, requests have a size limit, the opponent's move a time limit, and clients
that vanish mid-step or a step stuck at shutdown are one line each in the log."""

from __future__ import annotations

import json
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import chess as pychess
import pytest

pytest.importorskip("openenv")

import uvicorn  # noqa: E402  (an OpenEnv dependency)
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect as ws_connect  # noqa: E402

from rookworld.chess import rules  # noqa: E402
from rookworld.chess.rewards import RewardScorer, policy_targets  # noqa: E402
from rookworld.integrations.openenv import (MAX_REQUEST_BYTES, ChessAction, ChessEngines,  # noqa: E402
                                            ChessEnvClient, create_chess_app)

from conftest import REPO  # noqa: E402
from test_layers import graph  # noqa: E402
from test_trust_engine import GOOD, fake_engine  # noqa: E402

MATE_IN_ONE = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1"  # Ra8# (a1a8)
KQK = "8/8/4k3/8/8/3QK3/8/8 w - - 0 1"
SESSIONS = 3
#: Bound on every wait for a server: to come up, to end a session's engines, to stop.
WAIT_S = 60
#: Bound on `rookworld serve`'s start: importing OpenEnv (gradio) and torch takes 30 s on a loaded 2-core machine.
START_S = 180


def stockfish_children(pid: int) -> set[int]:
    """The Stockfish processes `pid` started (read from /proc: the pid and the parent of each process)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if rest[0] != "Z" and int(rest[1]) == pid and "stockfish" in name:
            found.add(int(entry))
    return found


def wait_until(condition, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"gave up after {timeout:.0f} s waiting for {what}")


class Server:
    """A server in this process on a free port: its URL, its engines, and the Stockfish processes it runs."""

    def __init__(self, max_sessions: int, idle_s: float = 300, first_message_s: float = 10, **engine_options):
        self.before = stockfish_children(os.getpid())  # other tests' engines, if any are left
        self.engines = ChessEngines(**dict(stockfish_depth=4, stockfish_workers=1, opponent_skill=0,
                                           opponent_nodes=200) | engine_options)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.ws = self.url.replace("http", "ws") + "/ws"
        app = create_chess_app(self.engines, max_sessions=max_sessions, idle_s=idle_s, first_message_s=first_message_s)
        self.runner = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=10))
        self.thread = threading.Thread(target=self.runner.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        wait_until(lambda: self.runner.started, "the server to start")

    def stockfish(self) -> set[int]:
        return stockfish_children(os.getpid()) - self.before

    def stop(self) -> None:
        self.runner.should_exit = True
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive()
        assert self.stockfish() == set()  # the shutdown ended every engine


@pytest.fixture(scope="module")
def server():
    running = Server(max_sessions=SESSIONS)
    yield running
    running.stop()


def client(url: str):
    return ChessEnvClient(base_url=url).sync()


def replay(observation, start: str) -> pychess.Board:
    board = pychess.Board(start)
    for move in observation.moves:
        board.push_uci(move)  # raises on an illegal move
    assert board.fen() == observation.fen
    if not observation.done:
        assert sorted(observation.legal_moves) == sorted(m.uci() for m in board.legal_moves)
    return board


def play(url: str, seed: int, start: str, colour: str, max_plies: int = 30) -> tuple:
    """A whole game of random legal moves through the client: its last result and its state."""
    rng = random.Random(seed)
    with client(url) as env:
        result = env.reset(task="game", fen=start, colour=colour, max_plies=max_plies)
        assert result.reward is None and not result.done and result.observation.moves == (
            [] if start.split()[1] == colour else [result.observation.opponent_move])
        while not result.done:
            replay(result.observation, start)
            result = env.step(ChessAction(text=rng.choice(result.observation.legal_moves)))
            obs = result.observation
            assert obs.legal and result.reward == obs.reward == obs.move_reward + obs.result_reward
            assert result.done == obs.done
        state = env.state()
    return result, state


def test_whole_games_in_sessions_at_once(server):
    url = server.url
    starts = [(rules.START_FEN, "w"), (KQK, "b"), (rules.START_FEN, "b")]
    with ThreadPoolExecutor(len(starts)) as pool:
        games = list(pool.map(lambda seed, start, colour: play(url, seed, start, colour), range(len(starts)),
                              *zip(*starts)))
    for (start, colour), (result, state) in zip(starts, games):
        obs = result.observation
        board = replay(obs, start)
        assert result.done and obs.outcome in ("win", "draw", "loss", "unfinished")
        assert obs.outcome != "unfinished" or len(obs.moves) >= 30
        assert obs.outcome not in ("win", "loss") or board.is_checkmate()
        assert state.task == "game" and state.done and state.moves == obs.moves and state.colour == colour
        mine = [i for i in range(len(obs.moves)) if (i % 2 == 0) == (start.split()[1] == colour)]
        assert state.step_count == len(mine)  # one step for each of the user's moves
        assert state.start_fen == start and state.fen == obs.fen and state.outcome == obs.outcome
    # Each session's opponent ended with its session: the pool's engine alone is left.
    wait_until(lambda: len(server.stockfish()) == 1, "the sessions' opponents to end")


def test_a_mate_in_one_wins_and_the_client_reads_reward_and_done(server):
    url = server.url
    with client(url) as env:
        env.reset(fen=MATE_IN_ONE)
        result = env.step(ChessAction(text="Ra8#"))
        assert (result.reward, result.done) == (2.0, True)
        obs = result.observation
        assert (obs.reward, obs.done, obs.outcome, obs.reason, obs.move) == (2.0, True, "win", "checkmate", "a1a8")
        assert (obs.move_reward, obs.result_reward) == (1.0, 1.0)
        # A whole P: answer is a move too; the seed of a reset names a generated position.
        first = env.reset(seed=7).observation
        assert first.fen == env.reset(seed=7).observation.fen != rules.START_FEN
        move = first.legal_moves[0]
        result = env.step(ChessAction(text=f"M: {move} E: 0.1 B: {move}"))
        assert result.observation.move == move and result.observation.legal
        # Another strength is another opponent: the session's earlier one ends, so it holds one at a time.
        for options in ({"opponent_elo": 1500}, {"opponent_skill": 5, "colour": "b"}, {}):
            result = env.reset(**options)
            assert (result.observation.opponent_move is not None) == ("colour" in options)
            wait_until(lambda: len(server.stockfish()) == 2, "one opponent and the pool's engine")


@pytest.mark.parametrize("text", ["e2e5", "hello", "", "M: e2e4 E: 0.1 B: e7e5", "🙂" * 500])
def test_a_bad_move_in_a_game_is_a_lost_game_and_the_session_goes_on(server, text):
    url = server.url
    with client(url) as env:
        env.reset()
        result = env.step(ChessAction(text=text))
        assert (result.reward, result.done, result.observation.outcome) == (-2.0, True, "loss")
        assert result.observation.legal is False and result.observation.move is None
        with pytest.raises(RuntimeError, match="the episode is over"):
            env.step(ChessAction(text="e2e4"))
        assert env.reset().observation.fen == rules.START_FEN
        assert env.step(ChessAction(text="e4")).observation.legal


@pytest.mark.parametrize("reset, said", [
    ({"task": "chess960"}, "task: Input should be"), ({"fen": "not a fen"}, "bad fen"),
    ({"fen": "R5k1/5ppp/8/8/8/8/8/6K1 b - - 1 1"}, "the game is over"), ({"colour": "white"}, "colour"),
    ({"opponent_skill": 30}, "opponent_skill"), ({"opponent_elo": 1500, "opponent_skill": 3}, "not both"),
    ({"opponent_elo": 5000}, "opponent_elo: "),  # beyond what Stockfish plays, which would clamp it
    ({"seed": -1}, "seed"), ({"color": "w"}, "color: Extra inputs are not permitted"),
    ({"task": "policy", "colour": "w"}, "colour: options of task 'game'"),
    ({"task": "env", "fen": MATE_IN_ONE, "move": "zz"}, "bad move"),
    ({"task": "env", "fen": "R5k1/5ppp/8/8/8/8/8/6K1 b - - 1 1"}, "no move to make"),
    ({"task": "env", "fen": rules.START_FEN, "move": "e2e4", "history": ["e7e5"]}, "bad history"),
])
def test_bad_requests_are_errors_and_the_session_goes_on(server, reset, said):
    url = server.url
    with client(url) as env:
        with pytest.raises(RuntimeError, match="step before reset"):
            env.step(ChessAction(text="e2e4"))
        with pytest.raises(RuntimeError, match=re.escape(said)):
            env.reset(**reset)
        assert env.reset(fen=MATE_IN_ONE).observation.fen == MATE_IN_ONE
        assert env.step(ChessAction(text="a1a8")).done


def answers(prompt: str, fen: str, scorer: RewardScorer) -> list[str]:
    """A right answer to a P: or A: prompt, a half of it, a wrong one and rubbish."""
    if prompt.startswith("A:"):
        right = rules.env_targets([prompt])[0]
    else:
        moves, evals = scorer.ground_truth([prompt])[0]
        right = policy_targets([fen], [moves], [evals], [moves[0]], layout="compact")[0]
    return [right, right[: len(right) // 2], "M: a1a1 E: 0 B: a1a1" if prompt.startswith("P:") else "8/8/8+0+0+0",
            "\x00🙂" * 30]


def test_single_turn_tasks_are_scored_as_rookworld_scores_them(server):
    url = server.url
    scorer = RewardScorer(server.engines.scorer().stockfish)  # the server's analyses, from the pool's cache
    seen = set()
    with client(url) as env:
        for task, seed in [("policy", 1), ("env", 2), ("mixed", 3), ("mixed", 4), ("mixed", 5), ("mixed", 6)]:
            first = env.reset(task=task, seed=seed).observation
            assert first.prompt.startswith(("P: " if task == "policy" else "A: " if task == "env" else ""))
            assert env.state().seed == seed and env.state().task == task
            for k, text in enumerate(answers(first.prompt, first.fen, scorer)):
                again = env.reset(task=task, seed=seed).observation
                assert (again.prompt, again.fen) == (first.prompt, first.fen)
                result = env.step(ChessAction(text=text))
                expected = scorer.score_batch([first.prompt], [text])
                assert result.done and result.reward == expected.rewards[0]
                assert result.observation.breakdown == expected.breakdown(0)
                assert k != 0 or result.reward == 1.0
                with pytest.raises(RuntimeError, match="the episode is over"):
                    env.step(ChessAction(text=text))
            seen.add(first.prompt[:2])
        assert seen == {"P:", "A:"}
        # A FEN of one's own, with the A: move and history given.
        prompt = env.reset(task="env", fen=rules.START_FEN, move="Nf3").observation.prompt
        assert prompt == rules.env_prompt(rules.START_FEN, "g1f3")
        after_e4 = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"
        prompt = env.reset(task="env", fen=after_e4, move="e7e5", history=["e2e4"]).observation.prompt
        assert prompt == rules.env_prompt(after_e4, "e7e5", ["e2e4"])
        assert env.step(ChessAction(text=rules.env_targets([prompt])[0])).reward == 1.0


def test_the_sessions_are_bounded_and_protocol_abuse_is_answered():
    server = Server(max_sessions=SESSIONS)  # its own, so that no other test's session is still closing
    try:
        protocol_abuse(server.url)
    finally:
        server.stop()


def protocol_abuse(url: str) -> None:
    ws = url.replace("http", "ws") + "/ws"
    envs = [client(url) for _ in range(SESSIONS)]
    try:
        for env in envs:
            env.reset(task="policy", seed=1)
        with ws_connect(ws, open_timeout=10) as conn:  # one too many: refused, in a frame before the close
            assert json.loads(conn.recv(timeout=10))["data"]["code"] == "CAPACITY_REACHED"
    finally:
        for env in envs:
            env.close()
    # What no EnvClient sends: another's session, a frame that is no JSON, an unknown message, a bad action.
    with ws_connect(ws + "?session_id=no-such-session", open_timeout=10) as conn:
        assert "belongs to the connection that made it" in json.loads(conn.recv(timeout=10))["data"]["message"]
    with wait_until(lambda: _connect(ws), "a free session") as conn:
        for frame in ["{not json", json.dumps({"type": "dance"}), json.dumps({"type": "step", "data": {"move": 1}})]:
            conn.send(frame)
            assert json.loads(conn.recv(timeout=10))["type"] == "error"
        conn.send(json.dumps({"type": "reset", "data": {"fen": MATE_IN_ONE}}))
        assert json.loads(conn.recv(timeout=10))["data"]["observation"]["fen"] == MATE_IN_ONE
    # Over plain HTTP each request meets a fresh environment: a step is refused with the reason, a reset answered.
    with pytest.raises(urllib.error.HTTPError) as refused:
        _post(url + "/step", {"action": {"text": "e2e4"}})
    assert refused.value.code == 400 and "step before reset" in json.loads(refused.value.read())["detail"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        _post(url + "/reset", {"fen": "8/8/8/8/8/8/8/8 w - - 0 1"})
    assert refused.value.code == 400 and "bad fen" in json.loads(refused.value.read())["detail"]
    assert _post(url + "/reset", {"fen": KQK})["observation"]["fen"] == KQK
    with client(url) as env:  # and the server still serves
        assert env.reset().observation.fen == rules.START_FEN


def _connect(ws: str):
    """A raw WebSocket session, or None while the server is still closing the last ones."""
    conn = ws_connect(ws, open_timeout=10)
    try:
        conn.send(json.dumps({"type": "state"}))
        if json.loads(conn.recv(timeout=10))["type"] != "error":
            return conn
    except ConnectionClosed:  # refused at capacity: the error frame, then the close
        pass
    conn.close()
    return None


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _refused(url: str, body: dict | bytes) -> tuple[int, bytes]:
    """The status and body of a request the server refuses (4xx)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(url, data, {"Content-Type": "application/json"}), timeout=30)
    return refused.value.code, refused.value.read()


def _frame(conn, message: dict) -> dict:
    conn.send(json.dumps(message))
    return json.loads(conn.recv(timeout=30))


def test_no_http_request_makes_or_reaches_a_session_so_websocket_clients_always_get_theirs():
    server = Server(max_sessions=SESSIONS)
    envs = []
    try:
        url = server.url
        create = {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create", "params": {}}
        for _ in range(SESSIONS + 2):  # the attack: each would have been a session no connection owns, never ended
            assert "not served over plain HTTP" in _post(url + "/mcp", create)["error"]["message"]
        for request in ({"method": "openenv/session/close", "params": {"session_id": "x"}},
                        {"method": "tools/call", "params": {"session_id": "x", "name": "t", "arguments": {}}}):
            answer = _post(url + "/mcp", {"jsonrpc": "2.0", "id": 2} | request)
            assert answer["id"] == 2 and "not served over plain HTTP" in answer["error"]["message"]
        # What holds no session is OpenEnv's to answer, as before.
        assert "does not support MCP" in _post(url + "/mcp", {"jsonrpc": "2.0", "id": 3, "method": "tools/list",
                                                               "params": {}})["error"]["message"]
        envs = [client(url) for _ in range(SESSIONS - 2)]
        for env in envs:  # every place is there for a WebSocket client
            env.reset(fen=MATE_IN_ONE)
            assert env.step(ChessAction(text="Ra8#")).reward == 2.0
        # Nor does one WebSocket end another's session, though it knows its id.
        with ws_connect(server.ws, open_timeout=10) as mine, ws_connect(server.ws, open_timeout=10) as theirs:
            own = {"jsonrpc": "2.0", "id": 4, "method": "openenv/session/create", "params": {}}
            their_id = _frame(theirs, {"type": "mcp", "data": own})["data"]["result"]["session_id"]
            close = {"jsonrpc": "2.0", "id": 5, "method": "openenv/session/close", "params": {"session_id": their_id}}
            assert "ends when its connection closes" in _frame(mine, {"type": "mcp", "data": close})["data"]["message"]
            assert _frame(theirs, {"type": "reset", "data": {"fen": MATE_IN_ONE}})["type"] == "observation"
            assert _frame(theirs, {"type": "step", "data": {"text": "Ra8#"}})["data"]["reward"] == 2.0
    finally:
        for env in envs:
            env.close()
        server.stop()


def test_frames_and_bodies_are_judged_parsed_and_a_session_goes_on_past_each(server):
    """Issue 71: an escaped `openenv\\/session\\/close` passed the guard's substring test, raw JSON-RPC over the
    WebSocket was not checked at all, a binary frame ended the session with the message 'text', and a deeply nested
    body was an HTTP 500 with a traceback in the log. Each is answered now, and the session (or server) goes on."""
    with ws_connect(server.ws, open_timeout=10) as mine, ws_connect(server.ws, open_timeout=10) as theirs:
        own = {"jsonrpc": "2.0", "id": 4, "method": "openenv/session/create", "params": {}}
        their_id = _frame(theirs, {"type": "mcp", "data": own})["data"]["result"]["session_id"]
        close = {"jsonrpc": "2.0", "id": 5, "method": "openenv/session/close", "params": {"session_id": their_id}}
        escaped = json.dumps({"type": "mcp", "data": close}).replace("/", "\\/")
        assert "\\/" in escaped and "openenv/session/close" not in escaped
        mine.send(escaped)
        assert "ends when its connection closes" in json.loads(mine.recv(timeout=30))["data"]["message"]
        assert "ends when its connection closes" in _frame(mine, close)["data"]["message"]  # raw JSON-RPC
        mine.send(b"\x00binary")
        assert "text frame of JSON" in json.loads(mine.recv(timeout=30))["data"]["message"]
        mine.send('{"type": "reset", "data": ' + "[" * 100_000 + "]" * 100_000 + "}")
        assert "nested too deep" in json.loads(mine.recv(timeout=30))["data"]["message"]
        assert _frame(mine, {"type": "reset", "data": {"fen": MATE_IN_ONE}})["type"] == "observation"
        assert _frame(theirs, {"type": "reset", "data": {"fen": MATE_IN_ONE}})["type"] == "observation"
        assert _frame(theirs, {"type": "step", "data": {"text": "Ra8#"}})["data"]["reward"] == 2.0
    status, body = _refused(server.url + "/reset", ("[" * 100_000 + "]" * 100_000).encode())
    assert status == 400 and b"nested too deep" in body
    assert _post(server.url + "/reset", {"fen": KQK})["observation"]["fen"] == KQK


def test_a_request_whose_body_never_comes_is_answered_408_in_bounded_time(monkeypatch):
    """A POST whose body never came held its connection with no time limit (issue 71): the guard, before any app,
    waits BODY_S for it."""
    import asyncio

    from rookworld.integrations import openenv_guard

    monkeypatch.setattr(openenv_guard, "BODY_S", 0.2)
    sent = []

    async def never():
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    async def app(scope, receive, send):
        raise AssertionError("the app is never reached")

    guard = openenv_guard.ConnectionGuard(app, idle_s=300, max_request_bytes=1000)
    scope = {"type": "http", "method": "POST", "path": "/reset", "headers": [(b"content-length", b"10")]}
    asyncio.run(asyncio.wait_for(guard(scope, never, send), timeout=10))
    assert sent[0]["status"] == 408 and b"did not come within 0.2 s" in sent[1]["body"]


@pytest.mark.slow
def test_an_idle_websocket_is_closed_and_its_place_given_to_the_next():
    server = Server(max_sessions=1, idle_s=1.5)
    try:
        idle = ws_connect(server.ws, open_timeout=10)
        started = time.monotonic()
        assert _frame(idle, {"type": "reset", "data": {"fen": MATE_IN_ONE}})["type"] == "observation"
        with ws_connect(server.ws, open_timeout=10) as late:  # the one place is taken
            assert json.loads(late.recv(timeout=10))["data"]["code"] == "CAPACITY_REACHED"
        with pytest.raises(ConnectionClosed) as closed:
            idle.recv(timeout=20)
        assert 1.4 < time.monotonic() - started < 10
        assert closed.value.rcvd.code == 1001 and "idle for 1.5 s" in closed.value.rcvd.reason
        with wait_until(lambda: _connect(server.ws), "the idle session's place") as conn:
            # A client that keeps talking keeps its session past the idle limit: idle is waiting on the client.
            for _ in range(5):
                assert _frame(conn, {"type": "reset", "data": {"fen": MATE_IN_ONE}})["type"] == "observation"
                time.sleep(0.5)
            assert _frame(conn, {"type": "step", "data": {"text": "Ra8#"}})["data"]["reward"] == 2.0
    finally:
        server.stop()


def test_connections_that_never_speak_lose_their_places_soon():
    """OpenEnv makes a session at the handshake: three WebSockets that connected and said nothing held all three
    places for the whole idle limit (300 s), and a reconnect each 299 s held them for ever. A connection silent for
    `first_message_s` after its handshake is closed (1001, saying why) and its place given to the next client;
    one over the limit meanwhile is told CAPACITY_REACHED before its close."""
    server = Server(max_sessions=3, first_message_s=1.0)
    try:
        silent = [ws_connect(server.ws, open_timeout=10) for _ in range(3)]
        started = time.monotonic()
        with ws_connect(server.ws, open_timeout=10) as late:
            assert json.loads(late.recv(timeout=10))["data"]["code"] == "CAPACITY_REACHED"
        for conn in silent:
            with pytest.raises(ConnectionClosed) as closed:
                conn.recv(timeout=20)
            assert closed.value.rcvd.code == 1001 and "no message within 1 s of connecting" in closed.value.rcvd.reason
        assert time.monotonic() - started < 10
        with wait_until(lambda: _connect(server.ws), "a silent connection's place") as conn:
            time.sleep(1.5)  # past the first wait once it has spoken: the idle limit holds from then on
            assert _frame(conn, {"type": "reset", "data": {"fen": MATE_IN_ONE}})["type"] == "observation"
    finally:
        server.stop()


@pytest.mark.parametrize("frame", ["[]", '"reset"', "null", "3", "true"])
def test_a_frame_of_json_that_is_no_object_is_an_error_and_the_session_goes_on(server, frame):
    """OpenEnv's reader ended the sender's session on `[]`, `"reset"` or `null` ("'list' object has no attribute
    'get'"): each is an error frame saying what a message is, and the same connection resets after it."""
    with wait_until(lambda: _connect(server.ws), "a free session") as conn:
        conn.send(frame)
        error = json.loads(conn.recv(timeout=10))
        assert error["type"] == "error" and "each message is a JSON object" in error["data"]["message"], error
        assert _frame(conn, {"type": "reset", "data": {"fen": MATE_IN_ONE}})["type"] == "observation"


def test_input_is_quoted_back_cut_and_requests_have_a_size_limit(server):
    url, ws = server.url, server.url.replace("http", "ws") + "/ws"
    megabyte = "x" * 1_000_000  # under the limit with its JSON around it: it reaches the FEN reader
    code, body = _refused(url + "/reset", {"fen": megabyte})
    detail = json.loads(body)["detail"]
    assert code == 400 and len(body) < 300 and "x" * 80 in detail and "x" * 81 not in detail, body[:300]
    code, body = _refused(url + "/reset", {"fen": rules.START_FEN, "y" * 100_000: 1})
    assert code == 400 and len(body) < 300, body[:300]
    code, body = _refused(url + "/step", {"action": {"move": megabyte}})  # OpenEnv's 422 quotes pydantic's errors
    assert code == 422 and len(body) < 1000, body[:300]
    code, body = _refused(url + "/reset", b'{"fen": "' + b"x" * (MAX_REQUEST_BYTES + 1) + b'"}')
    assert code == 413 and b"over 1048576 bytes" in body
    with ws_connect(ws, open_timeout=10) as conn:
        for message in ({"type": "reset", "data": {"fen": megabyte}}, {"type": "step", "data": {"move": megabyte}},
                        {"type": "y" * 100_000}):
            answer = _frame(conn, message)
            assert answer["type"] == "error" and len(json.dumps(answer)) < 1000, str(answer)[:300]
        assert _frame(conn, {"type": "reset", "data": {"fen": MATE_IN_ONE}})["type"] == "observation"
        conn.send(json.dumps({"type": "reset", "data": {"fen": "x" * MAX_REQUEST_BYTES}}))
        with pytest.raises(ConnectionClosed) as closed:
            conn.recv(timeout=20)
        assert closed.value.rcvd.code == 1009


def test_an_opponent_told_to_search_for_ever_answers_a_served_game_in_its_time():
    server = Server(max_sessions=1, opponent_nodes=10**20, opponent_move_s=1)
    try:
        with client(server.url) as env:
            started = time.monotonic()
            result = env.reset(colour="b")  # Stockfish moves first
            assert result.observation.opponent_move is not None and time.monotonic() - started < 5
    finally:
        server.stop()


def test_only_the_serve_command_imports_the_openenv_module():
    importers = {m for m, targets in graph().items() if "rookworld.integrations.openenv" in targets}
    assert importers == {"rookworld.commands.serve"}


@pytest.mark.slow
def test_rookworld_serve_starts_answers_and_stops_on_sigterm_with_its_engines():
    proc, url, lines = start_serve("--stockfish-depth", "4", "--stockfish-workers", "1", "--opponent-skill", "0",
                                   "--opponent-nodes", "200", "--max-sessions", "2")
    try:
        with client(url) as env:
            env.reset(fen=MATE_IN_ONE)
            engines = stockfish_children(proc.pid)
            assert len(engines) == 2  # the pool's and the game's opponent
            assert env.step(ChessAction(text="Ra8#")).reward == 2.0
            env.reset(task="policy", seed=3)
            assert env.step(ChessAction(text="e2e4")).done
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(WAIT_S) == 143
    finally:
        said = ended_log(proc, lines)
    assert all(not os.path.exists(f"/proc/{pid}") for pid in engines), said
    assert "Traceback" not in said


@pytest.mark.slow
def test_silent_connections_are_bounded_in_number_and_in_time():
    """300 sockets that never write, to a server under a 256-file limit (the third probe's case): those past its
    connection limit (128: half its files) are closed as they open, the rest once HEAD_S has passed without a
    request's head, and the server then answers `/health` and serves a game; one line in its log, no traceback.
    A WebSocket session quiet for longer than HEAD_S is not cut: its bound is the session's."""
    from rookworld.integrations.openenv_http import HEAD_S

    proc, url, lines = start_serve("--stockfish-depth", "2", "--stockfish-workers", "1", "--max-sessions", "2",
                                   files=256)
    host, port = url.removeprefix("http://").split(":")
    silent = []
    try:
        for _ in range(300):
            s = socket.create_connection((host, int(port)), timeout=WAIT_S)
            s.settimeout(HEAD_S + 30)
            silent.append(s)
        t0 = time.monotonic()
        ended = [s.recv(1) == b"" for s in silent]  # each waits until the server closes it
        assert all(ended) and time.monotonic() - t0 < HEAD_S + 30
        assert json.loads(urllib.request.urlopen(f"{url}/health", timeout=WAIT_S).read())["status"] == "healthy"
        with client(url) as env:
            env.reset(fen=MATE_IN_ONE)
            time.sleep(HEAD_S + 1)
            assert env.step(ChessAction(text="Ra8#")).reward == 2.0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 143
    finally:
        for s in silent:
            s.close()
        said = ended_log(proc, lines)
    assert said.count("new ones are closed until some end") == 1, said
    assert "Traceback" not in said


@pytest.mark.slow
@pytest.mark.parametrize("gap", [0.0005, 0.005, 0.05])
def test_a_burst_of_sigterms_as_serve_starts_ends_it_once_with_143(gap):
    """SIGTERMs that keep coming from the moment the server says it listens (a supervisor that repeats itself;
    two during start-up in issue 71's probe) end it as one does: its engines closed, one line, status 143. They
    had given a traceback chained on another, a coroutine never awaited, or the signal's default end (-15)."""
    proc, _, lines = start_serve("--stockfish-workers", "1")
    try:
        engines = stockfish_children(proc.pid)
        for _ in range(20):
            proc.send_signal(signal.SIGTERM)
            time.sleep(gap)
        assert proc.wait(WAIT_S) == 143
    finally:
        said = ended_log(proc, lines)
    assert said.endswith("rookworld serve: terminated\n") and said.count("terminated") == 1, said
    assert "Traceback" not in said and "never awaited" not in said, said
    assert all(not os.path.exists(f"/proc/{pid}") for pid in engines), said


def test_without_openenv_serve_says_how_to_get_it():
    hide = ("import sys, importlib.abc\n"
            "class Hide(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] == 'openenv':\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, Hide())\n"
            "from rookworld.cli import main\n"
            "sys.exit(main(['serve', '--port', '0']))\n")
    proc = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "rookworld serve: error: rookworld serve needs OpenEnv: pip install 'rookworld[openenv]' "
        "(no module 'openenv')"]


#: A scripted engine whose every answer takes half a second (so that a step outlasts a client that leaves at once),
#: and an hour for the position KQK (a step stuck there outlasts the shutdown's grace period).
SLOW = f"__import__('time').sleep(3600 if fen.startswith('8/8/4k3') else 0.5) or {GOOD}"


def start_serve(*args: str, files: int | None = None) -> tuple[subprocess.Popen, str, queue.Queue]:
    """`rookworld serve` on a free port (`files`: under that limit of open files): the process, its URL and its
    log's lines as they come."""
    import resource

    limit = None if files is None else (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (files, files)))
    proc = subprocess.Popen([sys.executable, "-m", "rookworld", "serve", "--port", "0", *args],
                            stderr=subprocess.PIPE, text=True, cwd=REPO, preexec_fn=limit)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr] + [lines.put(None)], daemon=True).start()
    deadline, port, said = time.monotonic() + START_S, None, ""
    try:
        while port is None:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if line is None:
                raise queue.Empty
            said += line
            port = re.search(r"on http://127\.0\.0\.1:(\d+) ", line)
    except queue.Empty:
        proc.kill()
        raise AssertionError(f"rookworld serve did not start within {START_S} s: {said}") from None
    return proc, f"http://127.0.0.1:{port.group(1)}", lines


def ended_log(proc: subprocess.Popen, lines: queue.Queue) -> str:
    """The server's whole log once it has ended: killed if a test's assertion left it running."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(WAIT_S)
    return whole_log(lines)


def whole_log(lines: queue.Queue) -> str:
    """What the server's log holds once it has ended."""
    wait_until(lambda: None in lines.queue, "the end of the server's log")
    return "".join(line for line in lines.queue if line is not None)


def vanish_mid_step(ws: str) -> None:
    conn = ws_connect(ws, open_timeout=10)
    assert _frame(conn, {"type": "reset", "data": {}})["type"] == "observation"
    conn.send(json.dumps({"type": "step", "data": {"text": "e2e4"}}))
    conn.socket.shutdown(socket.SHUT_RDWR)  # gone, without a closing handshake
    conn.socket.close()


@pytest.mark.slow
def test_clients_that_vanish_mid_step_and_a_step_stuck_at_shutdown_are_one_line_each(tmp_path):
    vanishing = 10
    proc, url, lines = start_serve("--stockfish-path", fake_engine(tmp_path, SLOW), "--stockfish-workers", "2",
                                   "--max-sessions", str(vanishing))
    ws = url.replace("http", "ws") + "/ws"

    def logged(text: str) -> int:
        return sum(text in line for line in list(lines.queue) if line is not None)

    try:
        with ThreadPoolExecutor(vanishing) as clients:
            list(clients.map(vanish_mid_step, [ws] * vanishing))
        wait_until(lambda: logged("gone before its answer was sent") == vanishing, "a line per vanished client")
        envs = [wait_until(lambda: _connect(ws), "a place") for _ in range(vanishing)]  # every place was freed
        for env in envs:
            env.close()
        stuck = ws_connect(ws, open_timeout=10)
        assert _frame(stuck, {"type": "reset", "data": {"task": "policy", "fen": KQK}})["type"] == "observation"
        stuck.send(json.dumps({"type": "step", "data": {"text": "M: d3d4 E: 0 B: d3d4"}}))  # waits on KQK's analysis
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 143
    finally:
        said = ended_log(proc, lines)
    assert logged("gone before its answer was sent") == vanishing, said
    assert logged("was still busy when the server's grace period ended: cancelled") == 1, said
    assert "Traceback" not in said and "Exception in ASGI application" not in said, said


def test_the_readme_s_snippet_runs_against_a_server(server, capsys):
    """The README's OpenEnv snippet, as written but for the port: it scores its exact next state 1.0."""
    readme = (REPO / "README.md").read_text()
    (snippet,) = [s for s in re.findall(r"```python\n(.*?)```", readme, re.S) if "ChessEnvClient(" in s]
    assert "http://127.0.0.1:8000" in snippet
    exec(compile(snippet.replace("http://127.0.0.1:8000", server.url), "README.md", "exec"), {})
    assert capsys.readouterr().out.split()[0] == "1.0"
