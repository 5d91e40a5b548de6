"""Deciding a gated action as the human: one durable write, then a wake."""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from roles.operations import Result, human_writer, signed
from roles.operations.wake import wake_coordinator
from state_db.kernel.config import Config
from state_db.ending import StopDecision, end_run
from state_db.kernel.errors import NotFound, StateError
from state_db.kernel.home import OrgHome
from state_db.queries import decisions, work
from state_db.queries.decisions import Decision
from state_db.vocab import DecisionKind, DecisionStatus as D, StopReason

VERDICTS = {"approve": D.APPROVED, "reject": D.REJECTED, "edit": D.EDITED, "respond": D.RESPONDED}
# Decisions whose approval confirms that the run ends, with the stop reason of the same name: the
# eval-agent's review found the goal impossible (roles/eval_agent/verifier.py). Nothing runs.
ENDS_RUN = {StopReason.IMPOSSIBLE}


class DecideError(StateError):
    code = "bad_decision"


@dataclass(frozen=True)
class Decided(Result):
    """What ``org decide`` recorded: ``status`` is the decision's new status; ``ended`` the stop
    reason when approving ended the run (e.g. ``impossible``), else None; ``replayed``: this
    idempotency key had decided it already; ``wake``: "push", "outbox" or "not sent: <why>"."""

    id: str
    work_id: str
    status: str
    ended: str | None
    replayed: bool
    wake: str


def decide(home: OrgHome, cfg: Config, decision_id: str, verdict: str, text: str | None = None, *,
           stop: bool = False, idempotency_key: str | None = None, via: str | None = None) -> Decided:
    """Record the human's decision, then wake the coordinator. Raises NotFound, DecideError,
    IllegalTransition (already decided). ``via``: the client it came through (``human_writer``)."""
    if verdict not in VERDICTS:
        raise DecideError(f"unknown decision {verdict!r}", hint="use approve, reject, edit or respond")
    if verdict in ("edit", "respond") and not (text or "").strip():
        raise DecideError(f"'{verdict}' needs a text", hint=f"org decide {decision_id} {verdict} \"...\"")
    if stop and verdict != "reject":
        raise DecideError("--stop goes with reject only")
    writer = human_writer(home.db_path, via)

    def do(tx):
        row = decisions.decision(tx.conn, decision_id)
        if row is None:
            raise NotFound(f"no decision {decision_id}", hint="see 'org decisions'")
        if verdict == "edit" and (row.kind in ENDS_RUN or row.kind == DecisionKind.NEEDS_HUMAN):   # no command to edit
            raise DecideError(f"{decision_id} asks whether the run ends {row.kind}: there is no command to edit",
                              hint="approve (it ends), respond TEXT (it goes on with your text) or reject")
        tx.set_status("decisions", decision_id, VERDICTS[verdict], answer=text, stop_run=int(stop),
                      decided_by=signed(writer), decided_at=tx.now)
        ended = _end_confirmed(tx, row, text) if verdict == "approve" and row.kind in ENDS_RUN else None
        return {"id": decision_id, "work_id": row.work_id, "status": str(VERDICTS[verdict]), "ended": ended}

    try:
        result, replayed = writer.run_once(idempotency_key or uuid.uuid4().hex, "decide", do,
                                           args={"decision": decision_id, "verdict": verdict, "text": text,
                                                 "stop": bool(stop)})
    finally:
        writer.close()
    wake = wake_coordinator(home, cfg, {"decision": decision_id})
    return Decided(**result, replayed=replayed, wake=wake)


def _end_confirmed(tx, row: Decision, text: str | None) -> str:
    """The human confirmed an ending the run asked about: it ends now with that stop reason (the
    decision is settled too: there is no action to run). Returns the stop reason."""
    reason = StopReason(row.kind)
    tx.set_status("decisions", row.id, D.EXECUTING)
    tx.set_status("decisions", row.id, D.EXECUTED, result=f"confirmed: the run ended {reason}")
    run = work.item(tx.conn, row.work_id)
    if run is not None and not run.ended:
        said = row.action.get("reason") or row.question
        end_run(tx, row.work_id, StopDecision(reason, f"confirmed by a human: {said}" + (f" ({text})" if text else "")),
                assigned_to=None)
    return str(reason)
