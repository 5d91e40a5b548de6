"""The human gate, on the loop-agent's side.

A gated action (``request_action``: lift the network block, reach outside the workspace, …) is
recorded as a pending decision in the same transaction as the iteration that asked for it (one
pending decision per run and action: a second identical request is dropped, and the database's
partial unique index refuses it too), and the run pauses. A paused run is *parked*: its
loop-agent lets go of it (``assigned_to`` cleared) and is free for other work; once nothing is
pending, the coordinator queues it again and whichever loop-agent is free picks it up, under the
per-run lock. Deciding while the org is suspended, stopped or crashed takes effect on the next
start. When a human decides:
- approve / edit → the workspace is first reset to the run's last settled state (the crash reset
  happens before the action, never after it); an ``executing`` marker naming the process
  (``pid:start time``) is committed; the command runs once with the block lifted; its effect is
  recorded as a checkpoint (``refs/actions/<decision>``, visible in ``org diff``) and the
  decision becomes ``executed`` with that checkpoint, before the next act starts. A marker whose
  process is dead (or is this process, from an engine that is gone) is turned back into a
  question — the action may have run partly — never run again on its own;
- reject → recorded, the loop continues without it (``reject --stop`` ends the run with
  ``human_rejected`` through the stop policy);
- respond → the text goes to the next gather.

Decisions are read as typed ``Decision`` rows (state_db.queries.decisions).
"""
from __future__ import annotations

import time
import uuid
from typing import Callable

from state_db.kernel.processes import identity, identity_alive
from state_db.queries import decisions, work
from state_db.queries.decisions import ASKED_AGAIN, Decision
from state_db.queries.loop import UNKNOWN_ERROR
from state_db.text import clean, command_shown
from state_db.vocab import DecisionKind, DecisionStatus as D, WorkStatus

# The eval-agent's question when every verify command passes on the baseline (approve: go on).
BASELINE_PASSES = DecisionKind.BASELINE_PASSES
# The doer's request to widen the run's change scope (roles/eval_agent/scope.py): its command is a
# glob; approved (or edited), it is added to the work item's scope for this run, and nothing runs.
SCOPE = DecisionKind.SCOPE

# Runs an approved action: (command, kind, workspace) -> (exit code or None, output).
GateRunner = Callable[[str, str, str], tuple]


def refuse_runner(command: str, kind: str, workspace: str) -> tuple:
    return None, "not run: this loop-agent has no runner that can lift the block"


def question_of(req: dict) -> str:
    """The question a gated request asks: its kind and reason (the reason cut to 1,000
    characters: it runs nothing), then the command that approving runs — whole, exactly the
    stored one, shown by ``text.command_shown`` (controls and whitespace runs visible, a warning
    when long). Nothing of the command is ever cut, so the question never stands in for it."""
    reason = clean(req.get("reason") or "")[:1000]
    if req["kind"] == DecisionKind.NEEDS_HUMAN:      # the doer asks a person; approving runs nothing
        return (f"needs_human: the doer asks: {reason} — respond TEXT: it goes on with your answer; "
                "reject --stop: the run ends needs_human")
    if req["kind"] == SCOPE:        # approving runs nothing: it widens the run's change scope by a glob
        return (f"scope: {reason} — approving widens this run's change scope to files matching this glob "
                f"({len(req['command'])} characters), exactly as shown:\n{command_shown(req['command'])}")
    return (f"{req['kind']}: {reason} — approving runs this command ({len(req['command'])} characters), "
            f"exactly as shown:\n{command_shown(req['command'])}")


def record_requests(tx, work_id: str, n: int, requests) -> list[str]:
    """Record the act's gated requests as pending decisions (a request identical to one still
    pending — same kind and command — is the same decision) and pause the run if any waits."""
    ids = []
    for req in requests:
        if decisions.has_pending(tx.conn, work_id, kind=req["kind"], command=req["command"]):
            continue
        did = f"d-{uuid.uuid4().hex[:8]}"
        tx.insert("decisions", {"id": did, "work_id": work_id, "iteration": n, "kind": req["kind"],
                                "action": req, "question": question_of(req), "status": D.PENDING,
                                "created_at": tx.now})
        ids.append(did)
    if decisions.has_pending(tx.conn, work_id):
        tx.set_status("work_items", work_id, WorkStatus.PAUSED)
    return ids


