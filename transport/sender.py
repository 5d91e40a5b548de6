"""Sending: build and sign an envelope, push it, fall back to the outbox if the push fails."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Literal

import zmq

from transport.endpoints import EndpointResolver
from transport.envelope import DEFAULT_LIMITS, Envelope, Limits
from transport.errors import Code, Rejected, TransportError
from transport.keys import Keyring
from transport.kinds import Kind, may_send
from transport.ledger import FELL_BACK, PUSHED, Counters
from transport.outbox import write_message
from transport.push import DEFAULT_HWM, Pusher

Path_ = Literal["push", "outbox"]
Via = Literal["auto", "push", "outbox", "both"]


class Sender:
    """Sends messages as one instance.

    Args:
        instance: the sending instance; its key must be in ``keyring``.
        keyring: loaded keyring (HMAC keys, CURVE keys for tcp).
        endpoint_resolver: instance → endpoint (:class:`transport.endpoints.Endpoints`).
        outbox_root: the org home's ``outbox/`` folder.
        counters: where ``pushed`` / ``fell_back`` are counted; share the receiver's so its
            ledger flushes them (default: a private one, see :attr:`counters`).
        clock: wall clock for ``created_at``.
        limits: ``max_bytes`` is checked before sending.
        context, hwm, wait_ms: passed to :class:`transport.push.Pusher`.
    """

    def __init__(self, instance: str, keyring: Keyring, endpoint_resolver: EndpointResolver,
                 outbox_root: Path | str, *, counters: Counters | None = None,
                 clock: Callable[[], float] = time.time, limits: Limits = DEFAULT_LIMITS,
                 context: zmq.Context | None = None, hwm: int = DEFAULT_HWM,
                 wait_ms: int = 50) -> None:
        self.instance = instance
        self.keyring = keyring
        self.outbox_root = Path(outbox_root)
        self.counters = counters or Counters(instance)
        self.clock = clock
        self.limits = limits
        self._key = keyring.require_key(instance)
        self.pusher = Pusher(instance, keyring, endpoint_resolver, context=context, hwm=hwm,
                             wait_ms=wait_ms)

    def envelope(self, recipient: str, kind: Kind | str, payload: dict[str, Any] | None = None,
                 *, msg_id: str | None = None) -> Envelope:
        """Build and sign an envelope from this instance.

        Raises:
            Rejected(not_authorized): this instance's role may not send ``kind``.
            Rejected(bad_envelope): payload not JSON-serialisable.
        """
        if not may_send(self.instance, kind):
            raise Rejected(Code.NOT_AUTHORIZED,
                           f"{self.instance} may not send {kind!r} (see transport.kinds)",
                           sender=self.instance, kind=str(kind))
        return Envelope.create(kind, self.instance, recipient, payload, key=self._key,
                               now=self.clock(), msg_id=msg_id)

    def send(self, recipient: str, kind: Kind | str, payload: dict[str, Any] | None = None) -> Path_:
        """Send one message: push, or the outbox if the push cannot complete.

        Returns:
            ``"push"`` or ``"outbox"`` — the path taken.

        Raises:
            Rejected: not_authorized / bad_envelope / message_too_large (nothing sent).
            TransportError: set-up errors (ipc_path_too_long, curve_required, bad_endpoint,
                bad_instance) or outbox_failed (the file could not be written either).
        """
        return self.send_envelope(self.envelope(recipient, kind, payload))  # type: ignore[return-value]

    def send_envelope(self, env: Envelope, *, via: Via = "auto") -> str:
        """Send a built envelope.

        Args:
            via: ``"auto"`` (push, else outbox), ``"push"`` (push only), ``"outbox"`` (file
                only), ``"both"`` (push and file: the receiver must handle it once).

        Returns:
            ``"push"``, ``"outbox"``, ``"push+outbox"``, or ``"none"`` (``via="push"`` failed).
        """
        data = env.encode()
        if len(data) > self.limits.max_bytes:
            raise Rejected(Code.MESSAGE_TOO_LARGE,
                           f"{len(data)} bytes is over the {self.limits.max_bytes}-byte cap; "
                           "put the data in state.db and send its id", msg_id=env.id)
        pushed = via != "outbox" and self.pusher.push(env.recipient, data)
        if pushed:
            self.counters.add(PUSHED)
        filed = via == "outbox" or via == "both" or (via == "auto" and not pushed)
        if filed:
            self._write_file(env, data)
            if via == "auto":
                self.counters.add(FELL_BACK)
        if pushed and filed:
            return "push+outbox"
        return "push" if pushed else ("outbox" if filed else "none")

    def close(self) -> None:
        """Close sockets (queued pushes get a short linger)."""
        self.pusher.close()

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write_file(self, env: Envelope, data: bytes) -> None:
        try:
            write_message(self.outbox_root, env.recipient, env.id, data)
        except OSError as e:
            raise TransportError(f"could not write outbox file for {env.recipient}: {e}; "
                                 "check free space and permissions of the org home's outbox/",
                                 code=Code.OUTBOX_FAILED) from e
