"""The coordinator's reconcile, in-process over a real state.db: workspace locks and their
promotion, orphans, parked runs, fair dispatch and the org-wide spend cap."""
from __future__ import annotations

import time

import pytest

from roles.coordinator import dispatch as D
from state_db.connection import read_rows
from state_db.vocab import Actor, WorkStatus
from state_db.writer import StateWriter


@pytest.fixture
def w(org_home):
    writers = {a: StateWriter(org_home.db_path, a, i) for a, i in (
        (Actor.HUMAN, None), (Actor.SUPERVISOR, None), (Actor.COORDINATOR, None),
        (Actor.LOOP_AGENT, "loop-agent-1"))}
    yield writers
    for x in writers.values():
        x.close()


def _agent(w, instance: str, *, alive: bool = True) -> None:
    now = time.time()
    with w[Actor.SUPERVISOR].transaction() as tx:
        tx.insert("role_instances", {"instance": instance, "role": "loop-agent", "status": "starting",
                                     "updated_at": now})
        if alive:
            tx.set_status("role_instances", instance, "ready", heartbeat_at=now)


def _item(w, wid: str, workspace: str, *, at: float, lock: bool = True) -> None:
    with w[Actor.HUMAN].transaction() as tx:
        busy = tx.one("SELECT work_id FROM workspace_locks WHERE workspace = ?", (workspace,))
        tx.insert("work_items", {"id": wid, "goal": "g", "workspace": workspace, "verify": ["true"],
                                 "backend": "anthropic", "status": WorkStatus.WAITING if busy else WorkStatus.QUEUED,
                                 "created_by": "t", "created_at": at, "updated_at": at})
        if lock and not busy:
            tx.insert("workspace_locks", {"workspace": workspace, "work_id": wid, "acquired_at": at})


def _rows(home, sql, params=()):
    return read_rows(home.db_path, sql, params)


def _reconcile(w, cap=1000.0):
    return D.reconcile(w[Actor.COORDINATOR], heartbeat_timeout_s=10.0, spend_cap_usd=cap)


def test_oldest_item_first_to_the_least_recently_used_live_agent(org_home, w):
    for a in ("loop-agent-1", "loop-agent-2"):
        _agent(w, a)
    _agent(w, "loop-agent-3", alive=False)
    _item(w, "b", "/ws/b", at=2.0)
    _item(w, "a", "/ws/a", at=1.0)
    _item(w, "c", "/ws/c", at=3.0)
    _item(w, "old", "/ws/old", at=0.5)
    with w[Actor.HUMAN].transaction() as tx:
        tx.set_status("work_items", "old", WorkStatus.ENDED, stop_reason="cancelled")
    with w[Actor.LOOP_AGENT].transaction() as tx:          # agent 1 worked most recently
        tx.insert("attempts", {"work_id": "old", "attempt": 1, "iteration": 1, "instance": "loop-agent-1",
                               "started_at": time.time()})
    got = _reconcile(w)["dispatched"]
    assert got == [("a", "loop-agent-2"), ("b", "loop-agent-1")]       # c waits: no free live agent
    assert _rows(org_home, "SELECT status FROM work_items WHERE id='c'")[0]["status"] == "queued"
    assert _reconcile(w)["dispatched"] == []                              # both agents are busy now


def test_a_free_workspace_goes_to_its_oldest_waiting_item(org_home, w):
    _item(w, "first", "/ws/same", at=1.0)
    _item(w, "second", "/ws/same", at=2.0)
    _item(w, "third", "/ws/same", at=3.0)
    assert [r["status"] for r in _rows(org_home, "SELECT status FROM work_items ORDER BY created_at")] == \
        ["queued", "waiting", "waiting"]
    with w[Actor.HUMAN].transaction() as tx:
        tx.set_status("work_items", "first", WorkStatus.ENDED, stop_reason="cancelled")
    assert _reconcile(w)["promoted"] == ["second"]
    lock = _rows(org_home, "SELECT work_id FROM workspace_locks WHERE workspace='/ws/same'")
    assert lock == [{"work_id": "second"}]


