"""The ``anthropic`` act backend: the official SDK, Messages API with workspace tools.

One act is a tool-use conversation: the stable prefix goes in a cached system block
(``cache_control: ephemeral``), the variable prompt is the first user message, and every
``tool_use`` the model asks for is run by ``WorkspaceTools`` and answered with a ``tool_result``
(``is_error`` when the tool refused). Each response's usage — input, output, cache write, cache
read, and cost from the price table — goes to ``on_usage`` before any tool runs.

The SDK's own retries are off (``max_retries=0``); ``Retrier`` retries instead, with a
``RateGate`` shared by every loop-agent of the org. Status mapping (see ``backends.base``):
``end_turn``/``stop_sequence`` → ``ok``; ``max_tokens``, ``model_context_window_exceeded``,
too many turns → ``failed``; ``refusal``, exhausted retries and non-retryable API errors →
``model_error``.

Caps cut inside a call. Before each request the run's ``Remaining`` (``ActContext.remaining``)
bounds it: ``max_tokens`` ≤ the tokens left and ≤ the cost left ÷ the model's output price per
token; the request timeout ≤ the seconds left, and no retry wait sleeps past them (``Retrier``'s
``time_left``); a streamed response is also cut when the run's time runs out between two events.
A cap already reached ends the act ``budget_exhausted`` with its stop code (``token_budget``,
``cost_budget``, ``timeout``) before the request is sent. What a cap cannot bound is the input:
the budget is checked before each call, and a call's input tokens are known only once it is
sent, so a run can exceed a token or cost budget by at most one request's input (plus, for
cost, one output token when less than one output token's price was left: the API needs
``max_tokens`` ≥ 1). Counting the input first with the count-tokens endpoint would cost a round
trip per turn and is not offered by every compatible server, so it is not used.

The request timeout applies to each phase of the HTTP exchange (connect, each read): a hung
server is cut when the run's time is up. A stream, which may never fall silent, has its socket
shut down when the bound passes. A non-streamed body trickled byte by byte is bounded per read
only (a real API sends the body at once, after a silent generation the read timeout cuts). A call cut by the timeout may have been billed
for what the server generated; that usage is counted when the response says it (a cut stream's
``message_start``), and is otherwise unknowable.

The API key comes only from ``ANTHROPIC_API_KEY`` in the environment, is read when the client is
built, and is never logged or kept in any record. ``base_url`` comes from the configuration or
``ANTHROPIC_BASE_URL``; a loopback server (local model, scripted server) needs no key.
"""
from __future__ import annotations

import json
import math
import os
import random
import socket
import sys
import threading
import time
import uuid
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field, replace as _replace
from typing import Any, Callable, Iterator, Mapping
from urllib.parse import urlparse

import structlog

from roles.base import telemetry
from roles.loop_agent.backends.base import ActContext, ActOutcome, BackendConfigError, Remaining, Usage
from roles.loop_agent.backends.retry import Failure, MemoryRateGate, RateGate, Retrier, RetryPolicy, parse_retry_after
from roles.loop_agent.pricing import Price, PriceTable
from roles.loop_agent.commands import CommandRunner
from roles.loop_agent.tools import ToolLimits, WorkspaceTools, summarize_call
from state_db.vocab import TranscriptKind

log = structlog.get_logger("loop_agent.anthropic")

DEFAULT_BASE_URL = "https://api.anthropic.com"
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_NO_KEY = "no-key-for-loopback"  # loopback servers ignore it; the SDK insists on some credential
_SUMMARY_CAP = 2000

# HTTP status → (failure code, retryable); anything else 5xx is server_error, other 4xx api_error
_STATUS = {
    400: ("bad_request", False), 401: ("auth", False), 402: ("payment_required", False),
    403: ("permission", False), 404: ("not_found", False), 408: ("timeout", True),
    409: ("conflict", True), 413: ("request_too_large", False), 429: ("rate_limited", True),
    529: ("overloaded", True),
}
_OK_STOPS = frozenset({"end_turn", "stop_sequence"})
# a request needs some time to fail fast when the run's last fraction of a second is all it has
_MIN_TIMEOUT_S = 0.1
_PER_MILLION = 1_000_000
_FAILED_STOPS = {"max_tokens": "max_tokens", "model_context_window_exceeded": "context_window"}


