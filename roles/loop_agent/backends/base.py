"""The act seam: what the engine hands a backend and what it gets back.

An *act* is one iteration's work by the model: a short conversation in which the model may call
workspace tools. The engine calls ``Backend.act`` once per attempt of an iteration; the backend
reports each model call's usage through ``on_usage`` as soon as the response arrives (before any
tool runs), so the engine can commit it keyed by request id and count it exactly once whatever
happens afterwards.

Token budgets count input, cache-write and output tokens (``Usage.budget_tokens``), not cache
reads; cost budgets count every token at its price, cache reads included.

Outcome statuses (closed set, ``ACT_STATUSES``):

- ``ok`` — the model ended its turn (``end_turn`` / ``stop_sequence``).
- ``budget_exhausted`` — ``budget_left()`` returned a stop code before a model call; ``error_code``
  carries that code (e.g. ``token_budget``). No further call was made.
- ``failed`` — the act ended without the model concluding, for a reason tied to this act's
  content, not to the service: ``max_tokens`` (output cut off), ``context_window`` (the request no
  longer fits), ``max_turns`` (the model kept calling tools). The workspace may still hold
  progress, so the engine commits and verifies as usual; ``no_progress`` / ``repeated_failure``
  catch a loop that keeps failing this way.
- ``model_error`` — the model service could not give a usable answer: retries exhausted for a
  transient fault (``rate_limited``, ``overloaded``, ``server_error``, ``timeout``, ``connection``,
  ``bad_response``), a non-retryable API error (``auth``, ``bad_request``, ``not_found``, …), or a
  ``refusal`` (the model declines the work; iterating on it would only burn budget). The run should
  end with stop reason ``model_error``.
"""
from __future__ import annotations

from state_db.kernel.errors import StateError
from state_db.vocab import ActStatus

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

ACT_STATUSES = tuple(ActStatus)


class BackendError(StateError):
    """Base error of the act backends. ``code`` is machine-readable; the message says what to do."""

    code = "backend_error"


class BackendConfigError(BackendError):
    """The backend cannot be built from its configuration (unknown model price, missing key, …)."""

    code = "backend_config"


@dataclass(frozen=True)
class Usage:
    """Tokens and cost of one model call, keyed by the provider's request id."""

    request_id: str
    model: str
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def total_tokens(self) -> int:
        """All tokens billed for the call (input incl. cache write/read, plus output)."""
        return (self.input_tokens + self.output_tokens
                + self.cache_creation_input_tokens + self.cache_read_input_tokens)

    @property
    def budget_tokens(self) -> int:
        """What the call spends of a run's token budget: input, cache writes and output. Cache
        reads are left out (a cached prefix re-read on every call would otherwise use up a
        budget without any new work); they count in ``cost_usd`` at their price."""
        return self.input_tokens + self.cache_creation_input_tokens + self.output_tokens

    def encode(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def decode(cls, data: dict[str, Any]) -> Usage:
        return cls(
            request_id=str(data["request_id"]),
            model=str(data["model"]),
            input_tokens=int(data["input_tokens"]),
            output_tokens=int(data["output_tokens"]),
            cache_creation_input_tokens=int(data.get("cache_creation_input_tokens", 0)),
            cache_read_input_tokens=int(data.get("cache_read_input_tokens", 0)),
            cost_usd=float(data.get("cost_usd", 0.0)),
        )


@dataclass(frozen=True)
class Remaining:
    """What a run has left at the moment it is asked, per cap; ``None`` where the run has no such
    cap. Backends bound each model request (``max_tokens``, its timeout) and each tool command's
    time limit by it, so a cap cuts inside a call rather than after it."""

    tokens: int | None = None
    cost_usd: float | None = None
    seconds: float | None = None


def unbounded() -> Remaining:
    return Remaining()


def unrecorded(kind: str, data: dict | None = None) -> None:
    """The transcript recorder of an act whose transcript nobody keeps (a bench's raw call)."""


@dataclass(frozen=True)
class ActContext:
    """What one act works from.

    ``system_prefix`` is the stable part (instructions + chosen skills) and is prompt-cached;
    ``variable_prompt`` holds everything that changes between iterations and always contains a
    line ``Iteration: N`` (the scripted server picks its step from it). ``record(kind, data)``
    keeps one transcript entry (``vocab.TranscriptKind``: the model's words, a tool call, its
    result, a turn); see ``roles.loop_agent.transcript``.
    """

    work_id: str
    iteration: int
    attempt: int
    workspace: Path
    system_prefix: str
    variable_prompt: str
    max_turns: int = 20
    remaining: Callable[[], Remaining] = field(default=unbounded, compare=False, repr=False)
    record: Callable[[str, dict | None], None] = field(default=unrecorded, compare=False, repr=False)


@dataclass(frozen=True)
class ActOutcome:
    """How an act ended; see the module docstring for the meaning of each status."""

    status: str
    summary: str
    tool_calls: tuple[dict, ...] = field(default_factory=tuple)
    stop_reason: str | None = None
    error_code: str | None = None
    error: str | None = None
    turns: int = 0
    requests: tuple[dict, ...] = ()   # gated actions the model asked a human for (request_action)

    def __post_init__(self) -> None:
        if self.status not in ACT_STATUSES:
            raise ValueError(f"act status {self.status!r} is not one of {ACT_STATUSES}")

    def encode(self) -> dict[str, Any]:
        data = asdict(self)
        data["tool_calls"] = [dict(c) for c in self.tool_calls]
        data["requests"] = [dict(r) for r in self.requests]
        return data

    @classmethod
    def decode(cls, data: dict[str, Any]) -> ActOutcome:
        return cls(
            status=str(data["status"]),
            summary=str(data.get("summary", "")),
            tool_calls=tuple(dict(c) for c in data.get("tool_calls", ())),
            stop_reason=data.get("stop_reason"),
            error_code=data.get("error_code"),
            error=data.get("error"),
            turns=int(data.get("turns", 0)),
            requests=tuple(dict(r) for r in data.get("requests", ())),
        )


class Backend(Protocol):
    """An act backend. ``name`` is ``"anthropic"`` or ``"command"``."""

    name: str

    def act(
        self,
        ctx: ActContext,
        *,
        on_usage: Callable[[Usage], None],
        budget_left: Callable[[], str | None],
    ) -> ActOutcome:
        """Run one act.

        Params: ``on_usage`` is called right after each model response; ``budget_left`` is called
        before each model call and a non-None code ends the act as ``budget_exhausted``.
        Errors: never raises for model, API or tool problems (they become a coded outcome);
        exceptions raised by ``on_usage`` propagate.
        Returns: the ``ActOutcome``.
        """
        ...
