"""StateWriter: transitions, writer checks, journal, idempotency, hooks (issue 2 proof)."""
from __future__ import annotations

import sqlite3
import time

import pytest

from state_db.connection import connect
from state_db.kernel.errors import Conflict, IllegalTransition, NotAllowed
from state_db.vocab import Actor, StopReason, WorkStatus
from tests.support.state import assign_and_run, commit_iteration, submit, verdict


def count(home, sql, params=()):
    conn = connect(home.db_path, readonly=True)
    try:
        return conn.execute(sql, params).fetchone()[0]
    finally:
        conn.close()


def test_insert_journals_one_event_in_same_transaction(org_home, writer_for):
    submit(writer_for)
    assert count(org_home, "SELECT COUNT(*) FROM events WHERE kind='work_items.created' AND subject='w1'") == 1


def test_illegal_transition_raises_coded_error_and_writes_nothing(org_home, writer_for):
    submit(writer_for)
    events_before = count(org_home, "SELECT COUNT(*) FROM events")
    with pytest.raises(IllegalTransition) as err:
        with writer_for(Actor.COORDINATOR).transaction() as tx:
            tx.set_status("work_items", "w1", WorkStatus.PAUSED)  # queued -> paused is not allowed
    assert err.value.code == "illegal_transition"
    assert count(org_home, "SELECT status = 'queued' FROM work_items WHERE id='w1'") == 1
    assert count(org_home, "SELECT COUNT(*) FROM events") == events_before


def test_failed_transaction_rolls_back_earlier_writes_in_it(org_home, writer_for):
    submit(writer_for)
    with pytest.raises(IllegalTransition):
        with writer_for(Actor.COORDINATOR).transaction() as tx:
            tx.set_status("work_items", "w1", WorkStatus.DISPATCHED, assigned_to="loop-agent-1")
            tx.set_status("work_items", "w1", WorkStatus.PAUSED)
    assert count(org_home, "SELECT status = 'queued' AND assigned_to IS NULL FROM work_items") == 1


def test_terminal_state_is_final(org_home, writer_for):
    submit(writer_for)
    with writer_for(Actor.HUMAN).transaction() as tx:
        tx.set_status("work_items", "w1", WorkStatus.ENDED, stop_reason=StopReason.CANCELLED)
    for new in (WorkStatus.RUNNING, WorkStatus.QUEUED, WorkStatus.ENDED):
        with pytest.raises(IllegalTransition):
            with writer_for(Actor.COORDINATOR).transaction() as tx:
                tx.set_status("work_items", "w1", new, stop_reason=StopReason.MAX_ITERATIONS)
    assert count(org_home, "SELECT stop_reason FROM work_items") == "cancelled"


def test_ending_needs_a_stop_reason_from_the_closed_set(org_home, writer_for):
    submit(writer_for)
    with pytest.raises(Exception) as err:
        with writer_for(Actor.HUMAN).transaction() as tx:
            tx.set_status("work_items", "w1", WorkStatus.ENDED, stop_reason="felt_done")
    assert err.value.code == "bad_stop_reason"


def test_loop_agent_may_not_write_a_verdict(org_home, writer_for):
    submit(writer_for)
    assign_and_run(writer_for)
    commit_iteration(writer_for)
    with pytest.raises(NotAllowed) as err:
        with writer_for(Actor.LOOP_AGENT, "loop-agent-1").transaction() as tx:
            tx.insert("verdicts", {"id": "v1", "work_id": "w1", "iteration": 1, "outcome": "pass",
                                   "written_by": "loop-agent-1", "at": time.time()})
    assert err.value.code == "not_allowed"
    assert count(org_home, "SELECT COUNT(*) FROM verdicts") == 0


def test_eval_agent_may_not_sign_a_verdict_with_another_name(org_home, writer_for):
    submit(writer_for)
    with pytest.raises(NotAllowed):
        with writer_for(Actor.EVAL_AGENT, "eval-agent").transaction() as tx:
            tx.insert("verdicts", {"id": "v1", "work_id": "w1", "iteration": 1, "outcome": "pass",
                                   "written_by": "eval-agent-9", "at": time.time()})


