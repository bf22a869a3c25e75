"""`rookworld serve`: rookworld's chess as an OpenEnv environment server (rookworld.integrations.openenv)."""

from __future__ import annotations

import argparse
import signal
import socket
import sys

from rookworld.commands.common import CliError, settings
from rookworld.chess.stockfish import StockfishError, StockfishNotFoundError
from rookworld.settings.commands import ServeSettings

try:
    import uvicorn

    from rookworld.integrations.openenv import (ENV_NAME, IDLE_S, MAX_REQUEST_BYTES, ChessEngines, ChessEnvError,
                                                create_chess_app)
    from rookworld.integrations.openenv_http import BoundedHTTP
except ModuleNotFoundError as e:  # the optional extra is not installed: said when the command runs
    missing: str | None = e.name
else:
    missing = None

#: Seconds the server waits at shutdown for its sessions' steps under way before it cancels them.
GRACE_S = 10


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket listening on host:port, so that an address in use is one line here and port 0 names its port."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise CliError(f"--host {host}: {e.strerror or e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)  # clients that come before the app is up wait for it, not get refused
    except OSError as e:
        sock.close()
        raise CliError(f"--host {host} --port {port}: {e.strerror or e}") from None
    return sock


def run(args: argparse.Namespace) -> int:
    s = settings(args, ServeSettings)
    if missing is not None:
        raise CliError(f"rookworld serve needs OpenEnv: pip install 'rookworld[openenv]' (no module {missing!r})")
    try:
        engines = ChessEngines(stockfish_path=s.stockfish_path, stockfish_depth=s.stockfish_depth,
                               stockfish_workers=s.stockfish_workers, stockfish_cache=s.stockfish_cache,
                               opponent_elo=s.opponent_elo, opponent_skill=s.opponent_skill,
                               opponent_nodes=s.opponent_nodes, max_plies=s.max_plies)
    except StockfishNotFoundError as e:
        raise CliError(str(e)) from None
    # A Stockfish that cannot start, or an opponent it will not be, is said now, not at the first client's reset.
    try:
        engines.close_game(engines.open_game(*engines.opponent))
        sock = listening_socket(s.host, s.port)
    except ChessEnvError as e:  # the opponent's strength, named as a reset names it: "opponent_elo: why"
        engines.close()
        flag = "--opponent-skill" if s.opponent_skill is not None else "--opponent-elo"
        raise CliError(f"{flag}:{str(e).partition(':')[2]}") from None
    except (StockfishError, OSError) as e:
        engines.close()
        raise CliError(f"cannot start Stockfish: {e}") from None
    except BaseException:
        engines.close()
        raise
    terminated: list[int] = []
    previous = signal.getsignal(signal.SIGTERM)
    try:
        app = create_chess_app(engines, max_sessions=s.max_sessions)
        # The protocol refuses a WebSocket message over the limit before reading it whole (uvicorn's own is 16 MiB);
        # BoundedHTTP: a bound on open connections and on the time to a request's head (silent sockets).
        config = uvicorn.Config(app, log_level="info", timeout_graceful_shutdown=GRACE_S,
                                ws_max_size=MAX_REQUEST_BYTES, http=BoundedHTTP)
        server = uvicorn.Server(config)
        # From here a SIGTERM is the server's to handle, also before its loop runs and takes signals over (one that
        # came between the line below and the loop's start left a coroutine never awaited): it shuts down as
        # asked, and the command then ends as any terminated one does.
        signal.signal(signal.SIGTERM, lambda sig, frame: (terminated.append(sig), server.handle_exit(sig, frame)))
        host, port = sock.getsockname()[:2]
        host = f"[{host}]" if ":" in host else host  # an IPv6 address, as a URL writes it
        print(f"rookworld serve: OpenEnv environment {ENV_NAME} on http://{host}:{port} (WebSocket /ws, up to "
              f"{s.max_sessions} sessions, each closed after {IDLE_S:g} s idle)", file=sys.stderr, flush=True)
        server.run(sockets=[sock])
    finally:
        engines.close()
        sock.close()
        signal.signal(signal.SIGTERM, previous)  # after the clean-up, which a SIGTERM must not cut short
    if terminated:
        signal.raise_signal(signal.SIGTERM)  # to the command's own handler: "terminated", 143
    return 0
