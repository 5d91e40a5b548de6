"""A role's ends of the transport seam (``transport.node``), wired from the org home and config.

``transport.role.RoleTransport`` is what a role process needs of a transport; ``TransportLink`` is
the real one (ZeroMQ push, outbox fallback, ledger) and ``transport.stub.StubTransport`` the
in-process one tests hand to a role (``RoleProcess(home, instance, transport=StubTransport(instance))``).
Sending as one actor from a thread or a short-lived process is the transport's own
(``transport.wake``); ``ThreadSender`` and ``send_once`` here take the org home and config.
"""
from __future__ import annotations

from state_db.kernel.config import Config
from state_db.kernel.home import OrgHome
from transport.endpoints import Endpoints
from transport.envelope import Envelope
from transport.keys import Keyring, keyring_path
from transport.node import open_node
from transport.role import Handler, RoleTransport, ThreadSending
from transport.wake import OneSender, send_or_skip
from transport.wake import send_once as _send_once

__all__ = ["Handler", "RoleTransport", "ThreadSender", "ThreadSending", "TransportLink", "keyring_file", "peer_keys",
           "send_once"]


def keyring_file(home: OrgHome):
    return keyring_path(home.run_dir)


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
        return send_or_skip(self.sender, recipient, kind, payload)

    def prepare(self, recipient: str) -> None:
        """Connect to ``recipient`` now, so the first send does not wait for a handshake."""
        self.sender.pusher.prepare(recipient)

    def close(self) -> None:
        self.node.close()

    def thread_sender(self) -> "ThreadSender":
        """A sender for another thread (zmq sockets must not be shared between threads)."""
        return ThreadSender(self.home, self.instance, self.cfg)


class ThreadSender(OneSender):
    """A sender of the same instance owned by one thread (``transport.wake.OneSender``); its
    counters are flushed on close."""

    def __init__(self, home: OrgHome, instance: str, cfg: Config):
        self.home, self.cfg = home, cfg
        super().__init__(home.root, instance, transport=cfg.transport.model_dump(), store=home.db_path)


def send_once(home: OrgHome, sender: str, recipient: str, kind: str, payload: dict | None, cfg: Config) -> str:
    """Send one message from a short-lived process (the supervisor); returns "push"|"outbox".
    Its counters are flushed into the store at once (``transport.wake.send_once``)."""
    return _send_once(home.root, sender, recipient, kind, payload, transport=cfg.transport.model_dump(),
                      store=home.db_path)


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
