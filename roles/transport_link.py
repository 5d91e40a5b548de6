"""A role's ends of the transport seam (``transport.node``), wired from the org home and config."""
from __future__ import annotations

from typing import Callable

from state_db.config import Config
from state_db.home import OrgHome
from transport.envelope import Envelope
from transport.keys import keyring_path
from transport.ledger import Ledger
from transport.node import open_node, open_sender


def keyring_file(home: OrgHome):
    return keyring_path(home.run_dir)


class TransportLink:
    """Sender + receiver of one instance (counters shared, flushed by the receiver's ledger).

    Args:
        home, cfg: where and how.
        instance: this instance.
        handler: called once per new, valid message.
    """

    def __init__(self, home: OrgHome, instance: str, cfg: Config, handler: Callable[[Envelope], None]):
        self.home, self.cfg, self.instance = home, cfg, instance
        self.node = open_node(home.root, instance, handler, transport=cfg.data["transport"], start=False)
        self.sender = self.node.sender
        self.receiver = self.node.receiver

    @property
    def endpoint(self) -> str | None:
        return self.receiver.endpoint

    def start(self) -> None:
        self.receiver.start()

    def poll(self, timeout_ms: int) -> int:
        return self.receiver.poll(timeout_ms)

    def send(self, recipient: str, kind: str, payload: dict | None = None) -> str:
        return self.sender.send(recipient, kind, payload)

    def close(self) -> None:
        self.node.close()

    def thread_sender(self) -> "ThreadSender":
        """A sender for another thread (zmq sockets must not be shared between threads)."""
        return ThreadSender(self.home, self.instance, self.cfg)


class ThreadSender:
    """A sender of the same instance owned by one thread; its counters are flushed on close."""

    def __init__(self, home: OrgHome, instance: str, cfg: Config):
        self.home, self.instance, self.cfg = home, instance, cfg
        self.sender = open_sender(home.root, instance, transport=cfg.data["transport"])
        self.counters = self.sender.counters

    def send(self, recipient: str, kind: str, payload: dict | None = None) -> str:
        return self.sender.send(recipient, kind, payload)

    def close(self) -> None:
        self.sender.close()
        ledger = Ledger(self.home.db_path, self.instance, counters=self.counters,
                        background_checkpoint=False)
        ledger.flush()
        ledger.close()


def send_once(home: OrgHome, sender: str, recipient: str, kind: str, payload: dict | None, cfg: Config) -> str:
    """Send one message from a short-lived process (CLI, supervisor); returns "push"|"outbox".
    Its counters are flushed into state.db at once."""
    link = ThreadSender(home, sender, cfg)
    try:
        return link.send(recipient, kind, payload)
    finally:
        link.close()
