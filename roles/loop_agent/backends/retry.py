"""Retries of model calls: exponential backoff with jitter, ``retry-after``, a shared rate gate.

The SDK's own retries are switched off (``max_retries=0``) so that every loop-agent of the org
retries the same way and honours one shared ``RateGate``: when any of them is told to slow down
(429 / 529), the gate's "not before" time moves forward and all of them wait for it before their
next call. ``FileRateGate`` shares the gate between processes through a small file under the org's
``run/`` directory; ``MemoryRateGate`` serves tests and single-process use.

The retrier knows nothing of the SDK: the caller passes a ``classify`` function turning an
exception into a ``Failure`` (code, retryable, retry-after).

A caller bound by a deadline (the run's timeout) passes ``time_left``: no backoff or gate wait
sleeps past it. A wait that would end later sleeps only until the deadline, and the next
``before_attempt`` then reports the cap that was reached.
"""
from __future__ import annotations

import email.utils
import fcntl
import json
import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generic, Mapping, Protocol, TypeVar

import structlog

log = structlog.get_logger("loop_agent.retry")

T = TypeVar("T")

#: failure codes that mean "the service asks everyone to slow down": they move the shared gate
GATE_CODES = frozenset({"rate_limited", "overloaded"})


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds of the retry loop.

    ``max_attempts`` counts calls (1 = no retry); ``max_total_wait_s`` bounds the sum of all waits
    (backoff and gate) within one call; ``jitter`` is the fraction of each delay drawn at random.
    """

    max_attempts: int = 6
    base_delay_s: float = 1.0
    max_delay_s: float = 60.0
    max_total_wait_s: float = 300.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.base_delay_s < 0 or self.max_total_wait_s < 0:
            raise ValueError("retry policy needs max_attempts >= 1 and non-negative delays")
        if not 0 <= self.jitter <= 1:
            raise ValueError("retry policy jitter must be within [0, 1]")


@dataclass(frozen=True)
class Failure:
    """One failed call, classified: ``code`` (e.g. ``rate_limited``), whether to retry, and the
    server's requested wait (seconds) if it sent one."""

    code: str
    retryable: bool
    message: str
    retry_after_s: float | None = None
    status: int | None = None


@dataclass(frozen=True)
class Attempted(Generic[T]):
    """Result of ``Retrier.call``: exactly one of ``value`` (success), ``failure`` (gave up) or
    ``stopped`` (the ``before_attempt`` hook returned a stop code) is meaningful."""

    value: T | None = None
    failure: Failure | None = None
    stopped: str | None = None
    attempts: int = 0
    waited_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.failure is None and self.stopped is None


class RateGate(Protocol):
    """A "not before" wall-clock time shared by all callers of one model service."""

    def not_before(self) -> float:
        """Wall time (seconds since the epoch) before which no call should start."""
        ...

    def push_back(self, until: float) -> None:
        """Move the gate to ``until`` unless it already stands later."""
        ...


