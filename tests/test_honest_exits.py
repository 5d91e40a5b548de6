"""A run that asked a human whether it ends (the goal judged impossible, an error the policy does
not know) on the iteration a cap fires waits for that answer: the cap does not end it first and
leave the question pending. Confirmed, the run ends with the honest reason; answered "go on", the
cap ends it."""
from __future__ import annotations

import uuid

import pytest

from roles.operations.decide import decide
from state_db.kernel import config
from state_db.vocab import Actor, DecisionStatus, StopReason, WorkStatus
from state_db.writer import StateWriter
from tests.support.loop import ScriptedActs, engine, make_workspace, submit
from tests.support.org import query
from tests.test_loop_next_step import redispatch

pytestmark = pytest.mark.timeout(120)
BAD = {"write": {"calc.py": "def add(a, b):\n    return a - b\n"}}


def asking_engine(home, wid, kind):
    """An engine whose eval-agent, with its verdict on iteration 1, asks whether the run ends
    (``kind``) and pauses it — as the verifier does when its review finds the goal impossible."""
    eng = engine(home, wid, ScriptedActs([[BAD]]))
    verify = eng.verify

    def verify_and_ask(work_id, n):
        verify(work_id, n)
        if n != 1:                          # the preflight (0) asks nothing
            return
        ev = StateWriter(home.db_path, Actor.EVAL_AGENT, "eval-agent")
        with ev.transaction() as tx:
            tx.insert("decisions", {"id": f"d-{uuid.uuid4().hex[:8]}", "work_id": work_id, "iteration": n,
                                    "kind": kind, "action": {"kind": kind, "command": "", "reason": "it contradicts"},
                                    "question": f"{kind}: confirm?", "status": DecisionStatus.PENDING,
                                    "created_at": tx.now})
            tx.set_status("work_items", work_id, WorkStatus.PAUSED)
        ev.close()
    eng.verify = verify_and_ask
    return eng


@pytest.mark.parametrize("answer, ends", [("approve", StopReason.IMPOSSIBLE), ("reject", StopReason.MAX_ITERATIONS)])
def test_a_pending_impossible_question_wins_over_the_iteration_cap_of_the_same_iteration(org_home, tmp_path,
                                                                                          answer, ends):
    wid = submit(org_home, make_workspace(tmp_path), caps={"max_iterations": 1})
    assert asking_engine(org_home, wid, "impossible").run() is None          # parked, not ended on the cap
    item = query(org_home, "SELECT * FROM work_items WHERE id=?", (wid,))[0]
    assert (item["status"], item["stop_reason"]) == ("paused", None)
    asked = query(org_home, "SELECT * FROM decisions WHERE work_id=?", (wid,))
    assert [d["status"] for d in asked] == ["pending"]
    decided = decide(org_home, config.load(None), asked[0]["id"], answer)
    if answer == "approve":
        assert decided.ended == "impossible"
    else:
        redispatch(org_home, wid)
        assert engine(org_home, wid, ScriptedActs([[BAD]])).run().reason == StopReason.MAX_ITERATIONS
    item = query(org_home, "SELECT * FROM work_items WHERE id=?", (wid,))[0]
    assert (item["status"], item["stop_reason"]) == ("ended", ends)
    assert query(org_home, "SELECT COUNT(*) AS n FROM decisions WHERE work_id=? AND status='pending'", (wid,))[0]["n"] == 0


@pytest.mark.parametrize("stop, ends", [(True, StopReason.NEEDS_HUMAN), (False, StopReason.MAX_ITERATIONS)])
def test_a_doer_asking_a_human_parks_the_run_even_on_its_last_iteration(org_home, tmp_path, stop, ends):
    """The question the command backend's ``loop-org-exit needs_human`` records (any backend's
    ``needs_human`` request): a decision with nothing to run; reject --stop ends the run
    needs_human, reject goes on (here: the iteration cap then ends it)."""
    wid = submit(org_home, make_workspace(tmp_path), caps={"max_iterations": 1})
    ask = {**BAD, "request": {"kind": "needs_human", "command": "", "reason": "should add() round?"}}
    assert engine(org_home, wid, ScriptedActs([[ask]])).run() is None
    asked = query(org_home, "SELECT * FROM decisions WHERE work_id=?", (wid,))
    assert [(d["kind"], d["status"]) for d in asked] == [("needs_human", "pending")]
    assert asked[0]["question"].startswith("needs_human: the doer asks: should add() round?")
    decide(org_home, config.load(None), asked[0]["id"], "reject", stop=stop)
    redispatch(org_home, wid)
    decision = engine(org_home, wid, ScriptedActs([[BAD]])).run()
    assert decision.reason == ends, decision
