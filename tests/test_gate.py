"""The human gate inside the loop: approve runs once, reject, edit, respond, and a crash with the
``executing`` marker set asks the human again instead of running twice."""
from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest

from roles.loop_agent import gate
from roles.loop_agent.engine import LoopSettings
from roles.operations.decide import decide
from state_db.kernel import config
from tests.support.loop import FIXED, ScriptedActs, engine, make_workspace, submit
from scripts.cli import main as cli_main
from state_db.queries.decisions import Decision
from state_db.vocab import Actor, WorkStatus
from state_db.writer import StateWriter
from tests.support.org import query

ASK = {"request": {"kind": "network", "command": "echo fetched >> fetched.txt", "reason": "need the upstream file"}}
GOOD = {"write": {"calc.py": FIXED}}


@pytest.fixture
def ws(tmp_path):
    return make_workspace(tmp_path)


def redispatch(org_home, work_id="w1", agent="loop-agent-1") -> None:
    """What the coordinator does once a parked run's decisions are made: queue it, dispatch it."""
    from roles.coordinator.dispatch import unpark
    co = StateWriter(org_home.db_path, Actor.COORDINATOR)
    with co.transaction() as tx:
        assert unpark(tx) == [work_id]
        tx.set_status("work_items", work_id, WorkStatus.DISPATCHED, assigned_to=agent)
    co.close()


def run_until_decided(org_home, verdict, text=None, stop=False, runner=None, acts=None):
    """Run the engine until it parks on a decision; decide it; dispatch the run again and run
    it; return (decision, engine result, backend)."""
    settings = LoopSettings(gate_runner=runner or (lambda c, k, w: (0, "ran")))
    backend = ScriptedActs(acts or [[ASK], [GOOD]])
    assert engine(org_home, "w1", backend, settings=settings).run() is None      # parked
    pending = query(org_home, "SELECT * FROM decisions WHERE status='pending'")
    work = query(org_home, "SELECT status, assigned_to FROM work_items")[0]
    assert pending and work["status"] == "paused" and work["assigned_to"] is None
    decide(org_home, config.load(None), pending[0]["id"], verdict, text, stop=stop)
    redispatch(org_home)
    result = engine(org_home, "w1", backend, settings=settings).run()
    return query(org_home, "SELECT * FROM decisions")[0], result, backend


def test_approve_runs_the_action_once_and_feeds_its_output_back(org_home, ws):
    submit(org_home, ws)
    calls = []
    d, decision, backend = run_until_decided(org_home, "approve",
                                             runner=lambda c, k, w: calls.append((c, k)) or (0, "downloaded 3 files"))
    assert calls == [("echo fetched >> fetched.txt", "network")]
    assert d["status"] == "executed" and "downloaded 3 files" in d["result"]
    assert decision.reason == "goal_met"
    assert "Human approved" in backend.prompts[1] and "downloaded 3 files" in backend.prompts[1]


def test_edit_runs_the_edited_command(org_home, ws):
    submit(org_home, ws)
    calls = []
    d, _, _ = run_until_decided(org_home, "edit", "echo safer", runner=lambda c, k, w: calls.append(c) or (0, "ok"))
    assert calls == ["echo safer"] and d["status"] == "executed"


def test_reject_continues_without_it_and_respond_feeds_text(org_home, ws, tmp_path):
    submit(org_home, ws)
    calls = []
    d, decision, backend = run_until_decided(org_home, "reject", "not today",
                                             runner=lambda c, k, w: calls.append(c) or (0, ""))
    assert calls == [] and d["status"] == "rejected" and decision.reason == "goal_met"
    assert "Human rejected" in backend.prompts[1] and "not today" in backend.prompts[1]


def test_respond_hands_the_text_to_the_next_gather(org_home, ws):
    submit(org_home, ws)
    d, decision, backend = run_until_decided(org_home, "respond", "use the mirror at ./vendor instead")
    assert d["status"] == "responded" and "use the mirror at ./vendor instead" in backend.prompts[1]


def test_reject_with_stop_ends_human_rejected(org_home, ws):
    submit(org_home, ws)
    d, decision, _ = run_until_decided(org_home, "reject", stop=True, acts=[[ASK]])
    assert decision.reason == "human_rejected"


def test_crash_with_the_executing_marker_set_asks_again_and_never_runs_twice(org_home, ws):
    submit(org_home, ws)
    ran = []

    def crashing(command, kind, workspace):
        ran.append(command)
        (Path(workspace) / "half-written.txt").write_text("the action got this far\n")
        raise KeyboardInterrupt("the loop-agent died while the approved action ran")

    assert engine(org_home, "w1", ScriptedActs([[ASK], [GOOD]]), settings=LoopSettings(gate_runner=crashing)).run() is None
    pending = query(org_home, "SELECT * FROM decisions WHERE status='pending'")
    decide(org_home, config.load(None), pending[0]["id"], "approve")
    redispatch(org_home)
    with pytest.raises(KeyboardInterrupt):
        engine(org_home, "w1", ScriptedActs([[ASK], [GOOD]]), settings=LoopSettings(gate_runner=crashing)).run()
    row = query(org_home, "SELECT status, executor FROM decisions")[0]
    assert row["status"] == "executing" and row["executor"].startswith(f"{os.getpid()}:")
    # a new engine resumes the run: the marker (of an engine that is gone) makes it ask again, and
    # nothing runs meanwhile: the run parks
    again = engine(org_home, "w1", ScriptedActs([[ASK], [GOOD]]),
                   settings=LoopSettings(gate_runner=lambda *a: ran.append("again") or (0, ""))).run()
    assert again is None
    row = query(org_home, "SELECT * FROM decisions")[0]
    assert row["status"] == "pending" and "interrupted while executing" in row["result"]
    assert ran == ["echo fetched >> fetched.txt"], "the approved action ran twice"
    # the question a human sees again says what happened: approved before, started, what it
    # changed meanwhile, that it may have run partly; and it is the same question everywhere
    question = row["question"]
    assert question.startswith("ASKED AGAIN: `echo fetched >> fetched.txt` was approved by ")
    for said in ("started at ", "by process ", "may have run partly", "half-written.txt", "first asked: "):
        assert said in question, question
    out = io.StringIO()
    with contextlib.redirect_stdout(out):            # the CLI prints the whole question below its table
        assert cli_main.main(["--home", str(org_home.root), "decisions"]) == 0
    assert f"{row['id']}: {question}" in out.getvalue()
    # asked again a second time, it does not nest the story
    assert gate.again(Decision.from_row(row), []).count("first asked: ") == 1


