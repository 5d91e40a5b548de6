"""The coordinator's reconcile, in-process over a real state.db: workspace locks and their
promotion, orphans, parked runs, fair dispatch and the org-wide spend cap; then the coordinator
role itself, driven turn by turn with a StubTransport and a clock the test moves."""
from __future__ import annotations

import time

import pytest

from roles.coordinator import dispatch as D
from roles.coordinator.process import CoordinatorProcess
from state_db.kernel import config as config_mod
from state_db.connection import read_rows
from state_db.vocab import Actor, WorkStatus
from state_db.writer import StateWriter
from transport.errors import Rejected
from transport.kinds import Kind
from transport.stub import StubTransport


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


# -- the coordinator in-process: its reconcile and messages through a StubTransport, on a clock
# the test moves (heartbeats go stale without waiting for them).

class Clock:
    """Wall and monotonic clock at once; moves only when the test says."""

    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def cw(org_home, clock):
    """Writers on the test's clock: human, supervisor, and loop-agents by instance."""
    made = {}

    def writer(actor, instance=None):
        if (actor, instance) not in made:
            made[actor, instance] = StateWriter(org_home.db_path, actor, instance, clock=clock)
        return made[actor, instance]
    yield writer
    for x in made.values():
        x.close()


def role_row(cw, instance: str, role: str, *, ready: bool = True) -> None:
    with cw(Actor.SUPERVISOR).transaction() as tx:
        tx.insert("role_instances", {"instance": instance, "role": role, "status": "starting", "updated_at": tx.now})
        if ready:
            tx.set_status("role_instances", instance, "ready", heartbeat_at=tx.now)


def beat(cw, *instances: str) -> None:
    with cw(Actor.SUPERVISOR).transaction() as tx:
        for instance in instances:
            tx.update("role_instances", instance, heartbeat_at=tx.now, updated_at=tx.now)


def submit(cw, wid: str, workspace: str) -> None:
    """A work item as the human submits it: queued with the workspace's lock, or waiting for it."""
    with cw(Actor.HUMAN).transaction() as tx:
        busy = tx.one("SELECT work_id FROM workspace_locks WHERE workspace = ?", (workspace,))
        tx.insert("work_items", {"id": wid, "goal": "g", "workspace": workspace, "verify": ["true"],
                                 "backend": "anthropic", "status": WorkStatus.WAITING if busy else WorkStatus.QUEUED,
                                 "created_by": "t", "created_at": tx.now, "updated_at": tx.now})
        if not busy:
            tx.insert("workspace_locks", {"workspace": workspace, "work_id": wid, "acquired_at": tx.now})


def run_and_end(cw, wid: str, agent: str) -> None:
    """The loop-agent given ``wid`` starts it (an attempt at the clock's time) and ends it."""
    la = cw(Actor.LOOP_AGENT, agent)
    with la.transaction() as tx:
        tx.set_status("work_items", wid, WorkStatus.RUNNING)
        tx.insert("attempts", {"work_id": wid, "attempt": 1, "iteration": 1, "instance": agent, "started_at": tx.now})
    with la.transaction() as tx:
        tx.set_status("work_items", wid, WorkStatus.ENDED, stop_reason="max_iterations")


def dispatched(stub) -> list[tuple[str, str]]:
    return [(e.payload["work_id"], e.recipient) for e in stub.messages(Kind.DISPATCH)]


@pytest.fixture
def coordinator(org_home, clock, cw):
    """The coordinator role in-process: a StubTransport, the test's clock, a $5 org spend cap,
    no desktop notifications."""
    role_row(cw, "coordinator", "coordinator", ready=False)
    stub = StubTransport("coordinator", clock=clock)
    cfg = config_mod.Config({"limits": {"total_spend_usd": 5.0}, "attention": {"notify_send": False}})
    proc = CoordinatorProcess(org_home, "coordinator", transport=stub, clock=clock, monotonic=clock, cfg=cfg)
    proc.start()
    yield proc, stub
    proc.close()


