"""The push backend: one pyzmq PUSH socket per recipient, connected to its PULL socket.

A push never blocks for long. Sockets use ``ZMQ_IMMEDIATE`` (queue only to completed
connections) and a small high-water mark, so a missing peer or a full queue shows as ``EAGAIN``
at once; the caller then falls back to the outbox. A peer that was reachable a moment ago (or a
connection still being made) gets a short grace wait first, which gives a busy receiver
back-pressure instead of a flood of files.

tcp:// endpoints are always CURVE-encrypted and authenticated: the client needs its own keypair
and the recipient's public key from the keyring, or :class:`CurveRequired` is raised. The
server side (and its ZAP check of client keys) is in :mod:`transport.receiver`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import zmq

from transport.endpoints import EndpointResolver, scheme_of
from transport.errors import CurveRequired
from transport.keys import Keyring

DEFAULT_HWM = 256


@dataclass
class _Peer:
    socket: zmq.Socket
    endpoint: str
    connected_at: float
    up: bool = False  # last push went through: worth a short wait when the queue is full


def curve_client(sock: zmq.Socket, keyring: Keyring, instance: str, recipient: str,
                 endpoint: str) -> None:
    """Make ``sock`` a CURVE client of ``recipient`` with ``instance``'s keypair.

    Raises:
        CurveRequired: either keypair is missing from the keyring.
    """
    mine, theirs = keyring.curve_keypair(instance), keyring.curve_keypair(recipient)
    if mine is None:
        raise CurveRequired(endpoint, instance)
    if theirs is None:
        raise CurveRequired(endpoint, recipient)
    sock.curve_publickey, sock.curve_secretkey = mine
    sock.curve_serverkey = theirs[0]


class Pusher:
    """Pushes encoded envelopes to recipients' PULL sockets.

    Args:
        instance: the sending instance (its CURVE keypair is used for tcp).
        keyring: for CURVE keys.
        resolver: instance → endpoint (e.g. :class:`transport.endpoints.Endpoints`).
        context: zmq context (default: the process-wide one).
        hwm: send high-water mark per recipient.
        wait_ms: longest a push waits for room or for a connection being made.
        connect_grace_ms: how long after connecting a push may wait for the connection.
    """

    def __init__(self, instance: str, keyring: Keyring, resolver: EndpointResolver, *,
                 context: zmq.Context | None = None, hwm: int = DEFAULT_HWM, wait_ms: int = 50,
                 connect_grace_ms: int = 250) -> None:
        self.instance = instance
        self.keyring = keyring
        self.resolver = resolver
        self.context = context or zmq.Context.instance()
        self.hwm = hwm
        self.wait_ms = wait_ms
        self.connect_grace_ms = connect_grace_ms
        self._peers: dict[str, _Peer] = {}

    def push(self, recipient: str, data: bytes) -> bool:
        """Queue ``data`` for ``recipient`` on a live connection.

        Returns:
            True if queued; False if it could not be within ``wait_ms`` (no peer, queue full):
            then the caller uses the outbox.

        Raises:
            BadInstance, IpcPathTooLong, BadEndpoint, CurveRequired: from endpoint set-up.
        """
        peer = self._peers.get(recipient) or self._connect(recipient)
        sock = peer.socket
        try:
            sock.send(data, zmq.NOBLOCK, copy=True)
            peer.up = True
            return True
        except zmq.Again:
            pass
        grace = self.connect_grace_ms - (time.monotonic() - peer.connected_at) * 1000
        wait = self.wait_ms if peer.up else min(self.wait_ms, grace)
        if wait > 0 and sock.poll(int(wait) or 1, zmq.POLLOUT):
            try:
                sock.send(data, zmq.NOBLOCK, copy=True)
                peer.up = True
                return True
            except zmq.Again:
                pass
        peer.up = False
        # The recipient may have come back elsewhere (a tcp receiver restarted on a new port).
        if self.resolver(recipient) != peer.endpoint:
            self.forget(recipient)
        return False

    def prepare(self, recipient: str) -> None:
        """Start connecting to ``recipient`` now, so a later push does not wait for the handshake."""
        if recipient not in self._peers:
            self._connect(recipient)

    def forget(self, recipient: str) -> None:
        """Close the socket to ``recipient``; the next push reconnects (re-resolving it)."""
        peer = self._peers.pop(recipient, None)
        if peer is not None:
            peer.socket.close(linger=0)

    def close(self, linger_ms: int = 200) -> None:
        """Close every socket, giving queued messages up to ``linger_ms`` to leave."""
        for peer in self._peers.values():
            peer.socket.close(linger=linger_ms)
        self._peers.clear()

    def _connect(self, recipient: str) -> _Peer:
        endpoint = self.resolver(recipient)
        sock = self.context.socket(zmq.PUSH)
        try:
            sock.setsockopt(zmq.SNDHWM, self.hwm)
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.setsockopt(zmq.LINGER, 200)
            sock.setsockopt(zmq.RECONNECT_IVL, 50)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
            if scheme_of(endpoint) == "tcp":
                curve_client(sock, self.keyring, self.instance, recipient, endpoint)
            sock.connect(endpoint)
        except BaseException:
            sock.close(linger=0)
            raise
        peer = _Peer(sock, endpoint, time.monotonic())
        self._peers[recipient] = peer
        return peer
