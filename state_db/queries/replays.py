"""Skill replays as typed data: which items a candidate came from, which ended items could be
replayed, the replays of a subject with their outcome, and the subjects still to plan.

A replay is an ordinary work item (``origin = 'replay'``) plus one ``replays`` row saying which
subject it measures, which ended item it reruns and which arm it is (``with`` the skill in
context, ``without`` it). Its outcome is read from the work item itself: its status, stop reason,
committed iterations and counted tokens, so the figures are the run's own, never a copy.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from state_db.queries.base import loads, marks
from state_db.vocab import CandidateStatus, Origin, StopReason, WorkStatus

WITH, WITHOUT = "with", "without"


@dataclass(frozen=True)
class Replay:
    """One replay run and what it came to (``status`` and ``stop_reason`` are the work item's)."""

    work_id: str
    subject: str
    subject_kind: str
    source_id: str
    relation: str
    arm: str
    skill_name: str
    status: str
    stop_reason: str | None
    iterations: int
    tokens: int
    cost_usd: float

    @property
    def ended(self) -> bool:
        return self.status == WorkStatus.ENDED

    @property
    def goal_met(self) -> bool:
        return self.stop_reason == StopReason.GOAL_MET


@dataclass(frozen=True)
class Plan:
    """What the coordinator planned for one subject: the items, or why none."""

    subject: str
    subject_kind: str
    status: str                 # planned | skipped
    name: str                   # the skill's name
    text: str                   # what the 'with' arm carries
    items: tuple[dict, ...]     # [{"id": work id, "relation": "source" | "similar"}]
    reason: str
    created_at: float


@dataclass(frozen=True)
class Ended:
    """An ended, non-replay work item that could be replayed: what it was about."""

    id: str
    goal: str
    verify: tuple[str, ...]
    stop_reason: str


def of_subject(conn: sqlite3.Connection, subject: str) -> list[Replay]:
    """Every replay of ``subject`` with its outcome, in the order they were made."""
    return [Replay(r["work_id"], r["subject"], r["subject_kind"], r["source_id"], r["relation"], r["arm"],
                   r["skill_name"], r["status"], r["stop_reason"], r["iterations"], r["tokens"], r["cost_usd"])
            for r in conn.execute(
                """SELECT p.work_id, p.subject, p.subject_kind, p.source_id, p.relation, p.arm, p.skill_name,
                          w.status, w.stop_reason,
                          (SELECT COUNT(*) FROM iterations i WHERE i.work_id = p.work_id) AS iterations,
                          (SELECT COALESCE(SUM(m.input_tokens + m.output_tokens + m.cache_write_tokens
                                               + m.cache_read_tokens), 0)
                             FROM model_calls m WHERE m.work_id = p.work_id) AS tokens,
                          (SELECT COALESCE(SUM(m.cost_usd), 0) FROM model_calls m WHERE m.work_id = p.work_id)
                             AS cost_usd
                     FROM replays p JOIN work_items w ON w.id = p.work_id
                    WHERE p.subject = ? ORDER BY p.created_at, p.work_id""", (subject,))]


def of_work(conn: sqlite3.Connection, work_id: str) -> dict | None:
    """The ``replays`` row of a work item (None when it is not a replay)."""
    row = conn.execute("SELECT * FROM replays WHERE work_id = ?", (work_id,)).fetchone()
    return dict(row) if row is not None else None


def is_replay(conn: sqlite3.Connection, work_id: str) -> bool:
    return conn.execute("SELECT 1 FROM replays WHERE work_id = ?", (work_id,)).fetchone() is not None


def plan(conn: sqlite3.Connection, subject: str) -> Plan | None:
    row = conn.execute("SELECT * FROM replay_plans WHERE subject = ?", (subject,)).fetchone()
    if row is None:
        return None
    return _plan(row)


def _plan(row) -> Plan:
    return Plan(row["subject"], row["subject_kind"], row["status"], row["name"], row["skill_text"],
                tuple(loads(row["items"], [])), row["reason"], row["created_at"])


def incomplete_plans(conn: sqlite3.Connection) -> list[Plan]:
    """Planned subjects with fewer replay runs than two per planned item, oldest first."""
    plans = [(_plan(r), r["runs"]) for r in conn.execute(
        """SELECT p.*, (SELECT COUNT(*) FROM replays x WHERE x.subject = p.subject) AS runs
             FROM replay_plans p WHERE p.status = 'planned' ORDER BY p.created_at, p.subject""")]
    return [p for p, runs in plans if runs < 2 * len(p.items)]


def unplanned_candidates(conn: sqlite3.Connection) -> list[str]:
    """Pending candidates no plan was made for yet, oldest first."""
    return [r[0] for r in conn.execute(
        """SELECT c.id FROM skill_candidates c
            WHERE c.status = ? AND NOT EXISTS (SELECT 1 FROM replay_plans p WHERE p.subject = c.id)
            ORDER BY c.created_at, c.id""", (CandidateStatus.PENDING,))]


def unmeasured_candidates(conn: sqlite3.Connection) -> set[str]:
    """Pending candidates whose replays are not all ended: no plan yet, or a planned replay that
    was not submitted yet or is still running."""
    out = set(unplanned_candidates(conn))
    for r in conn.execute(
            """SELECT c.id, p.items,
                      (SELECT COUNT(*) FROM replays x JOIN work_items w ON w.id = x.work_id
                        WHERE x.subject = c.id AND w.status = ?) AS ended
                 FROM skill_candidates c JOIN replay_plans p ON p.subject = c.id
                WHERE c.status = ? AND p.status = 'planned'""", (WorkStatus.ENDED, CandidateStatus.PENDING)):
        if r["ended"] < 2 * len(loads(r["items"], [])):
            out.add(r["id"])
    return out


def active_count(conn: sqlite3.Connection) -> int:
    """Replay runs not ended yet (queued, waiting, dispatched, running or paused)."""
    return conn.execute(
        """SELECT COUNT(*) FROM work_items w WHERE w.status != 'ended'
              AND EXISTS (SELECT 1 FROM replays p WHERE p.work_id = w.id)""").fetchone()[0]


def source_runs(conn: sqlite3.Connection, note_ids: list[str] | tuple[str, ...]) -> list[str]:
    """The runs raw notes ``note_ids`` came from, in the order of the notes, each once."""
    if not note_ids:
        return []
    found = {r[0]: r[1] for r in conn.execute(
        f"SELECT id, run_id FROM raw_notes WHERE id IN ({marks(note_ids)})", list(note_ids))}
    out: list[str] = []
    for n in note_ids:
        run = found.get(n)
        if run is not None and run not in out:
            out.append(run)
    return out


def ended_items(conn: sqlite3.Connection, limit: int = 500) -> list[Ended]:
    """Ended items that are not replays, newest first: what a replay may rerun. Items that ended
    because their checks could not run are left out (the machine failed: nothing to measure)."""
    return [Ended(r["id"], r["goal"], tuple(loads(r["verify"], [])), r["stop_reason"]) for r in conn.execute(
        """SELECT id, goal, verify, stop_reason FROM work_items
            WHERE status = ? AND origin != ? AND stop_reason IS DISTINCT FROM ?
            ORDER BY ended_at DESC, id LIMIT ?""",
        (WorkStatus.ENDED, Origin.REPLAY, StopReason.VERIFY_UNRUNNABLE, limit))]


def plans_named(conn: sqlite3.Connection, name: str) -> list[Plan]:
    """Every plan that measured a skill called ``name`` (as a candidate or on demand), oldest first."""
    return [_plan(r) for r in conn.execute(
        "SELECT * FROM replay_plans WHERE name = ? ORDER BY created_at, subject", (name,))]