def tick(proc, clock) -> None:
    """One reconcile: the monotonic clock reaches the next tick, then one turn of the loop."""
    clock.advance(proc.tick_s)
    proc.step(max_wait_ms=0)


def test_dispatch_messages_go_to_the_agent_idle_longest_so_work_is_shared(coordinator, clock, cw):
    proc, stub = coordinator
    for a in ("loop-agent-1", "loop-agent-2", "loop-agent-3"):
        role_row(cw, a, "loop-agent")
    for i in range(6):
        submit(cw, f"w{i}", f"/ws/{i}")
        clock.advance(1)
    tick(proc, clock)
    first = dispatched(stub)
    assert [w for w, _ in first] == ["w0", "w1", "w2"]          # oldest first, one per free agent
    for n, (wid, agent) in enumerate(first):                   # each starts and ends, one after the other
        clock.advance(1)
        run_and_end(cw, wid, agent)
        beat(cw, "loop-agent-1", "loop-agent-2", "loop-agent-3")
        tick(proc, clock)
    assert [w for w, _ in dispatched(stub)] == [f"w{i}" for i in range(6)]
    by_agent = {}
    for _, agent in dispatched(stub):
        by_agent[agent] = by_agent.get(agent, 0) + 1
    assert by_agent == {"loop-agent-1": 2, "loop-agent-2": 2, "loop-agent-3": 2}
    # the second round follows the order in which agents last started work: idle longest first
    assert [a for _, a in dispatched(stub)[3:]] == [a for _, a in first]


def test_a_run_whose_agent_stops_beating_is_requeued_and_sent_to_a_live_one(org_home, coordinator, clock, cw):
    proc, stub = coordinator
    role_row(cw, "loop-agent-1", "loop-agent")
    submit(cw, "x", "/ws/x")
    tick(proc, clock)
    assert dispatched(stub) == [("x", "loop-agent-1")]
    role_row(cw, "loop-agent-2", "loop-agent")
    clock.advance(9.0)                           # + this tick and the first: 10 s since loop-agent-1's beat
    beat(cw, "loop-agent-2")
    tick(proc, clock)                            # loop-agent-1's heartbeat is 10 s old: the timeout, still alive
    assert dispatched(stub) == [("x", "loop-agent-1")]
    beat(cw, "loop-agent-2")
    tick(proc, clock)                            # 10.5 s: gone; its run goes to the live agent in the same pass
    assert dispatched(stub) == [("x", "loop-agent-1"), ("x", "loop-agent-2")]
    row = _rows(org_home, "SELECT status, assigned_to FROM work_items WHERE id='x'")[0]
    assert row == {"status": "dispatched", "assigned_to": "loop-agent-2"}


def test_past_the_spend_cap_nothing_is_dispatched_and_waiting_work_ends(org_home, coordinator, clock, cw):
    proc, stub = coordinator
    role_row(cw, "loop-agent-1", "loop-agent")
    submit(cw, "spent", "/ws/s")
    tick(proc, clock)
    assert dispatched(stub) == [("spent", "loop-agent-1")]
    submit(cw, "queued", "/ws/q")
    submit(cw, "waiting", "/ws/s")
    with cw(Actor.LOOP_AGENT, "loop-agent-1").transaction() as tx:
        tx.insert("model_calls", {"request_id": "r1", "work_id": "spent", "model": "m", "input_tokens": 1,
                                  "output_tokens": 1, "cost_usd": 4.99, "at": tx.now})
    tick(proc, clock)                            # $4.99 < $5: nothing ends, no agent is free
    assert _rows(org_home, "SELECT count(*) AS n FROM work_items WHERE status='ended'")[0]["n"] == 0
    with cw(Actor.LOOP_AGENT, "loop-agent-1").transaction() as tx:
        tx.insert("model_calls", {"request_id": "r2", "work_id": "spent", "model": "m", "input_tokens": 1,
                                  "output_tokens": 1, "cost_usd": 0.01, "at": tx.now})
    run_and_end(cw, "spent", "loop-agent-1")     # the agent is free again: still nothing goes out
    beat(cw, "loop-agent-1")
    tick(proc, clock)
    assert dispatched(stub) == [("spent", "loop-agent-1")]
    rows = {r["id"]: r for r in _rows(org_home, "SELECT id, status, stop_reason FROM work_items")}
    assert rows["queued"] == {"id": "queued", "status": "ended", "stop_reason": "org_limit"}
    assert rows["waiting"] == {"id": "waiting", "status": "ended", "stop_reason": "org_limit"}


