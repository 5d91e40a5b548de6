"""'org continue': a run that ended on a cap or a budget goes on as the same work item with raised
caps, keeping its iterations, lessons, history and usage; other endings are refused with a code."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest

from roles.operations.continue_run import CONTINUABLE, ContinueRequest, continue_run
from state_db.kernel import config as config_mod
from state_db.kernel.errors import IllegalTransition, NotFound, StateError
from state_db.vocab import Actor, StopReason, WorkStatus
from state_db.writer import StateWriter
from tests.support.loop import ScriptedActs, engine, make_workspace, submit
from tests.support.org import query
from tests.test_engine import SHOW_AND_FAIL
from state_db.queries.work import Caps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATE_DONE = (f"{sys.executable} -c 'import sys; s = open(\"state\").read(); print(\"error: state \" + s); "
              f"sys.exit(s != \"done\")'")


def step(word):
    return [{"write": {"state": word}}]


@pytest.fixture
def ws(tmp_path):
    ws = make_workspace(tmp_path)
    (ws / "state").write_text("start")
    return ws


def go_on(home, work_id="w1", idempotency_key=None, **caps):
    return continue_run(home, config_mod.load(home.config_path), ContinueRequest(work_id, Caps(**caps), idempotency_key))


def dispatch(home, work_id="w1", instance="loop-agent-1"):
    co = StateWriter(home.db_path, Actor.COORDINATOR)
    with co.transaction() as tx:
        tx.set_status("work_items", work_id, WorkStatus.DISPATCHED, assigned_to=instance)
    co.close()


def work(home, wid="w1"):
    return query(home, "SELECT * FROM work_items WHERE id=?", (wid,))[0]


def usage(home, wid="w1"):
    return query(home, "SELECT COUNT(*) AS calls, SUM(input_tokens) AS input FROM model_calls WHERE work_id=?",
                 (wid,))[0]


def stopped_at_max_iterations(home, ws, backend, cap=2):
    submit(home, ws, caps={"max_iterations": cap}, verify=(STATE_DONE,), scope=("state",))
    decision = engine(home, "w1", backend).run()
    assert decision.reason == "max_iterations"


def test_a_run_stopped_at_max_iterations_continues_to_goal_met_with_iteration_numbers_carrying_on(org_home, ws):
    backend = ScriptedActs([step("attempt a"), step("attempt b"), step("done")])
    stopped_at_max_iterations(org_home, ws, backend)
    before = usage(org_home)
    out = go_on(org_home, max_iterations=4)
    assert (out["status"], out["seq"], out["stopped"], out["caps"]) == ("queued", 1, "max_iterations",
                                                                        {"max_iterations": 4})
    w = work(org_home)
    assert (w["status"], w["stop_reason"], w["stop_detail"], w["ended_at"], w["assigned_to"]) == (
        "queued", None, None, None, None)
    dispatch(org_home)
    decision = engine(org_home, "w1", backend).run()
    assert decision.reason == "goal_met"
    rows = query(org_home, "SELECT n, attempt, lesson, prompt FROM iterations WHERE work_id='w1' ORDER BY n")
    assert [(r["n"], r["attempt"]) for r in rows] == [(1, 1), (2, 2), (3, 3)]
    assert rows[0]["lesson"] and rows[1]["lesson"]              # the first two iterations' lessons are kept…
    manifest = json.loads(rows[2]["prompt"])
    assert manifest["iteration"] == 3 and manifest["lessons"]   # …and the third iteration is prompted with them
    after = usage(org_home)
    assert (before["calls"], after["calls"]) == (2, 3) and after["input"] == before["input"] + 100
    history = query(org_home, "SELECT * FROM stop_history WHERE work_id='w1'")
    assert [(h["seq"], h["stop_reason"], h["iterations"], json.loads(h["caps"]), json.loads(h["new_caps"]))
            for h in history] == [(1, "max_iterations", 2, {"max_iterations": 2}, {"max_iterations": 4})]
    assert history[0]["ended_at"] and history[0]["stop_detail"].startswith("2 iterations")
    events = query(org_home, "SELECT actor, data FROM events WHERE kind='work_items.continued'")
    assert [e["actor"] for e in events] == ["human"] and json.loads(events[0]["data"])["seq"] == 1
    assert work(org_home)["stop_reason"] == "goal_met"


def test_no_progress_after_a_continuation_looks_only_at_the_iterations_after_it(org_home, ws):
    submit(org_home, ws, verify=(SHOW_AND_FAIL,), caps={"max_iterations": 20}, scope=("state",))
    a, b = step("A"), step("B")
    backend = ScriptedActs([a, b, a, b, a, a, b, a, b, a])
    assert engine(org_home, "w1", backend).run().reason == "no_progress"
    assert len(query(org_home, "SELECT n FROM iterations")) == 5
    go_on(org_home)                                           # no cap given: the caps stay
    dispatch(org_home)
    decision = engine(org_home, "w1", backend).run()
    # iteration 6 repeats A for the fourth time in the last five: counted from the start it would
    # stop at once; after the continuation A must come back three times (6, 8, 10)
    assert decision.reason == "no_progress"
    assert len(query(org_home, "SELECT n FROM iterations")) == 10
    assert [h["stop_reason"] for h in query(org_home, "SELECT stop_reason FROM stop_history")] == ["no_progress"]


@pytest.mark.parametrize("reason", sorted(set(StopReason) - CONTINUABLE))
def test_final_endings_are_refused_and_nothing_is_written(org_home, ws, reason):
    submit(org_home, ws)
    raw = sqlite3.connect(org_home.db_path, isolation_level=None)
    raw.execute("UPDATE work_items SET status='ended', stop_reason=?, assigned_to=NULL WHERE id='w1'", (reason,))
    raw.close()
    events = len(query(org_home, "SELECT id FROM events"))
    with pytest.raises(StateError) as err:
        go_on(org_home, max_iterations=50)
    assert err.value.code == "not_continuable" and reason in str(err.value)
    assert work(org_home)["status"] == "ended" and work(org_home)["stop_reason"] == reason
    assert query(org_home, "SELECT * FROM stop_history") == []
    assert len(query(org_home, "SELECT id FROM events")) == events


def test_a_run_that_has_not_ended_or_does_not_exist_is_refused(org_home, ws):
    submit(org_home, ws)
    with pytest.raises(StateError) as err:
        go_on(org_home, max_iterations=9)
    assert err.value.code == "not_continuable" and "dispatched, not ended" in str(err.value)
    with pytest.raises(NotFound):
        go_on(org_home, "w-nope", max_iterations=9)


def test_caps_must_leave_the_run_something_to_do(org_home, ws):
    stopped_at_max_iterations(org_home, ws, ScriptedActs([step("attempt a"), step("attempt b")]))
    cases = [({}, "cap_reached"), ({"max_iterations": 2}, "cap_not_raised"), ({"max_iterations": 0}, "bad_cap"),
             ({"budget_usd": float("nan")}, "bad_cap"), ({"budget_tokens": 100}, "cap_not_raised"),
             ({"max_iterations": 3, "timeout_s": -1.0}, "bad_cap")]
    for caps, code in cases:
        with pytest.raises(StateError) as err:
            go_on(org_home, **caps)
        assert err.value.code == code, (caps, err.value)
    assert work(org_home)["status"] == "ended" and query(org_home, "SELECT * FROM stop_history") == []
    out = go_on(org_home, max_iterations=3, budget_tokens=1000)     # 240 budget tokens used so far
    assert out["caps"] == {"max_iterations": 3, "budget_tokens": 1000} and out["used"]["budget_tokens"] == 240


def test_the_same_idempotency_key_continues_once(org_home, ws):
    stopped_at_max_iterations(org_home, ws, ScriptedActs([step("attempt a"), step("attempt b")]))
    first = go_on(org_home, max_iterations=5, idempotency_key="k1")
    again = go_on(org_home, max_iterations=5, idempotency_key="k1")
    assert (first["replayed"], again["replayed"]) == (False, True) and again["seq"] == 1
    assert len(query(org_home, "SELECT * FROM stop_history")) == 1


def test_a_continued_run_waits_while_another_item_holds_its_workspace(org_home, ws):
    stopped_at_max_iterations(org_home, ws, ScriptedActs([step("attempt a"), step("attempt b")]))
    human = StateWriter(org_home.db_path, Actor.HUMAN)
    with human.transaction() as tx:
        tx.delete("workspace_locks", str(ws))                   # what the coordinator does once it ended
        tx.insert("work_items", {"id": "w2", "goal": "g", "workspace": str(ws), "verify": [], "caps": {},
                                 "backend": "anthropic", "status": "queued", "created_by": "h",
                                 "created_at": tx.now, "updated_at": tx.now})
        tx.insert("workspace_locks", {"workspace": str(ws), "work_id": "w2", "acquired_at": tx.now})
    human.close()
    out = go_on(org_home, max_iterations=5)
    assert (out["status"], out["waiting_for"]) == ("waiting", "w2")
    assert work(org_home)["stop_detail"] == "workspace busy with w2"
    locks = query(org_home, "SELECT work_id FROM workspace_locks")
    assert locks == [{"work_id": "w2"}]


def test_only_the_human_reopens_an_ended_run(org_home, ws):
    stopped_at_max_iterations(org_home, ws, ScriptedActs([step("attempt a"), step("attempt b")]))
    for actor in (Actor.COORDINATOR, Actor.LOOP_AGENT):
        w = StateWriter(org_home.db_path, actor, "loop-agent-1" if actor == Actor.LOOP_AGENT else None)
        with pytest.raises(IllegalTransition):
            with w.transaction() as tx:
                tx.set_status("work_items", "w1", WorkStatus.QUEUED, stop_reason=None)
        w.close()


def test_a_retro_is_written_for_each_ending_of_a_continued_run(org_home, ws):
    from knowledge import notes
    from knowledge.notes import NoteDraft
    backend = ScriptedActs([step("attempt a"), step("attempt b"), step("done")])
    stopped_at_max_iterations(org_home, ws, backend)
    curator = StateWriter(org_home.db_path, Actor.CURATOR)
    draft = NoteDraft("f", "j", "r", "a", {"kind": "outcome"})
    assert notes.runs_without_retro(curator.conn) == ["w1"]
    with curator.transaction() as tx:
        assert notes.write_retro(tx, "w1", [draft]) == ["rn-w1-0"]
    assert notes.runs_without_retro(curator.conn) == []
    go_on(org_home, max_iterations=4)
    assert notes.runs_without_retro(curator.conn) == []        # not ended: nothing to look back on yet
    dispatch(org_home)
    assert engine(org_home, "w1", backend).run().reason == "goal_met"
    assert notes.runs_without_retro(curator.conn) == ["w1"] and not notes.has_retro(curator.conn, "w1")
    with curator.transaction() as tx:
        assert notes.write_retro(tx, "w1", [draft]) == ["rn-w1.1-0"]
    assert notes.runs_without_retro(curator.conn) == [] and notes.has_retro(curator.conn, "w1")
    curator.close()


def org(home, *argv):
    env = {**os.environ, "ORG_HOME": str(home.root), "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "scripts.cli.main", *argv], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=60)


def test_the_cli_continues_once_refuses_with_one_coded_line_and_show_lists_the_ending(org_home, ws):
    stopped_at_max_iterations(org_home, ws, ScriptedActs([step("attempt a"), step("attempt b")]))
    bad = org(org_home, "continue", "w1", "--max-iterations", "2")
    assert bad.returncode == 1 and bad.stderr.startswith("error[cap_not_raised]: ") and bad.stderr.count("\n") == 1
    ok = org(org_home, "continue", "w1", "--max-iterations", "5")
    assert ok.returncode == 0, ok.stderr
    assert "continued w1 (queued) after it stopped with max_iterations (ending 1)" in ok.stdout
    again = org(org_home, "continue", "w1", "--max-iterations", "6")
    assert again.returncode == 1 and again.stderr.startswith("error[not_continuable]: w1 is queued, not ended")
    assert again.stderr.count("\n") == 1 and "Traceback" not in again.stderr
    shown = org(org_home, "show", "w1")
    assert shown.returncode == 0, shown.stderr
    assert "ending 1: max_iterations after 2 iterations" in shown.stdout
    assert "cache read 0" in shown.stdout and "CACHE-R" in shown.stdout
    assert json.loads(work(org_home)["caps"]) == {"max_iterations": 5, "from": {"max_iterations": "flag"}}