def interrupted(conn, work_id: str) -> list[Decision]:
    """The run's ``executing`` markers whose process is gone (or an earlier engine of this one):
    the action may or may not have run. A marker held by another live process is not among them
    (it is still running the action)."""
    mine = identity()
    return [r for r in decisions.of_work(conn, work_id, D.EXECUTING)
            if not (r.executor and r.executor != mine and identity_alive(r.executor))]


def ask_again_if_interrupted(writer, work_id: str, changed: Callable[[Decision], list[str]] | None = None,
                             output: Callable[[Decision], str | None] | None = None) -> int:
    """Ask again about each action cut while it ran (``interrupted``), saying what happened so a
    human does not re-approve blind: that it was approved before (by whom, when), that it started
    (when), what it changed in the workspace meanwhile (``changed(decision)``: paths, when known)
    and that it may have run partly — in the question itself, which every front end shows.
    ``output(decision)``: the end of what it printed before it was cut, when kept.
    Returns how many were asked again."""
    asked = 0
    for r in interrupted(writer.conn, work_id):
        paths = changed(r) if changed is not None else []
        told = again(r, paths, output(r) if output is not None else None)
        with writer.transaction() as tx:
            now = decisions.decision(tx.conn, r.id)
            if now is None or now.status != D.EXECUTING:
                continue
            tx.set_status("decisions", r.id, D.PENDING, executor=None, question=told[:2000],
                          result=f"interrupted while executing; it may have run partly — decide again ({r.result or 'no start recorded'})")
            tx.update("decisions", r.id, announced_at=None)
            asked += 1
    return asked


def again(d: Decision, changed: list[str], printed: str | None = None) -> str:
    """The question of an action asked again after it was cut while it ran (``ask_again_if_interrupted``)."""
    first = d.question.split(" || first asked: ", 1)[-1]
    approved = f"approved by {d.decided_by or 'a human'}" + (f" at {_when(d.decided_at)}" if d.decided_at else "")
    started = d.result if d.result and d.result.startswith("started") else "started"
    wrote = (f"; meanwhile the workspace changed: {', '.join(changed[:20])}"
             + (f" and {len(changed) - 20} more" if len(changed) > 20 else "")
             + " (set aside: a new run of it starts from where the first began)") if changed else \
        "; it changed nothing in the workspace that is still there"
    said = (f"; before it was cut it printed: «{' '.join(printed.split())[-600:]}»" if printed
            else "; nothing it printed was kept")
    return (f"{ASKED_AGAIN}: `{d.command}` was {approved}, {started}, and its process was lost while it ran: "
            f"it may have run partly (outside the workspace too){wrote}{said}. Approve runs it again from the "
            f"start; reject goes on without it. || first asked: {first}")


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def settle(writer, work_id: str, workspace: str, runner: GateRunner, *,
           before_action: Callable[[], None] | None = None,
           after_action: Callable[[Decision], str | None] | None = None) -> bool:
    """Process this run's decisions once: run every approved or edited action (once), then
    return True when nothing is pending (the run goes on), or park the run and return False
    when a decision still waits for a human.

    ``before_action()`` runs before the first action (the engine's crash reset);
    ``after_action(decision)`` records the action's effect and returns its checkpoint, or
    (checkpoint, a note the decision's result starts with).
    """
    conn = writer.conn
    for d in decisions.of_work(conn, work_id, D.APPROVED, D.EDITED):
        if before_action is not None:
            before_action()
            before_action = None
        _execute(writer, d, workspace, runner, after_action)
    if decisions.has_pending(conn, work_id):
        park(writer, work_id)
        return False
    if work.item(conn, work_id).status == WorkStatus.PAUSED:   # only then a write: the common case reads
        with writer.transaction() as tx:
            if work.item(tx.conn, work_id).status == WorkStatus.PAUSED:
                tx.set_status("work_items", work_id, WorkStatus.RUNNING)
    return True


