"""The typed read model (state_db/queries/): every read of state.db outside state_db/ goes through
it, its functions return frozen dataclasses built from real migrated rows, there is one
"latest eval-agent verdict", and the org's spend remembers what retention folded away."""
from __future__ import annotations

import dataclasses
import re
import sqlite3
import time
from pathlib import Path

import pytest

from roles.coordinator.dispatch import reconcile
from roles.operations.retention import collect
from state_db.kernel import config as config_mod
from state_db.connection import connect
from state_db.queries import decisions, processes, verdicts, work
from state_db.queries.base import plain
from state_db.queries.events import after, last_id
from state_db.queries.iterations import count, iteration, last_n, of_work as iterations_of, open_attempt
from state_db.queries.usage import Usage, calls, of_work as usage_of, org_spend
from state_db.queries.work import Caps, WorkItem
from state_db.retention import DAY
from state_db.vocab import Actor, DecisionStatus, WorkStatus
from state_db.writer import StateWriter
from tests.support.state import assign_and_run, commit_iteration, submit, verdict

ROOT = Path(__file__).resolve().parents[1]
# where SQL may be written: the state layer, and the benchmarks and tests that check what was stored
SQL_ALLOWED = ("state_db", "bench", "tests")
SKIPPED = {".venv", ".git", "__pycache__", "node_modules"}
SELECT = re.compile(r"\bSELECT\b")


def _python_files():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if SKIPPED & set(rel.parts) or rel.parts[0] in SQL_ALLOWED:
            continue
        yield rel, path


def test_no_select_outside_state_db_bench_and_tests():
    """Roles, knowledge, skills, transport and the CLI read state.db only through state_db.queries."""
    found = [f"{rel}:{i}: {line.strip()[:100]}" for rel, path in _python_files()
             for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if SELECT.search(line)]
    assert not found, "SQL reads outside state_db/ (move them into state_db/queries/):\n" + "\n".join(found)


def test_no_query_binds_a_like_pattern():
    """A LIKE whose pattern is a bound parameter makes SQLite prepare the statement again on every
    run (its LIKE optimisation depends on the value): ~80 µs a query, on queries the loop asks
    several times an iteration. The patterns asked here are constants: they are written inline."""
    bound = re.compile(r"\bLIKE\s+\?", re.I)
    found = [f"{path.relative_to(ROOT)}:{i}: {line.strip()[:100]}"
             for path in sorted((ROOT / "state_db" / "queries").glob("*.py"))
             for i, line in enumerate(path.read_text().splitlines(), 1) if bound.search(line)]
    assert not found, "write the LIKE pattern into the SQL:\n" + "\n".join(found)
    assert bound.search("AND name LIKE ?") and not bound.search("AND name LIKE 'eval-agent%'")


def test_the_grep_sees_every_package_that_reads_state():
    """The check above would see a SELECT in each package that reads state (it is not vacuous)."""
    tops = {rel.parts[0] for rel, _ in _python_files()}
    assert {"roles", "scripts", "transport", "knowledge", "skills"} <= tops, tops


@pytest.fixture
def conn(org_home):
    c = connect(org_home.db_path, readonly=True)
    yield c
    c.close()


def test_a_work_item_is_frozen_typed_data_with_parsed_caps(writer_for, conn):
    submit(writer_for, "w1", caps={"max_iterations": 5, "budget_usd": 2.5, "not_a_cap": 1}, protect=["t/*.py"])
    item = work.item(conn, "w1")
    assert isinstance(item, WorkItem) and item.status == WorkStatus.QUEUED and not item.ended
    assert item.verify == ("pytest -q",) and item.protect == ("t/*.py",) and item.default_protect is True
    assert item.caps == Caps(max_iterations=5, budget_usd=2.5) and item.caps.timeout_s is None
    assert item.cancel_requested is False and item.toolchain == {} and item.review == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        item.status = "ended"
    assert work.item(conn, "nope") is None
    assert plain(item)["caps"] == {"max_iterations": 5, "budget_usd": 2.5}


