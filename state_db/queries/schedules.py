"""Standing orders (schedules and triggers), what they started, and the daily cap on automatic starts.

``automatic_start_allowed`` is the one rule every automatic start obeys — a schedule's tick, a
trigger's event, discovery's standing policy: what work started without a human spent today plus
what its open runs may still spend (their cost budgets) plus the new run's budget must stay within
``limits.daily_spend_usd``.
"""
from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field

from state_db.queries.base import columns, loads, marks
from state_db.vocab import TIMER_KINDS, Origin, ScheduleStatus, WorkStatus

# work that started without a human: bounded by limits.daily_spend_usd
AUTOMATIC = (Origin.SCHEDULE, Origin.TRIGGER, Origin.DISCOVERY)
# a run of the org is changing the workspace (a paused one holds an unsettled act's edits)
AT_WORK = (WorkStatus.DISPATCHED, WorkStatus.RUNNING, WorkStatus.PAUSED)


@dataclass(frozen=True)
class Schedule:
    """One standing order: a schedule (kind every | cron) or a trigger (git-commit | file-change |
    verify-fails). ``request`` is the submit request it starts work with; ``watch`` what a
    trigger last saw."""

    id: str
    name: str
    kind: str
    status: str
    created_by: str
    created_at: float
    updated_at: float
    rule: dict = field(default_factory=dict)
    request: dict = field(default_factory=dict)
    argv: list = field(default_factory=list)
    last_tick_at: float | None = None
    last_fired_at: float | None = None
    last_work_id: str | None = None
    fired: int = 0
    skipped_busy: int = 0
    skipped_spend: int = 0
    coalesced: int = 0
    last_skip: str | None = None
    watch: dict = field(default_factory=dict)

    @classmethod
    def of(cls, row: sqlite3.Row) -> "Schedule":
        data = columns(cls, row)
        for col, default in (("rule", {}), ("request", {}), ("argv", []), ("watch", {})):
            data[col] = loads(data.get(col), default)
        return cls(**data)

    @property
    def actor(self) -> str:
        """Who its work items are signed by: ``schedule:NAME`` or ``trigger:NAME``."""
        return f"{self.origin}:{self.name}"

    @property
    def origin(self) -> str:
        """``schedule`` for a timer, ``trigger`` for an event."""
        return str(Origin.SCHEDULE if self.kind in TIMER_KINDS else Origin.TRIGGER)

    def encode(self) -> dict:
        from dataclasses import asdict
        return asdict(self)


def find(conn: sqlite3.Connection, name_or_id: str) -> Schedule | None:
    """The live order named ``name_or_id`` (not removed), else the order with that id."""
    row = conn.execute("SELECT * FROM schedules WHERE name = ? AND status != ? ORDER BY created_at DESC LIMIT 1",
                       (name_or_id, ScheduleStatus.REMOVED)).fetchone()
    if row is None:
        row = conn.execute("SELECT * FROM schedules WHERE id = ?", (name_or_id,)).fetchone()
    return Schedule.of(row) if row else None


def listing(conn: sqlite3.Connection, kinds: tuple[str, ...], *, removed: bool = False) -> list[Schedule]:
    """Orders of ``kinds``, oldest first; removed ones only when asked."""
    listed = marks(kinds)
    sql = f"SELECT * FROM schedules WHERE kind IN ({listed})" + ("" if removed else " AND status != ?")
    params = (*kinds,) if removed else (*kinds, ScheduleStatus.REMOVED)
    return [Schedule.of(r) for r in conn.execute(sql + " ORDER BY created_at, id", params)]


def active(conn: sqlite3.Connection, kinds: tuple[str, ...]) -> list[Schedule]:
    """Orders of ``kinds`` that tick (not paused, not removed)."""
    listed = marks(kinds)
    return [Schedule.of(r) for r in conn.execute(
        f"SELECT * FROM schedules WHERE status = ? AND kind IN ({listed}) ORDER BY created_at, id",
        (ScheduleStatus.ACTIVE, *kinds))]


def work_status(conn: sqlite3.Connection, work_id: str | None) -> str | None:
    """The status of work item ``work_id`` (None: no such item, or no id)."""
    if not work_id:
        return None
    row = conn.execute("SELECT status FROM work_items WHERE id = ?", (work_id,)).fetchone()
    return row["status"] if row else None


