"""Decisions (gated actions and questions waiting for a human) as typed data."""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from state_db.queries.base import columns, loads, marks, scalar
from state_db.vocab import DecisionStatus


#: How the question of an action asked again after it was cut while it ran begins
#: (roles/loop_agent/gate.py writes it; the front ends show such a question whole).
ASKED_AGAIN = "ASKED AGAIN"


@dataclass(frozen=True)
class Decision:
    """One ``decisions`` row; ``action`` decoded (``{"kind", "command", "reason", ...}``)."""

    id: str
    work_id: str
    kind: str
    status: str
    created_at: float
    iteration: int | None = None
    action: dict = field(default_factory=dict)
    question: str = ""
    answer: str | None = None
    stop_run: bool = False
    result: str | None = None
    decided_by: str | None = None
    decided_at: float | None = None
    announced_at: float | None = None
    executor: str | None = None
    checkpoint: str | None = None

    @classmethod
    def from_row(cls, row) -> "Decision":
        v = columns(cls, row)
        v["action"] = loads(v.get("action"), {}) or {}
        v["stop_run"] = bool(v.get("stop_run"))
        return cls(**v)

    @property
    def command(self) -> str | None:
        """The command the action asked to run."""
        return self.action.get("command")

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def decision(conn: sqlite3.Connection, decision_id: str) -> Decision | None:
    """The decision ``decision_id``, or None."""
    row = conn.execute("SELECT * FROM decisions WHERE id = ?", (decision_id,)).fetchone()
    return Decision.from_row(row) if row else None


def of_work(conn: sqlite3.Connection, work_id: str, *statuses: str, iteration: int | None = None) -> list[Decision]:
    """Decisions of ``work_id`` (in ``statuses`` when given; of ``iteration`` when given), oldest first."""
    sql, params = "SELECT * FROM decisions WHERE work_id = ?", [work_id]
    if statuses:
        sql += f" AND status IN ({marks(statuses)})"
        params += statuses
    if iteration is not None:
        sql += " AND iteration = ?"
        params.append(iteration)
    return [Decision.from_row(r) for r in conn.execute(sql + " ORDER BY created_at", params)]


def pending(conn: sqlite3.Connection) -> list[Decision]:
    """Every decision waiting for a human, oldest first."""
    return [Decision.from_row(r) for r in conn.execute(
        "SELECT * FROM decisions WHERE status = ? ORDER BY created_at", (DecisionStatus.PENDING,))]


def recent(conn: sqlite3.Connection, limit: int = 100) -> list[Decision]:
    """The latest ``limit`` decisions, whatever their status, newest first."""
    return [Decision.from_row(r) for r in conn.execute(
        "SELECT * FROM decisions ORDER BY created_at DESC LIMIT ?", (limit,))]


def has_pending(conn: sqlite3.Connection, work_id: str, *, kind: str | None = None,
                command: str | None = None) -> bool:
    """True if a decision of ``work_id`` waits (of ``kind`` asking for ``command``, when given)."""
    sql, params = "SELECT 1 FROM decisions WHERE work_id = ? AND status = ?", [work_id, DecisionStatus.PENDING]
    if kind is not None:
        sql += " AND kind = ? AND json_extract(action, '$.command') IS NOT DISTINCT FROM ?"
        params += [kind, command]
    return conn.execute(sql, params).fetchone() is not None


def unannounced_since(conn: sqlite3.Connection, before: float) -> list[Decision]:
    """Pending decisions last announced (or created) before ``before``."""
    return [Decision.from_row(r) for r in conn.execute(
        """SELECT * FROM decisions WHERE status = ? AND COALESCE(announced_at, created_at) < ?
           ORDER BY created_at""", (DecisionStatus.PENDING, before))]


def settled_checkpoint(conn: sqlite3.Connection, work_id: str, after_iteration: int) -> str | None:
    """The checkpoint of the latest executed action decided at or after ``after_iteration``, or None."""
    return scalar(conn, """SELECT checkpoint FROM decisions WHERE work_id = ? AND status = ? AND checkpoint IS NOT NULL
                           AND COALESCE(iteration, 0) >= ? ORDER BY decided_at DESC, created_at DESC LIMIT 1""",
                  (work_id, DecisionStatus.EXECUTED, after_iteration))


def action_checkpoints(conn: sqlite3.Connection, work_id: str) -> list[str]:
    """The checkpoints of every executed action of ``work_id`` a human approved, oldest first."""
    return [r[0] for r in conn.execute("""SELECT checkpoint FROM decisions WHERE work_id = ? AND status = ?
                                          AND checkpoint IS NOT NULL ORDER BY decided_at, created_at""",
                                       (work_id, DecisionStatus.EXECUTED))]


def rejected_to_stop(conn: sqlite3.Connection, work_id: str, *stopping_kinds: str) -> bool:
    """True if a rejection of ``work_id`` ends the run: one rejected with ``stop_run``, or a
    rejected decision of one of ``stopping_kinds``."""
    listed = marks(stopping_kinds)
    return conn.execute(f"""SELECT 1 FROM decisions WHERE work_id = ? AND status = ?
                            AND (stop_run = 1 OR kind IN ({listed}))""",
                        (work_id, DecisionStatus.REJECTED, *stopping_kinds)).fetchone() is not None
