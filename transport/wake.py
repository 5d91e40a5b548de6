"""Sending as one actor from a short-lived process or one thread: the human's commands (their
wake after a durable write), the supervisor (a role that failed), a role's worker thread.

``OneSender`` opens a sender of its own (zmq sockets are never shared between threads), can
connect ahead (``prepare``: a fresh connection takes tens of milliseconds to be usable, so a
command opens it before its durable write), and flushes its counters into the store on
``close``; ``send_once`` is the one-message form. A recipient the transport cannot reach at all
(over tcp, an instance no host registered keys for) is logged and skipped: a message only wakes
its recipient up, the facts are rows in the store.
"""
from __future__ import annotations

from pathlib import Path

import structlog

from transport.ledger import Ledger
from transport.node import open_sender

# a recipient the transport cannot reach at all: over tcp, an instance no host registered keys for
UNREACHABLE = frozenset({"curve_required", "bad_endpoint"})


def send_or_skip(sender, recipient: str, kind: str, payload: dict | None) -> str:
    """Send with ``sender``, or — for a recipient no host registered (an instance of another
    host that left) — log it and go on. Returns the path taken ("push", "outbox", or "none").
    Raises TransportError for any other failure."""
    from transport.errors import TransportError
    try:
        return sender.send(recipient, kind, payload)
    except TransportError as exc:
        if exc.code not in UNREACHABLE or recipient == sender.instance:
            raise
        sender.counters.add("unreachable")
        structlog.get_logger("transport").warning("not_sent", recipient=recipient, kind=str(kind), error=exc.code,
                                                  next="it finds the facts in the store on its tick")
        return "none"


class OneSender:
    """A sender of ``instance`` owned by one thread or one short-lived process.

    Args:
        root: the org home's root (its run dir holds the keyring and sockets).
        instance: who sends (``human``, ``supervisor``, a role instance).
        transport: org.toml's [transport] table, as a dict.
        store: the store its counters are flushed into on ``close``.
    """

    def __init__(self, root: Path, instance: str, *, transport: dict, store):
        self.instance, self.store = instance, store
        self.sender = open_sender(root, instance, transport=transport, store=store)
        self.counters = self.sender.counters

    def prepare(self, recipient: str) -> None:
        """Connect to ``recipient`` now, so the first send does not wait for a handshake."""
        self.sender.pusher.prepare(recipient)

    def send(self, recipient: str, kind: str, payload: dict | None = None) -> str:
        return send_or_skip(self.sender, recipient, kind, payload)

    def flush(self, writer) -> None:
        """Write the counters gathered so far into the store through ``writer`` (a sender kept
        open across several uses: ``close`` flushes through a connection of its own)."""
        if self.counters.peek():
            Ledger(self.store, self.instance, counters=self.counters, writer=writer,
                   background_checkpoint=False).flush()

    def close(self) -> None:
        self.sender.close()
        ledger = Ledger(self.store, self.instance, counters=self.counters, background_checkpoint=False)
        ledger.flush()
        ledger.close()


def send_once(root: Path, instance: str, recipient: str, kind: str, payload: dict | None = None, *,
              transport: dict, store) -> str:
    """Send one message as ``instance``; returns "push", "outbox" or "none" (unreachable). Its
    counters are flushed into the store at once. Raises TransportError."""
    link = OneSender(root, instance, transport=transport, store=store)
    try:
        return link.send(recipient, kind, payload)
    finally:
        link.close()
