"""Taking an ended run out of "needs you" as the human (``org dismiss ID``, the watch's ``x``).

A run that ended ``verify_unrunnable`` asks the human to fix its verify command; once they have
read it (or submitted again), it should stop asking. Dismissing is one durable write of who and
when on the work item; the run, its stop reason and its record stay as they were. Only an ended
run can be dismissed: a running one is cancelled, not dismissed.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from roles.operations import Result, human_writer, signed
from state_db.kernel.errors import NotFound, StateError
from state_db.kernel.home import OrgHome
from state_db.queries import work
from state_db.vocab import WorkStatus


class NotEnded(StateError):
    code = "not_ended"


@dataclass(frozen=True)
class Dismissed(Result):
    """``changed`` is False when the run was dismissed already (``by`` / ``at``: the first time)."""

    id: str
    stop_reason: str | None
    by: str
    at: float
    changed: bool


def dismiss(home: OrgHome, work_id: str, *, idempotency_key: str | None = None, via: str | None = None) -> Dismissed:
    """Record that the human has seen ended run ``work_id``. Raises NotFound, NotEnded."""
    writer = human_writer(home.require().db_path, via)

    def do(tx):
        item = work.item(tx.conn, work_id)
        if item is None:
            raise NotFound(f"no work item {work_id}", hint="list them with 'org status'")
        if item.status != WorkStatus.ENDED:
            raise NotEnded(f"{work_id} has not ended ({item.status})",
                           hint=f"only an ended run is dismissed; stop this one with 'org cancel {work_id}'")
        row = tx.get("work_items", work_id)
        if row["dismissed_at"] is not None:
            return {"id": work_id, "stop_reason": item.stop_reason, "by": row["dismissed_by"],
                    "at": row["dismissed_at"], "changed": False}
        tx.update("work_items", work_id, dismissed_by=signed(writer), dismissed_at=tx.now)
        return {"id": work_id, "stop_reason": item.stop_reason, "by": signed(writer), "at": tx.now, "changed": True}

    try:
        result, _ = writer.run_once(idempotency_key or uuid.uuid4().hex, "dismiss", do, args={"id": work_id})
    finally:
        writer.close()
    return Dismissed(**result)
