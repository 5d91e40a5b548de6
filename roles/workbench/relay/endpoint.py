"""One way out of a sandbox without network: the model API, metered, and nothing else.

``ModelEndpoint`` runs outside the sandbox: an HTTP server on a Unix socket (in a private folder
bound into the sandbox) that forwards each request to the configured upstream — the real API,
a local model server, the scripted server — and sets the credentials itself. The sandbox holds
only a placeholder key: the org's key never enters it, so agent code cannot read it from the
environment or from the CLI's memory.

What passes: ``POST /v1/messages`` (any query, e.g. Claude Code's ``?beta=true``) — the only call
Claude Code 2.1.112 makes in ``-p`` mode, besides a ``HEAD /`` warm-up answered here with an
empty 200. Everything else (batches, files, models, count_tokens, admin, other methods) is refused
with a 403 ``permission_error`` and ``x-should-retry: false``, logged and counted in
``refusals`` (by code; ``refused`` is the total). The command backend logs the counts with each
act (``cli ended``) and keeps the run's total on the backend.

What is counted: the usage of every response, read here from the JSON body or from the SSE stream
(``metering.UsageReader``), is handed to ``on_served`` keyed by the response's ``request-id``
header (else the message id) as soon as the response ends — whether or not the client is still
there to read it: when the client goes away mid-response the rest is still read from the upstream,
so its final usage is known. ``stop()`` waits ``drain_s`` for responses in flight, then cuts them;
a cut response counts its input and the whole ``max_tokens`` it was allowed.

What is refused for the budget: ``ledger`` (``metering.Ledger``) admits each request, lowers its
``max_tokens`` to what the run has left, and refuses it (400 ``invalid_request_error``, code =
the stop reason) once the budget is spent or the run was told to stop.

Who may connect: the socket is a per-act path in an owner-only folder, mode 0600, and only one
process may use it — the first to connect (``SO_PEERCRED``), which is the relay, because the relay
connects before it starts the CLI. The relay in turn serves only the CLI's own process (see
``endpoint_relay.py``). Inside the sandbox every process of the run has the same uid, so this
separates processes only as far as they cannot act as one another; a process that can ptrace the
CLI can send requests as it. Those requests are metered and capped all the same.

Inside the sandbox, ``endpoint_relay.py`` listens on 127.0.0.1 in the sandbox's own network
namespace and relays bytes to that socket, because HTTP clients speak TCP, not Unix sockets.
"""
from __future__ import annotations

import http.client
import json
import socket
import socketserver
import ssl
import struct
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

import structlog

from roles.workbench.sandbox.errors import SandboxConfigError
from roles.workbench.relay.metering import COUNTS, Ledger, Refusal, Served, Ticket, UsageReader

log = structlog.get_logger("sandbox.endpoint")

