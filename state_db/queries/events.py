"""The journal (``events``) and the attention rows derived from it, as typed data."""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from state_db.queries.base import columns, exists, loads, marks, scalar


@dataclass(frozen=True)
class Event:
    """One journal entry; ``data`` decoded."""

    id: int
    at: float
    actor: str
    kind: str
    instance: str | None = None
    os_user: str | None = None
    subject: str | None = None
    data: dict = field(default_factory=dict)

    @classmethod
    def from_row(cls, row) -> "Event":
        v = columns(cls, row)
        v["data"] = loads(v.get("data"), {}) or {}
        return cls(**v)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class Attention:
    """Something a human was told outside the chat (``attention``), and how its delivery went."""

    key: str
    kind: str
    text: str
    created_at: float
    subject: str | None = None
    link: str | None = None
    notified_at: float | None = None
    posted_at: float | None = None
    post_attempts: int = 0
    last_error: str | None = None

    @classmethod
    def from_row(cls, row) -> "Attention":
        return cls(**columns(cls, row))


def last_id(conn: sqlite3.Connection, kind: str | None = None) -> int:
    """The newest journal id (of ``kind`` when given); 0 for an empty journal."""
    if kind is None:
        return scalar(conn, "SELECT MAX(id) FROM events", (), 0)
    return scalar(conn, "SELECT MAX(id) FROM events WHERE kind = ?", (kind,), 0)


def last_at(conn: sqlite3.Connection) -> float:
    """When the newest journal entry was written (0: none)."""
    return scalar(conn, "SELECT MAX(at) FROM events", (), 0)


def after(conn: sqlite3.Connection, after_id: int, *kinds: str, upto: int | None = None,
          limit: int | None = None) -> list[Event]:
    """Journal entries after ``after_id`` (up to ``upto``; of ``kinds`` when given), oldest first."""
    sql, params = "SELECT * FROM events WHERE id > ?", [after_id]
    if upto is not None:
        sql += " AND id <= ?"
        params.append(upto)
    if kinds:
        sql += f" AND kind IN ({marks(kinds)})"
        params += kinds
    sql += " ORDER BY id"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return [Event.from_row(r) for r in conn.execute(sql, params)]


def announced_upto(conn: sqlite3.Connection) -> int:
    """The journal id the coordinator's announcements cover (each ``announce`` records it)."""
    return scalar(conn, "SELECT MAX(CAST(json_extract(data, '$.upto') AS INTEGER)) FROM events WHERE kind = 'announce'",
                  (), 0)


def attention_known(conn: sqlite3.Connection, key: str) -> bool:
    """True once an attention row with ``key`` was written (one per event that needs a human)."""
    return exists(conn, "SELECT 1 FROM attention WHERE key = ?", (key,))


def attention_undelivered(conn: sqlite3.Connection, retries: int) -> list[Attention]:
    """Attention rows not shown on the desktop yet, or not posted with tries left, oldest first."""
    return [Attention.from_row(r) for r in conn.execute(
        """SELECT * FROM attention WHERE notified_at IS NULL OR (posted_at IS NULL AND post_attempts <= ?)
           ORDER BY created_at""", (retries,))]
