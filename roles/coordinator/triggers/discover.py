"""``discover``: every ``every_s`` a discovery scan (``discover.scan_all``: the verify commands'
failures, TODO/FIXME markers, the ``issues`` file) runs on the workspace and its candidates are
recorded as proposals (``proposals.record``, signed ``trigger:NAME``). Nothing starts unless
org.toml's ``discover.auto_start`` names the kind and ``limits.daily_spend_usd`` has room
(``proposals.auto_start``, with the trigger's submit options); a start is the trigger's firing, a
cap that has no room a skip. A scan whose verify commands cannot start records why on the trigger
and records no proposal (it would expire the open ones it cannot see)."""
from __future__ import annotations

import structlog

from roles.coordinator import schedules
from roles.coordinator.triggers.mark import mark as _mark
from roles.operations import schedules as rules
from roles.operations.discover import scan_all
from roles.operations.proposals import Edits, auto_start, record
from state_db.kernel.config import Config
from state_db.kernel.errors import OrgError
from state_db.kernel.home import OrgHome
from state_db.queries import schedules as q
from state_db.vocab import Actor, ScheduleStatus, WorkStatus
from state_db.writer import StateWriter

log = structlog.get_logger("coordinator.triggers")
SCANNED = "scanned"            # a discover trigger's scan that started nothing (no kind the policy names)


def discover(writer: StateWriter, home: OrgHome, cfg: Config, order: q.Schedule, watch: dict,
             now: float) -> schedules.Outcome | None:
    """One period of a discover trigger: scan, record the proposals, apply the auto-start policy.
    Returns None when the scan could not run (why is recorded on the trigger), else the outcome:
    ``scanned`` (nothing started), ``fired`` (the policy started one), ``skipped_spend`` (the
    daily cap had no room), ``skipped_busy`` (what it started before is still queued or running),
    ``failed`` (the start was refused, e.g. the proposal has no verify command)."""
    every = float(order.rule["every_s"])
    missed = 0 if watch.get("checked_at") is None else max(0, int((now - watch["checked_at"]) // every) - 1)
    watch = {**watch, "checked_at": now}
    previous = q.work_status(writer.conn, order.last_work_id)
    if previous is not None and previous != WorkStatus.ENDED:
        return _discovered(writer, order, watch, schedules.BUSY, f"{order.last_work_id} is still {previous}",
                           coalesced=missed)
    req = rules.request_of(order)
    try:
        found = scan_all(req.workspace, req.verify, order.rule.get("issues"), cfg=cfg, home=home)
        cannot = [n for n in found.notes if any(n.startswith(f"`{c}`") for c in req.verify)]
    except OrgError as exc:
        cannot = [exc.line()]
    if cannot:
        why = "; ".join(cannot)[:500]
        if why != watch.get("why"):
            log.info("trigger_cannot_scan", trigger=order.name, why=why, next="scans again next period")
        _mark(writer, order, {**watch, "why": why}, last_skip=f"cannot scan: {why}"[:500],
              coalesced=order.coalesced + missed)
        return None
    watch.pop("why", None)
    signer = StateWriter(writer.db_path, Actor.COORDINATOR, order.actor, clock=writer.clock)
    try:
        shown = record(home, cfg, req.workspace, found, writer=signer)
    finally:
        signer.close()
    watch["scan"] = {"at": now, "found": shown["found"], "proposed": [p["id"] for p in shown["proposals"]],
                     "expired": len(shown["expired"]), "held_back": shown["held_back"], "notes": shown["notes"]}
    watch["scans"] = watch.get("scans", 0) + 1
    try:
        started = auto_start(home, cfg, shown["proposals"], edits=_edits(req))
    except OrgError as exc:
        log.warning("trigger_start_failed", trigger=order.name, error=exc.line(), next="scans again next period")
        return _discovered(writer, order, watch, schedules.FAILED, exc.line(), coalesced=missed)
    if started is None:
        return _discovered(writer, order, watch, SCANNED, "", coalesced=missed)
    if not started["started"]:
        return _discovered(writer, order, watch, schedules.SPEND, f"{started['proposal']}: {started['why']}",
                           coalesced=missed)
    log.info("standing_order_fired", order=order.name, work_id=started["work_id"], proposal=started["proposal"],
             next="dispatch on the coordinator's next reconcile")
    return _discovered(writer, order, watch, schedules.FIRED, started["why"], coalesced=missed,
                       work_id=started["work_id"])


def _edits(req) -> Edits:
    """The trigger's submit options a started proposal takes (its goal and verify stay the proposal's)."""
    return Edits(protect=list(req.protect) or None, default_protect=req.default_protect,
                 caps=req.caps, backend=req.backend, worktree=req.worktree, review=req.review)


_COUNTED = {schedules.BUSY: "skipped_busy", schedules.SPEND: "skipped_spend", schedules.FIRED: "fired"}


def _discovered(writer: StateWriter, order: q.Schedule, watch: dict, result: str, reason: str, *,
                coalesced: int, work_id: str | None = None) -> schedules.Outcome:
    """Record one period of a discover trigger on its row: the scan, the count, why nothing started."""
    with writer.transaction() as tx:
        row = tx.get("schedules", order.id)
        if row is None or row["status"] != ScheduleStatus.ACTIVE:
            return schedules.Outcome(order.id, order.name, result, work_id, reason="the order changed meanwhile")
        fields = {"updated_at": tx.now, "watch": watch, "coalesced": row["coalesced"] + coalesced}
        if result in _COUNTED:
            fields[_COUNTED[result]] = row[_COUNTED[result]] + 1
        if result == schedules.FIRED:
            fields.update(last_fired_at=tx.now, last_work_id=work_id, last_skip=None)
        elif result != SCANNED:
            fields["last_skip"] = f"{result}: {reason}"[:500]
        elif (row["last_skip"] or "").startswith("cannot scan"):
            fields["last_skip"] = None              # it scans again
        tx.update("schedules", order.id, **fields)
    return schedules.Outcome(order.id, order.name, result, work_id, coalesced, reason)
