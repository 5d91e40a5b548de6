"""A role's two ends of the transport seam, wired from the org home and configuration."""
from __future__ import annotations

from typing import Callable

from state_db.config import Config
from state_db.home import OrgHome
from transport.endpoints import Endpoints
from transport.envelope import Envelope, Limits
from transport.keys import Keyring
from transport.ledger import Counters, Ledger
from transport.receiver import Receiver
from transport.sender import Sender


def keyring_file(home: OrgHome):
    return home.run_dir / "keys" / "keyring.json"


def _endpoints(home: OrgHome, cfg: Config) -> Endpoints:
    return Endpoints(home.run_dir, tcp_base=cfg["transport.endpoint"])


class TransportLink:
    """Sender + receiver of one instance, sharing counters so the ledger flushes both.

    Args:
        home, cfg: where and how.
        instance: this instance.
        handler: called once per new, valid message.
    """

    def __init__(self, home: OrgHome, instance: str, cfg: Config, handler: Callable[[Envelope], None]):
        self.keyring = Keyring.load(keyring_file(home))
        limits = Limits.from_config(cfg.data["transport"])
        self.counters = Counters(instance)
        endpoints = _endpoints(home, cfg)
        self.ledger = Ledger(home.db_path, instance, counters=self.counters, limits=limits)
        self.receiver = Receiver(instance, run_dir=home.run_dir, outbox_root=home.outbox_dir,
                                 keyring=self.keyring, handler=handler, ledger=self.ledger,
                                 endpoint=endpoints(instance), limits=limits,
                                 sweep_s=cfg["transport.sweep_s"])
        self.sender = Sender(instance, self.keyring, endpoints, home.outbox_dir,
                             counters=self.counters, limits=limits)

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
        self.sender.close()
        self.receiver.close()

    def thread_sender(self) -> "ThreadSender":
        """A sender for another thread (zmq sockets must not be shared between threads)."""
        return ThreadSender(self)


class ThreadSender:
    """A second sender of the same instance, owned by one worker thread; its counters are
    flushed into state.db when it closes."""

    def __init__(self, link: TransportLink):
        self._link = link
        self.counters = Counters(link.sender.instance)
        self.sender = Sender(link.sender.instance, link.keyring, link.sender.pusher.resolver,
                             link.sender.outbox_root, counters=self.counters, limits=link.sender.limits)

    def send(self, recipient: str, kind: str, payload: dict | None = None) -> str:
        return self.sender.send(recipient, kind, payload)

    def close(self) -> None:
        self.sender.close()
        ledger = Ledger(self._link.ledger.writer.db_path, self.sender.instance, counters=self.counters)
        ledger.flush()
        ledger.close()


def send_once(home: OrgHome, sender: str, recipient: str, kind: str, payload: dict | None,
              cfg: Config) -> str:
    """Send one message from a short-lived process (CLI, supervisor); returns "push"|"outbox".

    Its counters are flushed into state.db right away."""
    keyring = Keyring.load(keyring_file(home))
    counters = Counters(sender)
    limits = Limits.from_config(cfg.data["transport"])
    with Sender(sender, keyring, _endpoints(home, cfg), home.outbox_dir, counters=counters,
                limits=limits) as s:
        path = s.send(recipient, kind, payload)
    ledger = Ledger(home.db_path, sender, counters=counters, limits=limits)
    ledger.flush()
    ledger.close()
    return path
