"""OpenTelemetry GenAI traces of every run: off by default, and free when off.

On when org.toml's ``telemetry.enabled`` is true or ``telemetry.otlp_endpoint`` is set (the
environment's ``OTEL_EXPORTER_OTLP_ENDPOINT`` sets it). Off, ``current()`` is ``OFF``: its methods
return one shared do-nothing span and the SDK is never imported. On, ``configure`` imports the
OpenTelemetry SDK and exports over OTLP/HTTP from a batch processor (its own thread), flushed
when the role stops (``shutdown``).

One trace per run, joined by every process without a message or a column: the ids are derived
from the run itself (a hash of the work id), so a loop-agent, the loop-agent that resumes the run
after a crash, and the eval-agent all compute the same ones:

- trace id: ``sha256("loop-org trace " + work_id)``; the run's span (``invoke_agent``, emitted once
  by the loop-agent that sees the run end, from the run's creation to its end, with its stop
  reason) has a span id derived the same way;
- each committed iteration's span id is derived from (work id, n, attempt): the eval-agent reads the
  attempt of the iteration it verifies from state.db and makes its ``verify`` span a child of it.

Span tree: ``invoke_agent loop-org`` → ``iteration N`` → ``gather``, ``chat MODEL`` (one per model
call, with the GenAI attributes), ``execute_tool NAME`` (one per tool call), ``checkpoint``,
``await_verdict`` (the loop-agent's wait) and ``verify`` (the eval-agent's check, another process).
Token attributes follow the GenAI semantic conventions: ``gen_ai.usage.input_tokens`` counts all
input tokens, cached ones included; the cache writes and reads are also given apart.
"""
from __future__ import annotations

import hashlib
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

# GenAI semantic-convention names (the spec's strings; the semconv package marks them moved)
OPERATION, PROVIDER = "gen_ai.operation.name", "gen_ai.provider.name"
REQUEST_MODEL, RESPONSE_MODEL, RESPONSE_ID = "gen_ai.request.model", "gen_ai.response.model", "gen_ai.response.id"
REQUEST_MAX_TOKENS, FINISH_REASONS = "gen_ai.request.max_tokens", "gen_ai.response.finish_reasons"
INPUT_TOKENS, OUTPUT_TOKENS = "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"
CACHE_WRITE_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
AGENT_NAME, CONVERSATION_ID = "gen_ai.agent.name", "gen_ai.conversation.id"
TOOL_NAME, TOOL_CALL_ID, ERROR_TYPE = "gen_ai.tool.name", "gen_ai.tool.call.id", "error.type"
EXPORTERS = ("otlp", "none")
TRACES_PATH = "/v1/traces"


def trace_id_of(work_id: str) -> int:
    return _id(f"loop-org trace {work_id}", 16)


def run_span_id(work_id: str) -> int:
    return _id(f"loop-org run {work_id}", 8)


def iteration_span_id(work_id: str, n: int, attempt: int) -> int:
    return _id(f"loop-org iteration {work_id} {n} {attempt}", 8)


def _id(text: str, size: int) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:size], "big") or 1


class _Null:
    """The span of tracing off: every method does nothing; one shared instance."""

    recording = False

    def __enter__(self) -> "_Null":
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def set(self, attributes: dict) -> None:
        pass

    def usage(self, usage: Any, finish_reasons: tuple = (), response_id: str | None = None) -> None:
        pass


NULL = _Null()


class Off:
    """Tracing off: nothing is imported, nothing is recorded."""

    enabled = False

    def iteration(self, work_id: str, n: int, attempt: int) -> _Null:
        return NULL

    def step(self, name: str, attributes: dict | None = None) -> _Null:
        return NULL

    def model_call(self, model: str, provider: str = "anthropic", max_tokens: int | None = None) -> _Null:
        return NULL

    def model_call_done(self, usage: Any, started_ns: int, provider: str = "anthropic") -> None:
        pass

    def tool(self, name: str, call_id: str | None = None) -> _Null:
        return NULL

    def verification(self, work_id: str, n: int, attempt: int | None) -> _Null:
        return NULL

    def run_ended(self, work_id: str, created_at_s: float, reason: str, detail: str = "",
                  attributes: dict | None = None) -> None:
        pass

    def shutdown(self) -> None:
        pass


