"""Deciding a gated action as the human: one durable write, then a wake."""
from __future__ import annotations

import uuid

from roles.operations import human_writer, signed
from state_db.config import Config
from state_db.errors import NotFound, StateError
from state_db.home import OrgHome
from state_db.vocab import DecisionStatus as D

VERDICTS = {"approve": D.APPROVED, "reject": D.REJECTED, "edit": D.EDITED, "respond": D.RESPONDED}


class DecideError(StateError):
    code = "bad_decision"


def decide(home: OrgHome, cfg: Config, decision_id: str, verdict: str, text: str | None = None, *,
           stop: bool = False, idempotency_key: str | None = None, via: str | None = None) -> dict:
    """Record the human's decision, then wake the coordinator. Raises NotFound, DecideError,
    IllegalTransition (already decided). Returns {id, work_id, status, replayed, wake} (``wake``:
    "push", "outbox" or "not sent: <why>"). ``via``: the client it came through (``human_writer``)."""
    if verdict not in VERDICTS:
        raise DecideError(f"unknown decision {verdict!r}", hint="use approve, reject, edit or respond")
    if verdict in ("edit", "respond") and not (text or "").strip():
        raise DecideError(f"'{verdict}' needs a text", hint=f"org decide {decision_id} {verdict} \"...\"")
    if stop and verdict != "reject":
        raise DecideError("--stop goes with reject only")
    writer = human_writer(home.db_path, via)

    def do(tx):
        row = tx.get("decisions", decision_id)
        if row is None:
            raise NotFound(f"no decision {decision_id}", hint="see 'org decisions'")
        tx.set_status("decisions", decision_id, VERDICTS[verdict], answer=text, stop_run=int(stop),
                      decided_by=signed(writer), decided_at=tx.now)
        return {"id": decision_id, "work_id": row["work_id"], "status": str(VERDICTS[verdict])}

    try:
        result, replayed = writer.run_once(idempotency_key or uuid.uuid4().hex, "decide", do)
    finally:
        writer.close()
    from roles.operations.wake import wake_coordinator
    wake = wake_coordinator(home, cfg, {"decision": decision_id})
    return {**result, "replayed": replayed, "wake": wake}
