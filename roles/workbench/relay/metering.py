"""What the model endpoint counts: the usage of every response, read off the wire, and the run's
budget as it stands during one act.

``UsageReader`` reads a Messages API response as it passes — a JSON body, or the SSE stream whose
``message_start`` carries the input and cache tokens and whose ``message_delta`` carries the
output tokens — so usage is known from the server's own figures whether or not the client lives
to see the end. ``Ledger`` admits each request against what the run has left: it refuses once the
budget is spent, and lowers ``max_tokens`` so that the request's input (estimated from its size)
plus its output fits in the remaining tokens and the remaining cost at the model's output price.
Requests in flight hold a reservation until their usage is known, so parallel requests cannot
spend the same remainder twice.

Limits, measured against the budget: a request's input is known only from its response, so the
estimate (one token per ``BYTES_PER_TOKEN`` bytes of body) may undercount dense input, and the
budget can then be exceeded by that error for the requests in flight. Hand-written because no
library meters Anthropic responses in a proxy.
"""
from __future__ import annotations

import json
import math
import threading
import uuid
from dataclasses import dataclass, field
from typing import Callable

from state_db.vocab import StopReason

BYTES_PER_TOKEN = 4          # JSON-heavy English request bodies run 3.5-4.5 bytes a token
_JSON_CAP = 64 * 2**20       # a Messages response larger than this is not a response we can read
_THINKING_MIN = 1024         # the API's smallest extended-thinking budget
COUNTS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


@dataclass(frozen=True)
class Rates:
    """USD per token of each kind (the price table's per-million figures ÷ 1e6)."""

    input: float
    output: float
    cache_write: float
    cache_read: float

    def cost(self, counts: dict[str, int]) -> float:
        return (counts["input_tokens"] * self.input + counts["output_tokens"] * self.output
                + counts["cache_creation_input_tokens"] * self.cache_write
                + counts["cache_read_input_tokens"] * self.cache_read)


@dataclass(frozen=True)
class Served:
    """One response's usage as the endpoint read it. ``complete`` is False when the response was
    cut before its final usage: the output then counts as the whole ``max_tokens`` it was allowed."""

    request_id: str
    model: str
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    cost_usd: float
    complete: bool = True

    @property
    def total_tokens(self) -> int:
        return (self.input_tokens + self.output_tokens
                + self.cache_creation_input_tokens + self.cache_read_input_tokens)


class UsageReader:
    """Usage, message id and model of one response, fed chunk by chunk.

    Params: ``streamed`` — the response is ``text/event-stream``. ``feed`` each chunk as it
    passes; ``counts()`` returns the four token counts seen (None when the body named none) and
    ``complete`` whether the final usage (JSON body, or ``message_delta``/``error`` event) arrived.
    """

    def __init__(self, streamed: bool) -> None:
        self.streamed = streamed
        self._buf = bytearray()
        self._usage: dict[str, int] = {}
        self.message_id: str | None = None
        self.model: str | None = None
        self.complete = False

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk
        if not self.streamed:
            if len(self._buf) > _JSON_CAP:
                self._buf.clear()
            return
        *lines, rest = self._buf.split(b"\n")
        self._buf = bytearray(rest)
        for line in lines:
            # only the few small message_* / error events matter; content deltas are skipped unparsed
            if line.startswith(b"data:") and (b'"message_' in line[:40] or b'"error"' in line[:40]):
                self._event(_json(bytes(line[5:])))

    def finish(self) -> None:
        """The body ended: read a JSON body (or a last unterminated SSE line)."""
        if self.streamed:
            self.feed(b"\n")
            return
        data = _json(bytes(self._buf))
        self._buf.clear()
        if isinstance(data, dict) and isinstance(data.get("usage"), dict):
            self._message(data)
            self.complete = True

    def counts(self) -> dict[str, int] | None:
        if not self._usage:
            return None
        return {k: self._usage.get(k, 0) for k in COUNTS}

    def _event(self, data: object) -> None:
        if not isinstance(data, dict):
            return
        kind = data.get("type")
        if kind == "message_start" and isinstance(data.get("message"), dict):
            self._message(data["message"])
        elif kind == "message_delta":
            self._merge(data.get("usage"))  # cumulative: later figures replace earlier ones
            self.complete = True
        elif kind == "error":
            self.complete = True  # the server ended the stream: what it reported is all it served

    def _message(self, message: dict) -> None:
        self.message_id = message.get("id") if isinstance(message.get("id"), str) else self.message_id
        self.model = message.get("model") if isinstance(message.get("model"), str) else self.model
        self._merge(message.get("usage"))

    def _merge(self, usage: object) -> None:
        if isinstance(usage, dict):
            for k in COUNTS:
                v = usage.get(k)
                if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                    self._usage[k] = v


@dataclass(frozen=True)
class Refusal:
    """Why a request is not sent: ``code`` (a stop reason, ``unpriced_model``, ``bad_request``)."""

    code: str
    message: str
    status: int = 400