OFF = Off()
_current: Off = OFF


def current():
    """The process's tracing: ``OFF`` unless ``configure`` or ``use`` turned it on."""
    return _current


def wanted(cfg) -> bool:
    return bool(cfg.telemetry.enabled or cfg.telemetry.otlp_endpoint)


def configure(cfg, role: str, instance: str):
    """Turn tracing on for this process if org.toml (or the environment) asks for it.

    Params: ``cfg`` the org's config; ``role`` and ``instance`` name the process in the resource.
    Returns: the tracing now current (``OFF`` when not asked for).
    """
    if not wanted(cfg):
        return OFF
    try:
        kind = cfg.telemetry.exporter
        exporter = _otlp_exporter(cfg.telemetry.otlp_endpoint) if kind == "otlp" else _Discard()
        return use(exporter, role=role, instance=instance, batch=True)
    except ImportError as exc:      # traces are an extra: a role never fails for want of them
        import structlog
        structlog.get_logger("telemetry").warning("telemetry_unavailable", role=role, instance=instance, error=str(exc),
                                                  next="tracing stays off; pip install 'loop-org[telemetry]'")
        return OFF


def use(exporter, *, role: str = "loop-org", instance: str = "", batch: bool = False):
    """Trace to ``exporter`` (any SDK ``SpanExporter``), synchronously unless ``batch``; for
    tests and benchmarks. Returns the tracing now current."""
    global _current
    _current.shutdown()
    _current = On(exporter, role=role, instance=instance, batch=batch)
    return _current


def reset() -> None:
    """Back to ``OFF`` (flushing what was recorded)."""
    global _current
    _current.shutdown()
    _current = OFF


def _otlp_exporter(endpoint: str):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    if not endpoint:
        return OTLPSpanExporter()                  # OTEL_EXPORTER_OTLP_* or localhost:4318
    endpoint = endpoint.rstrip("/")
    return OTLPSpanExporter(endpoint=endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH)


class _Discard:
    """An exporter that drops every span: the cost of tracing without a receiver."""

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class _Span:
    """A recording span, as callers see it."""

    recording = True

    def __init__(self, span) -> None:
        self.span = span

    def set(self, attributes: dict) -> None:
        self.span.set_attributes({k: v for k, v in attributes.items() if v is not None})

    def usage(self, usage: Any, finish_reasons: tuple = (), response_id: str | None = None) -> None:
        """GenAI attributes of one model call's ``Usage`` (``backends.base.Usage``)."""
        self.set(usage_attributes(usage, finish_reasons, response_id))


def usage_attributes(usage: Any, finish_reasons: tuple = (), response_id: str | None = None) -> dict:
    cache_write, cache_read = usage.cache_creation_input_tokens, usage.cache_read_input_tokens
    out = {RESPONSE_MODEL: usage.model, RESPONSE_ID: response_id or usage.request_id,
           INPUT_TOKENS: usage.input_tokens + cache_write + cache_read, OUTPUT_TOKENS: usage.output_tokens,
           CACHE_WRITE_TOKENS: cache_write, CACHE_READ_TOKENS: cache_read, "loop_org.cost_usd": usage.cost_usd}
    reasons = [r for r in finish_reasons if r]
    if reasons:
        out[FINISH_REASONS] = reasons
    return out


