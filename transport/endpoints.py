"""Where each instance's PULL socket lives.

Default: ``ipc://<org home>/run/s/<instance>`` — the instance name is at most ~16 characters, so
the path only fails the operating system's ~100-byte limit for socket paths when the org home
itself is long; that case is a coded error (:class:`IpcPathTooLong`) computed before binding.
tcp:// only by configuration (a base address; each instance gets a fixed port offset) and then
only with CURVE (enforced by the sender and receiver, see :mod:`transport.push`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Mapping

from state_db.vocab import Actor

from transport.errors import BadEndpoint, IpcPathTooLong
from transport.kinds import role_of

#: Linux's sun_path holds 108 bytes with the NUL; libzmq and other platforms are tighter.
IPC_PATH_MAX = 100
SOCKET_DIR = "s"

EndpointResolver = Callable[[str], str]

_ROLE_SLOT = {actor: i for i, actor in enumerate(Actor)}


def ipc_path(run_dir: Path | str, instance: str) -> Path:
    """The socket file of ``instance``: ``<run_dir>/s/<instance>`` (absolute, not resolved).

    Raises:
        BadInstance: not an instance name.
        IpcPathTooLong: the path would exceed :data:`IPC_PATH_MAX` bytes.
    """
    role_of(instance)  # instance names become file names: only the strict shape is allowed
    path = Path(os.path.abspath(run_dir)) / SOCKET_DIR / instance
    length = len(os.fsencode(path))
    if length > IPC_PATH_MAX:
        raise IpcPathTooLong(str(path), length, IPC_PATH_MAX)
    return path


def tcp_port_offset(instance: str) -> int:
    """Fixed port offset of an instance on a tcp base: role slot × 100 + instance number."""
    role = role_of(instance)
    suffix = instance[len(role):].lstrip("-")
    n = int(suffix) if suffix else 0
    if n > 99:
        raise BadEndpoint(f"tcp base cannot place {instance!r} (instance numbers above 99)")
    return _ROLE_SLOT[role] * 100 + n


def scheme_of(endpoint: str) -> str:
    """``"ipc"`` or ``"tcp"``.

    Raises:
        BadEndpoint: any other scheme.
    """
    scheme = endpoint.split("://", 1)[0] if "://" in endpoint else ""
    if scheme not in ("ipc", "tcp"):
        raise BadEndpoint(endpoint)
    return scheme


class Endpoints:
    """Resolve an instance name to its endpoint; call it like a function.

    Args:
        run_dir: the org home's ``run/`` folder (ipc sockets go under ``run/s/``).
        tcp_base: ``tcp://HOST:PORT`` from org.toml's ``transport.endpoint``; each instance then
            listens on PORT + :func:`tcp_port_offset`. None (or ``"ipc"``) → ipc.
        overrides: explicit endpoints by instance (e.g. recorded by the supervisor after binding
            ``tcp://127.0.0.1:*``); they win over both rules.
        peers: the org's registered instances (``transport.peers.StorePeers``): an instance
            another host runs is reached where it registered; they win over the tcp base.
    """

    def __init__(self, run_dir: Path | str, *, tcp_base: str | None = None,
                 overrides: Mapping[str, str] | None = None, peers=None) -> None:
        self.run_dir = Path(run_dir)
        self.peers = peers      # transport.peers.StorePeers: endpoints other hosts registered
        self.tcp_base = None if tcp_base in (None, "", "ipc") else tcp_base
        if self.tcp_base is not None:
            host_port = self.tcp_base.removeprefix("tcp://")
            host, _, port = host_port.rpartition(":")
            if scheme_of(self.tcp_base) != "tcp" or not host or not port.isdigit():
                raise BadEndpoint(self.tcp_base)
            self._host, self._port = host, int(port)
        self.overrides = dict(overrides or {})

    def __call__(self, instance: str) -> str:
        """The endpoint of ``instance``.

        Raises:
            BadInstance, IpcPathTooLong, BadEndpoint.
        """
        found = self.overrides.get(instance)
        if found is not None:
            scheme_of(found)
            return found
        if self.peers is not None and (peer := self.peers.get(instance)) is not None:
            scheme_of(peer.endpoint)
            return peer.endpoint
        if self.tcp_base is not None:
            return f"tcp://{self._host}:{self._port + tcp_port_offset(instance)}"
        return f"ipc://{ipc_path(self.run_dir, instance)}"