@dataclass
class Ticket:
    """An admitted request: its (possibly rewritten) body and what it holds of the budget."""

    body: bytes
    model: str
    rates: Rates
    max_tokens: int
    requested_max_tokens: int | None
    tokens_held: int = 0
    cost_held: float = 0.0
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])


class Ledger:
    """The run's budget as the endpoint sees it during one act. Thread-safe.

    Params: ``tokens`` / ``cost_usd`` the run has left when the act starts (None: no such cap);
    ``rates(model)`` returns the model's ``Rates`` or None when the price table lacks it.
    """

    def __init__(self, tokens: int | None, cost_usd: float | None,
                 rates: Callable[[str], Rates | None]) -> None:
        self.tokens, self.cost_usd, self._rates = tokens, cost_usd, rates
        self.used_tokens, self.used_cost = 0, 0.0
        self._held_tokens, self._held_cost = 0, 0.0
        self.stop_code: str | None = None
        self.refused: str | None = None   # the last budget or stop code a request was refused with
        self._lock = threading.Lock()

    def stop(self, code: str) -> None:
        """The run must stop (``budget_left()`` said ``code``): refuse every later request."""
        self.stop_code = code

    def admit(self, raw: bytes) -> Ticket | Refusal:
        """Admit a ``POST /v1/messages`` body or say why not; the ticket's body carries the capped
        ``max_tokens`` (and a thinking budget below it)."""
        body = _json(raw)
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return Refusal("bad_request", "the request body must be a JSON object naming a model")
        model = body["model"]
        rates = self._rates(model)
        if rates is None:
            return Refusal("unpriced_model", f"model {model!r} has no entry in the org's price table; "
                           f"add [prices.\"{model}\"] to org.toml or ask for a priced model")
        asked = body.get("max_tokens")
        asked = asked if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0 else None
        est_in = math.ceil(len(raw) / BYTES_PER_TOKEN)
        with self._lock:
            if self.stop_code is not None:
                self.refused = self.stop_code
                return Refusal(self.stop_code, f"the run must stop ({self.stop_code}); no further model calls")
            cap, refusal = self._room(est_in, rates)
            if refusal is not None:
                self.refused = refusal.code
                return refusal
            granted = min(x for x in (asked, cap) if x is not None) if (asked or cap) else None
            ticket = Ticket(raw, model, rates, granted or 0, asked)
            if granted is not None:
                ticket.tokens_held = est_in + granted
                ticket.cost_held = est_in * rates.input + granted * rates.output
                self._held_tokens += ticket.tokens_held
                self._held_cost += ticket.cost_held
        if granted is not None and granted != asked:
            ticket.body = _rewrite(body, granted)
        return ticket

    def settle(self, ticket: Ticket, counts: dict[str, int]) -> float:
        """The request ended with ``counts``: release its hold, count its use. Returns its cost."""
        cost = ticket.rates.cost(counts)
        with self._lock:
            self._held_tokens -= ticket.tokens_held
            self._held_cost -= ticket.cost_held
            # the token budget leaves cache reads out, as the engine does (``Usage.budget_tokens``);
            # the cost counts them at their price
            self.used_tokens += sum(v for k, v in counts.items() if k != "cache_read_input_tokens")
            self.used_cost += cost
        return cost

    def _room(self, est_in: int, rates: Rates) -> tuple[int | None, Refusal | None]:
        """The largest ``max_tokens`` that fits (None: no cap), or the refusal."""
        cap = None
        if self.tokens is not None:
            left = self.tokens - self.used_tokens - self._held_tokens
            if left - est_in < 1:
                return None, Refusal(StopReason.TOKEN_BUDGET, f"the run's token budget is spent ({max(left, 0)} "
                                     f"left, this request's input is about {est_in})")
            cap = left - est_in
        if self.cost_usd is not None:
            left_usd = self.cost_usd - self.used_cost - self._held_cost - est_in * rates.input
            by_cost = math.floor(left_usd / rates.output) if rates.output > 0 else (None if left_usd > 0 else 0)
            if by_cost is not None and by_cost < 1:
                return None, Refusal(StopReason.COST_BUDGET, f"the run's cost budget is spent "
                                     f"(${max(left_usd, 0):.4f} left after this request's input)")
            cap = by_cost if cap is None else (cap if by_cost is None else min(cap, by_cost))
        return cap, None


def _rewrite(body: dict, max_tokens: int) -> bytes:
    body = dict(body, max_tokens=max_tokens)
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and isinstance(thinking.get("budget_tokens"), int) \
            and thinking["budget_tokens"] >= max_tokens:
        # the API wants budget_tokens < max_tokens and ≥ 1024: shrink thinking, or leave it out
        if max_tokens - 1 >= _THINKING_MIN:
            body["thinking"] = dict(thinking, budget_tokens=max_tokens - 1)
        else:
            body.pop("thinking")
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def _json(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        return None
