"""The HTTP connections `rookworld serve` holds: how many may be open at once, and how long each may take to send a
request's head, so that silent sockets cannot hold the server's file descriptors for ever (a client that opens
hundreds and writes nothing left `/health` unanswered). A body's own bound is the guard's (`openenv_guard.BODY_S`),
a WebSocket session's idle time the session's (`IDLE_S`): a connection upgraded to a WebSocket is theirs."""

from __future__ import annotations

import asyncio
import resource
import time

from uvicorn.protocols.http.h11_impl import H11Protocol

from rookworld.integrations.openenv_guard import LOG

#: Seconds a connection may take to send a request's head (its line and headers), from its opening or from the
#: end of its last response: a client sends it at once.
HEAD_S = 10.0
#: Seconds between two notes in the log that connections were refused, however many were.
NOTE_EVERY_S = 60.0


def connection_limit() -> int:
    """Connections open at once: half the process's file descriptors (the rest hold Stockfish's pipes, the model
    and the log), and no more than 1,024."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(8, min(1024, soft // 2))


class BoundedHTTP(H11Protocol):
    """uvicorn's h11 protocol with both bounds: a connection past `limit` is closed as it opens, and one whose
    request head has not come within `HEAD_S` is closed, unless a request of it is being served."""

    limit = connection_limit()
    _noted = -NOTE_EVERY_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        if len(self.connections) > self.limit:
            now = time.monotonic()
            if now - BoundedHTTP._noted >= NOTE_EVERY_S:
                BoundedHTTP._noted = now
                LOG.warning("rookworld serve: %d connections are open, the most it holds: new ones are closed until "
                            "some end", self.limit)
            transport.close()
            return
        self._await_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        waited_from = self.cycle
        self._head_timer = self.loop.call_later(HEAD_S, self._head_late, waited_from)

    def _head_late(self, waited_from) -> None:
        serving = self.cycle is not None and not self.cycle.response_complete
        upgraded = self.transport.get_protocol() is not self  # a WebSocket now: its session's bounds hold it
        if self.cycle is waited_from and not serving and not upgraded and not self.transport.is_closing():
            self.transport.close()
