"""An in-process transport for tests, as dramatiq's ``StubBroker``: no sockets, no keys, no files.

``StubTransport`` has the shape a role process drives (``transport.role.RoleTransport``):
``start(handler)``, ``poll``, ``send``, ``prepare``, ``thread_sender``, ``close``. What the role
sends is recorded (``sent``, ``messages()``, ``wait_for()`` for a worker thread's sends); what a
test gives it with ``deliver()`` reaches the role's handler on its next ``poll`` (or at once
with ``deliver(..., now=True)``). It keeps the two rules of the real seam that a role's logic can
trip over: the capability table (a role may not send a kind it has no right to, and a delivered
message from a sender without the right is dropped) and at-most-once delivery (a message id is
handled once). Envelopes carry a fixed tag: nothing is signed or checked for authenticity.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable

from transport.envelope import Envelope
from transport.errors import Code, Rejected
from transport.kinds import may_send

STUB_KEY = b"stub-transport-key"
Handler = Callable[[Envelope], None]


class StubTransport:
    """Records sends and delivers test messages in-process.

    Args:
        instance: the instance the role runs as (the sender of what it sends).
        clock: wall clock for envelopes' ``created_at`` (inject the role's clock).
    """

    endpoint = "stub://"

    def __init__(self, instance: str, *, clock: Callable[[], float] = time.time):
        self.instance = instance
        self.clock = clock
        self.sent: list[Envelope] = []
        self.prepared: set[str] = set()
        self.dropped: list[tuple[Envelope, str]] = []     # delivered but refused: (message, code)
        self.handled: list[Envelope] = []
        self.started = self.closed = False
        self._handler: Handler | None = None
        self._inbox: deque[Envelope] = deque()
        self._seen: set[str] = set()
        self._changed = threading.Condition()

    # -- the role's side (RoleTransport) --------------------------------------------------
    def start(self, handler: Handler) -> None:
        self._handler, self.started = handler, True

    def poll(self, timeout_ms: int) -> int:
        """Hand every queued message to the handler; wait up to ``timeout_ms`` for one if none is queued.
        Returns how many were handled."""
        with self._changed:
            if not self._inbox:
                self._changed.wait(max(0, timeout_ms) / 1000)
            batch = list(self._inbox)
            self._inbox.clear()
        for env in batch:
            self._handle(env)
        return len(batch)

    def send(self, recipient: str, kind: str, payload: dict | None = None) -> str:
        """Record one message from this instance. Raises ``Rejected(not_authorized)`` as the real
        sender does when the role may not send ``kind``. Returns ``"stub"``."""
        self._record(self.instance, recipient, kind, payload)
        return "stub"

    def prepare(self, recipient: str) -> None:
        self.prepared.add(recipient)

    def thread_sender(self) -> StubThreadSender:
        return StubThreadSender(self)

    def close(self) -> None:
        self.closed = True
        with self._changed:
            self._changed.notify_all()

    # -- the test's side ------------------------------------------------------------------
    def deliver(self, kind: str, payload: dict | None = None, *, sender: str = "human", now: bool = False,
                msg_id: str | None = None) -> Envelope:
        """Give the role a message from ``sender``: handled on its next ``poll``, or at once with
        ``now=True``. The same ``msg_id`` twice is handled once."""
        env = Envelope.create(kind, sender, self.instance, payload, key=STUB_KEY, now=self.clock(), msg_id=msg_id)
        if now:
            self._handle(env)
        else:
            with self._changed:
                self._inbox.append(env)
                self._changed.notify_all()
        return env

    def messages(self, kind: str | None = None, recipient: str | None = None) -> list[Envelope]:
        """What the role sent, in order, optionally of one kind and/or to one recipient."""
        with self._changed:
            return [e for e in self.sent if (kind is None or e.kind == kind)
                    and (recipient is None or e.recipient == recipient)]

    def wait_for(self, kind: str, *, recipient: str | None = None, count: int = 1,
                 timeout_s: float = 10.0) -> list[Envelope]:
        """Wait until the role (or one of its threads) has sent ``count`` messages of ``kind``.
        Raises AssertionError naming what was sent when the timeout passes first."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                got = [e for e in self.sent if e.kind == kind and (recipient is None or e.recipient == recipient)]
                left = deadline - time.monotonic()
                if len(got) >= count or left <= 0:
                    break
                self._changed.wait(left)
        if len(got) < count:
            raise AssertionError(f"{count} {kind!r} message(s) expected within {timeout_s}s; sent: "
                                 f"{[(e.kind, e.recipient, e.payload) for e in self.sent]}")
        return got

    # -- both ----------------------------------------------------------------------------
    def _record(self, sender: str, recipient: str, kind: str, payload: dict | None) -> Envelope:
        if not may_send(sender, kind):
            raise Rejected(Code.NOT_AUTHORIZED, f"{sender} may not send {kind!r} (see transport.kinds)",
                           sender=sender, kind=str(kind))
        env = Envelope.create(kind, sender, recipient, payload, key=STUB_KEY, now=self.clock())
        with self._changed:
            self.sent.append(env)
            self._changed.notify_all()
        return env

    def _handle(self, env: Envelope) -> None:
        if env.id in self._seen:
            self.dropped.append((env, Code.DUPLICATE))
            return
        self._seen.add(env.id)
        if not may_send(env.sender, env.kind):
            self.dropped.append((env, Code.NOT_AUTHORIZED))
            return
        if self._handler is None:
            raise RuntimeError("StubTransport.deliver before start(handler): the role is not running")
        self.handled.append(env)
        self._handler(env)


class StubThreadSender:
    """A worker thread's sender: its messages land in the same ``sent`` list."""

    def __init__(self, stub: StubTransport):
        self.stub = stub
        self.closed = False

    def send(self, recipient: str, kind: str, payload: dict[str, Any] | None = None) -> str:
        self.stub._record(self.stub.instance, recipient, kind, payload)
        return "stub"

    def prepare(self, recipient: str) -> None:
        self.stub.prepare(recipient)

    def close(self) -> None:
        self.closed = True

