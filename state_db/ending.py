"""How a run ends: the one ``end_run`` path and the ``StopDecision`` it records.

Every place that stops a run — the loop-agent's stop policy, the eval-agent's verdict (goal_met,
verify_unrunnable), the coordinator's org-wide spend cap, a backend that cannot be built, the
human's cancel of a run that has not started — produces a ``StopDecision`` and hands it to
``end_run`` inside its own transaction. ``end_run`` writes it once: a run already ended keeps its
first ending, and the caller gets that one back, so two stoppers racing agree on one reason.

It lives in the state layer because the roles that stop runs may not import each other (the
eval-agent never imports the loop-agent; the coordinator and the operations neither).
``goal_met`` is the one statement of when a goal counts as met; the loop-agent's ``GoalMet``
stop condition and the eval-agent's verdict both ask it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from state_db.kernel.errors import NotFound
from state_db.queries.work import WorkItem, item
from state_db.vocab import StopReason, WorkStatus

DETAIL_CAP = 1000


@dataclass(frozen=True)
class StopDecision:
    """Why a run stops: a reason from the closed set, and a sentence saying what fired."""

    reason: StopReason
    detail: str

    def encode(self) -> dict[str, str]:
        return {"reason": str(self.reason), "detail": self.detail}

    @classmethod
    def decode(cls, data: dict[str, Any]) -> StopDecision:
        return cls(StopReason(data["reason"]), str(data["detail"]))


def goal_met(iteration: int, latest: int, passed: bool, by_eval_agent: bool,
             evidence: str = "") -> StopDecision | None:
    """The goal counts as met when the latest committed iteration carries a passing verdict
    written by the eval-agent; returns that decision, else None. ``evidence``: what the pass
    rests on (test counts), added to the detail."""
    if iteration < 1 or iteration != latest or not passed or not by_eval_agent:
        return None
    return StopDecision(StopReason.GOAL_MET, f"iteration {iteration} passed every check"
                        + (f" ({evidence})" if evidence else " (verified by the eval-agent)"))


def recorded(work: WorkItem | None) -> StopDecision | None:
    """The ending a work item carries, or None while it runs."""
    if work is None or work.status != WorkStatus.ENDED or work.stop_reason is None:
        return None
    return StopDecision(StopReason(work.stop_reason), work.stop_detail or "")


def end_run(tx, work_id: str, decision: StopDecision, **fields: Any) -> StopDecision:
    """End ``work_id`` with ``decision`` in the open transaction ``tx`` (a StateWriter
    ``Transaction``); ``fields``: other work-item columns written with the ending.

    Returns the decision now recorded: ``decision``, or the earlier ending when the run had
    already ended (nothing is written then). Raises NotFound; NotAllowed when the writer may not
    record that reason (goal_met is the eval-agent's alone); StateError for a reason outside the
    closed set.
    """
    work = item(tx.conn, work_id)
    if work is None:
        raise NotFound(f"work item {work_id} does not exist")
    earlier = recorded(work)
    if earlier is not None:
        return earlier
    tx.set_status("work_items", work_id, WorkStatus.ENDED, stop_reason=StopReason(decision.reason),
                  stop_detail=decision.detail[:DETAIL_CAP], **fields)
    return StopDecision(StopReason(decision.reason), decision.detail[:DETAIL_CAP])
