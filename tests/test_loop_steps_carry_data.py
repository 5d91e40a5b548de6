"""The loop's steps carry their data: each step ``derive`` returns holds the view of the run it
was derived from, ``advance`` acts on that view (no cache inside the engine), the acting code
is an object of its own, and a run's stored step alone is enough to resume it — after a pause
in the middle of an act, and after a kill -9 of the process that resumed it.

The backend is the in-process scripted one; the verifier is the eval-agent's own; the kill
runs the engine in its own process (tests/support/engine_runner.py)."""
from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from roles.loop_agent import steps
from roles.loop_agent.acting import Acting
from roles.loop_agent.steps import ActAgain, AwaitPreflight, Ended, Paused, RunView
from state_db.vocab import StopReason
from tests.support.loop import BUGGY, FIXED, ScriptedActs, engine, make_workspace, submit
from tests.support.org import query

pytestmark = pytest.mark.timeout(120)

GOOD = {"write": {"calc.py": FIXED}}
BAD = {"write": {"calc.py": BUGGY.replace("a - b", "a * b")}}


@pytest.fixture
def ws(tmp_path):
    return make_workspace(tmp_path)


def work(home, wid="w1"):
    return query(home, "SELECT * FROM work_items WHERE id=?", (wid,))[0]


def iterations(home):
    return [(r["n"], r["attempt"]) for r in query(home, "SELECT n, attempt FROM iterations ORDER BY n")]


def test_a_derived_step_holds_the_view_its_move_needs_and_the_engine_keeps_no_cache(org_home, ws):
    submit(org_home, ws)
    eng = engine(org_home, "w1", ScriptedActs([[BAD], [GOOD]]))
    first = eng.resume()
    assert first == AwaitPreflight() and isinstance(first.view, RunView)
    assert first.view.work.id == "w1" and first.view.iterations == () and first.view.progress.iterations == 0
    act = eng.advance(first)
    assert act == ActAgain(1) and act.view.progress.iterations == 0
    after = eng.advance(act)                          # acts, commits, waits for the verdict, reflects
    assert after == ActAgain(2)
    assert [r["n"] for r in after.view.iterations] == [1] and after.view.progress.iterations == 1
    assert not after.view.verdicts[1].passed and after.view.iteration(1)["verdict_id"] == after.view.verdicts[1].id
    assert not any(hasattr(eng, name) for name in ("_ctx", "_fresh", "_derived"))
    assert isinstance(eng.acting, Acting) and not isinstance(eng, Acting)
    # the view is not part of what a step is, nor of what is stored
    assert after == ActAgain(2, view=None) and "view" not in steps.decode(steps.dumps(after)).encode()


def test_a_step_derived_by_one_engine_is_taken_by_another_from_its_own_data(org_home, ws):
    """No engine needs to have derived the step it advances: the step carries the view."""
    submit(org_home, ws)
    one = engine(org_home, "w1", ScriptedActs([[GOOD]]))
    assert one.advance(one.resume()) == ActAgain(1)
    step = one.derive()
    other = engine(org_home, "w1", ScriptedActs([[GOOD]]))
    other.resume()
    while not isinstance(step, Ended):
        step = other.advance(step)
    assert step.decision.reason == StopReason.GOAL_MET and iterations(org_home) == [(1, 1)]


def test_a_run_paused_mid_act_resumes_from_its_stored_step_alone(org_home, ws):
    """suspend --force in the middle of an act: the attempt is discarded and the step stored; a
    new engine, given nothing but that stored step, takes the run to its end."""
    submit(org_home, ws)
    interrupt = threading.Event()

    class CutInSecond(ScriptedActs):
        def act(self, ctx, *, on_usage, budget_left):
            if ctx.iteration == 2:
                interrupt.set()             # the act's next model call sees it and stops
            return super().act(ctx, on_usage=on_usage, budget_left=budget_left)

    assert engine(org_home, "w1", CutInSecond([[BAD], [GOOD, GOOD]]), interrupt=interrupt).run() is None
    stored = steps.decode(work(org_home)["next_step"])
    assert stored == Paused(ActAgain(2)) and stored.next.view is None
    assert iterations(org_home) == [(1, 1)]
    fresh = engine(org_home, "w1", ScriptedActs([[BAD], [GOOD]]))
    assert fresh.resume() == stored.next                               # the stored step, not one derived
    step = stored.next
    while not isinstance(step, Ended):
        step = fresh.advance(step)
    assert step.decision.reason == StopReason.GOAL_MET
    assert iterations(org_home) == [(1, 1), (2, 3)]                     # attempt 2 was cut and discarded
    outcomes = [r["outcome"] for r in query(org_home, "SELECT outcome FROM attempts ORDER BY attempt")]
    assert outcomes == ["committed", "interrupted", "committed"]


def _engine_process(home, acts):
    return subprocess.run([sys.executable, "-m", "tests.support.engine_runner", str(home.root), "w1", json.dumps(acts)],
                          capture_output=True, text=True, timeout=90)


def test_a_paused_run_killed_while_resuming_is_resumed_again_from_what_is_stored(org_home, ws):
    """Paused at a safe boundary (its step stored), resumed by a process killed -9 in the middle of
    its act, then resumed by a third: no iteration twice, every model call counted once."""
    submit(org_home, ws)
    pause = threading.Event()

    class PauseAfterFirst(ScriptedActs):
        def act(self, ctx, *, on_usage, budget_left):
            pause.set()
            return super().act(ctx, on_usage=on_usage, budget_left=budget_left)

    assert engine(org_home, "w1", PauseAfterFirst([[BAD], [GOOD]]), pause=pause).run() is None
    assert steps.decode(work(org_home)["next_step"]) == Paused(ActAgain(2))
    killed = _engine_process(org_home, [[BAD], [{"write": {"calc.py": "half", "stray.txt": "x"}, "crash": "kill"}]])
    assert killed.returncode == -9, killed.stderr
    assert iterations(org_home) == [(1, 1)] and work(org_home)["next_step"] is None   # cleared as the act began
    done = _engine_process(org_home, [[BAD], [GOOD]])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["reason"] == "goal_met"
    assert iterations(org_home) == [(1, 1), (2, 3)] and not (ws / "stray.txt").exists()
    calls = [r["request_id"] for r in query(org_home, "SELECT request_id FROM model_calls")]
    assert len(calls) == len(set(calls)) == 3
