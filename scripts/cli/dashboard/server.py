"""Run the dashboard: bind the socket, print the link with its one-time ticket, serve until Ctrl-C.

The socket is bound here, before uvicorn starts, so a port in use is one coded error and
``--port 0`` prints the port the system chose.
"""
from __future__ import annotations

import secrets
import socket
import sys
from typing import TextIO

from scripts.cli.dashboard.app import build_app
from scripts.cli.dashboard.errors import PortInUse
from scripts.cli.dashboard.guard import LOOPBACK, Guard
from state_db.kernel import config as config_mod
from state_db.kernel.home import OrgHome


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port. Raises PortInUse."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise PortInUse(host, port, exc.strerror or str(exc)) from None
    sock.set_inheritable(True)
    return sock


def link(host: str, port: int, ticket: str) -> str:
    """The printed link: its ticket opens the dashboard once (``guard``), then nothing."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/?ticket={ticket}"


def serve(home: OrgHome, host: str = "127.0.0.1", port: int = 0, *, token: str | None = None,
          out: TextIO = sys.stdout) -> None:
    """Serve the dashboard of ``home`` until interrupted.

    Args:
        host, port: where to listen (port 0: a free one).
        token: the one-time ticket of the printed link (default: a fresh random one each start).
        out: where the link is printed (one line, flushed, before the first request is served).
    Raises: PortInUse, ConfigError (a bad org.toml), HomeNotFound.
    """
    import uvicorn

    cfg = config_mod.load_config(home)
    token = token or secrets.token_urlsafe(24)
    sock = bind(host, port)
    port = sock.getsockname()[1]
    app = build_app(home, Guard(token, host, port), cfg.limits.total_spend_usd)
    print(f"dashboard: {link(host, port, token)}", file=out, flush=True)
    if host not in LOOPBACK:
        print(f"warning: listening on {host}, not only this machine; whoever opens the link first acts as you",
              file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                           timeout_graceful_shutdown=2))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
