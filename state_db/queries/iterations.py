"""Iterations and attempts as typed data.

An ``Iteration`` is a committed act (its tool calls, changed paths and prompt manifest decoded);
an ``Attempt`` is a try at the next iteration, open (``ended_at`` NULL) while it acts.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Iterable

from state_db.queries.base import columns, loads, scalar

# all but the prompt manifest, which only grows (what the loop and the views read)
_LOOP_COLUMNS = ("work_id, n, attempt, act_status, act_summary, tool_calls, changed_paths, fingerprint, "
                 "checkpoint, verdict_id, feedback, lesson, elapsed_s, committed_at, input_tokens, output_tokens, "
                 "cache_write_tokens, cache_read_tokens, cost_usd")


@dataclass(frozen=True)
class Iteration:
    work_id: str
    n: int
    attempt: int
    act_status: str
    committed_at: float
    act_summary: str = ""
    tool_calls: tuple = ()
    input_tokens: int = 0
    output_tokens: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0
    cost_usd: float = 0.0
    elapsed_s: float = 0.0
    fingerprint: str | None = None
    checkpoint: str | None = None
    changed_paths: tuple[str, ...] = ()
    verdict_id: str | None = None
    feedback: str | None = None
    lesson: str | None = None
    prompt: dict = field(default_factory=dict)

    @classmethod
    def from_row(cls, row) -> "Iteration":
        v = columns(cls, row)
        v["tool_calls"] = tuple(loads(v.get("tool_calls"), []))
        v["changed_paths"] = tuple(loads(v.get("changed_paths"), []))
        v["prompt"] = loads(v.get("prompt"), {}) or {}
        return cls(**v)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_write_tokens + self.cache_read_tokens

    def as_row(self) -> dict:
        """Its columns as a new dict (decoded values shared, not copied): the loop's working row."""
        return dict(vars(self))


@dataclass(frozen=True)
class Attempt:
    work_id: str
    attempt: int
    iteration: int
    started_at: float
    instance: str | None = None
    ended_at: float | None = None
    outcome: str | None = None
    alive_at: float | None = None
    current_tool: str | None = None
    current_tool_at: float | None = None

    @classmethod
    def from_row(cls, row) -> "Attempt":
        return cls(**columns(cls, row))


def iteration(conn: sqlite3.Connection, work_id: str, n: int) -> Iteration | None:
    """Iteration ``n`` of ``work_id``, or None (not committed)."""
    row = conn.execute("SELECT * FROM iterations WHERE work_id = ? AND n = ?", (work_id, n)).fetchone()
    return Iteration.from_row(row) if row else None


def of_work(conn: sqlite3.Connection, work_id: str, *, after: int = 0, prompts: bool = True) -> list[Iteration]:
    """Iterations of ``work_id`` after ``after``, in order; ``prompts=False`` leaves the prompt
    manifests unread (what the loop reads each iteration)."""
    cols = "*" if prompts else _LOOP_COLUMNS
    return [Iteration.from_row(r) for r in conn.execute(
        f"SELECT {cols} FROM iterations WHERE work_id = ? AND n > ? ORDER BY n", (work_id, after))]


def recent(conn: sqlite3.Connection, work_id: str, limit: int) -> list[Iteration]:
    """The latest ``limit`` iterations of ``work_id``, newest first."""
    return [Iteration.from_row(r) for r in conn.execute(
        f"SELECT {_LOOP_COLUMNS} FROM iterations WHERE work_id = ? "
        "ORDER BY n DESC LIMIT ?", (work_id, limit))]


def count(conn: sqlite3.Connection, work_id: str) -> int:
    """How many iterations ``work_id`` has committed."""
    return scalar(conn, "SELECT COUNT(*) FROM iterations WHERE work_id = ?", (work_id,), 0)


def last_n(conn: sqlite3.Connection, work_id: str) -> int:
    """The latest committed iteration's number (0: none yet)."""
    return scalar(conn, "SELECT MAX(n) FROM iterations WHERE work_id = ?", (work_id,), 0)


def checkpoints(conn: sqlite3.Connection, work_id: str) -> dict[int, str]:
    """Iteration number → its checkpoint commit."""
    return {r[0]: r[1] for r in conn.execute(
        "SELECT n, checkpoint FROM iterations WHERE work_id = ? ORDER BY n", (work_id,))}


def skill_first_uses(conn: sqlite3.Connection) -> list[tuple[str, str, float]]:
    """``(skill, work_id, at)``: when each run's prompt first carried each skill, in time order."""
    return [(r[0], r[1], r[2]) for r in conn.execute(
        """SELECT j.value, i.work_id, MIN(i.committed_at) AS at FROM iterations i, json_each(i.prompt, '$.skills') j
           GROUP BY j.value, i.work_id ORDER BY at""")]


# -- attempts ------------------------------------------------------------------------------------

def attempt_instance(conn: sqlite3.Connection, work_id: str, attempt: int) -> str | None:
    """The instance that ran attempt ``attempt`` of ``work_id`` (None: no such attempt)."""
    row = conn.execute("SELECT instance FROM attempts WHERE work_id = ? AND attempt = ?", (work_id, attempt)).fetchone()
    return row[0] if row is not None else None


def attempts(conn: sqlite3.Connection, work_id: str) -> list[Attempt]:
    """Every attempt of ``work_id`` (acts, committed or discarded), in order."""
    return [Attempt.from_row(r) for r in conn.execute(
        "SELECT * FROM attempts WHERE work_id = ? ORDER BY attempt", (work_id,))]


def open_attempts(conn: sqlite3.Connection, work_id: str) -> list[Attempt]:
    """Attempts of ``work_id`` still open (acting, or cut by a crash), newest first."""
    return [Attempt.from_row(r) for r in conn.execute(
        "SELECT * FROM attempts WHERE work_id = ? AND ended_at IS NULL ORDER BY attempt DESC", (work_id,))]


def open_attempt(conn: sqlite3.Connection, work_id: str) -> Attempt | None:
    """The newest open attempt of ``work_id``, or None."""
    found = open_attempts(conn, work_id)
    return found[0] if found else None


def last_started_by_instance(conn: sqlite3.Connection, instances: Iterable[str]) -> dict[str, float]:
    """Instance → when it last started an attempt (its last use, for fair dispatch), for the
    ``instances`` asked about (each one look-up in the index ``attempts_instance``)."""
    out = {}
    for name in instances:
        row = conn.execute("SELECT MAX(started_at) FROM attempts WHERE instance = ?", (name,)).fetchone()
        out[name] = (row[0] if row is not None else None) or 0
    return out
