"""What the loop asks of state.db beyond iterations and verdicts: the decisions a run waits on,
the error classes it already asked a human about, its endings and its hand-off notes."""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from state_db.queries.base import columns, loads
from state_db.vocab import Actor, DecisionKind, DecisionStatus as D

#: the decision kind of "an error the stop policy does not know: go on, or stop?"
UNKNOWN_ERROR = DecisionKind.UNKNOWN_ERROR


@dataclass(frozen=True)
class Handoff:
    """The hand-off note of one ending of a run (``ending``: 1, then one more per continuation)."""

    work_id: str
    ending: int
    done: str
    remains: str
    learned: str
    note: str = ""
    source: str = "record"          # "wrapup": the wrap-up act wrote ``note``; "record": derived only
    allowance: dict | None = None   # the reserved slice the wrap-up act had: tokens, cost_usd, seconds
    attempt: int | None = None
    tokens: int = 0
    cost_usd: float = 0.0
    elapsed_s: float = 0.0
    written_by: str = ""
    at: float = 0.0
    act: str | None = None          # what became of the wrap-up act: ran, or not made and why

    @classmethod
    def of(cls, row: sqlite3.Row | dict) -> Handoff:
        data = columns(cls, row)
        data["allowance"] = loads(data.get("allowance"), {})
        return cls(**data)

    def encode(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def open_decisions(conn: sqlite3.Connection, work_id: str) -> tuple[str, ...]:
    """Ids of the run's decisions a human must still make or whose approved action must still
    run (pending, approved, edited), oldest first."""
    return tuple(r[0] for r in conn.execute(
        "SELECT id FROM decisions WHERE work_id = ? AND status IN (?, ?, ?) ORDER BY created_at",
        (work_id, D.PENDING, D.APPROVED, D.EDITED)))


def pending_decisions(conn: sqlite3.Connection, work_id: str) -> tuple[str, ...]:
    return tuple(r[0] for r in conn.execute(
        "SELECT id FROM decisions WHERE work_id = ? AND status = ? ORDER BY created_at", (work_id, D.PENDING)))


#: Decisions that ask whether the run should end for a reason of its own: the goal judged
#: impossible, an error the stop policy does not know (needs_human).
ENDING_QUESTIONS = (DecisionKind.IMPOSSIBLE, DecisionKind.UNKNOWN_ERROR, DecisionKind.NEEDS_HUMAN)


def pending_endings(conn: sqlite3.Connection, work_id: str) -> tuple[str, ...]:
    """Ids of the run's pending decisions that ask whether it ends (``ENDING_QUESTIONS``)."""
    return tuple(r[0] for r in conn.execute(
        "SELECT id FROM decisions WHERE work_id = ? AND status = ? AND kind IN (?, ?, ?) ORDER BY created_at",
        (work_id, D.PENDING, *ENDING_QUESTIONS)))


def errors_asked(conn: sqlite3.Connection, work_id: str) -> set[str]:
    """The error classes this run already asked a human about (whatever the answer)."""
    return {r[0] for r in conn.execute(
        "SELECT json_extract(action, '$.command') FROM decisions WHERE work_id = ? AND kind = ?",
        (work_id, UNKNOWN_ERROR)) if r[0]}


def stop_confirmed(conn: sqlite3.Connection, work_id: str) -> str | None:
    """The error class whose stop a human confirmed (approved, or rejected with a stop, an
    ``unknown_error`` decision), or None."""
    row = conn.execute(
        """SELECT json_extract(action, '$.command') FROM decisions WHERE work_id = ? AND kind = ?
             AND (status IN (?, ?, ?, ?) OR (status = ? AND stop_run = 1)) ORDER BY decided_at LIMIT 1""",
        (work_id, UNKNOWN_ERROR, D.APPROVED, D.EDITED, D.EXECUTING, D.EXECUTED, D.REJECTED)).fetchone()
    if row is None:         # the doer asked a human (needs_human), who stopped the run
        row = conn.execute("SELECT 'the question the doer asked' FROM decisions WHERE work_id = ? AND kind = ? "
                           "AND status = ? AND stop_run = 1 LIMIT 1",
                           (work_id, DecisionKind.NEEDS_HUMAN, D.REJECTED)).fetchone()
    return None if row is None else (row[0] or "an unknown error")


def endings(conn: sqlite3.Connection, work_id: str) -> tuple[int, float]:
    """(how many times the run was continued, when it was last continued — 0.0 if never)."""
    row = conn.execute("SELECT COUNT(*), COALESCE(MAX(continued_at), 0) FROM stop_history WHERE work_id = ?",
                       (work_id,)).fetchone()
    return int(row[0]), float(row[1])


def wrapup_attempt(conn: sqlite3.Connection, work_id: str, since: float) -> int | None:
    """The wrap-up attempt started at or after ``since`` (this ending's), or None."""
    row = conn.execute("SELECT attempt FROM attempts WHERE work_id = ? AND wrapup = 1 AND started_at >= ? "
                       "ORDER BY attempt DESC LIMIT 1", (work_id, since)).fetchone()
    return None if row is None else int(row[0])


def attempt_usage(conn: sqlite3.Connection, work_id: str, attempt: int) -> tuple[int, float]:
    """(budget tokens, cost) of one attempt's model calls (cache reads are not budget tokens)."""
    row = conn.execute(f"""SELECT COALESCE(SUM(input_tokens + cache_write_tokens + output_tokens), 0),
                                 COALESCE(SUM(cost_usd), 0) FROM model_calls WHERE work_id = ? AND attempt = ?
                                 AND lower(COALESCE(instance, '')) LIKE '{Actor.LOOP_AGENT}%'""", (work_id, attempt)).fetchone()
    return int(row[0]), float(row[1])


def handoffs(conn: sqlite3.Connection, work_id: str) -> list[Handoff]:
    """The run's hand-off notes, one per ending that had one, oldest first."""
    return [Handoff.of(r) for r in conn.execute("SELECT * FROM handoffs WHERE work_id = ? ORDER BY ending",
                                                (work_id,))]


def latest_handoff(conn: sqlite3.Connection, work_id: str) -> Handoff | None:
    notes = handoffs(conn, work_id)
    return notes[-1] if notes else None
