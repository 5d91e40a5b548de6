"""The coordinator's reconcile: workspace locks, fair dispatch, recovery of orphaned runs,
the org-wide spend cap. Pure over state.db: every decision is a StateWriter transaction."""
from __future__ import annotations

import time

from state_db import queries
from state_db.vocab import DecisionStatus, RoleStatus, StopReason, WorkStatus
from state_db.writer import StateWriter

ACTIVE_ASSIGNED = (WorkStatus.DISPATCHED, WorkStatus.RUNNING)


def release_locks(tx) -> list[str]:
    """Drop locks of ended runs; give each free workspace to its oldest waiting item."""
    promoted = []
    for row in tx.conn.execute("""SELECT l.workspace FROM workspace_locks l JOIN work_items w ON w.id = l.work_id
                                   WHERE w.status = ?""", (WorkStatus.ENDED,)).fetchall():
        tx.delete("workspace_locks", row["workspace"])
    for row in tx.conn.execute("""SELECT id, workspace FROM work_items WHERE status = ?
                                   AND workspace NOT IN (SELECT workspace FROM workspace_locks)
                                   ORDER BY created_at""", (WorkStatus.WAITING,)).fetchall():
        if tx.one("SELECT 1 FROM workspace_locks WHERE workspace = ?", (row["workspace"],)):
            continue
        tx.insert("workspace_locks", {"workspace": row["workspace"], "work_id": row["id"], "acquired_at": tx.now})
        tx.set_status("work_items", row["id"], WorkStatus.QUEUED, stop_detail=None)
        promoted.append(row["id"])
    return promoted


def live_agents(tx, heartbeat_timeout_s: float) -> dict[str, bool]:
    """Loop-agent instance → alive (ready and heartbeating)."""
    out = {}
    for r in tx.conn.execute("SELECT instance, status, heartbeat_at FROM role_instances WHERE role = 'loop-agent'"):
        out[r["instance"]] = (r["status"] == RoleStatus.READY and r["heartbeat_at"] is not None
                              and tx.now - r["heartbeat_at"] <= heartbeat_timeout_s)
    return out


def requeue_orphans(tx, alive: dict[str, bool]) -> list[str]:
    """Runs assigned to a loop-agent that is gone go back to the queue (they resume elsewhere
    from their last committed iteration); a paused run whose loop-agent is gone is parked
    (assigned to nobody) — ``unpark`` queues it once nothing waits for a human."""
    moved = []
    for row in tx.conn.execute("SELECT id, assigned_to, status FROM work_items WHERE status IN (?, ?, ?)",
                               (*ACTIVE_ASSIGNED, WorkStatus.PAUSED)).fetchall():
        if row["assigned_to"] is None or alive.get(row["assigned_to"], False):
            continue
        if row["status"] == WorkStatus.PAUSED:
            tx.update("work_items", row["id"], assigned_to=None, updated_at=tx.now)
        else:
            tx.set_status("work_items", row["id"], WorkStatus.QUEUED, assigned_to=None)
        moved.append(row["id"])
    return moved


def unpark(tx) -> list[str]:
    """Parked runs (paused, assigned to nobody) whose decisions are all made go back to the
    queue: whichever loop-agent is free runs the approved actions and goes on."""
    moved = []
    for row in tx.conn.execute("""SELECT w.id FROM work_items w WHERE w.status = ? AND w.assigned_to IS NULL
                                   AND NOT EXISTS (SELECT 1 FROM decisions d WHERE d.work_id = w.id AND d.status = ?)
                                   ORDER BY w.created_at""", (WorkStatus.PAUSED, DecisionStatus.PENDING)).fetchall():
        tx.set_status("work_items", row["id"], WorkStatus.QUEUED)
        moved.append(row["id"])
    return moved


def dispatch(tx, alive: dict[str, bool]) -> list[tuple[str, str]]:
    """Give queued items to free live loop-agents, oldest item first, least-recently-used agent first."""
    # a paused run holds its loop-agent only until that loop-agent parks it
    busy = {r["assigned_to"] for r in tx.conn.execute(
        "SELECT assigned_to FROM work_items WHERE status IN (?, ?, ?) AND assigned_to IS NOT NULL",
        (*ACTIVE_ASSIGNED, WorkStatus.PAUSED))}
    last_used = {r["instance"]: r["t"] or 0 for r in tx.conn.execute(
        "SELECT instance, MAX(started_at) AS t FROM attempts GROUP BY instance")}
    free = sorted((a for a, ok in alive.items() if ok and a not in busy), key=lambda a: (last_used.get(a, 0), a))
    queued = tx.conn.execute("SELECT id FROM work_items WHERE status = ? ORDER BY created_at", (WorkStatus.QUEUED,)).fetchall()
    pairs = []
    for row, agent in zip(queued, free):
        tx.set_status("work_items", row["id"], WorkStatus.DISPATCHED, assigned_to=agent)
        pairs.append((row["id"], agent))
    return pairs


def enforce_spend_cap(tx, cap_usd: float) -> list[str]:
    """Beyond the org-wide cap, queued and waiting runs end with org_limit (running ones stop
    themselves between model calls)."""
    spent = queries.org_spend(tx.conn)
    if spent < cap_usd:
        return []
    ended = []
    for row in tx.conn.execute("SELECT id FROM work_items WHERE status IN (?, ?)",
                               (WorkStatus.QUEUED, WorkStatus.WAITING)).fetchall():
        tx.set_status("work_items", row["id"], WorkStatus.ENDED, stop_reason=StopReason.ORG_LIMIT,
                      stop_detail=f"org spend ${spent:.2f} reached the cap ${cap_usd:.2f}")
        ended.append(row["id"])
    return ended


def reconcile(writer: StateWriter, *, heartbeat_timeout_s: float, spend_cap_usd: float) -> dict:
    """One pass; returns what changed: {"promoted", "requeued", "dispatched", "capped"}."""
    with writer.transaction() as tx:
        capped = enforce_spend_cap(tx, spend_cap_usd)
        promoted = release_locks(tx)
        alive = live_agents(tx, heartbeat_timeout_s)
        requeued = requeue_orphans(tx, alive)
        unparked = unpark(tx)
        pairs = dispatch(tx, alive)
    return {"promoted": promoted, "requeued": requeued, "unparked": unparked, "dispatched": pairs, "capped": capped,
            "at": time.time()}
