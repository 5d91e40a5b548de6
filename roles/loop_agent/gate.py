"""The human gate, on the loop-agent's side.

A gated action (``request_action``: lift the network block, reach outside the workspace, …) is
recorded as a pending decision in the same transaction as the iteration that asked for it, and
the run pauses. When a human decides:
- approve / edit → an ``executing`` marker is written first, then the command runs once with the
  block lifted, and its output is stored; a resume that finds the marker asks the human again
  instead of running it twice;
- reject → recorded, the loop continues without it (``reject --stop`` ends the run with
  ``human_rejected`` through the stop policy);
- respond → the text goes to the next gather.
"""
from __future__ import annotations

import time
import uuid
from typing import Callable

from state_db.vocab import DecisionStatus as D, WorkStatus

# The eval-agent's question when every verify command passes on the baseline (approve: go on).
BASELINE_PASSES = "baseline_passes"

# Runs an approved action: (command, kind, workspace) -> (exit code or None, output).
GateRunner = Callable[[str, str, str], tuple]


def refuse_runner(command: str, kind: str, workspace: str) -> tuple:
    return None, "not run: this loop-agent has no runner that can lift the block"


def record_requests(tx, work_id: str, n: int, requests) -> list[str]:
    ids = []
    for req in requests:
        did = f"d-{uuid.uuid4().hex[:8]}"
        question = f"{req['kind']}: run `{req['command']}` — {req['reason']}"
        tx.insert("decisions", {"id": did, "work_id": work_id, "iteration": n, "kind": req["kind"],
                                "action": req, "question": question[:1000], "status": D.PENDING,
                                "created_at": tx.now})
        ids.append(did)
    if ids:
        tx.set_status("work_items", work_id, WorkStatus.PAUSED)
    return ids


def ask_again_if_interrupted(writer, work_id: str) -> int:
    """An ``executing`` marker left by a crash: the action may or may not have run — ask again."""
    with writer.transaction() as tx:
        rows = tx.conn.execute("SELECT id FROM decisions WHERE work_id = ? AND status = ?", (work_id, D.EXECUTING)).fetchall()
        for r in rows:
            tx.set_status("decisions", r["id"], D.PENDING,
                          result="interrupted while executing; it may have run partly — decide again")
            tx.update("decisions", r["id"], announced_at=None)
    return len(rows)


def settle(writer, work_id: str, workspace: str, runner: GateRunner, *, wait: Callable[[], bool]) -> bool:
    """Process this run's decisions. Blocks while any is pending (``wait()`` returns False to
    give up: suspend/shutdown). Returns True when nothing is pending any more."""
    while True:
        conn = writer.conn
        pending = conn.execute("SELECT COUNT(*) FROM decisions WHERE work_id = ? AND status = ?",
                               (work_id, D.PENDING)).fetchone()[0]
        for d in conn.execute("SELECT * FROM decisions WHERE work_id = ? AND status IN (?, ?)",
                              (work_id, D.APPROVED, D.EDITED)).fetchall():
            _execute(writer, dict(d), workspace, runner)
        if pending == 0:
            paused = conn.execute("SELECT status = ? FROM work_items WHERE id = ?", (WorkStatus.PAUSED, work_id)).fetchone()[0]
            if paused:                      # only then a write: the common case costs one read
                with writer.transaction() as tx:
                    if tx.get("work_items", work_id)["status"] == WorkStatus.PAUSED:
                        tx.set_status("work_items", work_id, WorkStatus.RUNNING)
            return True
        if not wait():
            return False


def _execute(writer, d: dict, workspace: str, runner: GateRunner) -> None:
    import orjson
    action = orjson.loads(d["action"])
    command = d["answer"] if d["status"] == D.EDITED and d["answer"] else action["command"]
    if d["kind"] == BASELINE_PASSES:        # nothing to run: the human chose to go on
        with writer.transaction() as tx:
            tx.set_status("decisions", d["id"], D.EXECUTING)
            tx.set_status("decisions", d["id"], D.EXECUTED, result="the human chose to go on")
        return
    with writer.transaction() as tx:
        tx.set_status("decisions", d["id"], D.EXECUTING)          # the marker, committed before running
    t0 = time.monotonic()
    code, output = runner(command, d["kind"], workspace)
    result = f"exit {code} after {time.monotonic() - t0:.1f}s\n{output[-3000:]}"
    with writer.transaction() as tx:
        tx.set_status("decisions", d["id"], D.EXECUTED, result=result)


def feedback_for(conn, work_id: str, n: int) -> str:
    """What the human decided about the actions iteration ``n`` asked for, for the next gather."""
    lines = []
    for d in conn.execute("SELECT * FROM decisions WHERE work_id = ? AND iteration = ? ORDER BY created_at",
                          (work_id, n)).fetchall():
        if d["status"] == D.EXECUTED:
            lines.append(f"Human approved `{d['question']}`; it ran: {d['result']}")
        elif d["status"] == D.REJECTED:
            lines.append(f"Human rejected `{d['question']}`" + (f": {d['answer']}" if d["answer"] else "")
                         + ". Continue without it.")
        elif d["status"] == D.RESPONDED:
            lines.append(f"Human answered `{d['question']}`: {d['answer']}")
    return "\n".join(lines)


def rejected_with_stop(conn, work_id: str) -> bool:
    """A rejection that ends the run: ``reject --stop``, or rejecting a run whose baseline passes."""
    return conn.execute("SELECT 1 FROM decisions WHERE work_id = ? AND status = ? AND (stop_run = 1 OR kind = ?)",
                        (work_id, D.REJECTED, BASELINE_PASSES)).fetchone() is not None