class On:
    """Tracing on, through the OpenTelemetry SDK (imported here only)."""

    enabled = True

    def __init__(self, exporter, *, role: str, instance: str, batch: bool) -> None:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        self._trace = trace
        self._ids = _DerivedIds()
        self.provider = TracerProvider(id_generator=self._ids, resource=Resource.create(
            {"service.name": "loop-org", "service.instance.id": instance or role, "loop_org.role": role}))
        self.provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("loop-org")
        self._kind = trace.SpanKind

    # -- parents computed from the run ---------------------------------------------------------
    def _parent(self, work_id: str, span_id: int):
        t = self._trace
        ctx = t.SpanContext(trace_id_of(work_id), span_id, is_remote=True, trace_flags=t.TraceFlags(t.TraceFlags.SAMPLED))
        return t.set_span_in_context(t.NonRecordingSpan(ctx))

    @contextmanager
    def _span(self, name: str, attributes: dict | None = None, *, context=None, kind=None, span_id: int | None = None,
              trace_id: int | None = None, start_time: int | None = None) -> Iterator[_Span]:
        with self._ids.forced(trace_id, span_id):
            span = self.tracer.start_span(name, context=context, kind=kind or self._kind.INTERNAL, start_time=start_time,
                                          attributes={k: v for k, v in (attributes or {}).items() if v is not None})
        with self._trace.use_span(span, end_on_exit=True):
            yield _Span(span)

    def iteration(self, work_id: str, n: int, attempt: int):
        return self._span(f"iteration {n}", {"loop_org.work_id": work_id, "loop_org.iteration": n,
                                             "loop_org.attempt": attempt},
                          context=self._parent(work_id, run_span_id(work_id)),
                          span_id=iteration_span_id(work_id, n, attempt))

    def step(self, name: str, attributes: dict | None = None):
        """A child of the current span; nothing outside one (a verdict awaited on resume)."""
        if not self._trace.get_current_span().get_span_context().is_valid:
            return NULL
        return self._span(name, attributes)

    def model_call(self, model: str, provider: str = "anthropic", max_tokens: int | None = None):
        attrs = {OPERATION: "chat", PROVIDER: provider, REQUEST_MODEL: model}
        if max_tokens is not None:
            attrs[REQUEST_MAX_TOKENS] = max_tokens
        return self._span(f"chat {model}", attrs, kind=self._kind.CLIENT)

    def model_call_done(self, usage: Any, started_ns: int, provider: str = "anthropic") -> None:
        """A model call reported after the fact (the command backend's metered calls)."""
        with self._span(f"chat {usage.model}", {OPERATION: "chat", PROVIDER: provider, REQUEST_MODEL: usage.model},
                        kind=self._kind.CLIENT, start_time=started_ns) as span:
            span.usage(usage)

    def tool(self, name: str, call_id: str | None = None):
        attrs = {OPERATION: "execute_tool", TOOL_NAME: str(name)}
        if call_id:
            attrs[TOOL_CALL_ID] = call_id
        return self._span(f"execute_tool {name}", attrs)

    def verification(self, work_id: str, n: int, attempt: int | None):
        parent = run_span_id(work_id) if attempt is None else iteration_span_id(work_id, n, attempt)
        return self._span("verify" if n else "preflight", {"loop_org.work_id": work_id, "loop_org.iteration": n},
                          context=self._parent(work_id, parent))

    def run_ended(self, work_id: str, created_at_s: float, reason: str, detail: str = "",
                  attributes: dict | None = None) -> None:
        attrs = {OPERATION: "invoke_agent", AGENT_NAME: "loop-org", CONVERSATION_ID: work_id,
                 "loop_org.work_id": work_id, "loop_org.stop_reason": str(reason), "loop_org.stop_detail": detail[:500],
                 **(attributes or {})}
        from opentelemetry.context import Context
        with self._span("invoke_agent loop-org", attrs, context=Context(), trace_id=trace_id_of(work_id),
                        span_id=run_span_id(work_id), start_time=int(created_at_s * 1e9)):
            pass

    def shutdown(self) -> None:
        self.provider.shutdown()


class _DerivedIds:
    """The SDK's id generator, except for the next span started under ``forced``: its ids are
    the ones derived from the run (the SDK offers no other way to give a span a chosen id)."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
        self._random = RandomIdGenerator()
        self._local = threading.local()

    @contextmanager
    def forced(self, trace_id: int | None, span_id: int | None):
        self._local.ids = (trace_id, span_id)
        try:
            yield
        finally:
            self._local.ids = (None, None)

    def generate_trace_id(self) -> int:
        forced = getattr(self._local, "ids", (None, None))[0]
        return forced if forced is not None else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        forced = getattr(self._local, "ids", (None, None))[1]
        return forced if forced is not None else self._random.generate_span_id()

    def is_trace_id_random(self) -> bool:
        return False


def now_ns() -> int:
    return time.time_ns()
