"""A role's ends of the transport seam (``transport.node``), wired from the org home and config.

``RoleTransport`` is what a role process needs of a transport; ``TransportLink`` is the real one
(ZeroMQ push, outbox fallback, ledger) and ``transport.stub.StubTransport`` the in-process one
tests hand to a role (``RoleProcess(home, instance, transport=StubTransport(instance))``).
"""
from __future__ import annotations

from typing import Callable, Protocol

import structlog

from state_db.kernel.config import Config
from state_db.kernel.home import OrgHome
from transport.endpoints import Endpoints
from transport.envelope import Envelope
from transport.keys import Keyring, keyring_path
from transport.ledger import Ledger
from transport.node import open_node, open_sender


Handler = Callable[[Envelope], None]


def keyring_file(home: OrgHome):
    return keyring_path(home.run_dir)


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


class TransportLink:
    """Sender + receiver of one instance (counters shared, flushed by the receiver's ledger).

    Args:
        home, cfg: where and how.
        instance: this instance.
        handler: called once per new, valid message (or given to ``start``).
    """

    def __init__(self, home: OrgHome, instance: str, cfg: Config, handler: Handler | None = None):
        self.home, self.cfg, self.instance = home, cfg, instance
        self.handler = handler
        self.node = open_node(home.root, instance, self._deliver, transport=cfg.transport.model_dump(), start=False,
                              store=home.db_path)
        self.sender = self.node.sender
        self.receiver = self.node.receiver

    def _deliver(self, env: Envelope) -> None:
        if self.handler is not None:
            self.handler(env)

    @property
    def endpoint(self) -> str | None:
        return self.receiver.endpoint

    def start(self, handler: Handler | None = None) -> None:
        """Bind and watch; messages go to ``handler`` (or the one given at construction)."""
        if handler is not None:
            self.handler = handler
        self.receiver.start()

    def poll(self, timeout_ms: int) -> int:
        return self.receiver.poll(timeout_ms)

    def interrupt_on(self, fd: int) -> None:
        """``poll`` returns early once ``fd`` is readable (``Receiver.interrupt_on``)."""
        self.receiver.interrupt_on(fd)

    def send(self, recipient: str, kind: str, payload: dict | None = None) -> str:
        return _send(self.sender, recipient, kind, payload)

    def prepare(self, recipient: str) -> None:
        """Connect to ``recipient`` now, so the first send does not wait for a handshake."""
        self.sender.pusher.prepare(recipient)

    def close(self) -> None:
        self.node.close()

    def thread_sender(self) -> "ThreadSender":
        """A sender for another thread (zmq sockets must not be shared between threads)."""
        return ThreadSender(self.home, self.instance, self.cfg)


class ThreadSender:
    """A sender of the same instance owned by one thread; its counters are flushed on close."""

    def __init__(self, home: OrgHome, instance: str, cfg: Config):
        self.home, self.instance, self.cfg = home, instance, cfg
        self.sender = open_sender(home.root, instance, transport=cfg.transport.model_dump(), store=home.db_path)
        self.counters = self.sender.counters

    def send(self, recipient: str, kind: str, payload: dict | None = None) -> str:
        return _send(self.sender, recipient, kind, payload)

    def prepare(self, recipient: str) -> None:
        self.sender.pusher.prepare(recipient)

    def close(self) -> None:
        self.sender.close()
        ledger = Ledger(self.home.db_path, self.instance, counters=self.counters,
                        background_checkpoint=False)
        ledger.flush()
        ledger.close()


# a recipient the transport cannot reach at all: over tcp, an instance no host registered keys for
UNREACHABLE = frozenset({"curve_required", "bad_endpoint"})


def _send(sender, recipient: str, kind: str, payload: dict | None) -> str:
    """Send, or — for a recipient no host registered (an instance of another host that left) —
    log it and go on: a message only wakes its recipient up, the facts are rows in the store.
    Returns the path taken ("push", "outbox", or "none")."""
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


def send_once(home: OrgHome, sender: str, recipient: str, kind: str, payload: dict | None, cfg: Config) -> str:
    """Send one message from a short-lived process (CLI, supervisor); returns "push"|"outbox".
    Its counters are flushed into state.db at once."""
    link = ThreadSender(home, sender, cfg)
    try:
        return link.send(recipient, kind, payload)
    finally:
        link.close()


def peer_keys(home: OrgHome, cfg: Config, instances: list[str]) -> dict[str, dict]:
    """What the store's peers table holds of each of ``instances`` (this host's): where it
    listens on the configured tcp base, its CURVE public key and its HMAC key (hex).

    Raises:
        KeyringError(unknown_key): an instance has no key (the supervisor issues them at start).
    """
    ring = Keyring.load(keyring_path(home.run_dir))
    where = Endpoints(home.run_dir, tcp_base=cfg.transport.endpoint)
    rows = {}
    for name in instances:
        pair = ring.curve_keypair(name)
        if pair is None:
            from transport.errors import CurveRequired
            raise CurveRequired(where(name), name)
        rows[name] = {"endpoint": where(name), "curve_public": pair[0].decode(),
                      "hmac_key": ring.require_key(name).hex()}
    return rows
