"""The read model of what the org is doing: plain nested dicts and lists, ready for JSON.

``org status``, ``org show``, ``org watch`` and the dashboard show the same thing because they
call the same two functions: ``run_view(conn, work_id)`` and ``org_view(conn)``. Everything is
derived from committed rows; nothing here writes.

A run's phase (``RunPhase``) is derived, in this order:
- ``ended``: the work item ended (its stop reason says why);
- ``queued``: submitted, not dispatched yet (``waiting``: its workspace is busy with another run);
- ``waiting_for_human``: paused on a pending decision while its loop-agent still holds it;
- ``parked``: paused on a pending decision, let go of (no loop-agent is held);
- ``preflight``: dispatched, and the eval-agent has not recorded the baseline check yet
  (table ``preflights``): the verify commands run once before the first act;
- ``acting``: an attempt is open (``attempts.ended_at`` NULL), or the run is between a verdict and
  its next attempt;
- ``verifying``: the latest committed iteration has no eval-agent verdict yet.

The iteration shown (``n`` of ``max``) is the one in progress: the open attempt's while acting, the
one being verified while verifying, the last committed once ended, else the next one.
"""
from __future__ import annotations

import sqlite3
import time
from enum import StrEnum
from typing import Any

import orjson

from state_db import queries
from state_db.queries import proposals as proposal_queries
from state_db.queries import verdicts
from state_db.queries.base import plain
from state_db.queries.review import review_usage
from state_db.queries.verdicts import latest_eval_verdict
from state_db.queries.work import Caps, Ladder
from state_db.stop_hints import hint as stop_hint
from state_db.kernel.errors import NotFound
from state_db.kernel.processes import is_alive
from state_db.vocab import RoleStatus, StopReason, WorkStatus


class RunPhase(StrEnum):
    QUEUED = "queued"
    PREFLIGHT = "preflight"
    ACTING = "acting"
    VERIFYING = "verifying"
    WAITING_FOR_HUMAN = "waiting_for_human"
    PARKED = "parked"
    ENDED = "ended"


# what a human should look at first: these phases wait for a person, not for the org
NEEDS_HUMAN = (RunPhase.WAITING_FOR_HUMAN, RunPhase.PARKED)
_OPEN_ATTEMPT = """SELECT * FROM attempts WHERE work_id = ? AND ended_at IS NULL
                    ORDER BY attempt DESC LIMIT 1"""
_LAST_ITERATION = "SELECT n, committed_at, verdict_id FROM iterations WHERE work_id = ? ORDER BY n DESC LIMIT 1"


def loads(value: Any) -> Any:
    """JSON text from a column as data (values already decoded pass through)."""
    return orjson.loads(value) if isinstance(value, (str, bytes)) and value else value