def test_loop_agent_may_not_mark_its_own_run_goal_met_even_with_a_pass(org_home, writer_for):
    submit(writer_for)
    assign_and_run(writer_for)
    commit_iteration(writer_for)
    verdict(writer_for, outcome="pass")
    with pytest.raises(NotAllowed):
        with writer_for(Actor.LOOP_AGENT, "loop-agent-1").transaction() as tx:
            tx.set_status("work_items", "w1", WorkStatus.ENDED, stop_reason=StopReason.GOAL_MET)
    assert count(org_home, "SELECT status FROM work_items") == "running"


def test_goal_met_needs_a_passing_eval_verdict_on_the_latest_iteration(org_home, writer_for):
    submit(writer_for)
    assign_and_run(writer_for)
    commit_iteration(writer_for, n=1)
    verdict(writer_for, n=1, outcome="pass")
    commit_iteration(writer_for, n=2)
    verdict(writer_for, n=2, outcome="fail")
    ev = writer_for(Actor.EVAL_AGENT, "eval-agent-1")
    with pytest.raises(NotAllowed, match="no passing eval-agent verdict"):
        with ev.transaction() as tx:
            tx.set_status("work_items", "w1", WorkStatus.ENDED, stop_reason=StopReason.GOAL_MET)
    commit_iteration(writer_for, n=3)
    verdict(writer_for, n=3, outcome="pass")
    with ev.transaction() as tx:
        tx.set_status("work_items", "w1", WorkStatus.ENDED, stop_reason=StopReason.GOAL_MET)
    assert count(org_home, "SELECT stop_reason FROM work_items") == "goal_met"


def test_iteration_numbers_are_never_committed_twice_or_out_of_order(org_home, writer_for):
    submit(writer_for)
    assign_and_run(writer_for)
    commit_iteration(writer_for, n=1)
    with pytest.raises(Conflict):
        commit_iteration(writer_for, n=1)
    with pytest.raises(Conflict):
        commit_iteration(writer_for, n=3)
    assert count(org_home, "SELECT COUNT(*) FROM iterations") == 1


def test_only_the_assigned_loop_agent_commits_iterations(org_home, writer_for):
    submit(writer_for)
    assign_and_run(writer_for, instance="loop-agent-1")
    with pytest.raises(NotAllowed):
        commit_iteration(writer_for, n=1, instance="loop-agent-2")


def test_raw_sql_cannot_write_domain_tables(org_home, writer_for):
    submit(writer_for)
    with pytest.raises(NotAllowed):
        with writer_for(Actor.LOOP_AGENT, "loop-agent-1").transaction() as tx:
            tx.execute("UPDATE work_items SET status='ended', stop_reason='goal_met'")
    with writer_for(Actor.LOOP_AGENT, "loop-agent-1").transaction(render=False) as tx:
        tx.execute("INSERT INTO transport_counters(instance, name, value) VALUES ('x','pushed',1)")


def test_second_org_session_row_is_refused(org_home, writer_for):
    sup = writer_for(Actor.SUPERVISOR)
    with sup.transaction() as tx:
        tx.insert("org_session", {"id": 1, "status": "running", "updated_at": time.time()})
    with pytest.raises(Conflict):
        with sup.transaction() as tx:
            tx.insert("org_session", {"id": 1, "status": "running", "updated_at": time.time()})
    # even a raw insert with another id is refused by the schema's singleton check
    conn = connect(org_home.db_path)
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("INSERT INTO org_session(id, status, updated_at) VALUES (2, 'running', 0)")
    conn.close()


