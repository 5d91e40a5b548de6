"""The human gate inside the loop: approve runs once, reject, edit, respond, and a crash with the
``executing`` marker set asks the human again instead of running twice."""
from __future__ import annotations

import threading

import pytest

from roles.loop_agent.engine import LoopSettings
from roles.operations.decide import decide
from state_db import config
from tests.support.loop import FIXED, ScriptedActs, engine, make_workspace, submit
from tests.support.org import query, wait_for

ASK = {"request": {"kind": "network", "command": "echo fetched >> fetched.txt", "reason": "need the upstream file"}}
GOOD = {"write": {"calc.py": FIXED}}


@pytest.fixture
def ws(tmp_path):
    return make_workspace(tmp_path)


def run_until_decided(org_home, verdict, text=None, stop=False, runner=None, acts=None):
    """Run the engine in a thread; decide the first pending decision; return (decision, engine result)."""
    settings = LoopSettings(gate_runner=runner or (lambda c, k, w: (0, "ran")))
    backend = ScriptedActs(acts or [[ASK], [GOOD]])
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("d", engine(org_home, "w1", backend, settings=settings).run()))
    t.start()
    pending = wait_for(lambda: query(org_home, "SELECT * FROM decisions WHERE status='pending'"), what="a decision")
    assert query(org_home, "SELECT status FROM work_items")[0]["status"] == "paused"
    decide(org_home, config.load(None), pending[0]["id"], verdict, text, stop=stop)
    t.join(30)
    assert not t.is_alive()
    return query(org_home, "SELECT * FROM decisions")[0], result.get("d"), backend


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
        raise KeyboardInterrupt("the loop-agent died while the approved action ran")

    died = []

    def first_process():
        try:
            engine(org_home, "w1", ScriptedActs([[ASK], [GOOD]]), settings=LoopSettings(gate_runner=crashing)).run()
        except KeyboardInterrupt as exc:
            died.append(exc)

    t1 = threading.Thread(target=first_process)
    t1.start()
    pending = wait_for(lambda: query(org_home, "SELECT * FROM decisions WHERE status='pending'"), what="a decision")
    decide(org_home, config.load(None), pending[0]["id"], "approve")
    t1.join(30)
    assert died, "the runner's crash did not end the first engine"
    assert query(org_home, "SELECT status FROM decisions")[0]["status"] == "executing"
    # a new process resumes the run: the marker makes it ask again, and nothing runs meanwhile
    stop = threading.Event()
    t = threading.Thread(target=lambda: engine(org_home, "w1", ScriptedActs([[ASK], [GOOD]]),
                                               settings=LoopSettings(gate_runner=lambda *a: ran.append("again") or (0, "")),
                                               pause=stop).run())
    t.start()
    row = wait_for(lambda: (r := query(org_home, "SELECT * FROM decisions")[0])["status"] == "pending" and r,
                   what="the decision to be asked again")
    assert "interrupted while executing" in row["result"]
    stop.set()
    t.join(30)
    assert ran == ["echo fetched >> fetched.txt"], "the approved action ran twice"