def run_view(conn: sqlite3.Connection, work_id: str, *, now: float | None = None,
             item: dict | None = None) -> dict:
    """What one run is doing, as plain data.

    Args:
        conn: a connection to state.db (read-only is enough).
        work_id: the work item.
        now: the wall clock (injectable for tests).
        item: the work item as ``queries.work_item`` returns it, when the caller has it already.
    Returns: ``{id, goal, status, phase, assigned_to, iteration: {n, max, committed}, tokens:
    {used, cap, total}, cost_usd: {used, cap}, elapsed_s: {used, cap}, verdict: {iteration,
    outcome, line} | None, baseline: {outcome, line} | None, current_tool: {call, for_s} | None,
    pending_decisions: [ids], stop: {reason, detail, ended_at, hint} | None, created_at, updated_at,
    review: {calls, tokens, cost_usd}, caps: {name: {value, from}}}`` (``value`` None: removed on
    purpose; ``from``: flag, org.toml, default, or None when not recorded). Tokens and cost used are the doer's, against its caps: the
    eval-agent's review calls have their own budget (``review``; ``tokens.total`` counts everything).
    Raises NotFound (no such work item).
    """
    now = time.time() if now is None else now
    item = item or queries.work_item(conn, work_id)
    if item is None:
        raise NotFound(f"no work item {work_id}", hint="list them with 'org status'")
    caps = Caps.from_json(item["caps"])
    attempt = _row(conn, _OPEN_ATTEMPT, (work_id,))
    last = _row(conn, _LAST_ITERATION, (work_id,))
    committed = last["n"] if last else 0
    verdict = plain(latest_eval_verdict(conn, work_id))
    verified = verdict is not None and last is not None and verdict["iteration"] >= committed
    preflight = plain(verdicts.preflight(conn, work_id))
    pending = [r["id"] for r in conn.execute(
        "SELECT id FROM decisions WHERE work_id = ? AND status = 'pending' ORDER BY created_at", (work_id,))]
    phase = _phase(item, attempt, committed, verified, preflight is not None)

    n = committed + 1
    review = review_usage(conn, work_id)
    elapsed = item["elapsed_s"]
    if phase == RunPhase.ACTING and attempt is not None:
        n = attempt["iteration"]
        elapsed += max(0.0, now - attempt["started_at"])
    else:
        if phase in (RunPhase.VERIFYING, RunPhase.ENDED):
            n = committed
        elapsed += _unrecorded_wait(last, verdict, phase, now)
    current = None
    if attempt is not None and attempt.get("current_tool"):   # absent before migration 0008
        current = {"call": attempt["current_tool"],
                   "for_s": round(max(0.0, now - (attempt.get("current_tool_at") or now)), 1)}
    return {
        "id": item["id"], "goal": item["goal"], "status": item["status"], "phase": str(phase),
        "assigned_to": item["assigned_to"], "backend": item["backend"], "workspace": item["workspace"],
        "iteration": {"n": n, "max": caps.max_iterations, "committed": committed},
        "tokens": {"used": item["budget_tokens"] - review["budget_tokens"], "cap": caps.budget_tokens,
                   "total": item["tokens"]},
        "cost_usd": {"used": round(item["cost_usd"] - review["cost_usd"], 6), "cap": caps.budget_usd},
        "review": {"calls": review["calls"], "tokens": review["budget_tokens"], "cost_usd": round(review["cost_usd"], 6)},
        "elapsed_s": {"used": round(elapsed, 1), "cap": caps.timeout_s},
        "caps": {k: {"value": getattr(caps, k), "from": caps.source(k)} for k in Caps.names()
                 if getattr(caps, k) is not None or caps.source(k) is not None},
        "ladder": {**ladder.encode(), "label": ladder.label()} if (ladder := Ladder.parse(item.get("ladder"))).models
        else None,
        "verdict": None if verdict is None else {"iteration": verdict["iteration"], "outcome": verdict["outcome"],
                                                 "line": verdict_line(verdict)},
        "baseline": None if preflight is None else {"outcome": preflight["outcome"], "line": preflight["detail"]},
        "current_tool": current,
        "pending_decisions": pending,
        "stop": None if not item["stop_reason"] else {"reason": item["stop_reason"], "detail": item["stop_detail"],
                                                      "ended_at": item["ended_at"],
                                                      "hint": stop_hint(item["stop_reason"], item["id"])},
        "created_at": item["created_at"], "updated_at": item["updated_at"],
        "origin": _origin(conn, item),
    }


def _origin(conn: sqlite3.Connection, item: dict) -> dict:
    """What started the run (``work_items.origin``) and, for a skill's replay, what it measures:
    the subject, the arm and the ended item it reruns."""
    out = {"kind": item.get("origin") or "human", "id": item.get("origin_id")}
    if out["kind"] == "replay":
        row = _row(conn, "SELECT subject, arm, source_id, skill_name FROM replays WHERE work_id = ?", (item["id"],))
        if row is not None:
            out.update(subject=row["subject"], arm=row["arm"], source=row["source_id"], skill=row["skill_name"])
    return out