def test_same_idempotency_key_twice_does_the_thing_once(org_home, writer_for):
    human = writer_for(Actor.HUMAN)

    def do(tx):
        n = tx.one("SELECT COUNT(*) FROM work_items")[0]
        wid = f"w{n + 1}"
        tx.insert("work_items", {"id": wid, "goal": "g", "workspace": "/ws", "backend": "anthropic",
                                 "status": "queued", "created_by": "human", "created_at": 0, "updated_at": 0})
        return {"id": wid}

    first, replayed1 = human.run_once("key-1", "submit", do, args={"goal": "g"})
    second, replayed2 = human.run_once("key-1", "submit", do, args={"goal": "g"})
    assert (first, replayed1) == ({"id": "w1"}, False)
    assert (second, replayed2) == ({"id": "w1"}, True)
    assert count(org_home, "SELECT COUNT(*) FROM work_items") == 1
    assert count(org_home, "SELECT os_user IS NOT NULL FROM idempotency WHERE key='key-1'") == 1
    with pytest.raises(Conflict):
        human.run_once("key-1", "cancel", do, args={"goal": "g"})


def test_an_idempotency_key_is_bound_to_its_arguments(org_home, writer_for):
    """The same key with other arguments is a conflict (nothing written, no stored result handed
    back); with the same arguments, in any key order, it replays."""
    human = writer_for(Actor.HUMAN)
    calls = []

    def do(tx):
        calls.append(1)
        return {"n": len(calls)}

    assert human.run_once("k", "decide", do, args={"decision": "d1", "verdict": "approve"}) == ({"n": 1}, False)
    with pytest.raises(Conflict) as caught:
        human.run_once("k", "decide", do, args={"decision": "d2", "verdict": "approve"})
    assert caught.value.code == "idempotency_conflict" and "other arguments" in str(caught.value)
    assert human.run_once("k", "decide", do, args={"verdict": "approve", "decision": "d1"}) == ({"n": 1}, True)
    assert calls == [1]


def test_human_actor_records_os_user_on_events(org_home, writer_for):
    submit(writer_for)
    assert count(org_home, "SELECT os_user FROM events WHERE actor='human'")


def test_snapshot_hook_failure_keeps_the_commit(org_home, writer_for, caplog):
    from state_db.snapshot import SnapshotHook

    def broken(conn):
        raise RuntimeError("renderer exploded")

    hook = SnapshotHook(org_home.db_path, org_home.snapshots_dir / "org-state.md", render=broken, debounce_s=0)
    w = writer_for(Actor.HUMAN, hooks=[hook])
    submit(lambda *a, **k: w)
    assert count(org_home, "SELECT COUNT(*) FROM work_items") == 1


def test_snapshot_is_rendered_after_commit_and_debounced(org_home, writer_for):
    from state_db.snapshot import SnapshotHook, snapshot_event_id

    calls = []

    def render(conn):
        from state_db.snapshot import render_markdown
        calls.append(1)
        return render_markdown(conn)

    clock = [100.0]
    hook = SnapshotHook(org_home.db_path, org_home.snapshots_dir / "org-state.md", render=render, debounce_s=10,
                        clock=lambda: clock[0])
    w = writer_for(Actor.HUMAN, hooks=[hook])
    submit(lambda *a, **k: w, work_id="a")
    submit(lambda *a, **k: w, work_id="b")      # inside the window: deferred, not rendered now
    assert len(calls) == 1
    hook.flush()                                 # the trailing render happens
    assert len(calls) == 2
    assert snapshot_event_id(hook.out_path) == count(org_home, "SELECT MAX(id) FROM events")
    assert "| b |" in hook.out_path.read_text()


def test_ledger_writes_trigger_no_snapshot(org_home, writer_for):
    calls = []
    w = writer_for(Actor.LOOP_AGENT, "loop-agent-1", hooks=[lambda *_: calls.append(1)])
    with w.transaction(render=False) as tx:
        tx.execute("INSERT INTO delivery_ledger(msg_id, recipient, recorded_at) VALUES ('m1', 'x', 0)")
    assert calls == []
