"""Errors the stop policy does not know: the run asks a human instead of spending on them.

An error's *class* is the tool's code (``os_error: Permission denied`` and ``tool_failed: KeyError``
keep their first clause: the environment fails in many ways), or, for an exception out of an act,
``exception: <type>`` with its code. A class the policy does not ``recognise`` that this run has
not met before — in an earlier iteration's tool calls, or in an earlier question — records a
pending ``unknown_error`` decision in the same transaction as the iteration that met it, and the
run pauses: it is verified and reflected as usual, then parked until a human answers.

The human's answers (``org decide ID …``):
- ``respond TEXT``: go on; the text reaches the next prompt;
- ``reject``: go on without an answer;
- ``approve`` (or ``reject --stop``): confirm the stop: the run ends ``needs_human`` through the
  stop policy (``HumanRejected`` fires on the ``needs_human`` flag).
An answered class is known to the run from then on: it never asks twice about one class.
"""
from __future__ import annotations

import uuid
from typing import Iterable

import orjson

from roles.loop_agent.policy import StopPolicy
from state_db.connection import as_store_busy
from state_db.kernel.errors import OrgError
from state_db.queries.decisions import has_pending
from state_db.queries.loop import UNKNOWN_ERROR, errors_asked
from state_db.queries.work import item
from state_db.vocab import DecisionStatus, WorkStatus

_REFINED = ("os_error", "tool_failed")


def error_class(code: str, text: str = "") -> str:
    """The class of a tool error with ``code`` whose result said ``text``."""
    if code in _REFINED:
        said = text.split(":", 1)[1] if text.startswith("error (") and ":" in text else text
        head = said.strip().split(":")[0].split("\n")[0].strip()[:60]
        return f"{code}: {head}" if head else code
    return code


def machine_busy(exc: BaseException) -> bool:
    """Whether ``exc`` is the store's ``StoreBusy`` (code ``store_busy``: its lock held past its
    wait — SQLite's busy timeout, PostgreSQL's lock_timeout or serialization failure), or an
    SQLite error with the same result code raised outside a writer's transaction: the machine's
    failure, passing, never a question for a human; the run is retried as after a crash."""
    return as_store_busy(exc) is not None


def exception_class(exc: BaseException) -> str:
    return f"exception: {type(exc).__name__}" + (f" ({exc.code})" if isinstance(exc, OrgError) else "")


def tool_errors(tool_calls: Iterable[dict] | str | None) -> dict[str, str]:
    """Class → an example result, of the failed calls in ``tool_calls`` (an iteration's record)."""
    calls = orjson.loads(tool_calls) if isinstance(tool_calls, (str, bytes)) else (tool_calls or ())
    out: dict[str, str] = {}
    for call in calls:
        if not isinstance(call, dict) or call.get("ok", True) or not call.get("code"):
            continue
        out.setdefault(error_class(str(call["code"]), str(call.get("result") or "")), str(call.get("result") or ""))
    return out


def unknown(policy: StopPolicy, met: dict[str, str], earlier: Iterable[dict], conn, work_id: str) -> dict[str, str]:
    """Of the classes ``met`` (class → example), those the policy does not recognise and the
    run has not met before: in ``earlier`` iteration rows, or in an earlier question."""
    strange = {c: said for c, said in met.items() if not policy.recognises(c)}
    if not strange:                 # the common case: nothing to look up
        return {}
    seen = set(errors_asked(conn, work_id))
    for row in earlier:
        seen.update(tool_errors(row.get("tool_calls")))
    return {c: said for c, said in strange.items() if c not in seen}


def ask(tx, work_id: str, n: int, errors: dict[str, str], *, where: str) -> list[str]:
    """Record one pending ``unknown_error`` decision per class in ``errors`` (class → what it
    said) and pause the run; ``where`` says where it was met. Returns the decision ids."""
    ids = []
    for cls, said in errors.items():
        if has_pending(tx.conn, work_id, kind=UNKNOWN_ERROR, command=cls):
            continue
        did = f"d-{uuid.uuid4().hex[:8]}"
        quoted = " ".join(said.split())[:300]
        question = (f"unknown_error: {where} met an error the stop policy does not know ({cls}): {quoted} — "
                    "respond TEXT: go on with your answer; reject: go on without one; approve: stop the run "
                    "(needs_human)")
        tx.insert("decisions", {"id": did, "work_id": work_id, "iteration": n, "kind": UNKNOWN_ERROR,
                                "action": {"kind": UNKNOWN_ERROR, "command": cls, "reason": quoted},
                                "question": question[:1000], "status": DecisionStatus.PENDING, "created_at": tx.now})
        ids.append(did)
    if ids and item(tx.conn, work_id).status == WorkStatus.RUNNING:
        tx.set_status("work_items", work_id, WorkStatus.PAUSED)
    return ids
