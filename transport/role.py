"""What a role process drives of a transport, beside the two that have that shape: the real one
(``roles.base.transport_link.TransportLink``: ZeroMQ push, outbox fallback, ledger) and the in-process
one tests hand a role (``transport.stub.StubTransport``:
``RoleProcess(home, instance, transport=StubTransport(instance))``)."""
from __future__ import annotations

from typing import Callable, Protocol

from transport.envelope import Envelope

Handler = Callable[[Envelope], None]


class ThreadSending(Protocol):
    """A sender owned by one worker thread."""

    def send(self, recipient: str, kind: str, payload: dict | None = None) -> str: ...

    def prepare(self, recipient: str) -> None: ...

    def close(self) -> None: ...


class RoleTransport(Protocol):
    """What a role process drives: ``start(handler)`` once, ``poll`` from its main loop (the
    handler is called there, once per new valid message), ``send`` from the main thread,
    ``thread_sender()`` for a worker thread, ``close`` once."""

    @property
    def endpoint(self) -> str | None: ...

    def start(self, handler: Handler) -> None: ...

    def poll(self, timeout_ms: int) -> int: ...

    def send(self, recipient: str, kind: str, payload: dict | None = None) -> str: ...

    def prepare(self, recipient: str) -> None: ...

    def thread_sender(self) -> ThreadSending: ...

    def close(self) -> None: ...
