"""A local Anthropic-compatible Messages API server replaying a script.

``ScriptedServer(script, log_path).start()`` returns the base URL (``http://127.0.0.1:PORT``);
the loop reaches it only through the ``anthropic`` backend with that ``base_url``. It answers
``POST /v1/messages`` as JSON or, when the request says ``"stream": true``, as the SSE event
sequence of the real API (``message_start``, ``ping``, per block ``content_block_start`` /
``content_block_delta`` / ``content_block_stop``, ``message_delta``, ``message_stop``).

Results are labelled: the response's ``model`` is ``scripted/<requested model>`` and every
response carries ``x-loop-org-served-by: scripted``. Every request is logged as one JSONL line in
``log_path`` (``event`` ``step`` when served, ``error`` when refused) and the first turn of each
act adds an ``act`` line — the chaos tests count them.

``MessagesServer`` (the HTTP plumbing) and ``message_body`` / ``sse_events`` (the wire shapes)
are shared with the tests' fault-injecting fake server.

CLI: ``python -m roles.workbench.scripted.server --script F --log L`` prints the URL, serves
until SIGINT/SIGTERM; a bad script exits 2 with one line on stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator, Mapping

import structlog

from roles.workbench.scripted.script import (Script, ScriptError, Turn, first_user_text, load_script,
                                              review_of_request, step_of_request)

log = structlog.get_logger("loop_agent.scripted")

SERVED_BY = "scripted"
_STREAM_CHUNK = 40  # characters per text / JSON delta, so clients really reassemble


def message_body(*, model: str, content: list[dict], stop_reason: str | None,
                 usage: Mapping[str, int], msg_id: str | None = None) -> dict[str, Any]:
    """A Messages API response object."""
    return {"id": msg_id or f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
            "model": model, "content": content, "stop_reason": stop_reason, "stop_sequence": None,
            "usage": dict(usage)}


def error_body(kind: str, message: str) -> dict[str, Any]:
    """A Messages API error object (``kind`` e.g. ``invalid_request_error``)."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def sse_event(name: str, data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def sse_events(message: Mapping[str, Any]) -> Iterator[bytes]:
    """The streaming event sequence that reassembles into ``message``."""
    usage = dict(message["usage"])
    start = dict(message, content=[], stop_reason=None, stop_sequence=None,
                 usage=dict(usage, output_tokens=min(1, usage.get("output_tokens", 0))))
    yield sse_event("message_start", {"type": "message_start", "message": start})
    yield sse_event("ping", {"type": "ping"})
    for index, block in enumerate(message["content"]):
        if block.get("type") == "text":
            head, deltas = {"type": "text", "text": ""}, [{"type": "text_delta", "text": c}
                                                          for c in _chunks(block.get("text", ""))]
        elif block.get("type") == "tool_use":
            head = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": c} for c in _chunks(json.dumps(block["input"]))]
        else:
            head, deltas = block, []
        yield sse_event("content_block_start", {"type": "content_block_start", "index": index, "content_block": head})
        for delta in deltas:
            yield sse_event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        yield sse_event("content_block_stop", {"type": "content_block_stop", "index": index})
    yield sse_event("message_delta", {"type": "message_delta",
                                      "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                                      "usage": {"output_tokens": usage.get("output_tokens", 0)}})
    yield sse_event("message_stop", {"type": "message_stop"})


def _chunks(text: str) -> list[str]:
    return [text[i:i + _STREAM_CHUNK] for i in range(0, len(text), _STREAM_CHUNK)] or [""]


class Exchange:
    """One HTTP request and the ways to answer it."""

    def __init__(self, handler: BaseHTTPRequestHandler, raw: bytes) -> None:
        self.handler, self.raw, self.path = handler, raw, handler.path
        self.headers = {k.lower(): v for k, v in handler.headers.items()}
        try:
            self.body: Any = json.loads(raw) if raw else None
        except ValueError:
            self.body = None

    def send(self, status: int, data: bytes, headers: Mapping[str, str] | None = None,
             content_type: str = "application/json") -> None:
        h = self.handler
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()

    def json(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        self.send(status, json.dumps(body).encode(), headers)

    def sse(self, events: Iterator[bytes], headers: Mapping[str, str] | None = None) -> None:
        h = self.handler
        h.close_connection = True  # no Content-Length: the end of the stream is the end of the connection
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(b"".join(events))  # one write: the client still parses event by event
        h.wfile.flush()

    def drop(self) -> None:
        """Close the connection without any response."""
        self.handler.close_connection = True
        self.handler.connection.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as separate writes: avoid the 40 ms ACK stall
    server: _HTTPServer

    def do_POST(self) -> None:  # noqa: N802 — http.server's naming
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.owner.respond(Exchange(self, raw))

    def log_message(self, format: str, *args: Any) -> None:  # requests go to the JSONL log instead
        pass


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a deliberately hung handler must not block stop()
    owner: MessagesServer


class MessagesServer:
    """A threaded HTTP server on 127.0.0.1 that hands each POST to ``respond``."""

    def __init__(self, port: int = 0) -> None:
        self._port = port
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("server not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> str:
        """Bind and serve in a background thread. Returns the base URL."""
        self._httpd = _HTTPServer(("127.0.0.1", self._port), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=type(self).__name__, daemon=True)
        self._thread.start()
        return self.base_url

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> MessagesServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def respond(self, exchange: Exchange) -> None:
        raise NotImplementedError


LOG_MAX_BYTES = 10 * 2**20
PROMPT_LOG_CHARS = 8000


class ScriptedServer(MessagesServer):
    """Serves ``script`` (a ``Script`` or a path to a script file); logs JSONL to ``log_path``."""

    def __init__(self, script: Script | Path | str, log_path: Path | str, port: int = 0) -> None:
        super().__init__(port)
        self.script = script if isinstance(script, Script) else load_script(Path(script))
        self.log_path = Path(log_path)
        self._log_lock = threading.Lock()

    def respond(self, exchange: Exchange) -> None:
        request_id = f"req_scripted_{uuid.uuid4().hex[:20]}"
        headers = {"request-id": request_id, "x-loop-org-served-by": SERVED_BY}
        if exchange.path.split("?")[0].rstrip("/") != "/v1/messages":
            return self._refuse(exchange, headers, 404, "not_found_error", f"no route {exchange.path}; "
                                "the scripted server answers POST /v1/messages only")
        body = exchange.body
        reviewed = review_of_request(body)
        script = self.script.for_request(body)
        try:
            if reviewed is not None:       # the eval-agent's review: one scripted answer per iteration
                iteration, turn_index = reviewed, 0
                turn = script.review_for(reviewed)
            else:
                iteration, turn_index = step_of_request(body)
                turn = script.step(iteration, turn_index)
        except ScriptError as exc:
            return self._refuse(exchange, headers, 400, "invalid_request_error", f"scripted server: {exc}",
                                code=exc.code)
        if turn.delay_s:
            time.sleep(turn.delay_s)
        model = f"{SERVED_BY}/{body.get('model', 'unknown')}"
        message = message_body(model=model, content=turn_blocks(turn, iteration, turn_index),
                               stop_reason=turn.stop_reason, usage=turn.usage)
        stream = bool(body.get("stream"))
        if reviewed is not None:
            self._log({"event": "review", "iteration": iteration, "request_id": request_id,
                       "prompt": first_user_text(body)[:PROMPT_LOG_CHARS], "usage": turn.usage})
        elif turn_index == 0:   # the act's prompt, so a test can see what reached the model
            self._log({"event": "act", "iteration": iteration, "request_id": request_id,
                       "prompt": first_user_text(body)[:PROMPT_LOG_CHARS]})
        self._log({"event": "step", "request_id": request_id, "iteration": iteration, "turn": turn_index,
                   "stream": stream, "stop_reason": turn.stop_reason,
                   "tool_uses": [u.name for u in turn.tool_uses], "usage": turn.usage})
        if stream:
            exchange.sse(sse_events(message), headers)
        else:
            exchange.json(200, message, headers)

    def _refuse(self, exchange: Exchange, headers: dict, status: int, kind: str, message: str,
                code: str | None = None) -> None:
        log.error("scripted request refused", status=status, code=code, error=message,
                  request_id=headers["request-id"], next="the client gets an HTTP error")
        self._log({"event": "error", "request_id": headers["request-id"], "status": status,
                   "code": code, "message": message})
        exchange.json(status, error_body(kind, message), {**headers, "x-should-retry": "false"})

    def _log(self, entry: dict[str, Any]) -> None:
        line = json.dumps({"ts": time.time(), **entry}) + "\n"
        with self._log_lock:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            try:
                if self.log_path.stat().st_size > LOG_MAX_BYTES:   # rotate: one previous file kept
                    self.log_path.replace(self.log_path.with_name(self.log_path.name + ".1"))
            except FileNotFoundError:
                pass
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(line)


def turn_blocks(turn: Turn, iteration: int, turn_index: int) -> list[dict[str, Any]]:
    """Content blocks of a scripted turn; tool-use ids are derived from the step, so a repeated
    request gets the same ids."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": turn.text}] if turn.text else []
    blocks += [{"type": "tool_use", "id": f"toolu_s{iteration}_{turn_index}_{k}", "name": u.name, "input": u.input}
               for k, u in enumerate(turn.tool_uses)]
    return blocks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m roles.workbench.scripted.server",
                                     description="Serve a model script as an Anthropic-compatible API on 127.0.0.1.")
    parser.add_argument("--script", required=True, type=Path, help="script file (JSON, see scripted/script.py)")
    parser.add_argument("--log", required=True, type=Path, help="JSONL file logging every request and act")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (default: any free port)")
    args = parser.parse_args(argv)
    try:
        server = ScriptedServer(args.script, args.log, port=args.port)
    except ScriptError as exc:
        print(f"error ({exc.code}): {exc}", file=sys.stderr)
        return 2
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    print(server.start(), flush=True)
    log.info("scripted server ready", url=server.base_url, pid=os.getpid(), next="serving until SIGTERM")
    done.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