RELAY_SCRIPT = Path(__file__).with_name("endpoint_relay.py")
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes; longer paths fail to bind
ROUTES = frozenset({("POST", "/v1/messages")})
MAX_BODY = 32 * 2**20  # the API's own request limit
_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                  "transfer-encoding", "upgrade", "host", "content-length"})
_CREDENTIALS = frozenset({"x-api-key", "authorization"})
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
_UCRED = struct.Struct("3i")


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
    """Forwards model requests from a Unix socket to ``upstream`` with the org's credentials.

    Params: ``upstream`` base URL (``http(s)://host[:port][/prefix]``); ``socket_path`` where to
    listen (≤ 100 characters); ``api_key`` sent as ``x-api-key`` / ``auth_token`` as a bearer
    token, replacing whatever the client sent; ``ledger`` admits and caps each request (None:
    no budget); ``on_served(Served)`` gets each response's usage, from the serving thread;
    ``drain_s`` how long ``stop()`` waits for responses in flight; ``pin_peer`` serves only the
    first process that connects.
    Errors: ``SandboxConfigError`` for a bad upstream or a socket path too long.
    """

    def __init__(self, upstream: str, socket_path: Path, *, api_key: str | None = None,
                 auth_token: str | None = None, ledger: Ledger | None = None,
                 on_served: Callable[[Served], None] | None = None, timeout_s: float = 600.0,
                 drain_s: float = 5.0, pin_peer: bool = True) -> None:
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
        self.ledger, self.on_served = ledger, on_served
        self.timeout_s, self.drain_s, self.pin_peer = timeout_s, drain_s, pin_peer
        self.requests = 0
        self.warmups = 0
        self.refusals: Counter[str] = Counter()
        self.peer_pid: int | None = None
        self._ids: set[str] = set()
        self._inflight: dict[int, http.client.HTTPConnection | None] = {}
        self._idle = threading.Condition()
        self._server: _Server | None = None

    @property
    def refused(self) -> int:
        return sum(self.refusals.values())

    def start(self) -> Path:
        """Listen (owner-only socket) and serve in a thread. Returns the socket path."""
        server = _Server(str(self.socket_path), _Handler)
        server.endpoint = self
        self.socket_path.chmod(0o600)
        self._server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                         name="model-endpoint", daemon=True).start()
        return self.socket_path

    def stop(self) -> None:
        """Stop listening; wait ``drain_s`` for responses in flight, then cut them (each is still
        metered before this returns, within two more seconds)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.socket_path.unlink(missing_ok=True)
        if not self._wait_idle(self.drain_s):
            with self._idle:
                cut = [c for c in self._inflight.values() if c is not None]
            log.warning("model responses still in flight at the end of the act; cutting them", count=len(cut),
                        next="each counts its input and its whole max_tokens")
            for conn in cut:
                _shutdown(conn)
            self._wait_idle(2.0)

    def __enter__(self) -> ModelEndpoint:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- one request ------------------------------------------------------------------------

    def forward(self, req: BaseHTTPRequestHandler) -> None:
        path = req.path if req.path.startswith("/") else "/" + req.path
        route = path.split("?", 1)[0]
        if not self._peer_allowed(req.connection):
            return self._refuse(req, Refusal("peer", "only the relay of this act may use this socket", 403), path)
        if req.command == "HEAD" and route == "/.relay/refused":
            return self._refuse(req, Refusal("relay_peer", "the relay refused a connection from a process other "
                                             "than the CLI", 403), path)
        if req.command == "HEAD" and path == "/":
            # Claude Code's connection warm-up: a HEAD of the base URL whose answer it ignores.
            # Answered here, so nothing goes upstream and no refusal is logged for every run.
            self.warmups += 1
            return _reply(req, 200, b"", "text/plain")
        if (req.command, route) not in ROUTES:
            return self._refuse(req, Refusal("route", "only POST /v1/messages is reachable from the sandbox", 403),
                                path)
        if "chunked" in (req.headers.get("Transfer-Encoding") or "").lower():
            return self._refuse(req, Refusal("bad_request", "send a Content-Length", 411), path)
        length = int(req.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY:
            return self._refuse(req, Refusal("bad_request", f"the body must be 1..{MAX_BODY} bytes", 413), path)
        body = req.rfile.read(length)
        ticket = self.ledger.admit(body) if self.ledger is not None else None
        if isinstance(ticket, Refusal):
            return self._refuse(req, ticket, path)
        key = threading.get_ident()
        with self._idle:
            self._inflight[key] = None
        try:
            self._exchange(req, path, ticket.body if ticket else body, ticket)
        finally:
            with self._idle:
                self._inflight.pop(key, None)
                self._idle.notify_all()

    def _exchange(self, req: BaseHTTPRequestHandler, path: str, body: bytes, ticket: Ticket | None) -> None:
        conn = self._connection()
        with self._idle:
            self.requests += 1
            self._inflight[threading.get_ident()] = conn
        try:
            conn.putrequest(req.command, self.url.path.rstrip("/") + path, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", self.url.netloc)
            for name, value in req.headers.items():
                if name.lower() not in _HOP and name.lower() not in _CREDENTIALS:
                    conn.putheader(name, value)
            for name, value in self._credentials.items():
                conn.putheader(name, value)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            self._settle(ticket, None, {}, "")  # nothing was answered: the hold is released
            log.warning("model endpoint unreachable", upstream=self.url.netloc, error=type(exc).__name__)
            return _error(req, 502, "api_error", f"the model endpoint is unreachable: {type(exc).__name__}")
        reader = UsageReader("text/event-stream" in (resp.getheader("Content-Type") or ""))
        client = True
        try:
            client = _send_head(req, resp)
            while chunk := resp.read1(65536):
                reader.feed(chunk)
                if client:
                    client = _write(req, chunk)
            reader.finish()
        except (OSError, http.client.HTTPException) as exc:
            log.info("model response cut", error=type(exc).__name__, client_connected=client)
        finally:
            conn.close()
            self._settle(ticket, reader, dict(resp.getheaders()), str(resp.status))

    def _settle(self, ticket: Ticket | None, reader: UsageReader | None, headers: dict, status: str) -> None:
        counts = reader.counts() if reader is not None else None
        if counts is None:
            if ticket is not None and self.ledger is not None:
                self.ledger.settle(ticket, dict.fromkeys(COUNTS, 0))
            if status.startswith("2"):
                log.warning("model response without usage; nothing counted", status=status,
                            next="check that the upstream reports usage like the Anthropic API")
            return
        if not reader.complete and ticket is not None:
            counts["output_tokens"] = max(counts["output_tokens"], ticket.max_tokens)
        cost = self.ledger.settle(ticket, counts) if ticket is not None and self.ledger is not None else 0.0
        served = Served(self._request_id(headers, reader), ticket.model if ticket else (reader.model or "unknown"),
                        cost_usd=cost, complete=reader.complete, **counts)
        log.info("model call metered", request_id=served.request_id, model=served.model,
                 tokens=served.total_tokens, cost_usd=round(cost, 6), complete=served.complete,
                 max_tokens=ticket.max_tokens if ticket else None)
        if self.on_served is not None:
            self.on_served(served)

    def _request_id(self, headers: dict, reader: UsageReader) -> str:
        lower = {k.lower(): v for k, v in headers.items()}
        rid = lower.get("request-id") or reader.message_id or f"ep_{uuid.uuid4().hex[:20]}"
        with self._idle:
            # a server that repeats its ids must not make two calls count as one
            while rid in self._ids:
                rid = f"{rid}+{uuid.uuid4().hex[:6]}"
            self._ids.add(rid)
        return rid

    def _peer_allowed(self, sock: socket.socket) -> bool:
        if not self.pin_peer:
            return True
        try:
            pid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))[0]
        except OSError:
            return False
        with self._idle:
            if self.peer_pid is None:
                self.peer_pid = pid
        return pid == self.peer_pid

    def _refuse(self, req: BaseHTTPRequestHandler, refusal: Refusal, path: str) -> None:
        with self._idle:
            self.refusals[refusal.code] += 1
        log.warning("model endpoint refused a request", code=refusal.code, method=req.command, path=path[:200],
                    status=refusal.status, next="the client gets an HTTP error; nothing reached the model")
        kind = "permission_error" if refusal.status == 403 else "invalid_request_error"
        _error(req, refusal.status, kind, f"{refusal.code}: {refusal.message}")

    def _wait_idle(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _connection(self) -> http.client.HTTPConnection:
        if self.url.scheme == "https":
            return http.client.HTTPSConnection(self.url.hostname, self.url.port or 443, timeout=self.timeout_s,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(self.url.hostname, self.url.port or 80, timeout=self.timeout_s)


def _send_head(req: BaseHTTPRequestHandler, resp: http.client.HTTPResponse) -> bool:
    """Pass the status and headers on; False when the client is gone."""
    try:
        req.send_response(resp.status, resp.reason)
        for name, value in resp.getheaders():
            if name.lower() not in _HOP or (name.lower() == "content-length" and not resp.chunked):
                req.send_header(name, value)
        req.send_header("Connection", "close")  # without a length, the body ends when we close
        req.end_headers()
        return True
    except OSError:
        return False


def _write(req: BaseHTTPRequestHandler, chunk: bytes) -> bool:
    try:
        req.wfile.write(chunk)
        req.wfile.flush()
        return True
    except OSError:
        return False  # the client went away: the rest is still read, for its usage


def _shutdown(conn: http.client.HTTPConnection) -> None:
    try:
        if conn.sock is not None:
            conn.sock.shutdown(socket.SHUT_RDWR)  # wakes a read blocked in another thread
    except OSError:
        pass


def _error(req: BaseHTTPRequestHandler, status: int, kind: str, message: str) -> None:
    _reply(req, status, json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode(),
           "application/json", {"x-should-retry": "false"})


def _reply(req: BaseHTTPRequestHandler, status: int, data: bytes, content_type: str,
           headers: dict[str, str] | None = None) -> None:
    try:
        req.send_response(status)
        req.send_header("Content-Type", content_type)
        req.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            req.send_header(name, value)
        req.send_header("Connection", "close")
        req.end_headers()
        if req.command != "HEAD":
            req.wfile.write(data)
    except OSError:
        pass  # the client went away before its answer