def started_by(conn: sqlite3.Connection, schedule_id: str, limit: int = 20) -> list[dict]:
    """The latest work items an order started: id, status, stop reason, created."""
    return [dict(r) for r in conn.execute(
        """SELECT id, status, stop_reason, created_at, ended_at FROM work_items WHERE origin_id = ?
           ORDER BY created_at DESC LIMIT ?""", (schedule_id, limit))]


def at_work(conn: sqlite3.Connection, workspace: str) -> str | None:
    """A work item of the org changing ``workspace`` right now (its id), or None."""
    listed = marks(AT_WORK)
    row = conn.execute(f"SELECT id FROM work_items WHERE workspace = ? AND status IN ({listed}) LIMIT 1",
                       (workspace, *AT_WORK)).fetchone()
    return row["id"] if row else None


def org_checkpoints(conn: sqlite3.Connection, workspace: str, limit: int = 8) -> list[tuple[str, str]]:
    """(work id, checkpoint commit) of what the org's latest runs on ``workspace`` left there:
    each run's last iteration checkpoint and the checkpoints of the actions a human approved."""
    items = [r["id"] for r in conn.execute(
        "SELECT id FROM work_items WHERE workspace = ? ORDER BY created_at DESC LIMIT ?", (workspace, limit))]
    out: list[tuple[str, str]] = []
    for work_id in items:
        row = conn.execute("""SELECT checkpoint FROM iterations WHERE work_id = ? AND checkpoint IS NOT NULL
                              ORDER BY n DESC LIMIT 1""", (work_id,)).fetchone()
        if row:
            out.append((work_id, row["checkpoint"]))
        out.extend((work_id, r["checkpoint"]) for r in conn.execute(
            "SELECT checkpoint FROM decisions WHERE work_id = ? AND checkpoint IS NOT NULL", (work_id,)))
    return out


def day_start(now: float) -> float:
    """Local midnight of the day ``now`` falls in."""
    t = time.localtime(now)
    return time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0, 0, 0, -1))


def automatic_spend(conn: sqlite3.Connection, now: float) -> tuple[float, float]:
    """(spent since local midnight by work started without a human, what its open runs may still
    spend: each one's cost budget less what it spent)."""
    listed = marks(AUTOMATIC)
    spent = conn.execute(
        f"""SELECT COALESCE(SUM(m.cost_usd), 0) FROM model_calls m JOIN work_items w ON w.id = m.work_id
            WHERE w.origin IN ({listed}) AND m.at >= ?""", (*AUTOMATIC, day_start(now))).fetchone()[0]
    open_budget = 0.0
    for row in conn.execute(
            f"""SELECT w.caps, (SELECT COALESCE(SUM(cost_usd), 0) FROM model_calls WHERE work_id = w.id) AS used
                FROM work_items w WHERE w.origin IN ({listed}) AND w.status != ?""", (*AUTOMATIC, WorkStatus.ENDED)):
        budget = loads(row["caps"], {}).get("budget_usd")
        if isinstance(budget, (int, float)):
            open_budget += max(0.0, float(budget) - row["used"])
    return float(spent), open_budget


def automatic_start_allowed(conn: sqlite3.Connection, now: float, *, cap_usd: float,
                            budget_usd: float | None = None) -> tuple[bool, str]:
    """May work start without a human now? ``cap_usd`` is ``limits.daily_spend_usd``;
    ``budget_usd`` the new run's cost budget (None: it has none, and only what is spent and held
    counts). Returns (allowed, reason): the reason says what was counted either way."""
    spent, held = automatic_spend(conn, now)
    more = float(budget_usd or 0.0)
    counted = (f"today's automatic starts spent ${spent:.2f} and hold ${held:.2f} in open budgets"
               + (f", this one ${more:.2f}" if budget_usd is not None else ""))
    if cap_usd <= 0:
        return False, "limits.daily_spend_usd is 0: nothing starts without a human"
    if spent + held + more > cap_usd or spent >= cap_usd:
        return False, f"{counted}: over limits.daily_spend_usd ${cap_usd:.2f}"
    return True, f"{counted}: within limits.daily_spend_usd ${cap_usd:.2f}"