def test_caps_have_one_parser_and_one_stored_form():
    assert Caps.names() == ("max_iterations", "budget_tokens", "budget_usd", "timeout_s")
    for raw in ('{"max_iterations": 3, "timeout_s": 60}', b'{"max_iterations": 3, "timeout_s": 60}',
                {"max_iterations": 3, "timeout_s": 60, "budget_usd": None}):
        assert Caps.from_json(raw) == Caps(max_iterations=3, timeout_s=60)
    assert Caps.from_json(None) == Caps.from_json("") == Caps.from_json("{}") == Caps() and not Caps()
    caps = Caps.given({"budget_tokens": 1000, "timeout_s": None}).over(Caps(max_iterations=3))
    assert caps.encode() == {"max_iterations": 3, "budget_tokens": 1000}
    assert caps.sources == (("budget_tokens", "flag"),)
    assert Caps.from_json(caps.to_json()) == caps and Caps.from_json(caps) is caps


def test_every_place_that_names_the_caps_names_the_same_ones():
    """The flags (submit's and continue's) and the MCP tools' schema are keyed by ``Caps``' fields;
    ``continue`` keeps no table of its own."""
    from roles.operations import continue_run
    from roles.operations.caps import CAP_FLAGS
    from scripts.cli.mcp_tools import CAPS as MCP_CAPS
    assert tuple(CAP_FLAGS) == tuple(MCP_CAPS) == Caps.names()
    assert not hasattr(continue_run, "CAPS")


def test_locks_waiting_items_and_busy_agents(writer_for, conn):
    submit(writer_for, "a", workspace="/ws/one")
    with writer_for(Actor.HUMAN).transaction() as tx:
        tx.insert("workspace_locks", {"workspace": "/ws/one", "work_id": "a", "acquired_at": tx.now})
    submit(writer_for, "b", workspace="/ws/one", status=WorkStatus.WAITING, created_at=time.time() + 1)
    assert work.lock_holder(conn, "/ws/one") == "a" and work.lock_holder(conn, "/ws/two") is None
    assert work.waiting_on_free_workspace(conn) == []            # a holds it
    assign_and_run(writer_for, "a")
    assert work.busy_agents(conn, WorkStatus.RUNNING) == {"loop-agent-1"}
    assert [w.id for w in work.with_status(conn, WorkStatus.RUNNING, WorkStatus.WAITING)] == ["a", "b"]
    assert work.assigned_to(conn, "loop-agent-1", WorkStatus.RUNNING).id == "a"
    with writer_for(Actor.HUMAN).transaction() as tx:
        tx.set_status("work_items", "a", WorkStatus.ENDED, stop_reason="cancelled")
    assert work.locks_of_ended(conn) == ["/ws/one"]


def test_the_latest_eval_verdict_is_the_only_one_that_counts(writer_for, org_home, conn):
    """Latest per iteration and overall; a row not written by an eval-agent is never taken."""
    submit(writer_for)
    assign_and_run(writer_for)
    commit_iteration(writer_for, n=1)
    assert verdicts.latest_eval_verdict(conn, "w1") is None and not verdicts.verified(conn, "w1", 1)
    verdict(writer_for, n=1, outcome="fail")
    time.sleep(0.01)                                  # a later verdict of the same iteration
    verdict(writer_for, n=1, outcome="pass", instance="eval-agent-2")
    commit_iteration(writer_for, n=2)
    verdict(writer_for, n=2, outcome="fail")
    # a forged row (never possible through StateWriter): written by a loop-agent, for iteration 3
    raw = sqlite3.connect(org_home.db_path)
    raw.execute("INSERT INTO verdicts(id, work_id, iteration, outcome, written_by, at) "
                "VALUES ('forged', 'w1', 3, 'pass', 'loop-agent-1', ?)", (time.time(),))
    raw.commit()
    raw.close()
    latest = verdicts.latest_eval_verdict(conn, "w1")
    assert (latest.iteration, latest.outcome, latest.passed) == (2, "fail", False)
    first = verdicts.latest_eval_verdict(conn, "w1", 1)
    assert (first.outcome, first.written_by) == ("pass", "eval-agent-2")
    assert verdicts.latest_eval_verdict(conn, "w1", 3) is None
    assert {n: v.outcome for n, v in verdicts.latest_eval_verdicts(conn, "w1").items()} == {1: "pass", 2: "fail"}
    assert verdicts.latest_iteration_passed(conn, "w1") is False and verdicts.verified(conn, "w1", 2)
    assert isinstance(latest.checks, tuple) and latest.review is None


