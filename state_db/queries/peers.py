"""The instances an org reaches over tcp (the ``peers`` table): where each listens, its CURVE
public key and the HMAC key of its envelopes — the coordinator host's and every joined host's.

A host's supervisor registers its own instances (:func:`register`); every role reads them
through ``transport.peers`` to reach and authenticate the others. The HMAC key is stored
because a role on another host must check the envelopes this one signs; whoever can write the
store can already write any verdict, so it holds nothing the store did not already trust.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from state_db.queries.base import columns, marks


@dataclass(frozen=True)
class Peer:
    instance: str
    host: str
    role: str
    endpoint: str
    curve_public: str
    hmac_key: str
    registered_at: float
    updated_at: float
    git_url: str = ""

    @classmethod
    def from_row(cls, row) -> "Peer":
        return cls(**columns(cls, row))

    def public(self) -> dict:
        """What may be shown or journaled (everything but the HMAC key)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "hmac_key"}


def all_peers(conn: sqlite3.Connection) -> list[Peer]:
    return [Peer.from_row(r) for r in conn.execute("SELECT * FROM peers ORDER BY instance")]


def peer(conn: sqlite3.Connection, instance: str) -> Peer | None:
    row = conn.execute("SELECT * FROM peers WHERE instance = ?", (instance,)).fetchone()
    return Peer.from_row(row) if row else None


def of_host(conn: sqlite3.Connection, host: str) -> list[Peer]:
    return [Peer.from_row(r) for r in conn.execute("SELECT * FROM peers WHERE host = ? ORDER BY instance", (host,))]


def instance_role(instance: str) -> str:
    """The role an instance name is of: ``loop-agent`` of ``loop-agent-50``; ``coordinator`` of
    ``coordinator`` (the peers table's ``role`` column)."""
    stem, _, n = instance.rpartition("-")
    return stem if n.isdigit() else instance


def taken_names(conn: sqlite3.Connection, role: str) -> set[str]:
    """Instance names of ``role`` already in use: registered peers and role rows alike."""
    rows = conn.execute("SELECT instance FROM role_instances WHERE role = ? "
                        "UNION SELECT instance FROM peers WHERE role = ?", (role, role))
    return {r[0] for r in rows}


def register(tx, *, instance: str, host: str, role: str, endpoint: str, curve_public: str, hmac_key: str,
             git_url: str = "") -> None:
    """Write ``instance``'s row (replacing an older one of the same host); journals
    ``peers.registered`` without the HMAC key.

    Raises:
        Conflict: the name or the public key belongs to another host's instance.
    """
    from state_db.kernel.errors import Conflict

    old = peer(tx.conn, instance)
    if old is not None and old.host != host:
        raise Conflict(f"instance {instance} is registered by host {old.host!r}",
                       hint="each host registers its own instances under names no other host uses")
    row = {"instance": instance, "host": host, "role": role, "endpoint": endpoint, "curve_public": curve_public,
           "hmac_key": hmac_key, "git_url": git_url, "registered_at": old.registered_at if old else tx.now,
           "updated_at": tx.now}
    if old is not None:
        if Peer.from_row(row) == Peer(**{**old.__dict__, "updated_at": tx.now}):
            return                                          # unchanged: no journal event
        tx.delete("peers", instance)
    tx.insert("peers", row, journal=False)
    tx.journal("peers.registered", instance, {k: v for k, v in row.items() if k != "hmac_key"})


def live_eval_agents(conn: sqlite3.Connection, *, heartbeat_timeout_s: float, now: float) -> list[Peer]:
    """The registered eval-agents that are ready and heartbeating (within ``heartbeat_timeout_s``
    of ``now``), by name: the org's eval-agent list over tcp (``roles.base.instances.EvalAgents``)."""
    rows = conn.execute("""SELECT p.* FROM peers p JOIN role_instances r ON r.instance = p.instance
                           WHERE p.role = 'eval-agent' AND r.status = 'ready'
                             AND r.heartbeat_at IS NOT NULL AND r.heartbeat_at >= ?
                           ORDER BY p.instance""", (now - heartbeat_timeout_s,))
    return [Peer.from_row(r) for r in rows]


def instances_of_host(conn, host: str) -> dict[str, str]:
    """The instances registered for ``host``: instance -> role."""
    return {r[0]: r[1] for r in conn.execute("SELECT instance, role FROM peers WHERE host = ?", (host,)).fetchall()}


def host_touch(conn, work_id: str, instances) -> dict:
    """What a host's ``instances`` have to do with ``work_id``: ``assigned_to`` and ``status`` of
    the item (None when it does not exist), the next iteration's number, whether one of them ran
    an attempt of it (``ran``) and whether one of them wrote a verdict on it (``judged``)."""
    row = conn.execute("SELECT assigned_to, status FROM work_items WHERE id = ?", (work_id,)).fetchone()
    last = conn.execute("SELECT MAX(n) FROM iterations WHERE work_id = ?", (work_id,)).fetchone()
    out = {"item": None if row is None else (row[0], row[1]),
           "next": int((last[0] if last and last[0] is not None else 0)) + 1, "ran": False, "judged": False}
    mine = list(instances)
    if mine:
        listed = marks(mine)
        out["ran"] = conn.execute(f"SELECT 1 FROM attempts WHERE work_id = ? AND instance IN ({listed}) LIMIT 1",
                                  (work_id, *mine)).fetchone() is not None
        out["judged"] = conn.execute(f"SELECT 1 FROM verdicts WHERE work_id = ? AND written_by IN ({listed}) LIMIT 1",
                                     (work_id, *mine)).fetchone() is not None
    return out