def test_a_freed_workspace_is_promoted_and_dispatched_in_the_same_pass(org_home, coordinator, clock, cw):
    proc, stub = coordinator
    role_row(cw, "loop-agent-1", "loop-agent")
    role_row(cw, "loop-agent-2", "loop-agent")
    submit(cw, "first", "/ws/same")
    clock.advance(1)
    submit(cw, "second", "/ws/same")
    clock.advance(1)
    submit(cw, "third", "/ws/same")
    tick(proc, clock)
    assert dispatched(stub) == [("first", "loop-agent-1")]      # one run per workspace; agent 2 stays free
    run_and_end(cw, "first", "loop-agent-1")
    beat(cw, "loop-agent-1", "loop-agent-2")
    tick(proc, clock)
    assert dispatched(stub) == [("first", "loop-agent-1"), ("second", "loop-agent-2")]
    assert _rows(org_home, "SELECT work_id FROM workspace_locks") == [{"work_id": "second"}]
    assert _rows(org_home, "SELECT status FROM work_items WHERE id='third'")[0]["status"] == "waiting"


def test_a_wake_reconciles_at_once_and_only_authorised_messages_reach_the_coordinator(coordinator, clock, cw):
    proc, stub = coordinator
    role_row(cw, "loop-agent-1", "loop-agent")
    tick(proc, clock)                            # nothing queued yet; the next tick is 0.5 s away
    submit(cw, "w", "/ws/w")
    env = stub.deliver(Kind.WAKE, {"work_id": "w"}, sender="human")
    proc.step(max_wait_ms=0)
    assert dispatched(stub) == [("w", "loop-agent-1")]
    stub.deliver(Kind.WAKE, {}, sender="human", msg_id=env.id)   # the same message again: handled once
    stub.deliver(Kind.PING, {"reply_to": "human"}, sender="supervisor")
    stub.deliver(Kind.STOP, {}, sender="loop-agent-1")          # only the supervisor may stop a role
    proc.step(max_wait_ms=0)
    assert [(e.kind, e.recipient) for e in stub.messages(Kind.PONG)] == [("pong", "human")]
    assert sorted(code for _, code in stub.dropped) == ["duplicate", "not_authorized"]
    assert not proc.stopping
    stub.deliver(Kind.STOP, {}, sender="supervisor")
    proc.step(max_wait_ms=0)
    assert proc.stopping


def test_the_messages_of_one_turn_are_one_reconcile(coordinator, clock, cw):
    """Many runs ending together (a wake each) make one dispatch pass, in the turn they arrive in."""
    proc, stub = coordinator
    for a in ("loop-agent-1", "loop-agent-2"):
        role_row(cw, a, "loop-agent")
    tick(proc, clock)                            # the next tick is 0.5 s away
    passes = []
    real = proc.reconcile
    proc.reconcile = lambda: passes.append(1) or real()
    submit(cw, "w1", "/ws/1")
    submit(cw, "w2", "/ws/2")
    for i in range(5):
        stub.deliver(Kind.WAKE, {"work_id": f"w{i}"}, sender="human")
    proc.step(max_wait_ms=0)
    assert len(passes) == 1
    assert sorted(w for w, _ in dispatched(stub)) == ["w1", "w2"]


def test_the_stub_refuses_a_kind_the_role_may_not_send(coordinator):
    _, stub = coordinator
    with pytest.raises(Rejected, match="not_authorized|may not send"):
        stub.send("loop-agent-1", Kind.VERDICT_READY, {})