def _unrecorded_wait(last: dict | None, verdict: dict | None, phase: RunPhase, now: float) -> float:
    """The wait for the latest iteration's verdict while it is not yet in ``elapsed_s``.

    The wait counts toward the timeout; the loop-agent adds it to ``elapsed_s`` in the transaction
    that writes its reflection on that verdict (``iterations.verdict_id``). Until then it is counted
    here — up to now while the verdict is awaited, up to the verdict once it is in — so the figure
    never goes back when the verdict arrives or ends the run. Without a verdict, only a run that
    is verifying is waiting (a cancelled or parked one records its wait itself, or not at all)."""
    if last is None or last["verdict_id"] is not None:
        return 0.0
    if verdict is not None and verdict["iteration"] >= last["n"]:
        return max(0.0, verdict["at"] - last["committed_at"])
    return max(0.0, now - last["committed_at"]) if phase == RunPhase.VERIFYING else 0.0


def _phase(item: dict, attempt: dict | None, committed: int, verified: bool, preflight: bool) -> RunPhase:
    status = item["status"]
    if status == WorkStatus.ENDED:
        return RunPhase.ENDED
    if status in (WorkStatus.QUEUED, WorkStatus.WAITING):
        return RunPhase.QUEUED
    if status == WorkStatus.PAUSED:
        return RunPhase.WAITING_FOR_HUMAN if item["assigned_to"] else RunPhase.PARKED
    if attempt is not None:
        return RunPhase.ACTING
    if committed and not verified:
        return RunPhase.VERIFYING
    if not committed and not preflight:
        return RunPhase.PREFLIGHT
    return RunPhase.ACTING


