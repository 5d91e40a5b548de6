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
from state_db.vocab import (Origin, ReplayArm, ReplayPlanStatus, ReplayRelation, ReplaySubjectKind, ScheduleKind,
                            ScheduleStatus, TranscriptKind)
from state_db.vocab import (
    ActStatus, AttemptOutcome, AttentionKind, DecisionKind, HandoffSource, NoteKind, NoteTier, ProposalKind,
)

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
    ("replay_plans", "subject_kind"): ReplaySubjectKind,
    ("replays", "subject_kind"): ReplaySubjectKind,
    ("replays", "arm"): ReplayArm,
    ("replays", "relation"): ReplayRelation,
    ("iterations", "act_status"): ActStatus,
    ("attempts", "outcome"): AttemptOutcome,
    ("decisions", "kind"): DecisionKind,
    ("proposals", "kind"): ProposalKind,
    ("curated_notes", "kind"): NoteKind,
    ("curated_notes", "tier"): NoteTier,
    ("attention", "kind"): AttentionKind,
    ("handoffs", "source"): HandoffSource,
    ("transcript", "kind"): TranscriptKind,
}


# Every other TEXT column, and why it is not a vocabulary: identifiers, names and paths, text
# people or models wrote, JSON documents, times and codes kept as text. A new TEXT column is
# either guarded above or listed here (tests/test_vocab_guard.py fails otherwise).
FREE: dict[str, tuple[str, ...]] = {
    "_migrations": ("name",),
    "attempts": ("work_id", "instance", "current_tool", "detail"),
    "attention": ("key", "subject", "text", "link", "last_error"),
    "candidate_batches": ("id",),
    "curated_notes": ("id", "topic", "body", "source_notes", "contradicts", "signals"),
    "decisions": ("id", "work_id", "action", "question", "answer", "result", "decided_by", "executor", "checkpoint"),
    "delivery_ledger": ("msg_id", "recipient", "sender"),
    "events": ("instance", "os_user", "subject", "data"),
    "handoffs": ("work_id", "done", "remains", "learned", "note", "allowance", "written_by", "act"),
    "idempotency": ("key", "os_user", "command", "result", "args"),
    "iterations": ("work_id", "act_summary", "tool_calls", "fingerprint", "checkpoint", "changed_paths",
                   "verdict_id", "feedback", "lesson", "prompt"),
    "model_calls": ("request_id", "work_id", "instance"),
    "org_session": ("supervisor_start", "detail"),
    "peers": ("instance", "host", "endpoint", "curve_public", "hmac_key", "git_url"),
    "preflights": ("work_id", "checks", "detail", "written_by"),
    "proposals": ("id", "fingerprint", "workspace", "title", "goal", "verify", "caps", "evidence", "created_by",
                  "decided_by", "detail", "work_id"),
    "raw_notes": ("id", "run_id", "fact", "judgment", "rationale", "applicability", "evidence", "curated_id"),
    "role_instances": ("instance", "pid_start", "endpoint", "last_exit", "current_work"),
    "schedules": ("id", "name", "rule", "request", "argv", "created_by", "last_work_id", "last_skip", "watch"),
    "skill_candidates": ("id", "name", "description", "body", "signals", "source_notes", "merged_into", "batch_id",
                         "decided_by"),
    "replays": ("work_id", "subject", "source_id", "skill_name", "skill_text"),
    "replay_plans": ("subject", "name", "skill_text", "items", "planned_by"),
    "skills": ("name", "path", "candidate_id"),
    "stop_history": ("work_id", "stop_detail", "caps", "new_caps", "continued_by"),
    "transcript": ("work_id", "data"),
    "transport_counters": ("instance", "name"),
    "usage_summaries": ("work_id",),
    "verdicts": ("id", "work_id", "checks", "feedback", "protected_changed", "written_by", "held_back", "evidence",
                 "review", "verified"),
    "work_items": ("id", "goal", "workspace", "verify", "protect", "caps", "stop_detail", "assigned_to", "branch",
                   "created_by", "toolchain", "origin_id", "review", "next_step", "dismissed_by", "scope", "delivered",
                   "verify_hidden", "ladder"),
    "workspace_locks": ("workspace", "work_id"),
}

# Columns named like a vocabulary that are open on purpose, and why: the test holds every other
# ``*kind``, ``*status``, ``*outcome``, ``*reason``, ``*source``, ``*role``, ``*actor``, ``*tier``,
# ``*origin``, ``*backend`` and ``*model`` column to a guard.
OPEN: dict[tuple[str, str], str] = {
    ("skill_candidates", "decided_reason"): "the human's own words for a decision (org candidates reject --reason)",
    ("replay_plans", "reason"): "why a subject's replays were skipped or an item left out, in words for a human",
    ("events", "kind"): "the journal's event kinds name a table and its change (work_items.ended), written by "
                        "StateWriter itself from the table it wrote",
    ("delivery_ledger", "kind"): "message kinds are the transport's vocabulary (transport/envelope.py), which "
                                 "state_db does not know; an envelope of an unknown kind is refused before its ledger row",
    ("proposals", "source"): "where a discovery scan found it: a scanner's name or an issue tracker's address",
    ("skills", "origin"): "the runs and notes a skill came from (JSON)",
    ("work_items", "backend"): "anthropic, command, or scripted:PATH (a path)",
    ("model_calls", "model"): "the model's name as the price table knows it (org.toml)",
    ("iterations", "model"): "the model's name as the price table knows it (org.toml): the rung it ran on",
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
