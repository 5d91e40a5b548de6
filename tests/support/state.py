"""Helpers that put domain rows into state.db through StateWriter, as the real actors would."""
from __future__ import annotations

import time

from state_db.vocab import Actor, WorkStatus


def submit(writer_for, work_id="w1", workspace="/tmp/ws", **extra) -> str:
    row = {"id": work_id, "goal": "make the tests pass", "workspace": workspace,
           "verify": ["pytest -q"], "caps": {"max_iterations": 5}, "backend": "anthropic",
           "status": WorkStatus.QUEUED, "created_by": "human", "created_at": time.time(),
           "updated_at": time.time(), **extra}
    with writer_for(Actor.HUMAN).transaction() as tx:
        tx.insert("work_items", row)
    return work_id


def assign_and_run(writer_for, work_id="w1", instance="loop-agent-1") -> None:
    with writer_for(Actor.COORDINATOR).transaction() as tx:
        tx.set_status("work_items", work_id, WorkStatus.DISPATCHED, assigned_to=instance)
    with writer_for(Actor.LOOP_AGENT, instance).transaction() as tx:
        tx.set_status("work_items", work_id, WorkStatus.RUNNING)


def commit_iteration(writer_for, work_id="w1", n=1, instance="loop-agent-1") -> None:
    with writer_for(Actor.LOOP_AGENT, instance).transaction() as tx:
        tx.insert("iterations", {"work_id": work_id, "n": n, "attempt": 1, "act_status": "ok",
                                 "committed_at": time.time()})


def verdict(writer_for, work_id="w1", n=1, outcome="pass", instance="eval-agent-1") -> str:
    vid = f"v-{work_id}-{n}-{outcome}"
    with writer_for(Actor.EVAL_AGENT, instance).transaction() as tx:
        tx.insert("verdicts", {"id": vid, "work_id": work_id, "iteration": n, "outcome": outcome,
                               "written_by": instance, "at": time.time()})
    return vid
