"""Continuing a run that ended on a cap or a budget: one durable human write, then a wake.

The run goes on as the same work item — its iterations, lessons, shadow history and usage are
kept, iteration numbers carry on — with the caps the human raises (each above what the run has
used; the caps not given stay). The ending is kept in ``stop_history`` (reason, detail, caps, the
iterations committed by then, who continued it and with which caps), the item goes
``ended → queued`` (or ``waiting`` while another item holds its workspace, like a submit), and the
coordinator is woken.

Which endings may go on:

- the caps and budgets (``max_iterations``, ``token_budget``, ``cost_budget``, ``timeout``) and the
  loop detectors (``no_progress``, ``repeated_failure``; after a continuation they look only at
  the iterations after it, see roles/loop_agent/progress.py);
- ``model_error`` (the service failed, not the work: go on once it answers again) and
  ``org_limit`` (go on once ``limits.total_spend_usd`` is raised; otherwise it ends again at once).

Final: ``goal_met`` (done), ``human_rejected`` and ``cancelled`` (a human stopped it), and
``verify_unrunnable`` (the verify commands cannot start on this machine and the preflight is
recorded once per item: fix the machine, then submit again).

The curator writes a retro of each ending (knowledge/notes.py numbers them), so the retro of the
first ending does not stand in for the final one.

The run is read as a typed ``WorkItem`` (state_db.queries.work) inside the write transaction; the
caps given, the run's and the raised ones are all ``Caps`` (the given ones sourced ``flag``), and
the flags named in errors are the submit's (``CAP_FLAGS``).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from roles.operations import Result, human_writer, signed
from roles.operations.caps import CAP_FLAGS, CapsError, check_value
from roles.operations.wake import Waker
from state_db.kernel.config import Config
from state_db.kernel.errors import NotFound, StateError
from state_db.kernel.home import OrgHome
from state_db.queries import work as work_q
from state_db.queries.iterations import count as iterations_count
from state_db.queries.usage import of_work, summarised
from state_db.queries.work import Caps, WorkItem
from state_db.vocab import StopReason as R, WorkStatus

CONTINUABLE = frozenset({R.MAX_ITERATIONS, R.TOKEN_BUDGET, R.COST_BUDGET, R.TIMEOUT, R.NO_PROGRESS,
                         R.REPEATED_FAILURE, R.MODEL_ERROR, R.ORG_LIMIT})

_FINAL_HINT = {
    R.GOAL_MET: "its goal is met; submit a new goal with 'org submit'",
    R.HUMAN_REJECTED: "a human rejected its action; submit it again with 'org submit'",
    R.CANCELLED: "it was cancelled; submit it again with 'org submit'",
    R.VERIFY_UNRUNNABLE: "its verify commands cannot start here; fix the machine, then submit it again",
    R.IMPOSSIBLE: "a human confirmed its goal cannot be met as stated; submit a goal that can be",
    R.EVIDENCE_FORGED: "its test report was forged from inside the tests: review its change ('org diff'); submit "
                       "a new run only if you trust it",
    R.NEEDS_HUMAN: "a human stopped it at an error the stop policy does not know; fix what failed (see "
                   "'org show'), then submit it again",
}

class ContinueError(StateError):
    """The run cannot be continued (wrong state or stop reason, or its history is gone)."""

    code = "not_continuable"


class CapError(CapsError):
    """A cap given to ``org continue`` is not a usable cap, or leaves the run with nothing to do."""

    code = "bad_cap"


@dataclass
class ContinueRequest:
    work_id: str
    caps: Caps = field(default_factory=Caps)   # the caps raised: those with a value
    idempotency_key: str | None = None
    via: str | None = None                # the client it came through, e.g. mcp:claude-code


def used(conn, work: WorkItem) -> dict:
    """What the run has used of each cap: iterations, budget tokens (cache reads left out), US
    dollars and seconds — the figures its stop conditions compare."""
    spent = of_work(conn, work.id)
    return {"max_iterations": iterations_count(conn, work.id), "budget_tokens": spent.budget_tokens,
            "budget_usd": spent.cost_usd, "timeout_s": float(work.elapsed_s)}


def raised_caps(old: Caps, given: Caps, spent: dict) -> Caps:
    """The caps the run goes on with: ``old`` with the caps ``given`` applied (sourced ``flag``).

    Raises CapError: a given cap is not a positive (whole, for iterations and tokens) finite
    number (``bad_cap``) or not above what the run has used (``cap_not_raised``), or a cap kept
    from before is used up (``cap_reached``: the run would end again at once).
    """
    for key, value in given.encode().items():
        flag = CAP_FLAGS[key]
        try:
            check_value(key, value)
        except CapsError as exc:
            raise CapError(exc.message, hint=f"e.g. {flag} {int(spent[key]) + 10}") from None
        if value <= spent[key]:
            raise CapError(f"{flag} {value} is not above what the run has used ({_shown(spent[key])})",
                           code="cap_not_raised", hint=f"give {flag} a value above {_shown(spent[key])}")
    caps = Caps.given(given.encode()).over(old)
    for key, limit in caps.encode().items():
        if spent[key] >= limit:
            flag = CAP_FLAGS[key]
            raise CapError(f"the run has used {_shown(spent[key])} of its {key} cap {limit}; it would stop "
                           f"again at once", code="cap_reached", hint=f"raise it with {flag} N (N > {_shown(spent[key])})")
    return caps


def _shown(value) -> str:
    return f"{value:.4f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


def refusal(work: WorkItem) -> ContinueError | None:
    """Why ``work`` cannot be continued, or None."""
    if work.status != WorkStatus.ENDED:
        return ContinueError(f"{work.id} is {work.status}, not ended",
                             hint="only an ended run can be continued; follow it with 'org show'")
    if work.stop_reason not in CONTINUABLE:
        reason = R(work.stop_reason)
        return ContinueError(f"{work.id} ended with {reason}, which is final", hint=_FINAL_HINT[reason])
    return None


@dataclass(frozen=True)
class Continued(Result):
    """What ``org continue`` did: the run's new ``status`` (``queued``, or ``waiting`` for
    ``waiting_for``), the ending ``seq`` it went on from and its stop reason (``stopped``), the
    caps it goes on with (``caps``; ``old_caps`` before), what it had ``used`` of each, the wake,
    whether this idempotency key had continued it already (``replayed``) and the key."""

    id: str
    status: str
    seq: int
    stopped: str
    caps: Caps
    old_caps: Caps
    used: dict
    waiting_for: str | None
    wake: str
    replayed: bool
    idempotency_key: str


def continue_run(home: OrgHome, cfg: Config, req: ContinueRequest) -> Continued:
    """Reopen an ended run with raised caps (or return what this idempotency key did).

    Raises NotFound, ContinueError (``not_continuable``), CapError (``bad_cap``,
    ``cap_not_raised``, ``cap_reached``).
    """
    key = req.idempotency_key or uuid.uuid4().hex
    given = req.caps
    waker = Waker(home, cfg)
    writer = human_writer(home.db_path, req.via)

    def do(tx):
        work = work_q.item(tx.conn, req.work_id)
        if work is None:
            raise NotFound(f"no work item {req.work_id}", hint="list them with 'org status'")
        refused = refusal(work)
        if refused is not None:
            raise refused
        _still_there(home, tx, work)
        old = work.caps
        spent = used(tx.conn, work)
        caps = raised_caps(old, given, spent)
        seq = work_q.next_stop_seq(tx.conn, req.work_id)
        tx.insert("stop_history", {
            "work_id": req.work_id, "seq": seq, "stop_reason": work.stop_reason,
            "stop_detail": work.stop_detail, "ended_at": work.ended_at, "iterations": spent["max_iterations"],
            "caps": old.encode(), "new_caps": caps.encode(), "continued_by": signed(writer), "continued_at": tx.now})
        lock = work_q.lock_holder(tx.conn, work.workspace)
        busy = lock if lock is not None and lock != req.work_id else None
        if lock is None:
            tx.insert("workspace_locks", {"workspace": work.workspace, "work_id": req.work_id, "acquired_at": tx.now})
        status = WorkStatus.WAITING if busy else WorkStatus.QUEUED
        tx.set_status("work_items", req.work_id, status, stop_reason=None, ended_at=None, assigned_to=None,
                      stop_detail=f"workspace busy with {busy}" if busy else None, cancel_requested=0,
                      caps=caps.to_json(), updated_at=tx.now)
        result = {"id": req.work_id, "status": str(status), "seq": seq, "stopped": work.stop_reason,
                  "caps": caps.encode(), "old_caps": old.encode(), "used": spent, "waiting_for": busy}
        tx.journal("work_items.continued", req.work_id, result)
        return result

    try:
        result, replayed = writer.run_once(key, "continue", do, args={"work_id": req.work_id, "caps": given.encode()})
    finally:
        writer.close()
    result = {**result, "caps": Caps.from_json(result["caps"]), "old_caps": Caps.from_json(result["old_caps"])}
    return Continued(**result, wake=waker.wake({"work_id": result["id"]}), replayed=replayed, idempotency_key=key)


def _still_there(home: OrgHome, tx, work: WorkItem) -> None:
    """Refuse a run whose workspace, shadow history or per-call usage is gone: it could not go
    on from where it stopped, or its budget could not be counted."""
    from pathlib import Path
    if not Path(work.workspace).is_dir():
        raise ContinueError(f"the workspace {work.workspace} of {work.id} is gone",
                            hint="submit the goal again on an existing workspace")
    if not (home.history_dir / f"{work.id}.git").is_dir():
        raise ContinueError(f"the shadow history of {work.id} was removed ('org gc --history')",
                            hint="submit the goal again")
    if summarised(tx.conn, work.id):
        raise ContinueError(f"the per-call usage of {work.id} was folded into a summary by retention; "
                            "its budgets could not be counted", hint="submit the goal again")