@dataclass(frozen=True)
class AnthropicConfig:
    """Backend settings. ``timeout_s`` bounds each HTTP call; ``stream`` uses the SSE API."""

    model: str
    max_tokens: int = 8192
    base_url: str | None = None
    timeout_s: float = 120.0
    stream: bool = False
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    tool_limits: ToolLimits = field(default_factory=ToolLimits)


@dataclass(frozen=True)
class RequestBounds:
    """What one request may ask for: ``max_tokens`` and its timeout in seconds."""

    max_tokens: int
    timeout_s: float


def cap_reached(remaining: Remaining) -> str | None:
    """The stop code of a cap with nothing left (``token_budget``, ``cost_budget``, ``timeout``),
    or None. The engine's ``budget_left`` normally says so first; this guards the request itself."""
    if remaining.tokens is not None and remaining.tokens < 1:
        return "token_budget"
    if remaining.cost_usd is not None and remaining.cost_usd <= 0:
        return "cost_budget"
    if remaining.seconds is not None and remaining.seconds <= 0:
        return "timeout"
    return None


def request_bounds(config: AnthropicConfig, price: Price, remaining: Remaining) -> RequestBounds:
    """Bound one request by what the run has left.

    Params: ``config`` gives the configured ``max_tokens`` and ``timeout_s``; ``price`` the
    model's output price; ``remaining`` the run's caps left (None: no such cap).
    Returns: ``max_tokens`` ≤ the tokens left and ≤ the cost left ÷ the output price per token,
    at least 1 (the API's minimum); ``timeout_s`` ≤ the seconds left, at least ``_MIN_TIMEOUT_S``.
    Call it only when ``cap_reached`` says None.
    """
    max_tokens = config.max_tokens
    if remaining.tokens is not None:
        max_tokens = min(max_tokens, remaining.tokens)
    if remaining.cost_usd is not None and price.output > 0:
        max_tokens = min(max_tokens, math.floor(remaining.cost_usd * _PER_MILLION / price.output))
    timeout = config.timeout_s
    if remaining.seconds is not None:
        timeout = min(timeout, remaining.seconds)
    return RequestBounds(max(1, int(max_tokens)), max(_MIN_TIMEOUT_S, timeout))