def verdict_line(verdict: dict) -> str:
    """A verdict in one line: ``pass: 1 check, 12 tests passed`` or ``2 of 3 checks fail:
    test_mean, test_median``. Failing names are the runner's failing test ids where it reported
    them (``junit``), else the checks' names."""
    checks = [c for c in loads(verdict["checks"]) or [] if isinstance(c, dict)]
    total = len(checks)
    failing = [c for c in checks if not c.get("passed")]
    plural = "check" if total == 1 else "checks"
    if verdict["outcome"] == "pass":
        passed = sum((c.get("tests") or {}).get("passed", 0) for c in checks)
        return f"pass: {total} {plural}" + (f", {passed} tests passed" if passed else "")
    names: list[str] = []
    for c in failing:
        ids = [i for i, outcome in ((c.get("junit") or {}).get("ids") or {}).items() if outcome in ("failed", "error")]
        if ids:
            names += [i.rsplit("::", 1)[-1] or i for i in ids]
        elif c.get("code"):
            names.append(f"{c.get('name')} could not run ({c['code']})")
        else:
            names.append(str(c.get("name") or c.get("command")))
    shown = ", ".join(names[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3 else "")
    head = f"{len(failing)} of {total} {plural} fail" if total else verdict["outcome"]
    return f"{head}: {shown}" if shown else head


#: A role of another host (``peers``) cannot be looked up in this host's /proc: it is alive while
#: it heartbeats, within this many seconds.
REMOTE_STALE_S = 10.0
#: The role states whose process must be alive for the state to be true.
_LIVE_STATES = (RoleStatus.STARTING, RoleStatus.READY, RoleStatus.STOPPING)


def role_view(role: dict, *, held: dict[str, str] | None = None, remote: frozenset[str] = frozenset(),
              now: float | None = None) -> dict:
    """A role instance with what it is doing, as the durable state and its process say.

    ``activity``: ``dead`` when it is recorded starting, ready or stopping and its process is gone
    (the pid with the recorded start time; a role of another host, in ``remote``, by its
    heartbeat); for a ready role ``busy`` while it holds work, else ``idle``; else its status
    (stopped, crashed, failed, …). A loop-agent holds work while a run is assigned to it and
    dispatched or running (``held``: instance -> work id); another role while it records one in
    ``current_work`` (the eval-agent: the run it verifies). ``work_id``: that work.
    """
    out = dict(role)
    now = time.time() if now is None else now
    work_id = (held or {}).get(role["instance"]) if role["role"] == "loop-agent" else role["current_work"]
    if role["status"] in _LIVE_STATES and not _alive(role, role["instance"] in remote, now):
        out["activity"], work_id = "dead", None
    elif role["status"] == RoleStatus.READY:
        out["activity"] = "busy" if work_id else "idle"
    else:
        out["activity"], work_id = role["status"], None
    out["work_id"] = work_id
    return out


def _alive(role: dict, remote: bool, now: float) -> bool:
    if is_alive(role.get("pid"), role.get("pid_start")) and role.get("pid_start"):
        return True
    return remote and role.get("heartbeat_at") is not None and now - role["heartbeat_at"] <= REMOTE_STALE_S


def session_view(session: dict | None) -> dict | None:
    """The org session with ``alive``: for a session recorded running or suspending, whether its
    supervisor still runs (the pid with the recorded start time); else None (nothing should run).
    ``line``: one sentence saying so, and how to recover when it does not."""
    if session is None:
        return None
    out = dict(session)
    status = session["status"]
    if status not in ("running", "suspending"):
        out["alive"], out["line"] = None, status
        return out
    alive = bool(session.get("supervisor_start")) and is_alive(session.get("supervisor_pid"), session["supervisor_start"])
    out["alive"] = alive
    out["line"] = status if alive else (
        f"not running — recorded {status}, but its supervisor (pid {session.get('supervisor_pid')}) is gone: "
        "the org was killed or its machine restarted; start it again with 'scripts/start-org' (every run "
        "continues from its last committed iteration)")
    return out


def decision_view(decision: dict) -> dict:
    out = dict(decision)
    out["action"] = loads(decision["action"])
    return out


def org_view(conn: sqlite3.Connection, *, now: float | None = None, recent: int = 10) -> dict:
    """Everything ``org status`` and ``org watch`` show, as plain data.

    Returns ``queries.status`` (session, roles, work, usage, pending_decisions, open_batches,
    transport, last_event_id) with roles carrying ``activity``, decisions their ``action`` as data,
    and ``runs``: ``{running: [run_view], recent_ended: [run_view]}`` plus ``needs_you``:
    ``{decisions, batches, unrunnable: [run_view] (not dismissed: ``org dismiss``), failed_roles:
    [instance], proposals: [open discovery proposals, the recommended first]}``.
    """
    now = time.time() if now is None else now
    st = queries.status(conn)
    st["session"] = session_view(st["session"])
    held = {w["assigned_to"]: w["id"] for w in st["work"]["active"]
            if w["assigned_to"] and w["status"] in (WorkStatus.DISPATCHED, WorkStatus.RUNNING)}
    remote = _peers(conn)
    st["roles"] = [role_view(r, held=held, remote=remote, now=now) for r in st["roles"]]
    st["pending_decisions"] = [decision_view(d) for d in st["pending_decisions"]]
    running = [run_view(conn, w["id"], now=now, item=w) for w in st["work"]["active"]]
    ended = [run_view(conn, w["id"], now=now, item=w) for w in st["work"]["recent_ended"][:recent]]
    st["runs"] = {"running": running, "recent_ended": ended}
    st["needs_you"] = {
        "decisions": st["pending_decisions"],
        "batches": st["open_batches"],
        "unrunnable": [r for r, w in zip(ended, st["work"]["recent_ended"])
                       if r["stop"]["reason"] == StopReason.VERIFY_UNRUNNABLE and not w.get("dismissed_at")],
        "failed_roles": [r["instance"] for r in st["roles"] if r["status"] == RoleStatus.FAILED],
        "proposals": [p.as_dict() for p in proposal_queries.open_proposals(conn, now=now, limit=50)],
    }
    return st


def _peers(conn: sqlite3.Connection) -> frozenset[str]:
    """The instances of every host joined over tcp (none before migration 0014 made the table)."""
    try:
        return frozenset(r[0] for r in conn.execute("SELECT instance FROM peers"))
    except sqlite3.OperationalError:
        return frozenset()


def _row(conn: sqlite3.Connection, sql: str, params: tuple) -> dict | None:
    row = conn.execute(sql, params).fetchone()
    return dict(row) if row else None
