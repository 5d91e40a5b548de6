"""A fault-injecting fake Messages API on 127.0.0.1 for tests of the anthropic backend.

Each request takes the next queued behaviour: a normal reply (text / tool use, any usage and stop
reason), an HTTP error (429 with ``retry-after``, 529, 500, …), a hang beyond the client timeout,
a dropped connection, or a truncated JSON body. An empty queue answers a loud non-retryable 500.
Requests (bodies and headers) are recorded for assertions. The wire shapes and HTTP plumbing are
the scripted server's, so both speak the same dialect.
"""
from __future__ import annotations

import json
import threading
import uuid
from collections import deque
from itertools import islice
from typing import Any, Callable

from roles.workbench.scripted.server import Exchange, MessagesServer, error_body, message_body, sse_events

Behaviour = Callable[[Exchange, "FakeMessagesAPI"], None]
DEFAULT_USAGE = {"input_tokens": 10, "output_tokens": 5}


class FakeMessagesAPI(MessagesServer):
    def __init__(self) -> None:
        super().__init__()
        self._queue: deque[Behaviour] = deque()
        self._lock = threading.Lock()
        self.requests: list[Any] = []
        self.headers: list[dict[str, str]] = []
        self.stopping = threading.Event()

    def enqueue(self, *behaviours: Behaviour) -> FakeMessagesAPI:
        with self._lock:
            self._queue.extend(behaviours)
        return self

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def respond(self, exchange: Exchange) -> None:
        with self._lock:
            self.requests.append(exchange.body)
            self.headers.append(exchange.headers)
            behaviour = self._queue.popleft() if self._queue else None
        if behaviour is None:
            exchange.json(500, error_body("api_error", "fake: no behaviour queued"), {"x-should-retry": "false"})
        else:
            behaviour(exchange, self)

    def stop(self) -> None:
        self.stopping.set()  # releases hung handlers
        super().stop()


def reply(content: list[dict], stop_reason: str | None = "end_turn", usage: dict | None = None,
          request_id: str | None = None, model: str | None = None) -> Behaviour:
    """A normal response (JSON, or SSE when the request asks to stream)."""
    def behave(ex: Exchange, fake: FakeMessagesAPI) -> None:
        body = message_body(model=model or (ex.body or {}).get("model", "fake"), content=content,
                            stop_reason=stop_reason, usage=usage or DEFAULT_USAGE)
        headers = {"request-id": request_id or f"req_fake_{uuid.uuid4().hex[:16]}"}
        if (ex.body or {}).get("stream"):
            ex.sse(sse_events(body), headers)
        else:
            ex.json(200, body, headers)
    return behave


def text_turn(text: str, stop_reason: str = "end_turn", **kw: Any) -> Behaviour:
    return reply([{"type": "text", "text": text}], stop_reason, **kw)


def tool_use_turn(name: str, tool_input: Any, *, text: str | None = None, tool_id: str | None = None,
                  **kw: Any) -> Behaviour:
    content = [{"type": "text", "text": text}] if text else []
    content.append({"type": "tool_use", "id": tool_id or f"toolu_{uuid.uuid4().hex[:12]}",
                    "name": name, "input": tool_input})
    return reply(content, "tool_use", **kw)


def status(code: int, kind: str, message: str, headers: dict[str, str] | None = None) -> Behaviour:
    def behave(ex: Exchange, fake: FakeMessagesAPI) -> None:
        ex.json(code, error_body(kind, message), {"request-id": f"req_err_{uuid.uuid4().hex[:8]}", **(headers or {})})
    return behave


def rate_limited(retry_after: str | None = "2", retry_after_ms: str | None = None) -> Behaviour:
    headers = {k: v for k, v in (("retry-after", retry_after), ("retry-after-ms", retry_after_ms)) if v is not None}
    return status(429, "rate_limit_error", "fake: rate limited", headers)


def overloaded() -> Behaviour:
    return status(529, "overloaded_error", "fake: overloaded")


def server_error() -> Behaviour:
    return status(500, "api_error", "fake: internal error")


def hang(seconds: float) -> Behaviour:
    """Say nothing for ``seconds`` (longer than the client timeout), then drop the connection."""
    def behave(ex: Exchange, fake: FakeMessagesAPI) -> None:
        fake.stopping.wait(seconds)
        ex.drop()
    return behave


def drop() -> Behaviour:
    """Close the connection without answering."""
    return lambda ex, fake: ex.drop()


def cut_stream(events: int = 3) -> Behaviour:
    """Start a streamed reply, then close the connection after ``events`` SSE events."""
    def behave(ex: Exchange, fake: FakeMessagesAPI) -> None:
        body = message_body(model="fake", content=[{"type": "text", "text": "never finished " * 10}],
                            stop_reason="end_turn", usage=DEFAULT_USAGE)
        ex.sse(islice(sse_events(body), events), {"request-id": f"req_cut_{uuid.uuid4().hex[:8]}"})
    return behave


def truncated_json() -> Behaviour:
    """A complete HTTP response whose JSON body is cut in the middle."""
    def behave(ex: Exchange, fake: FakeMessagesAPI) -> None:
        full = json.dumps(message_body(model="fake", content=[{"type": "text", "text": "cut " * 20}],
                                       stop_reason="end_turn", usage=DEFAULT_USAGE)).encode()
        ex.send(200, full[: len(full) // 2], {"request-id": f"req_cut_{uuid.uuid4().hex[:8]}"})
    return behave
