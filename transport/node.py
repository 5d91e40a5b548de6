"""Wiring for one instance: its Sender and Receiver over one org home, sharing counters.

A role process opens a node, drives ``node.receiver.poll(timeout_ms)`` from its main loop
between reconcile ticks, sends with ``node.sender.send(...)``, and closes the node on exit.
A short-lived sender (the CLI as ``human``) uses :func:`open_sender`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from transport.endpoints import Endpoints
from transport.envelope import Limits
from transport.keys import keyring_path, Keyring
from transport.ledger import Counters, Ledger
from transport.peers import StorePeers
from transport.receiver import Handler, Receiver
from transport.sender import Sender


@dataclass
class Node:
    """The transport of one role instance (see :func:`open_node`)."""

    instance: str
    sender: Sender
    receiver: Receiver
    counters: Counters

    def close(self) -> None:
        """Close the sender, then the receiver (which flushes counters, sender's included)."""
        try:
            self.sender.close()
        finally:
            self.receiver.close()


def _endpoints(root: Path, transport: Mapping, overrides: Mapping[str, str] | None, peers=None) -> Endpoints:
    return Endpoints(root / "run", tcp_base=transport.get("endpoint"), overrides=overrides, peers=peers)


def _peers(root: Path, transport: Mapping, store: Path | str | None) -> StorePeers | None:
    """The instances other hosts registered, for an org that runs over tcp (none over ipc:
    an ipc org is one host, and its transport never asks the store)."""
    endpoint = transport.get("endpoint")
    if endpoint in (None, "", "ipc"):
        return None
    return StorePeers(store or root / "state.db")


def open_sender(home: Path | str, instance: str, *, transport: Mapping | None = None,
                endpoint_overrides: Mapping[str, str] | None = None,
                clock: Callable[[], float] = time.time, store: Path | str | None = None) -> Sender:
    """A Sender for ``instance`` in the org home ``home`` (keys from ``run/keys.json``).

    Args:
        transport: org.toml's ``[transport]`` table (endpoint base, limits); default: defaults.
        endpoint_overrides: endpoints recorded by the supervisor, by instance.
        store: the org's store, where a tcp org's instances on other hosts are registered.

    Raises:
        KeyringError: missing/unsafe keyring or no key for ``instance``.
    """
    root, transport = Path(home), dict(transport or {})
    peers = _peers(root, transport, store)
    keyring = Keyring.load(keyring_path(root / "run")).attach_peers(peers)
    return Sender(instance, keyring, _endpoints(root, transport, endpoint_overrides, peers),
                  root / "outbox", clock=clock, limits=Limits.from_config(transport))


def open_node(home: Path | str, instance: str, handler: Handler, *,
              transport: Mapping | None = None, endpoint: str | None = None,
              endpoint_overrides: Mapping[str, str] | None = None,
              clock: Callable[[], float] = time.time, start: bool = True,
              store: Path | str | None = None) -> Node:
    """Open the Sender and Receiver of ``instance``.

    Args:
        home: the org home (``state.db``, ``run/``, ``outbox/``).
        instance: this process's instance name.
        handler: called once per new envelope (after it is recorded in the ledger).
        transport: org.toml's ``[transport]`` table: ``endpoint`` ("ipc" or a tcp base),
            ``max_message_bytes``, ``max_age_s``, ``clock_skew_s``, ``sweep_s``.
        endpoint: bind here instead of the configured endpoint (e.g. ``tcp://127.0.0.1:*``;
            read the bound address from ``node.receiver.endpoint``).
        endpoint_overrides: where to reach other instances, by name.
        start: bind and watch now (else call ``node.receiver.start()``).
        store: where the delivery ledger lives: the org's store (default ``<home>/state.db``;
            a ``postgresql://`` URL when org.toml names one).

    Raises:
        KeyringError, IpcPathTooLong, CurveRequired, BadEndpoint, zmq.ZMQError.
    """
    root, transport = Path(home), dict(transport or {})
    limits = Limits.from_config(transport)
    peers = _peers(root, transport, store)
    keyring = Keyring.load(keyring_path(root / "run")).attach_peers(peers)
    endpoints = _endpoints(root, transport, endpoint_overrides, peers)
    counters = Counters(instance)
    sender = Sender(instance, keyring, endpoints, root / "outbox", counters=counters,
                    clock=clock, limits=limits)
    try:
        ledger = Ledger(store or root / "state.db", instance, counters=counters, limits=limits,
                        clock=clock)
        receiver = Receiver(instance, run_dir=root / "run", outbox_root=root / "outbox",
                            keyring=keyring, handler=handler, ledger=ledger,
                            endpoint=endpoint or endpoints(instance), limits=limits, clock=clock,
                            sweep_s=float(transport.get("sweep_s", 5.0)))
        if start:
            receiver.start()
    except BaseException:
        sender.close()
        raise
    return Node(instance, sender, receiver, counters)