class MemoryRateGate:
    """In-process gate (threads of one process, tests)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until = 0.0

    def not_before(self) -> float:
        with self._lock:
            return self._until

    def push_back(self, until: float) -> None:
        with self._lock:
            self._until = max(self._until, until)


class FileRateGate:
    """Gate shared by processes: a JSON file ``{"not_before": <epoch seconds>}`` under
    ``directory``, read and updated under ``fcntl.flock``.

    Wall time, not monotonic time, because monotonic clocks are not comparable across processes.
    A missing or unreadable file means the gate is open (a corrupt gate must not stop the org).
    """

    def __init__(self, directory: Path, name: str = "model-rate-gate") -> None:
        self.path = Path(directory) / f"{name}.json"

    def not_before(self) -> float:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return 0.0
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            return _read_gate(fd)
        finally:
            os.close(fd)  # closing releases the lock

    def push_back(self, until: float) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            current = _read_gate(fd)
            if until <= current:
                return
            data = json.dumps({"not_before": until}).encode()
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, data)
        finally:
            os.close(fd)


def _read_gate(fd: int) -> float:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 4096)
    try:
        return float(json.loads(raw)["not_before"])
    except (ValueError, KeyError, TypeError):
        return 0.0


def parse_retry_after(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """Seconds the server asks to wait: ``retry-after-ms``, else ``retry-after`` as seconds or as
    an HTTP date. Returns None when absent or unparsable; never negative."""
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    wall = time.time() if now is None else now
    return max(0.0, parsed.timestamp() - wall)


class Retrier:
    """Runs a call with bounded retries.

    Params: ``policy``; ``gate`` shared with the other callers; ``clock`` returns wall time;
    ``sleep`` waits; ``rng`` returns a float in [0, 1) (jitter). All injectable for tests.
    """

    def __init__(self, policy: RetryPolicy | None = None, gate: RateGate | None = None, *,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep,
                 rng: Callable[[], float] = random.random) -> None:
        self.policy = policy or RetryPolicy()
        self.gate = gate if gate is not None else MemoryRateGate()
        self._clock = clock
        self._sleep = sleep
        self._rng = rng

    def delay_for(self, attempt: int, failure: Failure) -> float:
        """Wait before retry number ``attempt`` (1-based): the server's ``retry-after`` if it gave
        one (never less), else exponential backoff capped at ``max_delay_s``; plus jitter."""
        p = self.policy
        backoff = min(p.max_delay_s, p.base_delay_s * (2 ** (attempt - 1)))
        if failure.retry_after_s is not None:
            # jitter only ever adds to a server-requested wait, so callers do not retry in lockstep
            return failure.retry_after_s * (1 + p.jitter * self._rng())
        return backoff * (1 - p.jitter * self._rng())

    def call(self, fn: Callable[[], T], classify: Callable[[BaseException], Failure], *,
             before_attempt: Callable[[], str | None] | None = None,
             time_left: Callable[[], float | None] | None = None,
             log_fields: Mapping[str, object] | None = None) -> Attempted[T]:
        """Call ``fn`` until it succeeds, a failure is not retryable, or the bounds are reached.

        Params: ``classify`` maps an exception raised by ``fn`` to a ``Failure``;
        ``before_attempt`` is called before every attempt and a non-None return stops at once;
        ``time_left`` returns the seconds the caller has left (None: no deadline) and bounds
        every wait, so the caller's deadline is reached asleep at worst, never overslept.
        Errors: none from ``fn`` (all are classified); exceptions from ``classify`` or
        ``before_attempt`` propagate.
        Returns: ``Attempted`` with the value, the last failure, or the stop code.
        """
        fields = dict(log_fields or {})

        def until_deadline(wait: float) -> float | None:
            """When ``wait`` would end past the deadline, sleep only until it and return the time
            slept (the caller's cap, now reached, takes precedence over the retry bounds)."""
            left = time_left() if time_left is not None else None
            if left is None or wait < left:
                return None
            left = max(0.0, left)
            log.info("model call wait cut at the deadline", wait_s=round(wait, 3), left_s=round(left, 3), **fields)
            self._sleep(left)
            return left

        p = self.policy
        waited = 0.0
        last: Failure | None = None
        for attempt in range(1, p.max_attempts + 1):
            if before_attempt is not None and (code := before_attempt()) is not None:
                return Attempted(stopped=code, attempts=attempt - 1, waited_s=waited)
            gate_wait = self.gate.not_before() - self._clock()
            if gate_wait > 0 and (slept := until_deadline(gate_wait)) is not None:
                waited += slept
                if before_attempt is not None and (code := before_attempt()) is not None:
                    return Attempted(stopped=code, attempts=attempt - 1, waited_s=waited)
            elif gate_wait > 0:
                if waited + gate_wait > p.max_total_wait_s:
                    last = last or Failure("rate_limited", True, "the shared rate gate stays closed "
                                           "longer than the retry wait bound")
                    log.warning("model call abandoned: rate gate closed too long",
                                gate_wait_s=round(gate_wait, 3), waited_s=round(waited, 3), **fields)
                    return Attempted(failure=last, attempts=attempt - 1, waited_s=waited)
                self._sleep(gate_wait)
                waited += gate_wait
                if before_attempt is not None and (code := before_attempt()) is not None:
                    return Attempted(stopped=code, attempts=attempt - 1, waited_s=waited)
            try:
                return Attempted(value=fn(), attempts=attempt, waited_s=waited)
            except Exception as exc:  # noqa: BLE001 — classified below, never swallowed silently
                last = classify(exc)
            if not last.retryable or attempt == p.max_attempts:
                log.warning("model call failed, giving up", code=last.code, status=last.status,
                            call_try=attempt, retryable=last.retryable, error=last.message, **fields)
                return Attempted(failure=last, attempts=attempt, waited_s=waited)
            delay = self.delay_for(attempt, last)
            if (slept := until_deadline(delay)) is not None:
                if last.code in GATE_CODES:
                    self.gate.push_back(self._clock() + delay - slept)   # the others still wait
                waited += slept
                continue                    # before_attempt now reports the cap reached
            if waited + delay > p.max_total_wait_s:
                log.warning("model call failed, retry wait bound reached", code=last.code,
                            call_try=attempt, waited_s=round(waited, 3), next_delay_s=round(delay, 3), **fields)
                return Attempted(failure=last, attempts=attempt, waited_s=waited)
            log.info("model call failed, retrying", code=last.code, status=last.status, call_try=attempt,
                     delay_s=round(delay, 3), shared=last.code in GATE_CODES, **fields)
            if last.code in GATE_CODES:
                # the shared gate does the waiting, for this caller and every other one
                self.gate.push_back(self._clock() + delay)
            else:
                self._sleep(delay)
                waited += delay
        raise AssertionError("unreachable: the loop returns on its last attempt")