def test_what_the_eval_agent_owes_follows_preflight_iterations_and_verdicts(writer_for, conn):
    submit(writer_for)
    assert verdicts.due(conn) == [verdicts.Due("w1", 0, None)]
    assign_and_run(writer_for)
    with writer_for(Actor.EVAL_AGENT, "eval-agent-1").transaction() as tx:
        tx.insert("preflights", {"work_id": "w1", "outcome": "ready", "checks": [{"command": "pytest -q"}],
                                 "detail": "baseline: 1 failing", "written_by": "eval-agent-1", "at": tx.now})
    assert verdicts.due(conn) == [] and verdicts.verified(conn, "w1", 0)
    assert verdicts.preflight(conn, "w1").checks == ({"command": "pytest -q"},)
    commit_iteration(writer_for, n=1)
    assert verdicts.due(conn) == [verdicts.Due("w1", 1, "loop-agent-1")]
    verdict(writer_for, n=1, outcome="fail")
    assert verdicts.due(conn) == []


def test_preflights_nobody_waits_for_come_after_the_verdicts_running_loops_wait_for(writer_for, conn):
    """A queued item's preflight waits behind every committed iteration (its loop-agent waits
    for the verdict); a dispatched item's preflight does not (its loop-agent waits for it)."""
    submit(writer_for, "w1")
    assign_and_run(writer_for, "w1")
    with writer_for(Actor.EVAL_AGENT, "eval-agent-1").transaction() as tx:
        tx.insert("preflights", {"work_id": "w1", "outcome": "ready", "checks": [], "detail": "",
                                 "written_by": "eval-agent-1", "at": tx.now})
    commit_iteration(writer_for, "w1", n=1)
    for k in range(3):                                   # a batch, submitted after w1
        submit(writer_for, f"q{k}", workspace=f"/tmp/q{k}")
    submit(writer_for, "w2", workspace="/tmp/w2")
    assign_and_run(writer_for, "w2", instance="loop-agent-2")
    assert verdicts.due(conn) == [verdicts.Due("w2", 0, "loop-agent-2"), verdicts.Due("w1", 1, "loop-agent-1"),
                                  verdicts.Due("q0", 0, None), verdicts.Due("q1", 0, None), verdicts.Due("q2", 0, None)]


def test_iterations_and_attempts(writer_for, conn):
    submit(writer_for)
    assign_and_run(writer_for)
    with writer_for(Actor.LOOP_AGENT, "loop-agent-1").transaction() as tx:
        tx.insert("attempts", {"work_id": "w1", "attempt": 1, "iteration": 1, "instance": "loop-agent-1",
                               "started_at": tx.now})
    assert open_attempt(conn, "w1").attempt == 1 and last_n(conn, "w1") == 0
    with writer_for(Actor.LOOP_AGENT, "loop-agent-1").transaction() as tx:
        tx.insert("iterations", {"work_id": "w1", "n": 1, "attempt": 1, "act_status": "ok",
                                 "tool_calls": [{"name": "edit_file"}], "changed_paths": ["calc.py"],
                                 "input_tokens": 10, "output_tokens": 5, "prompt": {"skills": ["x"]},
                                 "committed_at": tx.now})
        tx.update("attempts", ("w1", 1), ended_at=tx.now, outcome="committed")
    it = iteration(conn, "w1", 1)
    assert (it.tool_calls, it.changed_paths, it.prompt, it.tokens) == (({"name": "edit_file"},), ("calc.py",),
                                                                        {"skills": ["x"]}, 15)
    assert open_attempt(conn, "w1") is None and count(conn, "w1") == last_n(conn, "w1") == 1
    light = iterations_of(conn, "w1", prompts=False)[0]
    assert light.prompt == {} and light.changed_paths == ("calc.py",)