class AnthropicBackend:
    """Act backend over the Messages API.

    Params: ``config``; ``prices`` (a ``PriceTable`` or its raw mapping); ``gate`` the org's shared
    rate gate (default: in-memory); ``runner`` executes ``run_command``; ``environ`` is read for
    ``ANTHROPIC_API_KEY`` / ``ANTHROPIC_BASE_URL``; ``clock``/``sleep``/``rng`` drive retries.
    Errors: ``BackendConfigError`` (codes ``unknown_model``, ``bad_price_table``,
    ``missing_api_key``, ``bad_config``) at construction.
    """

    name = "anthropic"

    def __init__(self, config: AnthropicConfig, prices: PriceTable | Mapping[str, Mapping[str, float]], *,
                 gate: RateGate | None = None, runner: CommandRunner | None = None,
                 environ: Mapping[str, str] | None = None, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, rng: Callable[[], float] = random.random) -> None:
        if not config.model or config.max_tokens < 1 or config.timeout_s <= 0:
            raise BackendConfigError("anthropic backend needs a model, max_tokens >= 1 and timeout_s > 0",
                                     code="bad_config")
        self.config = config
        self.prices = prices if isinstance(prices, PriceTable) else PriceTable(prices)
        self._price = self.prices.price(config.model)  # unknown model: configuration error now, not mid-run
        self._environ = os.environ if environ is None else environ
        self.base_url = config.base_url or self._environ.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL
        if not self._environ.get("ANTHROPIC_API_KEY") and not _is_loopback(self.base_url):
            raise BackendConfigError(
                f"ANTHROPIC_API_KEY is not set; export it to reach {self.base_url} "
                "(keys are read from the environment only)", code="missing_api_key")
        self._runner = runner
        self._retrier = Retrier(config.retry, gate if gate is not None else MemoryRateGate(),
                                clock=clock, sleep=sleep, rng=rng)
        self._client: Any = None

    def with_model(self, model: str) -> "AnthropicBackend":
        """This backend on ``model`` (a rung of the run's ladder). Raises BackendConfigError for a
        model the price table lacks."""
        import copy
        other = copy.copy(self)
        other.config = _replace(self.config, model=model)
        other._price = self.prices.price(model)
        return other

    def __repr__(self) -> str:
        return f"AnthropicBackend(model={self.config.model!r}, base_url={self.base_url!r})"

    def act(self, ctx: ActContext, *, on_usage: Callable[[Usage], None],
            budget_left: Callable[[], str | None]) -> ActOutcome:
        """Run one act; see ``backends.base.Backend.act``. Never raises for model, API or tool
        problems; exceptions from ``on_usage`` propagate."""
        fields = {"work_id": ctx.work_id, "iteration": ctx.iteration, "attempt": ctx.attempt}

        def seconds_left() -> float | None:
            return ctx.remaining().seconds

        run = _Act(ctx, WorkspaceTools(ctx.workspace, self._runner, self.config.tool_limits, time_left=seconds_left))
        try:
            client = self._client_or_new()
        except Exception as exc:  # noqa: BLE001 — a client that cannot be built is a coded outcome
            return run.end("model_error", None, "client_error", f"cannot build the SDK client: {type(exc).__name__}")
        schemas = run.tools.schemas()

        def before_call() -> str | None:
            code = budget_left()
            return code if code is not None else cap_reached(ctx.remaining())

        def cut(message: Any, request_id: str) -> None:
            on_usage(self._usage(message, request_id))

        tracing = telemetry.current()

        def call() -> tuple[Any, str]:
            bounds = request_bounds(self.config, self._price, ctx.remaining())
            with tracing.model_call(self.config.model, max_tokens=bounds.max_tokens) as span:
                message, request_id = self._create(client, ctx.system_prefix, run.messages, schemas, bounds, on_cut=cut)
                if span.recording:
                    span.usage(self._usage(message, request_id), (message.stop_reason,), request_id)
                return message, request_id

        while run.turns < ctx.max_turns:
            got = self._retrier.call(call, classify_error, before_attempt=before_call, time_left=seconds_left,
                                     log_fields=fields)
            if got.stopped is not None:
                return run.end("budget_exhausted", run.stop_reason, got.stopped,
                               f"budget reached before model call {run.turns + 1}: {got.stopped}")
            if got.failure is not None:
                return run.end("model_error", run.stop_reason, got.failure.code, got.failure.message)
            message, request_id = got.value
            run.turns += 1
            usage = self._usage(message, request_id)
            on_usage(usage)
            ctx.record(TranscriptKind.TURN, {"turn": run.turns, "request_id": request_id, "model": usage.model,
                                             "stop_reason": message.stop_reason, **_counts(usage)})
            log.info("model turn", turn=run.turns, request_id=request_id, stop_reason=message.stop_reason,
                     input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                     cache_read=usage.cache_read_input_tokens, **fields)
            ended = run.take(message)
            if ended is not None:
                log.info("act ended", status=ended.status, error_code=ended.error_code, turns=run.turns, **fields)
                return ended
        return run.end("failed", run.stop_reason, "max_turns",
                       f"the model was still calling tools after {ctx.max_turns} turns")

    # -- SDK calls ---------------------------------------------------------------------------

    def _client_or_new(self) -> Any:
        if self._client is None:
            self._client = _shared_client(self._environ.get("ANTHROPIC_API_KEY") or _NO_KEY, self.base_url,
                                          self.config.timeout_s)
        return self._client

    def _create(self, client: Any, system_prefix: str, messages: list, tools: list, bounds: RequestBounds, *,
                on_cut: Callable[[Any, str], None]) -> tuple[Any, str]:
        """One request within ``bounds``. ``on_cut`` gets the partial message of a stream cut at
        the deadline (its usage so far), so what the server reported is counted before the
        ``StreamDeadline`` is raised."""
        kwargs: dict[str, Any] = {"model": self.config.model, "max_tokens": bounds.max_tokens,
                                  "messages": messages, "tools": tools, "timeout": bounds.timeout_s}
        if system_prefix:
            kwargs["system"] = [{"type": "text", "text": system_prefix, "cache_control": {"type": "ephemeral"}}]
        if self.config.stream:
            with client.messages.stream(**kwargs) as stream, _cut_at(bounds.timeout_s, stream.response) as cut:
                try:
                    stream.until_done()
                except Exception:
                    if not cut.is_set():
                        raise
                message = stream.current_message_snapshot if _stream_started(stream) else None
                request_id = stream.request_id
                if cut.is_set() and (message is None or message.stop_reason is None):
                    if message is not None:
                        on_cut(message, request_id or f"local-{uuid.uuid4().hex}")
                    raise StreamDeadline(f"the stream ran past its {bounds.timeout_s:.3g} s bound")
            if message is None or message.stop_reason is None:
                raise BadResponse("the response stream ended before message_stop")
        else:
            message = client.messages.create(**kwargs)
            request_id = message._request_id
        if getattr(message, "usage", None) is None or not isinstance(getattr(message, "content", None), list):
            raise BadResponse("the response lacks usage or content")
        # exactly-once accounting needs a key even from servers that send no request-id
        return message, request_id or f"local-{uuid.uuid4().hex}"

    def _usage(self, message: Any, request_id: str) -> Usage:
        u = message.usage
        counts = {"input_tokens": u.input_tokens or 0, "output_tokens": u.output_tokens or 0,
                  "cache_creation_input_tokens": u.cache_creation_input_tokens or 0,
                  "cache_read_input_tokens": u.cache_read_input_tokens or 0}
        return Usage(request_id=request_id, model=getattr(message, "model", None) or self.config.model,
                     cost_usd=self._price.cost(**counts), **counts)


