"""The database refuses what the vocabulary forbids: triggers generated from ``vocab.py``.

``GUARDED`` maps each status, role, outcome, actor and stop-reason column to the vocabulary that
closes it; the triggers are generated from it, so adding a value to a StrEnum is the one change.
SQLite cannot add a CHECK constraint to an existing table, so each column gets a ``BEFORE
INSERT`` and a ``BEFORE UPDATE OF <column>`` trigger that aborts the statement
(``sqlite3.IntegrityError``, message ``<table>.<column>: value is not one of …``; SQLite before
3.47 takes only a literal message, so it cannot quote the value). NULL passes: whether a column
may be NULL is its own NOT NULL constraint's business.

``sync`` compares the installed triggers' SQL (``sqlite_master``) with the generated SQL and
recreates those that differ in one transaction, at every ``migrate`` — so a grown vocabulary
needs no new migration.
"""
from __future__ import annotations

import sqlite3
from typing import Iterable

from state_db.vocab import (
    ROLE_ACTORS, Actor, BatchStatus, CandidateStatus, DecisionStatus, NoteStatus, PreflightOutcome,
    ProposalStatus, RoleStatus, SessionStatus, SkillStatus, StopReason, VerdictOutcome, WorkStatus,
)
from state_db.vocab import Origin, ReplayPlanStatus, ScheduleKind, ScheduleStatus, TranscriptKind

PREFIX = "vocab_"

# (table, column) -> the values it may hold
GUARDED: dict[tuple[str, str], Iterable[str]] = {
    ("work_items", "status"): WorkStatus,
    ("work_items", "stop_reason"): StopReason,
    ("stop_history", "stop_reason"): StopReason,
    ("decisions", "status"): DecisionStatus,
    ("role_instances", "status"): RoleStatus,
    ("role_instances", "role"): ROLE_ACTORS,
    ("peers", "role"): ROLE_ACTORS,
    ("org_session", "status"): SessionStatus,
    ("skill_candidates", "status"): CandidateStatus,
    ("candidate_batches", "status"): BatchStatus,
    ("raw_notes", "status"): NoteStatus,
    ("skills", "status"): SkillStatus,
    ("verdicts", "outcome"): VerdictOutcome,
    ("preflights", "outcome"): PreflightOutcome,
    ("events", "actor"): Actor,
    ("idempotency", "actor"): Actor,
    ("schedules", "status"): ScheduleStatus,
    ("schedules", "kind"): ScheduleKind,
    ("work_items", "origin"): Origin,
    ("proposals", "status"): ProposalStatus,
    ("replay_plans", "status"): ReplayPlanStatus,
    ("transcript", "kind"): TranscriptKind,
}


def allowed(table: str, column: str) -> list[str]:
    """The values ``table.column`` may hold, in their declared order."""
    return [str(v) for v in GUARDED[(table, column)]]


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def generated(tables: set[str] | None = None) -> dict[str, str]:
    """Trigger name -> its ``CREATE TRIGGER`` statement, for every guarded column (of ``tables``
    only, when given: a table a later migration creates is guarded from that migration on)."""
    out = {}
    for (table, column), _ in GUARDED.items():
        if tables is not None and table not in tables:
            continue
        values = allowed(table, column)
        message = _quote(f"{table}.{column}: value is not one of {', '.join(values)}")
        when = f"NEW.{column} NOT IN ({', '.join(_quote(v) for v in values)})"
        for event, on in (("insert", "INSERT"), ("update", f"UPDATE OF {column}")):
            name = f"{PREFIX}{table}_{column}_{event}"
            out[name] = (f"CREATE TRIGGER {name} BEFORE {on} ON {table} FOR EACH ROW WHEN {when} "
                         f"BEGIN SELECT RAISE(ABORT, {message}); END")
    return out


def installed(conn: sqlite3.Connection) -> dict[str, str]:
    """Trigger name -> SQL of the vocabulary triggers in the database."""
    return {r[0]: r[1] for r in conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND name LIKE ?", (PREFIX + "%",))}


def stale(conn: sqlite3.Connection) -> tuple[dict[str, str], list[str]]:
    """(triggers to create, triggers to drop) to bring the database to ``generated()``."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    want, have = generated(tables), installed(conn)
    create = {n: sql for n, sql in want.items() if have.get(n) != sql}
    drop = [n for n in have if n not in want or n in create]
    return create, drop


def install(conn: sqlite3.Connection) -> list[str]:
    """Create or recreate the triggers that differ, in the caller's transaction; returns their
    names. Raises sqlite3.Error (a guarded table is missing)."""
    create, drop = stale(conn)
    for name in drop:
        conn.execute(f"DROP TRIGGER IF EXISTS {name}")
    for sql in create.values():
        conn.execute(sql)
    return sorted(create)


def sync(conn: sqlite3.Connection) -> list[str]:
    """``install`` in its own ``BEGIN IMMEDIATE`` transaction, only when something differs
    (a read of ``sqlite_master`` otherwise). Returns the names of the triggers (re)created."""
    if stale(conn) == ({}, []):
        return []
    conn.execute("BEGIN IMMEDIATE")
    try:
        names = install(conn)            # re-read under the write lock: another process may have synced
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return names