def test_runs_of_a_dead_agent_are_requeued_and_a_paused_one_is_parked(org_home, w):
    _agent(w, "loop-agent-1", alive=False)
    _item(w, "run", "/ws/r", at=1.0)
    _item(w, "wait", "/ws/w", at=2.0)
    with w[Actor.COORDINATOR].transaction() as tx:
        for wid in ("run", "wait"):
            tx.set_status("work_items", wid, WorkStatus.DISPATCHED, assigned_to="loop-agent-1")
    with w[Actor.LOOP_AGENT].transaction() as tx:
        for wid in ("run", "wait"):
            tx.set_status("work_items", wid, WorkStatus.RUNNING)
        tx.set_status("work_items", "wait", WorkStatus.PAUSED)
        tx.insert("decisions", {"id": "d1", "work_id": "wait", "iteration": 1, "kind": "network",
                                "action": {"kind": "network", "command": "x", "reason": "r"}, "status": "pending",
                                "created_at": time.time()})
    got = _reconcile(w)
    assert sorted(got["requeued"]) == ["run", "wait"] and got["unparked"] == []
    rows = {r["id"]: r for r in _rows(org_home, "SELECT id, status, assigned_to FROM work_items")}
    assert rows["run"]["status"] == "queued" and rows["run"]["assigned_to"] is None
    assert rows["wait"]["status"] == "paused" and rows["wait"]["assigned_to"] is None      # parked
    with w[Actor.HUMAN].transaction() as tx:
        tx.set_status("decisions", "d1", "approved")
    assert _reconcile(w)["unparked"] == ["wait"]
    assert _rows(org_home, "SELECT status FROM work_items WHERE id='wait'")[0]["status"] == "queued"


def test_a_parked_run_holds_no_agent(org_home, w):
    _agent(w, "loop-agent-1")
    _item(w, "parked", "/ws/p", at=1.0)
    _item(w, "next", "/ws/n", at=2.0)
    with w[Actor.COORDINATOR].transaction() as tx:
        tx.set_status("work_items", "parked", WorkStatus.DISPATCHED, assigned_to="loop-agent-1")
    with w[Actor.LOOP_AGENT].transaction() as tx:
        tx.set_status("work_items", "parked", WorkStatus.RUNNING)
        tx.set_status("work_items", "parked", WorkStatus.PAUSED, assigned_to=None)
        tx.insert("decisions", {"id": "d1", "work_id": "parked", "iteration": 1, "kind": "network",
                                "action": {"kind": "network", "command": "x", "reason": "r"}, "status": "pending",
                                "created_at": time.time()})
    assert _reconcile(w)["dispatched"] == [("next", "loop-agent-1")]


def test_the_spend_cap_ends_queued_and_waiting_runs_only(org_home, w):
    _agent(w, "loop-agent-1")
    _item(w, "q", "/ws/q", at=1.0)
    _item(w, "wt", "/ws/q", at=2.0)
    _item(w, "live", "/ws/l", at=3.0)
    with w[Actor.COORDINATOR].transaction() as tx:
        tx.set_status("work_items", "live", WorkStatus.DISPATCHED, assigned_to="loop-agent-1")
    with w[Actor.LOOP_AGENT].transaction() as tx:
        tx.insert("model_calls", {"request_id": "r1", "work_id": "live", "model": "m", "input_tokens": 1,
                                  "output_tokens": 1, "cost_usd": 2.0, "at": time.time()})
    assert _reconcile(w, cap=5.0)["capped"] == []
    assert sorted(_reconcile(w, cap=2.0)["capped"]) == ["q", "wt"]
    rows = {r["id"]: r for r in _rows(org_home, "SELECT id, status, stop_reason FROM work_items")}
    assert rows["q"]["stop_reason"] == rows["wt"]["stop_reason"] == "org_limit"
    assert rows["live"]["status"] == "dispatched"          # a running run stops itself between model calls
