"""The org's processes as typed data: the org session (the supervisor's singleton row), role
instances, and the transport counters each instance keeps."""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from state_db.queries.base import columns, loads


@dataclass(frozen=True)
class Session:
    """The ``org_session`` row: the org's status and its supervisor."""

    status: str
    updated_at: float
    started_at: float | None = None
    supervisor_pid: int | None = None
    supervisor_start: str | None = None
    detail: str | None = None

    @classmethod
    def from_row(cls, row) -> "Session":
        return cls(**columns(cls, row))

    @property
    def intent(self) -> dict:
        """What the supervisor was asked to do (``detail`` as data; {} when unreadable)."""
        try:
            return loads(self.detail, {}) or {}
        except ValueError:
            return {}


@dataclass(frozen=True)
class RoleInstance:
    instance: str
    role: str
    status: str
    updated_at: float
    pid: int | None = None
    pid_start: str | None = None
    endpoint: str | None = None
    heartbeat_at: float | None = None
    started_at: float | None = None
    restarts: int = 0
    last_exit: str | None = None
    current_work: str | None = None

    @classmethod
    def from_row(cls, row) -> "RoleInstance":
        return cls(**columns(cls, row))

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def session(conn: sqlite3.Connection) -> Session | None:
    """The org session, or None (the org never started)."""
    row = conn.execute("SELECT * FROM org_session WHERE id = 1").fetchone()
    return Session.from_row(row) if row else None


def role_instances(conn: sqlite3.Connection, role: str | None = None) -> list[RoleInstance]:
    """Role instances (of ``role`` when given), by role then instance."""
    where, params = ("", ()) if role is None else (" WHERE role = ?", (role,))
    return [RoleInstance.from_row(r) for r in conn.execute(
        f"SELECT * FROM role_instances{where} ORDER BY role, instance", params)]


def role_instance(conn: sqlite3.Connection, instance: str) -> RoleInstance | None:
    """The role instance ``instance``, or None (never registered)."""
    row = conn.execute("SELECT * FROM role_instances WHERE instance = ?", (instance,)).fetchone()
    return RoleInstance.from_row(row) if row else None


def transport_counters(conn: sqlite3.Connection, instance: str | None = None) -> dict[str, dict[str, int]]:
    """Stored transport counters: ``{instance: {name: value}}`` (of ``instance`` when given)."""
    where, params = ("", ()) if instance is None else (" WHERE instance = ?", (instance,))
    out: dict[str, dict[str, int]] = {}
    for inst, name, value in conn.execute(
            f"SELECT instance, name, value FROM transport_counters{where} ORDER BY instance, name", params):
        out.setdefault(inst, {})[name] = value
    return out