class BadResponse(Exception):
    """A response that cannot be used (a stream cut before its end, no usage); retried as bad_response."""


class StreamDeadline(Exception):
    """A stream still running when the request's time bound passed; classified as ``timeout``."""


@contextmanager
def _cut_at(seconds: float, response: Any) -> Iterator[threading.Event]:
    """Shut the response's socket down after ``seconds``: a stream that keeps sending (events,
    or pings the SDK never shows) is never silent long enough for the read timeout. The event
    tells whether it fired. A response without a reachable socket is left to the read timeout."""
    fired = threading.Event()

    def cut() -> None:
        stream = getattr(response, "extensions", {}).get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            fired.set()
            try:
                sock.shutdown(socket.SHUT_RDWR)   # wakes the blocked read; close() would not
            except OSError:
                pass
    timer = threading.Timer(seconds, cut)
    timer.daemon = True
    timer.start()
    try:
        yield fired
    finally:
        timer.cancel()


def _stream_started(stream: Any) -> bool:
    try:
        stream.current_message_snapshot  # the SDK asserts when no message_start arrived
    except AssertionError:
        return False
    return True


class _Act:
    """State of one act's conversation."""

    def __init__(self, ctx: ActContext, tools: WorkspaceTools) -> None:
        self.tools = tools
        self.record = ctx.record
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": ctx.variable_prompt}]
        self.calls: list[dict] = []
        self.turns = 0
        self.text = ""
        self.stop_reason: str | None = None

    def end(self, status: str, stop_reason: str | None, code: str | None, error: str | None) -> ActOutcome:
        summary = self.text[:_SUMMARY_CAP] or f"{len(self.calls)} tool call(s), no closing text"
        return ActOutcome(status=status, summary=summary, tool_calls=tuple(self.calls), stop_reason=stop_reason,
                          error_code=code, error=error, turns=self.turns, requests=tuple(self.tools.requests))

    def take(self, message: Any) -> ActOutcome | None:
        """Record one response; run its tools. Returns the outcome when the act is over."""
        self.stop_reason = stop = message.stop_reason
        blocks = list(message.content or [])
        text = "".join(getattr(b, "text", "") or "" for b in blocks if getattr(b, "type", None) == "text")
        self.text = text or self.text
        if text:
            self.record(TranscriptKind.TEXT, {"text": text})
        self.messages.append({"role": "assistant", "content": [_echo(b) for b in blocks]})
        if stop == "tool_use":
            uses = [b for b in blocks if getattr(b, "type", None) == "tool_use"]
            if not uses or not all(isinstance(getattr(b, "id", None), str) for b in uses):
                return self.end("model_error", stop, "bad_response", "tool_use stop without well-formed tool_use blocks")
            self.messages.append({"role": "user", "content": [self._run_tool(b) for b in uses]})
            return None
        if stop == "pause_turn":  # the service paused a long turn; sending the conversation resumes it
            return None
        if stop in _OK_STOPS:
            return self.end("ok", stop, None, None)
        if stop == "refusal":
            return self.end("model_error", stop, "refusal", "the model declined the request")
        code = _FAILED_STOPS.get(stop, f"stop_{stop}" if stop else "no_stop_reason")
        return self.end("failed", stop, code, f"the model stopped with {stop!r}")

    def _run_tool(self, block: Any) -> dict[str, Any]:
        name, tool_input = getattr(block, "name", None), getattr(block, "input", None)
        self.record(TranscriptKind.TOOL_CALL, {"id": block.id, "name": str(name), "input": tool_input})
        with telemetry.current().tool(str(name), block.id) as span:
            result = self.tools.call(name, tool_input)
            if result.is_error:
                span.set({telemetry.ERROR_TYPE: result.code or "tool_error"})
        self.calls.append(summarize_call(str(name), tool_input, result))
        self.record(TranscriptKind.TOOL_RESULT, {"id": block.id, "name": str(name), "ok": not result.is_error,
                                                 "code": result.code, "output": result.content})
        return {"type": "tool_result", "tool_use_id": block.id, "content": result.content,
                "is_error": result.is_error}


