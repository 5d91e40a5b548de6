"""One way out of a sandbox without network: the model API, and nothing else.

``ModelEndpoint`` runs outside the sandbox: an HTTP server on a Unix socket (in a private folder
bound into the sandbox) that forwards each request to the configured upstream — the real API,
a local model server, the scripted server — and sets the credentials itself. The sandbox holds
only a placeholder key: the org's key never enters it, so agent code cannot read it from the
environment or from the CLI's memory. Only paths under ``allowed_prefixes`` (``/v1/``) pass;
``HEAD /`` (a client's connection warm-up) is answered here with an empty 200.

Inside the sandbox, ``endpoint_relay.py`` listens on 127.0.0.1 in the sandbox's own network
namespace and relays bytes to that socket, because HTTP clients speak TCP, not Unix sockets.
"""
from __future__ import annotations

import http.client
import json
import socketserver
import ssl
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Sequence
from urllib.parse import urlparse

import structlog

from roles.sandbox.errors import SandboxConfigError

log = structlog.get_logger("sandbox.endpoint")

RELAY_SCRIPT = Path(__file__).with_name("endpoint_relay.py")
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes; longer paths fail to bind
_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                  "transfer-encoding", "upgrade", "host", "content-length"})
_CREDENTIALS = frozenset({"x-api-key", "authorization"})
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False  # a request still waiting on the upstream must not hold up stop()
    endpoint: "ModelEndpoint"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args) -> None:  # noqa: A002 — the stdlib's name
        pass  # requests are logged by ``_forward`` with structlog

    def address_string(self) -> str:
        return "sandbox"

    def _forward(self) -> None:
        self.close_connection = True
        self.server.endpoint.forward(self)


for _m in _METHODS:
    setattr(_Handler, f"do_{_m}", _Handler._forward)


class ModelEndpoint:
    """Forwards HTTP from a Unix socket to ``upstream`` with the org's credentials.

    Params: ``upstream`` base URL (``http(s)://host[:port][/prefix]``); ``socket_path`` where to
    listen (≤ 100 characters); ``api_key`` sent as ``x-api-key`` / ``auth_token`` as a bearer
    token, replacing whatever the client sent; ``allowed_prefixes`` of request paths.
    Errors: ``SandboxConfigError`` for a bad upstream or a socket path too long.
    """

    def __init__(self, upstream: str, socket_path: Path, *, api_key: str | None = None,
                 auth_token: str | None = None, allowed_prefixes: Sequence[str] = ("/v1/",),
                 timeout_s: float = 600.0) -> None:
        url = urlparse(upstream)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise SandboxConfigError(f"model endpoint {upstream!r} must be an http(s) URL")
        if len(str(socket_path)) > MAX_SOCKET_PATH:
            raise SandboxConfigError(f"socket path {socket_path} is longer than {MAX_SOCKET_PATH} characters; "
                                     "use a shorter private folder")
        self.url = url
        self.socket_path = Path(socket_path)
        self._credentials = {"x-api-key": api_key} if api_key else {}
        if auth_token:
            self._credentials["Authorization"] = f"Bearer {auth_token}"
        self.allowed = tuple(allowed_prefixes)
        self.timeout_s = timeout_s
        self.requests = 0
        self.refused = 0
        self.warmups = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Path:
        """Listen (owner-only socket) and serve in a thread. Returns the socket path."""
        server = _Server(str(self.socket_path), _Handler)
        server.endpoint = self
        self.socket_path.chmod(0o600)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="model-endpoint", daemon=True)
        self._thread.start()
        return self.socket_path

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.socket_path.unlink(missing_ok=True)

    def __enter__(self) -> ModelEndpoint:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- one request ------------------------------------------------------------------------

    def forward(self, req: BaseHTTPRequestHandler) -> None:
        path = req.path if req.path.startswith("/") else "/" + req.path
        if req.command == "HEAD" and path == "/":
            # Claude Code's connection warm-up: a HEAD of the base URL whose answer it ignores.
            # Answered here, so nothing goes upstream and no refusal is logged for every run.
            self.warmups += 1
            return _reply(req, 200, b"", "text/plain")
        if not path.startswith(self.allowed) or ".." in path.split("?", 1)[0]:
            self.refused += 1
            log.warning("sandbox asked for a path outside the model API; refused", method=req.command, path=path[:200])
            return _error(req, 403, "permission_error", f"only {', '.join(self.allowed)} is reachable from the sandbox")
        if "chunked" in (req.headers.get("Transfer-Encoding") or "").lower():
            return _error(req, 411, "invalid_request_error", "send a Content-Length")
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length > 0 else None
        self.requests += 1
        conn = self._connection()
        try:
            conn.putrequest(req.command, self.url.path.rstrip("/") + path, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", self.url.netloc)
            for name, value in req.headers.items():
                if name.lower() not in _HOP and name.lower() not in _CREDENTIALS:
                    conn.putheader(name, value)
            for name, value in self._credentials.items():
                conn.putheader(name, value)
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            log.warning("model endpoint unreachable", upstream=self.url.netloc, error=type(exc).__name__)
            return _error(req, 502, "api_error", f"the model endpoint is unreachable: {type(exc).__name__}")
        try:
            req.send_response(resp.status, resp.reason)
            for name, value in resp.getheaders():
                if name.lower() not in _HOP or (name.lower() == "content-length" and not resp.chunked):
                    req.send_header(name, value)
            req.send_header("Connection", "close")  # without a length, the body ends when we close
            req.end_headers()
            if req.command != "HEAD":
                while chunk := resp.read1(65536):
                    req.wfile.write(chunk)
                    req.wfile.flush()
        except (OSError, http.client.HTTPException) as exc:
            log.info("model response cut", error=type(exc).__name__)
        finally:
            conn.close()

    def _connection(self) -> http.client.HTTPConnection:
        if self.url.scheme == "https":
            return http.client.HTTPSConnection(self.url.hostname, self.url.port or 443, timeout=self.timeout_s,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(self.url.hostname, self.url.port or 80, timeout=self.timeout_s)


def _error(req: BaseHTTPRequestHandler, status: int, kind: str, message: str) -> None:
    _reply(req, status, json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode(),
           "application/json")


def _reply(req: BaseHTTPRequestHandler, status: int, data: bytes, content_type: str) -> None:
    req.send_response(status)
    req.send_header("Content-Type", content_type)
    req.send_header("Content-Length", str(len(data)))
    req.send_header("Connection", "close")
    req.end_headers()
    if req.command != "HEAD":
        req.wfile.write(data)