def test_a_marker_held_by_another_live_process_is_not_asked_again(org_home, ws):
    """Only a dead executor's marker becomes a question: a live one is still running the action."""
    import subprocess
    import sys as _sys
    from state_db.kernel.processes import identity
    submit(org_home, ws)
    assert engine(org_home, "w1", ScriptedActs([[ASK], [GOOD]])).run() is None
    did = query(org_home, "SELECT id FROM decisions")[0]["id"]
    decide(org_home, config.load(None), did, "approve")
    other = subprocess.Popen([_sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        la = StateWriter(org_home.db_path, Actor.LOOP_AGENT, "loop-agent-1")
        with la.transaction() as tx:
            tx.set_status("decisions", did, "executing", executor=identity(other.pid))
        assert gate.ask_again_if_interrupted(la, "w1") == 0
        other.kill()
        other.wait()
        assert gate.ask_again_if_interrupted(la, "w1") == 1
        la.close()
    finally:
        other.kill()


def test_the_approved_action_runs_after_the_crash_reset_and_its_effect_is_checkpointed(org_home, ws):
    """The action's effect survives: the reset comes first, the action's checkpoint is the state
    the next act starts from, and org diff shows it."""
    from roles.workbench.workspace.history import WorkspaceHistory

    def runner(command, kind, workspace):
        (Path(workspace) / "fetched.txt").write_text("from upstream\n")
        return 0, "fetched"

    submit(org_home, ws)
    settings = LoopSettings(gate_runner=runner)
    assert engine(org_home, "w1", ScriptedActs([[ASK], [GOOD]]), settings=settings).run() is None
    (ws / "stray.txt").write_text("left by a crashed attempt\n")           # must be reset, before the action
    decide(org_home, config.load(None), query(org_home, "SELECT id FROM decisions")[0]["id"], "approve")
    redispatch(org_home)
    assert engine(org_home, "w1", ScriptedActs([[ASK], [GOOD]]), settings=settings).run().reason == "goal_met"
    assert (ws / "fetched.txt").read_text() == "from upstream\n" and not (ws / "stray.txt").exists()
    d = query(org_home, "SELECT * FROM decisions")[0]
    assert d["status"] == "executed" and d["checkpoint"]
    history = WorkspaceHistory(org_home.history_dir / "w1.git", ws)
    assert "fetched.txt" in history.diff(history.baseline_commit(), d["checkpoint"])
    its = query(org_home, "SELECT n, checkpoint, changed_paths FROM iterations WHERE work_id='w1' ORDER BY n")
    assert "fetched.txt" in history.diff(history.baseline_commit(), its[-1]["checkpoint"])
    assert "fetched.txt" not in its[-1]["changed_paths"]      # the action's change, not iteration 2's


def test_identical_requests_are_one_decision(org_home, ws):
    submit(org_home, ws)
    assert engine(org_home, "w1", ScriptedActs([[ASK, ASK]])).run() is None
    assert len(query(org_home, "SELECT * FROM decisions WHERE status='pending'")) == 1
    import sqlite3
    conn = sqlite3.connect(org_home.db_path)
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("""INSERT INTO decisions (id, work_id, iteration, kind, action, status, created_at)
                        SELECT 'd-dup', work_id, iteration, kind, action, 'pending', created_at FROM decisions""")
    conn.close()


def test_an_approved_scope_request_widens_this_run_only_and_runs_nothing(org_home, ws):
    """request_action kind scope: a human decision; approved, its glob is added to the run's scope
    (the eval-agent reads it at the next verification) and no command runs."""
    submit(org_home, ws)
    calls = []
    ask = {"request": {"kind": "scope", "command": "docs/**", "reason": "the goal asks for the docs too"}}
    d, decision, backend = run_until_decided(org_home, "approve", acts=[[ask], [GOOD]],
                                             runner=lambda c, k, w: calls.append(c) or (0, "ran"))
    assert calls == [] and d["status"] == "executed" and "docs/**" in d["result"]
    assert d["question"].startswith("scope: ") and "change scope" in d["question"] and "docs/**" in d["question"]
    assert query(org_home, "SELECT scope FROM work_items WHERE id='w1'")[0]["scope"] == '["docs/**"]'
    assert decision.reason == "goal_met"
