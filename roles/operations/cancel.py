"""Cancelling a work item as the human: one durable write, then a wake.

A run that has not started ends at once (``cancelled``, through ``state_db.ending.end_run`` like
every ending); a running or waiting one gets ``cancel_requested``, which its loop-agent's stop
policy honours (``Cancelled``) at the next model call, tool call boundary or wait for a verdict,
discarding the act in progress.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from roles.operations import Result, human_writer, signed
from roles.operations.wake import wake_coordinator
from state_db.kernel.config import Config
from state_db.ending import StopDecision, end_run
from state_db.kernel.errors import NotFound
from state_db.kernel.home import OrgHome
from state_db.queries import work
from state_db.vocab import StopReason, WorkStatus


@dataclass(frozen=True)
class Cancelled(Result):
    """What ``org cancel`` did: ``status`` is the item's status after it (``ended`` when it had
    not started or had ended already); ``changed`` is False when it had ended before; ``note``
    says when a running item stops; ``wake``: "push", "outbox", "not sent: <why>" or "not needed"."""

    OPTIONAL = frozenset({"note"})
    id: str
    status: str
    stop_reason: str | None
    changed: bool
    note: str | None = None
    wake: str = "not needed"


def cancel(home: OrgHome, cfg: Config, work_id: str, *, idempotency_key: str | None = None,
           via: str | None = None) -> Cancelled:
    """Record the cancel (the only write), then wake the coordinator.
    ``via``: the client it came through (``human_writer``). Raises NotFound."""
    writer = human_writer(home.db_path, via)

    def do(tx):
        item = work.item(tx.conn, work_id)
        if item is None:
            raise NotFound(f"no work item {work_id}", hint="list them with 'org status'")
        if item.status == WorkStatus.ENDED:
            return {"id": work_id, "status": "ended", "stop_reason": item.stop_reason, "changed": False}
        if item.status in (WorkStatus.QUEUED, WorkStatus.WAITING):
            ended = end_run(tx, work_id, StopDecision(StopReason.CANCELLED,
                                                      f"cancelled by {signed(writer)} before it started"))
            return {"id": work_id, "status": "ended", "stop_reason": str(ended.reason), "changed": True}
        tx.update("work_items", work_id, cancel_requested=1, updated_at=tx.now)
        return {"id": work_id, "status": item.status, "stop_reason": None, "changed": True,
                "note": "the loop-agent stops at its next model call or iteration boundary"}

    try:
        result, _ = writer.run_once(idempotency_key or uuid.uuid4().hex, "cancel", do, args={"work_id": work_id})
    finally:
        writer.close()
    # nothing to wake for when the run had ended already
    wake = wake_coordinator(home, cfg, {"work_id": work_id}) if result["changed"] else "not needed"
    return Cancelled(**result, wake=wake)