def test_decisions(writer_for, conn):
    submit(writer_for)
    with writer_for(Actor.LOOP_AGENT, "loop-agent-1").transaction() as tx:
        tx.insert("decisions", {"id": "d1", "work_id": "w1", "iteration": 1, "kind": "network",
                                "action": {"kind": "network", "command": "curl x"}, "question": "q",
                                "status": DecisionStatus.PENDING, "created_at": tx.now})
    d = decisions.decision(conn, "d1")
    assert (d.command, d.stop_run, d.action["kind"]) == ("curl x", False, "network")
    assert decisions.has_pending(conn, "w1") and decisions.has_pending(conn, "w1", kind="network", command="curl x")
    assert not decisions.has_pending(conn, "w1", kind="network", command="curl y")
    assert [x.id for x in decisions.pending(conn)] == ["d1"] == [x.id for x in decisions.of_work(conn, "w1", "pending")]
    assert decisions.of_work(conn, "w1", "rejected") == [] and not decisions.rejected_to_stop(conn, "w1", "network")
    assert plain(decisions.recent(conn, 5))[0]["action"] == {"kind": "network", "command": "curl x"}


def test_the_journal_and_the_processes(writer_for, conn):
    before = last_id(conn)
    submit(writer_for)
    new = after(conn, before)
    assert new and new[-1].id == last_id(conn) and all(isinstance(e.data, dict) for e in new)
    assert [e.subject for e in after(conn, before, "work_items.created")] == ["w1"]
    with writer_for(Actor.SUPERVISOR).transaction() as tx:
        tx.insert("role_instances", {"instance": "loop-agent-1", "role": "loop-agent", "status": "starting",
                                     "updated_at": tx.now})
    (role,) = processes.role_instances(conn, Actor.LOOP_AGENT)
    assert (role.instance, role.status, role.restarts) == ("loop-agent-1", "starting", 0)


def _old_run_and_a_queued_one(home, *, spent_old: float, spent_live: float) -> None:
    """An ended run whose calls are 40 days old, and a queued run with one recent call."""
    old = time.time() - 40 * DAY
    human = StateWriter(home.db_path, Actor.HUMAN, clock=lambda: old)
    agent = StateWriter(home.db_path, Actor.LOOP_AGENT, "loop-agent-1")
    try:
        with human.transaction() as tx:
            for wid in ("old", "live"):
                tx.insert("work_items", {"id": wid, "goal": "g", "workspace": f"/ws/{wid}", "backend": "anthropic",
                                         "status": WorkStatus.QUEUED, "created_by": "t", "created_at": old,
                                         "updated_at": old})
            tx.set_status("work_items", "old", WorkStatus.ENDED, stop_reason="cancelled")
        with agent.transaction() as tx:
            for rid, wid, cost, at in (("c1", "old", spent_old / 2, old), ("c2", "old", spent_old / 2, old),
                                       ("c3", "live", spent_live, time.time())):
                tx.insert("model_calls", {"request_id": rid, "work_id": wid, "model": "m", "input_tokens": 100,
                                          "output_tokens": 10, "cost_usd": cost, "at": at})
    finally:
        human.close()
        agent.close()


def test_gc_folds_old_calls_away_and_the_dispatch_spend_cap_still_trips(org_home, conn):
    """`org gc` (the operation) prunes the ended run's 40-day-old calls into a summary: the calls
    left cost $0.25, under a $1 cap, yet the org has spent $2.25, so the coordinator's reconcile
    ends the queued run with org_limit."""
    _old_run_and_a_queued_one(org_home, spent_old=2.0, spent_live=0.25)
    before = usage_of(conn)
    out = collect(org_home, config_mod.load_config(org_home), dry_run=False, history=False, older_than_days=30)
    assert out["model_calls"] == 2 and out["runs_summarized"] == 1
    assert [c.cost_usd for c in calls(conn)] == [0.25]                     # the old calls are gone
    assert usage_of(conn) == before and usage_of(conn, "old") == Usage(2, 200, 20, 0, 0, 2.0)
    assert org_spend(conn) == pytest.approx(2.25)
    coordinator = StateWriter(org_home.db_path, Actor.COORDINATOR)
    try:
        assert reconcile(coordinator, heartbeat_timeout_s=10.0, spend_cap_usd=1.0)["capped"] == ["live"]
    finally:
        coordinator.close()
    ended = work.item(conn, "live")
    assert (ended.status, ended.stop_reason) == (WorkStatus.ENDED, "org_limit") and "$2.25" in ended.stop_detail
