"""The coordinator's reconcile: workspace locks, fair dispatch, recovery of orphaned runs,
the org-wide spend cap. Pure over state.db: every decision is a StateWriter transaction, and
every read a typed query (state_db.queries) inside it."""
from __future__ import annotations

import time
from pathlib import Path

from roles.base import beat
from state_db.queries import processes, work
from state_db.queries.iterations import last_started_by_instance
from state_db.queries.usage import org_spend
from state_db.ending import StopDecision, end_run
from state_db.vocab import Actor, RoleStatus, StopReason, WorkStatus
from state_db.writer import StateWriter

ACTIVE_ASSIGNED = (WorkStatus.DISPATCHED, WorkStatus.RUNNING)


def release_locks(tx) -> list[str]:
    """Drop locks of ended runs; give each free workspace to its oldest waiting item."""
    promoted = []
    for workspace in work.locks_of_ended(tx.conn):
        tx.delete("workspace_locks", workspace)
    for item in work.waiting_on_free_workspace(tx.conn):
        if work.lock_holder(tx.conn, item.workspace):
            continue                                   # an older waiting item took it just now
        tx.insert("workspace_locks", {"workspace": item.workspace, "work_id": item.id, "acquired_at": tx.now})
        tx.set_status("work_items", item.id, WorkStatus.QUEUED, stop_detail=None)
        promoted.append(item.id)
    return promoted


def live_agents(tx, heartbeat_timeout_s: float, run_dir: Path | None = None) -> dict[str, bool]:
    """Loop-agent instance → alive (ready and heartbeating). Its heartbeat is the later of its
    row's and, for a loop-agent of this host (``run_dir``: this host's), its beat file's
    (``roles/base/beat.py``): one that waits for a busy store is not gone, and its run stays its own."""
    alive = {}
    for r in processes.role_instances(tx.conn, Actor.LOOP_AGENT):
        last = beat.latest(r.heartbeat_at, run_dir, r.instance)
        alive[r.instance] = r.status == RoleStatus.READY and last is not None and tx.now - last <= heartbeat_timeout_s
    return alive


def requeue_orphans(tx, alive: dict[str, bool]) -> list[str]:
    """Runs assigned to a loop-agent that is gone go back to the queue (they resume elsewhere
    from their last committed iteration); a paused run whose loop-agent is gone is parked
    (assigned to nobody) — ``unpark`` queues it once nothing waits for a human."""
    moved = []
    for item in work.with_status(tx.conn, *ACTIVE_ASSIGNED, WorkStatus.PAUSED):
        if item.assigned_to is None or alive.get(item.assigned_to, False):
            continue
        if item.status == WorkStatus.PAUSED:
            tx.update("work_items", item.id, assigned_to=None, updated_at=tx.now)
        else:
            tx.set_status("work_items", item.id, WorkStatus.QUEUED, assigned_to=None)
        moved.append(item.id)
    return moved


def unpark(tx) -> list[str]:
    """Parked runs (paused, assigned to nobody) whose decisions are all made go back to the
    queue: whichever loop-agent is free runs the approved actions and goes on."""
    moved = []
    for work_id in work.parked_and_decided(tx.conn):
        tx.set_status("work_items", work_id, WorkStatus.QUEUED)
        moved.append(work_id)
    return moved


def dispatch(tx, alive: dict[str, bool]) -> list[tuple[str, str]]:
    """Give queued items to free live loop-agents, oldest item first, least-recently-used agent first."""
    # a paused run holds its loop-agent only until that loop-agent parks it
    busy = work.busy_agents(tx.conn, *ACTIVE_ASSIGNED, WorkStatus.PAUSED)
    idle = [a for a, ok in alive.items() if ok and a not in busy]
    last_used = last_started_by_instance(tx.conn, idle)
    free = sorted(idle, key=lambda a: (last_used.get(a, 0), a))
    pairs = []
    for item, agent in zip(work.with_status(tx.conn, WorkStatus.QUEUED), free):
        tx.set_status("work_items", item.id, WorkStatus.DISPATCHED, assigned_to=agent)
        pairs.append((item.id, agent))
    return pairs


def enforce_spend_cap(tx, cap_usd: float) -> list[str]:
    """Beyond the org-wide cap, queued and waiting runs end with org_limit (running ones stop
    themselves between model calls)."""
    spent = org_spend(tx.conn)
    if spent < cap_usd:
        return []
    ended = []
    decision = StopDecision(StopReason.ORG_LIMIT, f"org spend ${spent:.2f} reached the cap ${cap_usd:.2f}")
    for item in work.with_status(tx.conn, WorkStatus.QUEUED, WorkStatus.WAITING):
        end_run(tx, item.id, decision)
        ended.append(item.id)
    return ended


def reconcile(writer: StateWriter, *, heartbeat_timeout_s: float, spend_cap_usd: float,
              run_dir: Path | None = None) -> dict:
    """One pass; returns what changed: {"promoted", "requeued", "dispatched", "capped"}.
    ``run_dir``: this host's, where its loop-agents' beat files are."""
    with writer.transaction() as tx:
        capped = enforce_spend_cap(tx, spend_cap_usd)
        promoted = release_locks(tx)
        alive = live_agents(tx, heartbeat_timeout_s, run_dir)
        requeued = requeue_orphans(tx, alive)
        unparked = unpark(tx)
        pairs = dispatch(tx, alive)
    return {"promoted": promoted, "requeued": requeued, "unparked": unparked, "dispatched": pairs, "capped": capped,
            "at": time.time()}
