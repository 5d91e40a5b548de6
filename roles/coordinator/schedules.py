"""Time-based loops: each tick of an active schedule submits its work item, as the coordinator.

The coordinator calls ``tick`` on every reconcile. For each active schedule it reads the last tick
handled from state.db and asks the rule (``operations.schedules.slots``) whether a tick fell due
since; ticks missed while the org was down (or the coordinator busy) are taken as one, and how
many it stands for is counted (``coalesced``). A tick then goes through ``start``, which triggers
share:

- single-flight: while the order's previous work item is still queued, waiting or running, the
  tick is skipped and counted (``skipped_busy``);
- the daily cap on automatic starts (``limits.daily_spend_usd``, ``queries.schedules.
  automatic_start_allowed``): a tick that would pass it is skipped and counted with the reason
  (``skipped_spend``);
- otherwise the order's stored submit request is submitted through the submit operation (the same
  checks, baseline and row as ``org submit``), written by the coordinator and signed
  ``schedule:NAME`` / ``trigger:NAME``, with ``origin`` and the order's id on the work item. The
  tick is recorded on the order in the same transaction, and its idempotency key names the tick,
  so a crash between the two never submits it twice.

The clock is the writer's (``StateWriter(clock=...)``): tests drive a simulated hour in
milliseconds.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import structlog

from roles.operations import schedules as rules
from roles.operations.submit import submit
from state_db.kernel.config import Config
from state_db.kernel.errors import OrgError
from state_db.kernel.home import OrgHome
from state_db.queries import schedules as q
from state_db.vocab import TIMER_KINDS, Actor, ScheduleStatus, WorkStatus
from state_db.writer import StateWriter

log = structlog.get_logger("coordinator.schedules")

FIRED, BUSY, SPEND, FAILED = "fired", "skipped_busy", "skipped_spend", "failed"


@dataclass(frozen=True)
class Outcome:
    """What one tick (or one trigger event) of an order came to."""

    order_id: str
    name: str
    result: str                 # fired | skipped_busy | skipped_spend | failed
    work_id: str | None = None
    coalesced: int = 0          # further ticks (or events) this one stood for
    reason: str = ""


class _Changed(Exception):
    """The order changed under the write lock (paused, removed, already ticked): write nothing.
    Control flow inside this module (it rolls the submit's transaction back), never shown to a human."""


def tick(writer: StateWriter, home: OrgHome, cfg: Config, now: float | None = None) -> list[Outcome]:
    """Handle every schedule that fell due by ``now`` (default: the writer's clock)."""
    now = writer.clock() if now is None else now
    out = []
    for order in q.active(writer.conn, TIMER_KINDS):
        slot, count = rules.slots(order.kind, order.rule, order.last_tick_at or order.created_at, now)
        if slot is None:
            continue
        try:
            out.append(start(writer, home, cfg, order, now=now, mark={"last_tick_at": slot}, coalesced=count - 1,
                             key=f"tick-{slot:.3f}"))
        except OrgError as exc:           # one order's trouble (a stored request that no longer fits) stops no other
            log.warning("schedule_failed", order=order.name, error=exc.line(), next="tries again on its next tick")
    return out


def start(writer: StateWriter, home: OrgHome, cfg: Config, order: q.Schedule, *, now: float, mark: dict,
          coalesced: int = 0, key: str, note: str = "") -> Outcome:
    """Start the order's work item for one tick or event, or count why not.

    ``mark``: the order's fields that record this tick or event (``last_tick_at``, ``watch``),
    written whatever the outcome; ``key``: names the tick or event (the submit's idempotency key
    is the order's id and it); ``note``: the event's details, added to the goal's context.
    """
    previous = q.work_status(writer.conn, order.last_work_id)
    if previous is not None and previous != WorkStatus.ENDED:
        return _skip(writer, order, BUSY, f"{order.last_work_id} is still {previous}", mark, coalesced)
    req = rules.request_of(order)
    budget = req.caps.budget_usd if req.caps.budget_usd is not None else _default_budget(req, cfg)
    allowed, why = q.automatic_start_allowed(writer.conn, now, cap_usd=float(cfg.limits.daily_spend_usd),
                                             budget_usd=budget)
    if not allowed:
        return _skip(writer, order, SPEND, why, mark, coalesced)
    goal = req.goal if not note else f"{req.goal}\n\nStarted by {order.actor}: {note}"
    req = replace(req, goal=goal, idempotency_key=f"{order.id}:{key}")

    def guard(tx, work_id: str) -> None:
        row = tx.get("schedules", order.id)
        if row is None or row["status"] != ScheduleStatus.ACTIVE or row["last_work_id"] != order.last_work_id:
            raise _Changed()
        tx.update("schedules", order.id, updated_at=tx.now, last_fired_at=tx.now, last_work_id=work_id,
                  fired=row["fired"] + 1, coalesced=row["coalesced"] + coalesced, last_skip=None, **mark)

    signer = StateWriter(writer.db_path, Actor.COORDINATOR, order.actor, clock=writer.clock)
    try:
        result = submit(home, cfg, req, writer=signer, guard=guard, wake=False,
                        origin={"origin": order.origin, "origin_id": order.id, "created_by": order.actor})
    except _Changed:
        return Outcome(order.id, order.name, FAILED, reason="the order changed meanwhile; nothing submitted")
    except OrgError as exc:
        log.warning("standing_order_failed", order=order.name, error=exc.line(),
                    next="counted on the order; its next tick or event tries again")
        return _skip(writer, order, FAILED, exc.line(), mark, coalesced)
    finally:
        signer.close()
    log.info("standing_order_fired", order=order.name, work_id=result["id"], coalesced=coalesced,
             next="dispatch on this reconcile")
    return Outcome(order.id, order.name, FIRED, result["id"], coalesced)


def _default_budget(req, cfg: Config) -> float | None:
    """The cost budget the item will get: org.toml's default caps apply only when it gives none."""
    if any(v is not None for v in (req.caps.max_iterations, req.caps.budget_tokens, req.caps.timeout_s)):
        return None
    return cfg.caps.budget_usd


_COUNTER = {BUSY: "skipped_busy", SPEND: "skipped_spend"}


def _skip(writer: StateWriter, order: q.Schedule, result: str, reason: str, mark: dict, coalesced: int) -> Outcome:
    """Record a tick or event that started nothing: its mark, the count and the reason."""
    with writer.transaction() as tx:
        row = tx.get("schedules", order.id)
        if row is None or row["status"] != ScheduleStatus.ACTIVE:
            return Outcome(order.id, order.name, result, reason="the order changed meanwhile")
        fields = {"updated_at": tx.now, "last_skip": f"{result}: {reason}"[:500],
                  "coalesced": row["coalesced"] + coalesced, **mark}
        if result in _COUNTER:
            fields[_COUNTER[result]] = row[_COUNTER[result]] + 1
        tx.update("schedules", order.id, **fields)
    if result != BUSY:
        log.info("standing_order_skipped", order=order.name, result=result, reason=reason,
                 next="the next tick or event tries again")
    return Outcome(order.id, order.name, result, coalesced=coalesced, reason=reason)