def _counts(usage: Usage) -> dict[str, int]:
    return {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
            "cache_write_tokens": usage.cache_creation_input_tokens, "cache_read_tokens": usage.cache_read_input_tokens}


def _echo(block: Any) -> dict[str, Any]:
    """A response content block as a request content block for the next turn."""
    kind = getattr(block, "type", None)
    if kind == "text":
        return {"type": "text", "text": block.text or ""}
    if kind == "tool_use":
        tool_input = getattr(block, "input", None)
        # the API rejects a non-object input in the history; the model already got the tool error
        return {"type": "tool_use", "id": block.id, "name": getattr(block, "name", None) or "unknown",
                "input": tool_input if isinstance(tool_input, dict) else {}}
    return block.to_dict()


def classify_error(exc: BaseException) -> Failure:
    """Map an exception from an SDK call to a ``Failure`` (code, retryable, retry-after)."""
    import anthropic  # lazy, see _client_or_new
    import httpx2

    if isinstance(exc, (anthropic.APITimeoutError, httpx2.TimeoutException, StreamDeadline)):
        return Failure("timeout", True, "the model call timed out")
    if isinstance(exc, anthropic.APIConnectionError) or isinstance(exc, httpx2.TransportError):
        return Failure("connection", True, f"connection to the model service failed: {type(exc).__name__}")
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        code, retryable = _STATUS.get(status, ("server_error", True) if status >= 500 else ("api_error", False))
        hint = exc.response.headers.get("x-should-retry")
        retryable = {"true": True, "false": False}.get(hint, retryable)
        detail = exc.api_message or (exc.body if isinstance(exc.body, str) else "") or ""
        return Failure(code, retryable, f"HTTP {status} {code}: {str(detail)[:300]}".rstrip(": "),
                       parse_retry_after(exc.response.headers), status)
    if isinstance(exc, (anthropic.APIResponseValidationError, json.JSONDecodeError, BadResponse)):
        return Failure("bad_response", True, f"the model service sent an unreadable response: {type(exc).__name__}")
    if isinstance(exc, ValueError) and "tool parameter JSON" in str(exc):  # the SDK's stream accumulator
        return Failure("bad_response", True, "the model service streamed invalid tool input JSON")
    log.error("model call raised an unexpected error", error_type=type(exc).__name__, exc_info=exc)
    return Failure("client_error", False, f"unexpected error in the model client: {type(exc).__name__}")


