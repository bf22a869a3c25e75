"""The ASGI guard in front of the OpenEnv server (`rookworld serve`): what each connection may hold and how it ends
(`ConnectionGuard`), and what a client is told of errors (cut to a bound, whatever they quote). It knows nothing
of chess: `openenv.create_chess_app` puts it before OpenEnv's app."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any
from urllib.parse import parse_qs

from rookworld.io.quote import ECHO_LIMIT, shortened

#: Seconds a WebSocket session may wait on its client before the server closes the connection and frees its place.
IDLE_S = 300.0
#: Seconds a new WebSocket may stay silent before its first message: OpenEnv makes its session at the handshake, so
#: connections that never speak held every place for IDLE_S (a client resets at once; ChessEnvClient does).
FIRST_MESSAGE_S = 10.0
#: The largest request taken, in bytes, an HTTP body or a WebSocket message: a move, a P: answer or a reset with a
#: long game's history takes a few kilobytes.
MAX_REQUEST_BYTES = 1 << 20
#: The longest error said to a client; what it quotes is cut first, this is the bound on the rest.
MESSAGE_LIMIT = 500
#: Seconds a request's body may take to arrive: a move, an answer or a reset is a few kilobytes.
BODY_S = 30.0
#: uvicorn's own log: the server's one-line notes sit among its lines.
LOG = logging.getLogger("uvicorn.error")


def cut_errors(errors: Any) -> Any:
    """pydantic's errors as a client is told them, with the input each quotes (a whole request, maybe) cut to
    ECHO_LIMIT characters, as are the names in its location (an unknown key may be any size)."""
    if not isinstance(errors, list):
        return errors
    cut = []
    for error in errors:
        if isinstance(error, dict):
            error = {k: v for k, v in error.items() if k not in ("input", "ctx", "url")} | (
                {"input": shortened(repr(error["input"]), ECHO_LIMIT)} if "input" in error else {})
            if isinstance(error.get("loc"), (list, tuple)):
                error["loc"] = [shortened(str(part), ECHO_LIMIT) for part in error["loc"]]
        cut.append(error)
    return cut


def _error_frame(text: str) -> str:
    """An OpenEnv WebSocket error frame with what it quotes cut (OpenEnv says pydantic's errors and an unknown
    message type whole); any other frame as it is."""
    if not text.startswith('{"type":"error"'):
        return text
    try:
        frame = json.loads(text)
        data = frame["data"]
        message = data.get("message")
        if isinstance(message, str):
            head, unknown, kind = message.partition("Unknown message type: ")
            data["message"] = shortened(head + unknown + shortened(kind, ECHO_LIMIT), MESSAGE_LIMIT)
        if "errors" in data:
            data["errors"] = cut_errors(data["errors"])
        return json.dumps(frame)
    except (ValueError, KeyError, TypeError, AttributeError):
        return text


#: The JSON-RPC method that ends a session, however a message spells it (escaped slashes read as slashes).
CLOSE_METHOD = "openenv/session/close"


#: What `_parsed` gives for text that is no JSON (JSON's null is None).
NOT_JSON = object()


def _parsed(text: str | bytes) -> tuple[Any, str | None]:
    """(a message's JSON value, or NOT_JSON; why the guard refuses it, or None). Text that is no JSON is the app's
    to answer; JSON nested past the parser's depth would be its traceback (HTTP 500), so it is refused here."""
    try:
        return json.loads(text), None
    except RecursionError:
        return NOT_JSON, "the message's JSON is nested too deep"
    except ValueError:
        return NOT_JSON, None


def _closes_a_session(message: Any) -> bool:
    """Whether a parsed WebSocket message closes a session: OpenEnv's MCP frame (`{"type": "mcp", "data": {...}}`)
    or a raw JSON-RPC request, with `openenv/session/close` as its method. Decided on the parsed message, never its
    text (`openenv\\/session\\/close` spells the same method)."""
    if not isinstance(message, dict):
        return False
    inner = message.get("data") if message.get("type") == "mcp" else message
    return isinstance(inner, dict) and inner.get("method") == CLOSE_METHOD


def _client(scope: dict) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "a client"


def _json_rpc_refusal(request: Any) -> dict | None:
    """The JSON-RPC error `POST /mcp` answers a request that would make, close or reach a session with, else None.

    OpenEnv makes a session for `openenv/session/create` over plain HTTP that belongs to no connection, so nothing
    ever ends it: `max_sessions` such requests would lock every WebSocket client out. And a session id named over
    HTTP would reach into a session that a WebSocket owns. rookworld's environment offers no MCP tools, so such a
    session gives a client nothing that a WebSocket does not: each is refused, saying where sessions are had."""
    if not isinstance(request, dict):  # text that is no JSON object: OpenEnv says what is wrong with it
        return None
    method, params = request.get("method"), request.get("params")
    names_session = isinstance(params, dict) and "session_id" in params
    if not (isinstance(method, str) and method.startswith("openenv/session/")) and not names_session:
        return None
    request_id = request.get("id") if isinstance(request.get("id"), (int, str)) else None
    message = ("sessions are not served over plain HTTP: a session belongs to the WebSocket connection that makes "
               "it and ends with it; connect to /ws (ChessEnvClient does)")
    return {"jsonrpc": "2.0", "id": shortened(request_id, ECHO_LIMIT) if isinstance(request_id, str) else request_id,
            "error": {"code": -32600, "message": message}}


async def _answer(send, status: int, content: dict) -> None:
    body = json.dumps(content).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _cancelled(scope: dict) -> None:
    """One line for a request cut off by the server's shutdown, where asyncio would print a traceback; the task
    is let end, as uvicorn asked."""
    what = "session" if scope["type"] == "websocket" else f"{scope.get('method', '')} {scope.get('path', '')}"
    LOG.warning("%s: its %s was still busy when the server's grace period ended: cancelled", _client(scope), what)
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


class ConnectionGuard:
    """ASGI middleware before OpenEnv's app, which bounds what each connection holds and how it ends.

    - A request over `max_request_bytes` (an HTTP body, a WebSocket message) is refused: 413, or close code 1009.
    - `POST /mcp` cannot make, close or reach a session (`_json_rpc_refusal`), and a WebSocket can neither join
      another's session (`/ws?session_id=`) nor close one (`openenv/session/close`): each session is the
      connection's that made it, ended when that ends.
    - A WebSocket that leaves its session waiting `idle_s` seconds, or `first_message_s` before its first message,
      is closed (code 1001), which ends its session; a request body that has not come within `BODY_S` is
      answered 408.
    - A frame that is JSON but no object (`[]`, `"reset"`, `null`) is answered with an error frame, the session
      kept (OpenEnv's reader ended the session on it).
    - Each frame and body is judged parsed (`_parsed`): JSON nested past the parser's depth is refused (400, or an
      error frame), a binary frame is answered, and a session close is recognised however it is spelt.
    - A client gone before its answer, and a request still running when the shutdown's grace period ends, are one
      line each in the log, where OpenEnv and uvicorn would print a traceback each."""

    def __init__(self, app, *, idle_s: float, max_request_bytes: int, first_message_s: float = FIRST_MESSAGE_S):
        self.app, self.idle_s, self.max_request_bytes = app, idle_s, max_request_bytes
        self.first_message_s = min(first_message_s, idle_s)

    async def __call__(self, scope, receive, send) -> None:
        try:
            if scope["type"] == "websocket":
                await self._websocket(scope, receive, send)
            elif scope["type"] == "http":
                await self._http(scope, receive, send)
            else:
                await self.app(scope, receive, send)
        except asyncio.CancelledError:
            _cancelled(scope)
            if scope["type"] == "http":
                await _try(_answer(send, 503, {"detail": "the server is shutting down"}))

    async def _http(self, scope, receive, send) -> None:
        if scope.get("method") in ("POST", "PUT", "PATCH"):
            try:  # a body that never comes held its connection for ever
                body = await asyncio.wait_for(self._body(scope, receive), timeout=BODY_S)
            except asyncio.TimeoutError:
                await _try(_answer(send, 408, {"detail": f"the request's body did not come within {BODY_S:g} s"}))
                return
            if body is None:
                await _answer(send, 413, {"detail": f"the request is over {self.max_request_bytes} bytes"})
                return
            value, why = _parsed(body) if body else (None, None)
            if why is not None:
                await _answer(send, 400, {"detail": why})
                return
            refusal = _json_rpc_refusal(value) if scope.get("path") == "/mcp" else None
            if refusal is not None:
                await _answer(send, 200, refusal)  # JSON-RPC's errors travel in a 200, as OpenEnv's own do
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send)

    async def _body(self, scope, receive) -> bytes | None:
        """The request's body, or None once it passes the limit (by its Content-Length, or as it comes). What is
        over the limit is read and dropped, up to 16 times the limit, so that a client that writes its whole request
        before it reads hears the 413 rather than a broken pipe; past that the connection is closed on it."""
        length = dict(scope.get("headers") or []).get(b"content-length", b"0")
        if length.isdigit() and int(length) > 16 * self.max_request_bytes:
            return None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks)  # the client left: the app meets the same disconnect
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > 16 * self.max_request_bytes:
                return None
            if size <= self.max_request_bytes:
                chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks) if size <= self.max_request_bytes else None

    async def _websocket(self, scope, receive, send) -> None:
        connection = _Connection(scope, receive, send, self.idle_s, self.max_request_bytes, self.first_message_s)
        try:
            if "session_id" in parse_qs(scope.get("query_string", b"").decode("latin-1")):
                await connection.refuse("a session belongs to the connection that made it: connect to /ws without "
                                        "a session_id for one of your own")
                return
            await self.app(scope, connection.receive, connection.send)
        finally:
            connection.stop()