def park(writer, work_id: str) -> None:
    """A run waiting for a human holds no loop-agent: paused, and assigned to nobody."""
    with writer.transaction() as tx:
        run = work.item(tx.conn, work_id)
        if run.ended:
            return
        if run.status != WorkStatus.PAUSED:
            tx.set_status("work_items", work_id, WorkStatus.PAUSED, assigned_to=None)
        elif run.assigned_to is not None:
            tx.update("work_items", work_id, assigned_to=None, updated_at=tx.now)


def _execute(writer, d: Decision, workspace: str, runner: GateRunner, after_action=None) -> None:
    command = d.answer if d.status == D.EDITED and d.answer else d.command
    if d.kind in (BASELINE_PASSES, UNKNOWN_ERROR, DecisionKind.NEEDS_HUMAN):   # nothing to run: a choice
        with writer.transaction() as tx:
            tx.set_status("decisions", d.id, D.EXECUTING, executor=identity())
            tx.set_status("decisions", d.id, D.EXECUTED, result="the human chose to go on")
        return
    if d.kind == SCOPE:                          # a widening, recorded on the run: nothing to run
        with writer.transaction() as tx:
            tx.set_status("decisions", d.id, D.EXECUTING, executor=identity())
            scope = list(work.item(tx.conn, d.work_id).scope)
            glob = command.strip()
            if glob and glob not in scope:
                tx.update("work_items", d.work_id, scope=[*scope, glob], updated_at=tx.now)
            tx.set_status("decisions", d.id, D.EXECUTED,
                          result=f"the change scope of this run now includes `{glob}`: changes to matching files "
                                 "reach the checks")
        return
    with writer.transaction() as tx:             # the marker, committed before running
        tx.set_status("decisions", d.id, D.EXECUTING, executor=identity(),
                      result=f"started at {_when(time.time())} by process {identity().split(':')[0]}")
    t0 = time.monotonic()
    code, output = runner(command, d.kind, workspace)
    result = f"exit {code} after {time.monotonic() - t0:.1f}s\n{output[-3000:]}"
    recorded = after_action(d) if after_action is not None else None
    checkpoint, note = recorded if isinstance(recorded, tuple) else (recorded, None)
    if note:
        result = f"{note}\n{result}"
    with writer.transaction() as tx:
        tx.set_status("decisions", d.id, D.EXECUTED, result=result, checkpoint=checkpoint)


def settled_checkpoint(conn, work_id: str, after_iteration: int) -> str | None:
    """The checkpoint of the latest action a human approved after ``after_iteration`` (its
    effect is part of the state the next act starts from), or None."""
    return decisions.settled_checkpoint(conn, work_id, after_iteration)


def feedback_for(conn, work_id: str, n: int) -> str:
    """What the human decided about the actions iteration ``n`` asked for, for the next gather."""
    lines = []
    for d in decisions.of_work(conn, work_id, iteration=n):
        if d.status == D.EXECUTED:
            lines.append(f"Human approved `{d.question}`; it ran: {d.result}")
        elif d.status == D.REJECTED:
            lines.append(f"Human rejected `{d.question}`" + (f": {d.answer}" if d.answer else "")
                         + ". Continue without it.")
        elif d.status == D.RESPONDED:
            lines.append(f"Human answered `{d.question}`: {d.answer}")
    return "\n".join(lines)


def rejected_with_stop(conn, work_id: str) -> bool:
    """A rejection that ends the run: ``reject --stop``, or rejecting a run whose baseline passes."""
    return decisions.rejected_to_stop(conn, work_id, BASELINE_PASSES)
