"""Verdicts and preflights as typed data, and the one question asked of them everywhere: the
latest eval-agent verdict.

Only an eval-agent instance writes ``verdicts`` and ``preflights`` (StateWriter refuses anyone
else, and a verdict in another instance's name); the queries still count only rows written by an
eval-agent instance (``written_by`` is the instance, e.g. ``eval-agent-1``), so a verdict is
never taken from anywhere else.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Callable

from state_db.queries.base import columns, loads
from state_db.vocab import Actor, VerdictOutcome

# A literal pattern, not a bound one: SQLite prepares a statement again on every run when a LIKE's
# pattern is a parameter (its LIKE optimisation depends on the value), ~80 µs a query. lower():
# SQLite's LIKE ignores ASCII case and PostgreSQL's does not; so both stores match alike.
_BY_EVAL = f"lower(written_by) LIKE '{Actor.EVAL_AGENT}%'"


@dataclass(frozen=True)
class Verdict:
    """One ``verdicts`` row: ``checks`` and ``held_back`` decoded (lists of dicts)."""

    id: str
    work_id: str
    iteration: int
    outcome: str
    written_by: str
    at: float
    checks: tuple = ()
    feedback: str = ""
    protected_changed: tuple[str, ...] = ()
    held_back: tuple = ()
    evidence: str = ""
    review: dict | None = None           # the model review that judged this pass, if one did
    verified: str | None = None          # the commit of the tree the checks ran on (roles/eval_agent/scope.py)

    @classmethod
    def from_row(cls, row) -> "Verdict":
        v = columns(cls, row)
        for col in ("checks", "protected_changed", "held_back"):
            v[col] = tuple(loads(v.get(col), []))
        v["review"] = loads(v.get("review"))
        return cls(**v)

    @property
    def passed(self) -> bool:
        return self.outcome == VerdictOutcome.PASS

    @property
    def failing(self) -> tuple[dict, ...]:
        return tuple(c for c in self.checks if isinstance(c, dict) and not c.get("passed"))


@dataclass(frozen=True)
class Preflight:
    """The verify commands' run on a work item's baseline (``preflights``): the one record of it,
    which the eval-agent writes and returns, the loop-agent waits for and ``org submit`` shows.
    ``checks`` are the stored check results (dicts); ``ended``: the stop reason the preflight
    ended the run with when it wrote it (not stored: the work item says so)."""

    work_id: str
    outcome: str
    written_by: str
    at: float
    checks: tuple = ()
    detail: str = ""
    ended: str | None = None

    @classmethod
    def from_row(cls, row) -> "Preflight":
        v = columns(cls, row)
        v["checks"] = tuple(loads(v.get("checks"), []))
        return cls(**v)


def latest_eval_verdict(conn: sqlite3.Connection, work_id: str, iteration: int | None = None) -> Verdict | None:
    """The latest verdict an eval-agent wrote for ``work_id``: of ``iteration`` when given, else
    of the latest iteration that has one. None when there is none."""
    if iteration is None:
        row = conn.execute(f"""SELECT * FROM verdicts WHERE work_id = ? AND {_BY_EVAL}
                               ORDER BY iteration DESC, at DESC LIMIT 1""", (work_id,)).fetchone()
    else:
        row = conn.execute(f"""SELECT * FROM verdicts WHERE work_id = ? AND iteration = ? AND {_BY_EVAL}
                               ORDER BY at DESC LIMIT 1""", (work_id, iteration)).fetchone()
    return Verdict.from_row(row) if row else None


def latest_eval_verdicts(conn: sqlite3.Connection, work_id: str, *, after: int = 0) -> dict[int, Verdict]:
    """Iteration → its latest eval-agent verdict, for the iterations after ``after``."""
    out: dict[int, Verdict] = {}
    for row in conn.execute(f"""SELECT * FROM verdicts WHERE work_id = ? AND iteration > ? AND {_BY_EVAL}
                                ORDER BY iteration, at""", (work_id, after)):
        out[row["iteration"]] = Verdict.from_row(row)
    return out


def latest_iteration_passed(conn: sqlite3.Connection, work_id: str) -> bool:
    """True if the latest committed iteration of ``work_id`` has a passing eval-agent verdict
    (what ``goal_met`` requires)."""
    last = conn.execute("SELECT MAX(n) FROM iterations WHERE work_id = ?", (work_id,)).fetchone()[0]
    if last is None:
        return False
    return conn.execute(f"""SELECT 1 FROM verdicts WHERE work_id = ? AND iteration = ? AND outcome = ?
                            AND {_BY_EVAL}""", (work_id, last, VerdictOutcome.PASS)).fetchone() is not None


def verdict(conn: sqlite3.Connection, verdict_id: str) -> Verdict | None:
    """The verdict ``verdict_id``, or None."""
    row = conn.execute("SELECT * FROM verdicts WHERE id = ?", (verdict_id,)).fetchone()
    return Verdict.from_row(row) if row else None


def of_work(conn: sqlite3.Connection, work_id: str) -> list[Verdict]:
    """Every verdict of ``work_id``, by iteration then time."""
    return [Verdict.from_row(r) for r in conn.execute(
        "SELECT * FROM verdicts WHERE work_id = ? ORDER BY iteration, at", (work_id,))]


def everything(conn: sqlite3.Connection) -> list[Verdict]:
    """Every verdict of the org, in time order."""
    return [Verdict.from_row(r) for r in conn.execute("SELECT * FROM verdicts ORDER BY at")]


def preflight(conn: sqlite3.Connection, work_id: str) -> Preflight | None:
    """The eval-agent's preflight of ``work_id``, or None (not run yet)."""
    row = conn.execute(f"SELECT * FROM preflights WHERE work_id = ? AND {_BY_EVAL}", (work_id,)).fetchone()
    return Preflight.from_row(row) if row else None