def _replay(body: bytes, receive):
    """A receive that gives the body read already, then what the client sends next (its disconnect)."""
    given = False

    async def replayed():
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _try(awaitable) -> None:
    """Sends what may find the connection gone already: nothing is lost that anyone could read."""
    try:
        await awaitable
    except (OSError, RuntimeError):
        pass


class _Connection:
    """One WebSocket as its session's app sees it: a receive that ends the connection after `idle_s` without a
    word or on a message over the limit, and a send that stops, in one line, once the client is gone."""

    def __init__(self, scope, receive, send, idle_s: float, max_bytes: int, first_message_s: float):
        self.client, self._receive, self._send = _client(scope), receive, send
        self.idle_s, self.max_bytes, self.first_message_s = idle_s, max_bytes, first_message_s
        self.heard = False  # a message of the client's has come (the handshake is none)
        self.ended = False  # the client left or the server closed it: nothing more is said
        self._pending: asyncio.Future | None = None

    async def receive(self) -> dict:
        # The wait is a task of its own that an idle timeout leaves running: cancelling a server's receive midway
        # could lose the message it was reading.
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._receive())
        wait = self.idle_s if self.heard else self.first_message_s
        done, _ = await asyncio.wait({self._pending}, timeout=wait)
        if not done:
            said = "no message" if self.heard else "no first message"
            LOG.warning("%s: %s for %g s: connection closed, its session ended", self.client, said, wait)
            return await self._close(1001, f"idle for {wait:g} s: connect again for a new session" if self.heard
                                     else f"no message within {wait:g} s of connecting: connect again, and send")
        message, self._pending = self._pending.result(), None
        self.heard |= message["type"] == "websocket.receive"
        if message["type"] == "websocket.disconnect":
            self.ended = True
        elif message["type"] == "websocket.receive" and self._size(message) > self.max_bytes:
            LOG.warning("%s: a message over %d bytes: connection closed, its session ended", self.client,
                        self.max_bytes)
            return await self._close(1009, f"a message is at most {self.max_bytes} bytes")
        elif message["type"] == "websocket.receive":
            why = self._refused(message)
            if why is not None:
                await self.send({"type": "websocket.send", "text": json.dumps(
                    {"type": "error", "data": {"message": why, "code": "SESSION_ERROR"}})})
                return await self.receive()
        return message

    @staticmethod
    def _refused(message: dict) -> str | None:
        """Why the session's app is not handed a frame (it is answered, and the session goes on), or None."""
        text = message.get("text")
        if not isinstance(text, str):  # OpenEnv reads message["text"]: a binary frame ended the session with 'text'
            return "send each message as a text frame of JSON: a binary frame is not read"
        value, why = _parsed(text)
        if why is not None:
            return why
        if value is not NOT_JSON and not isinstance(value, dict):  # text that is no JSON: OpenEnv answers it
            return (f"each message is a JSON object, such as {{\"type\": \"reset\", \"data\": {{}}}}, not "
                    f"{shortened(text, ECHO_LIMIT)}")
        if _closes_a_session(value):  # OpenEnv would end any session named, another connection's too
            return "a session ends when its connection closes: close the WebSocket"
        return None

    @staticmethod
    def _size(message: dict) -> int:
        text, data = message.get("text"), message.get("bytes")
        return len(text.encode()) if text is not None else len(data or b"")

    async def _close(self, code: int, reason: str) -> dict:
        """Closes the connection for the server, and tells the app its client is gone, which ends its session."""
        if not self.ended:
            self.ended = True
            await _try(self._send({"type": "websocket.close", "code": code, "reason": reason}))
        return {"type": "websocket.disconnect", "code": code}

    async def send(self, message: dict) -> None:
        if self.ended:
            return
        if message["type"] == "websocket.send" and isinstance(message.get("text"), str):
            message = message | {"text": _error_frame(message["text"])}
        try:
            await self._send(message)
        except (OSError, RuntimeError):  # uvicorn: ClientDisconnected, or the close the server sent at shutdown
            self.ended = True
            if message["type"] == "websocket.send":
                LOG.warning("%s: gone before its answer was sent: its session ended", self.client)

    async def refuse(self, reason: str) -> None:
        """Accepts only to say why in OpenEnv's error frame (a refused handshake says nothing), then closes."""
        if (await self._receive())["type"] != "websocket.connect":
            return
        await _try(self._send({"type": "websocket.accept"}))
        frame = {"type": "error", "data": {"message": reason, "code": "SESSION_ERROR"}}
        await _try(self._send({"type": "websocket.send", "text": json.dumps(frame)}))
        await self._close(1008, "no session here")

    def stop(self) -> None:
        if self._pending is not None and not self._pending.done():
            self._pending.cancel()
