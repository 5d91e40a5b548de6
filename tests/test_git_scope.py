"""What a joined host may reach of a work item's history, as the store has it (``gitscope``):
nothing for a host it does not know or a work item it never touched; fetch for one it ran or
judged; push only while one of its loop-agents holds it and the run lives; always the next
iteration after the last committed one."""
from __future__ import annotations

import time

import pytest

from roles.workbench.serve.gitscope import ScopeError, scope_of
from state_db.connection import connect
from state_db.vocab import Actor, WorkStatus
from tests.support.state import assign_and_run, commit_iteration, submit, verdict


def _peer(writer_for, instance: str, host: str, role: str = "loop-agent", k: int = 1) -> None:
    with writer_for(Actor.SUPERVISOR).transaction() as tx:
        tx.insert("peers", {"instance": instance, "host": host, "role": role, "endpoint": f"tcp://h:{7000 + k}",
                            "curve_public": f"{k}" * 40, "hmac_key": f"{k}" * 64, "registered_at": time.time(),
                            "updated_at": time.time()})


def _scope(org_home, host, wid="w1"):
    conn = connect(org_home.db_path, readonly=True)
    try:
        return scope_of(conn, host, wid)
    finally:
        conn.close()


def test_a_host_reaches_what_it_holds_ran_or_judged_and_nothing_else(org_home, writer_for):
    _peer(writer_for, "loop-agent-1", "host-a", k=1)
    _peer(writer_for, "loop-agent-2", "host-b", k=2)
    _peer(writer_for, "eval-agent-9", "host-e", "eval-agent", k=3)
    submit(writer_for, "w1")
    assign_and_run(writer_for, "w1", "loop-agent-1")
    a = _scope(org_home, "host-a")
    assert (a.fetch, a.push, a.next_iteration) == (True, True, 1)
    for host in ("host-b", "nobody", "host-e"):
        s = _scope(org_home, host)
        assert not s.fetch and not s.push
        with pytest.raises(ScopeError):
            s.require("upload-pack")
    assert not _scope(org_home, "host-a", "w-none").fetch
    commit_iteration(writer_for, "w1", 1, "loop-agent-1")
    assert _scope(org_home, "host-a").next_iteration == 2
    verdict(writer_for, "w1", 1, "fail", "eval-agent-9")
    assert _scope(org_home, "host-e").fetch and not _scope(org_home, "host-e").push


def test_a_host_that_held_a_run_fetches_it_but_pushes_no_more(org_home, writer_for):
    _peer(writer_for, "loop-agent-1", "host-a", k=1)
    _peer(writer_for, "loop-agent-2", "host-b", k=2)
    submit(writer_for, "w1")
    assign_and_run(writer_for, "w1", "loop-agent-1")
    with writer_for(Actor.LOOP_AGENT, "loop-agent-1").transaction() as tx:
        tx.insert("attempts", {"work_id": "w1", "attempt": 1, "iteration": 1, "instance": "loop-agent-1",
                               "started_at": time.time()})
    with writer_for(Actor.COORDINATOR).transaction() as tx:        # requeued, then another host's
        tx.set_status("work_items", "w1", WorkStatus.QUEUED, assigned_to=None)
        tx.set_status("work_items", "w1", WorkStatus.DISPATCHED, assigned_to="loop-agent-2")
    a, b = _scope(org_home, "host-a"), _scope(org_home, "host-b")
    assert a.fetch and not a.push and b.fetch and b.push
    with pytest.raises(ScopeError) as refused:
        a.require("receive-pack")
    assert refused.value.code == "git_shell_not_yours"