def verified(conn: sqlite3.Connection, work_id: str, n: int) -> bool:
    """True once an eval-agent judged iteration ``n`` of ``work_id`` (0: its preflight)."""
    if n == 0:
        return preflight(conn, work_id) is not None
    return latest_eval_verdict(conn, work_id, n) is not None


@dataclass(frozen=True)
class Due:
    """A verification the eval-agent owes: iteration ``n`` of ``work_id`` (0: the preflight)."""

    work_id: str
    n: int
    assigned_to: str | None


def due(conn: sqlite3.Connection, owns: Callable[[str], bool] | None = None) -> list[Due]:
    """What the eval-agent must verify, in order: preflights of live runs that have none and no
    iteration yet and are assigned to a loop-agent (it waits for them), then committed iterations
    of live runs with no verdict (their loop-agents wait too), then the preflights of queued items
    (nobody waits for them yet: done while the eval-agent has nothing else, ready when the item is
    dispatched; a batch of a thousand submitted at once must not hold every running loop's
    verdict behind it). Oldest first within each. ``owns``: of several eval-agents, which work
    items are this one's."""
    # the live items only (the partial index work_items_live: its predicate is written as the
    # index's), then their iterations by key: what is due never reads the ended history
    preflights = conn.execute("""SELECT w.id, 0, w.assigned_to FROM work_items w WHERE w.status != 'ended'
                                   AND NOT EXISTS (SELECT 1 FROM preflights p WHERE p.work_id = w.id)
                                   AND NOT EXISTS (SELECT 1 FROM iterations i WHERE i.work_id = w.id)
                                 ORDER BY w.created_at""").fetchall()
    pending = conn.execute("""SELECT i.work_id, i.n, w.assigned_to FROM work_items w CROSS JOIN iterations i
                               WHERE w.status != 'ended' AND i.work_id = w.id
                                 AND NOT EXISTS (SELECT 1 FROM verdicts v WHERE v.work_id = i.work_id AND v.iteration = i.n)
                               ORDER BY i.committed_at""").fetchall()
    waited = [r for r in preflights if r[2] is not None]
    queued = [r for r in preflights if r[2] is None]
    return [Due(r[0], r[1], r[2]) for r in (*waited, *pending, *queued) if owns is None or owns(r[0])]