def _is_loopback(base_url: str) -> bool:
    return (urlparse(base_url).hostname or "") in _LOOPBACK


# -- per process, not per client -------------------------------------------------------------------

_TLS_LOCK = threading.Lock()
_TLS: dict[tuple[str | None, str | None], Any] = {}


def _tls_context() -> Any:
    """The TLS context the SDK builds for each client by default (httpx2's: the system's CA
    store, or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` when set), built once per process and per
    value of those two variables instead: loading the CA store costs ~35 ms of CPU, and a
    backend (one client) is built for every run. Certificates are verified as before."""
    key = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    with _TLS_LOCK:
        ctx = _TLS.get(key)
        if ctx is None:
            import httpx2
            ctx = _TLS[key] = httpx2.create_ssl_context()
        return ctx


# The SDK clients of this process, by (key, endpoint, timeout), most recently used last: a
# loop-agent's runs follow one another on the same endpoint, and a client built for each run cost
# its first model call ~8 ms of CPU (the SDK's client, the HTTP client and its pool, a new
# connection). The client is safe to share between threads (the SDK's own advice); a forked
# process starts without them (their connections are the parent's).
_CLIENTS: "OrderedDict[tuple, Any]" = OrderedDict()
_CLIENTS_LOCK = threading.Lock()
_CLIENTS_MAX = 4


def _shared_client(api_key: str, base_url: str, timeout_s: float) -> Any:
    key = (api_key, base_url, timeout_s)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is not None:
            _CLIENTS.move_to_end(key)
            return client
    import anthropic  # lazy: the SDK import costs ~2 s

    client = anthropic.Anthropic(api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout_s,
                                 http_client=_http_client(base_url, timeout_s))
    with _CLIENTS_LOCK:
        client = _CLIENTS.setdefault(key, client)
        _CLIENTS.move_to_end(key)
        while len(_CLIENTS) > _CLIENTS_MAX:           # e.g. a scripted model's server per run
            _, old = _CLIENTS.popitem(last=False)
            try:
                old.close()
            except Exception:  # noqa: BLE001 - closing a pool that is gone already
                pass
    return client


os.register_at_fork(after_in_child=_CLIENTS.clear)


def _http_client(base_url: str, timeout_s: float) -> Any:
    """The HTTP client the SDK would build itself (its defaults: connection limits, redirects,
    keep-alive, proxies from the environment; closed when collected), on the shared TLS context."""
    try:
        from anthropic._base_client import SyncHttpxClientWrapper as client_cls
    except ImportError:                 # an SDK without it: the public alias, same defaults
        from anthropic import DefaultHttpxClient as client_cls
    return client_cls(base_url=base_url, timeout=timeout_s, verify=_tls_context())


def warm() -> None:
    """What a loop-agent's first act would otherwise pay once per process (~250 ms of CPU): the
    HTTP stack the SDK imports with its first client, the TLS context, and the validators the
    SDK builds the first time it reads a response. Done where the SDK is imported ahead of the
    roles (the supervisor's fork template), so every loop-agent forked from it starts warm."""
    import httpcore2  # noqa: F401 - the SDK's transport imports it with the first client
    from anthropic.types import Message

    _tls_context()
    Message.construct(**{
        "id": "msg_warm", "type": "message", "role": "assistant", "model": "warm", "stop_reason": "end_turn",
        "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0},
        "content": [{"type": "text", "text": ""}, {"type": "tool_use", "id": "toolu_warm", "name": "warm", "input": {}}]})


if "anthropic" in sys.modules:          # imported after the SDK: the fork template, a role's warm-up
    try:
        warm()
    except Exception:  # noqa: BLE001 - only a head start; the first act builds what it needs
        pass
