"""The loop engine's semantics over real state.db, shadow history and eval-agent verifier."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from roles.loop_agent.engine import LoopSettings
from roles.workbench.workspace.history import WorkspaceHistory
from tests.support.loop import BUGGY, FIXED, ScriptedActs, engine, make_workspace, submit
from tests.support.org import query

BAD = {"write": {"calc.py": BUGGY.replace("a - b", "a * b")}}
GOOD = {"write": {"calc.py": FIXED}}


@pytest.fixture
def ws(tmp_path):
    return make_workspace(tmp_path)


def its(home, wid="w1"):
    return query(home, "SELECT * FROM iterations WHERE work_id=? ORDER BY n", (wid,))


def work(home, wid="w1"):
    return query(home, "SELECT * FROM work_items WHERE id=?", (wid,))[0]


def test_fail_then_pass_ends_goal_met_by_the_eval_agent_with_a_lesson(org_home, ws):
    submit(org_home, ws)
    decision = engine(org_home, "w1", ScriptedActs([[BAD], [GOOD]])).run()
    assert decision.reason == "goal_met"
    rows = its(org_home)
    assert [r["n"] for r in rows] == [1, 2]
    assert rows[0]["lesson"] and "Failed" in rows[0]["lesson"] and rows[1]["lesson"] is None
    assert "AssertionError" in rows[0]["feedback"]
    verdicts = query(org_home, "SELECT iteration, outcome, written_by FROM verdicts ORDER BY iteration")
    assert verdicts == [{"iteration": 1, "outcome": "fail", "written_by": "eval-agent"},
                        {"iteration": 2, "outcome": "pass", "written_by": "eval-agent"}]
    ended = query(org_home, "SELECT actor FROM events WHERE kind='work_items.ended'")
    assert ended == [{"actor": "eval-agent"}]
    assert (ws / "calc.py").read_text() == FIXED
    # the prompt of iteration 2 carried the lesson and the verdict feedback
    manifest = json.loads(rows[1]["prompt"])
    assert manifest["lessons"] and manifest["iteration"] == 2


def test_same_failing_check_twice_in_a_row_stops_with_repeated_failure(org_home, ws):
    submit(org_home, ws)
    flip = {"write": {"calc.py": BUGGY.replace("a - b", "a * b") + "\n# v2\n"}}
    decision = engine(org_home, "w1", ScriptedActs([[BAD], [flip]])).run()
    assert decision.reason == "repeated_failure"
    assert len(its(org_home)) == 2


SHOW_AND_FAIL = f"{sys.executable} -c 'import sys; print(\"error: state \" + open(\"state\").read()); sys.exit(1)'"


def test_no_progress_fires_on_repeated_results_within_the_window_not_only_adjacent(org_home, ws):
    (ws / "state").write_text("start")
    submit(org_home, ws, verify=(SHOW_AND_FAIL,), caps={"max_iterations": 20}, scope=("state",))
    a, b = {"write": {"state": "A"}}, {"write": {"state": "B"}}
    decision = engine(org_home, "w1", ScriptedActs([[a], [b], [a], [b], [a], [b]]),
                      settings=LoopSettings(no_progress=(3, 5))).run()
    assert decision.reason == "no_progress"
    assert len(its(org_home)) == 5          # A B A B A: the third A within a window of five


def test_max_iterations_is_a_hard_cap(org_home, ws):
    (ws / "state").write_text("start")
    submit(org_home, ws, caps={"max_iterations": 3}, verify=(SHOW_AND_FAIL,), scope=("state",))
    # distinct words, not numbers: numbers that change from run to run are noise to the signature
    acts = [[{"write": {"state": f"attempt {'abcdefghi'[i]}"}}] for i in range(9)]
    decision = engine(org_home, "w1", ScriptedActs(acts)).run()
    assert decision.reason == "max_iterations"
    assert len(its(org_home)) == 3


def test_token_budget_cuts_inside_an_act_before_a_call_the_size_of_the_last_would_pass_it(org_home, ws):
    submit(org_home, ws, caps={"budget_tokens": 250, "max_iterations": 10})
    backend = ScriptedActs([[{}, {}, {}, {}, {}, BAD]], tokens=(100, 0))
    decision = engine(org_home, "w1", backend).run()
    assert decision.reason == "token_budget"
    assert len(backend.calls) == 2          # 100, 200; a third of 100 would pass 250: not made
    total = query(org_home, "SELECT SUM(input_tokens) AS t FROM model_calls")[0]["t"]
    assert total == 200 <= 250
    assert "the next call would need about 100" in decision.detail


def test_cost_budget_and_org_spend_cap(org_home, ws, tmp_path):
    submit(org_home, ws, caps={"budget_usd": 0.0025, "max_iterations": 10})
    decision = engine(org_home, "w1", ScriptedActs([[{}, {}, {}, {}]], cost=0.001)).run()
    assert decision.reason == "cost_budget"
    ws2 = make_workspace(tmp_path / "two")
    submit(org_home, ws2, work_id="w2", caps={"max_iterations": 10})
    settings = LoopSettings(org_spend_cap_usd=0.004)
    decision = engine(org_home, "w2", ScriptedActs([[{}, {}, {}, {}]], cost=0.001), settings=settings).run()
    assert decision.reason == "org_limit"


def test_model_error_ends_the_run_and_discards_the_act(org_home, ws):
    submit(org_home, ws)
    decision = engine(org_home, "w1", ScriptedActs([[{"write": {"calc.py": "junk"}, "error": "overloaded"}]])).run()
    assert decision.reason == "model_error" and "overloaded" in decision.detail
    assert its(org_home) == [] and (ws / "calc.py").read_text() == BUGGY
    assert query(org_home, "SELECT outcome FROM attempts")[0]["outcome"].startswith("model_error")


def test_a_run_counts_each_attempts_whole_span_slow_checkpoints_and_discarded_attempts_too(org_home, ws):
    # the time a run is charged covers every attempt's recorded span (started_at to ended_at):
    # a workspace that makes checkpoints slow, or a slow reset, cannot stretch the timeout
    submit(org_home, ws, caps={"max_iterations": 3})
    run = engine(org_home, "w1", ScriptedActs([[BAD], [{"write": {"calc.py": "junk"}, "error": "overloaded"}]]))
    checkpoint = run.history.checkpoint

    def slow_checkpoint(n):
        time.sleep(0.2)
        return checkpoint(n)

    run.history.checkpoint = slow_checkpoint
    assert run.run().reason == "model_error"
    attempts = query(org_home, "SELECT started_at, ended_at, outcome FROM attempts ORDER BY attempt")
    assert [a["outcome"] for a in attempts] == ["committed", "model_error"]
    spans = sum(a["ended_at"] - a["started_at"] for a in attempts)
    item = work(org_home)
    assert spans >= 0.2 and item["elapsed_s"] >= spans, (item["elapsed_s"], spans)
    assert item["discarded_s"] >= attempts[1]["ended_at"] - attempts[1]["started_at"]
    assert its(org_home)[0]["elapsed_s"] >= 0.2


def test_cancel_during_an_act_discards_it_and_ends_cancelled(org_home, ws):
    from state_db.writer import StateWriter
    submit(org_home, ws)

    class CancelMidAct(ScriptedActs):
        def act(self, ctx, *, on_usage, budget_left):
            with StateWriter(org_home.db_path, "human").transaction() as tx:
                tx.update("work_items", "w1", cancel_requested=1)
            return super().act(ctx, on_usage=on_usage, budget_left=budget_left)

    decision = engine(org_home, "w1", CancelMidAct([[BAD]])).run()
    assert decision.reason == "cancelled"
    assert its(org_home) == [] and (ws / "calc.py").read_text() == BUGGY


def test_interrupt_discards_the_attempt_and_resume_continues_numbering(org_home, ws):
    submit(org_home, ws)
    stop = threading.Event()

    class InterruptSecond(ScriptedActs):
        def act(self, ctx, *, on_usage, budget_left):
            if ctx.iteration == 2 and ctx.attempt == 2:
                (ctx.workspace / "calc.py").write_text("half-written")
                stop.set()
            return super().act(ctx, on_usage=on_usage, budget_left=budget_left)

    assert engine(org_home, "w1", InterruptSecond([[BAD], [{}, GOOD]]), interrupt=stop).run() is None
    assert [r["n"] for r in its(org_home)] == [1]
    decision = engine(org_home, "w1", ScriptedActs([[BAD], [GOOD]])).run()
    assert decision.reason == "goal_met"
    assert [r["n"] for r in its(org_home)] == [1, 2]
    attempts = query(org_home, "SELECT attempt, iteration, outcome FROM attempts ORDER BY attempt")
    assert attempts == [{"attempt": 1, "iteration": 1, "outcome": "committed"},
                        {"attempt": 2, "iteration": 2, "outcome": "interrupted"},
                        {"attempt": 3, "iteration": 2, "outcome": "committed"}]


def _run_process(home, acts, timeout=60):
    return subprocess.run([sys.executable, "-m", "tests.support.engine_runner", str(home.root), "w1", json.dumps(acts)],
                          capture_output=True, text=True, timeout=timeout)


def test_kill_9_mid_act_then_resume_no_iteration_twice_usage_once_workspace_reset(org_home, ws):
    submit(org_home, ws)
    crash = [[BAD], [{"write": {"calc.py": "garbage from a dying act", "stray.txt": "x"}, "crash": "kill"}]]
    first = _run_process(org_home, crash)
    assert first.returncode == -9
    assert [r["n"] for r in its(org_home)] == [1]
    calls_after_crash = query(org_home, "SELECT request_id FROM model_calls ORDER BY at")
    assert len(calls_after_crash) == 2      # iteration 1 and the cut act: both counted, once
    # the killed run's checkpoint is git's own commit already, named by its ref
    git_dir = org_home.history_dir / "w1.git"
    checkpoint = its(org_home)[0]["checkpoint"]
    assert subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", "refs/iterations/1"],
                          capture_output=True, text=True, check=True).stdout.strip() == checkpoint
    assert WorkspaceHistory(git_dir, ws).tree_id(checkpoint)
    second = _run_process(org_home, [[BAD], [GOOD]])
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout.strip().splitlines()[-1])["reason"] == "goal_met"
    rows = its(org_home)
    assert [r["n"] for r in rows] == [1, 2] and rows[1]["attempt"] == 3
    assert not (ws / "stray.txt").exists(), "the cut act's files survived the reset"
    calls = query(org_home, "SELECT request_id FROM model_calls")
    assert len(calls) == len({c["request_id"] for c in calls}) == 3
    assert query(org_home, "SELECT outcome FROM attempts WHERE attempt=2")[0]["outcome"] == "discarded"
    # the run stopped: every checkpoint is git's own, under its iteration's ref
    assert list(git_dir.glob("loop-org-pending-*")) == []
    gd = ["git", "--git-dir", str(git_dir)]
    heads = subprocess.run([*gd, "rev-parse", "refs/iterations/1", "refs/iterations/2"], capture_output=True,
                           text=True, check=True).stdout.split()
    assert heads == [r["checkpoint"] for r in rows]
    subprocess.run([*gd, "fsck", "--strict", "--no-dangling"], capture_output=True, check=True)


# the second act fails differently (a word, not another wrong number): the same assertion failing
# with another number would be the same failure, and end the run at repeated_failure
_THREE_ACTS = [[BAD], [{"write": {"calc.py": "def add(a, b):\n    return \"wrong\"\n"}}], [GOOD]]


def _reference_run_and_second_item(org_home, tmp_path) -> list:
    """Run item wa uninterrupted to goal_met (fail, fail, pass) and submit wb, to be run with
    the same acts and compared; returns the acts."""
    submit(org_home, make_workspace(tmp_path / "a"), work_id="wa")
    engine(org_home, "wa", ScriptedActs(_THREE_ACTS)).run()
    submit(org_home, make_workspace(tmp_path / "b"), work_id="wb")
    return _THREE_ACTS


def test_resume_after_iteration_k_equals_an_uninterrupted_run(org_home, tmp_path):
    acts = _reference_run_and_second_item(org_home, tmp_path)

    class StopAfter(ScriptedActs):
        def act(self, ctx, *, on_usage, budget_left):
            if ctx.iteration == 3:
                stop.set()
            return super().act(ctx, on_usage=on_usage, budget_left=budget_left)

    stop = threading.Event()
    engine(org_home, "wb", StopAfter(acts), interrupt=stop).run()
    engine(org_home, "wb", ScriptedActs(acts)).run()

    def shape(wid):
        rows = its(org_home, wid)
        return ([(r["n"], r["act_status"], r["input_tokens"], r["fingerprint"]) for r in rows],
                work(org_home, wid)["stop_reason"],
                query(org_home, "SELECT COUNT(*) AS c FROM model_calls WHERE work_id=? AND attempt IN "
                      "(SELECT attempt FROM iterations WHERE work_id=?)", (wid, wid))[0]["c"])
    a, b = shape("wa"), shape("wb")
    assert a[1] == b[1] == "goal_met"
    assert [x[:3] for x in a[0]] == [x[:3] for x in b[0]]
    assert [x[3] for x in a[0]] == [x[3] for x in b[0]]     # same workspace trees and outcomes
    assert a[2] == b[2]


def test_a_run_past_its_cap_takes_no_new_step_on_resume(org_home, ws):
    submit(org_home, ws, caps={"max_iterations": 1})
    engine(org_home, "w1", ScriptedActs([[BAD]])).run()
    backend = ScriptedActs([[GOOD]])
    decision = engine(org_home, "w1", backend).run()
    assert decision.reason == "max_iterations" and backend.calls == []


def test_editing_a_protected_test_never_reaches_goal_met(org_home, ws):
    submit(org_home, ws, caps={"max_iterations": 2}, verify=(f"{sys.executable} -m pytest -q tests",))
    cheat = {"write": {"tests/test_calc.py": "def test_add():\n    assert True\n"}}
    decision = engine(org_home, "w1", ScriptedActs([[cheat]])).run()
    assert decision.reason != "goal_met"
    v = query(org_home, "SELECT protected_changed, outcome FROM verdicts ORDER BY iteration")
    assert v[0]["outcome"] == "fail" and "tests/test_calc.py" in v[0]["protected_changed"]


def test_a_crash_between_a_verdict_and_its_reflection_is_reflected_identically_on_resume(org_home, tmp_path):
    """The reflection (lesson, feedback, fingerprint) rides on the next transaction; a run that
    dies before it leaves a verdict alone, and the next run derives exactly the same reflection."""
    acts = _reference_run_and_second_item(org_home, tmp_path)
    crashing = engine(org_home, "wb", ScriptedActs(acts))
    real_verify = crashing.verify

    def verify_then_die(work_id, n):
        real_verify(work_id, n)
        if n == 2:
            raise RuntimeError("killed after the verdict")
    crashing.verify = verify_then_die
    with pytest.raises(RuntimeError):
        crashing.run()
    left = its(org_home, "wb")
    assert [r["n"] for r in left] == [1, 2] and left[0]["verdict_id"] and left[1]["verdict_id"] is None
    assert query(org_home, "SELECT COUNT(*) AS c FROM verdicts WHERE work_id='wb' AND iteration=2")[0]["c"] == 1
    engine(org_home, "wb", ScriptedActs(acts)).run()

    def reflections(wid):
        return [(r["n"], r["lesson"], r["fingerprint"], r["feedback"] is not None, r["verdict_id"] is not None)
                for r in its(org_home, wid)]
    assert work(org_home, "wb")["stop_reason"] == work(org_home, "wa")["stop_reason"] == "goal_met"
    a, b = reflections("wa"), reflections("wb")
    assert [x[0] for x in a] == [1, 2, 3] and all(x[3] and x[4] for x in a + b)
    assert [x[1:3] for x in a] == [x[1:3] for x in b]
    assert a[1][1] and "Failed" in a[1][1]                  # iteration 2 failed: it has a lesson
    prompts = {wid: [json.loads(r["prompt"]) for r in its(org_home, wid)] for wid in ("wa", "wb")}
    # what the run kept in memory and what a new run read from state.db built the same prompts
    assert [m["sha256"] for m in prompts["wa"]] == [m["sha256"] for m in prompts["wb"]]
