"""Replays and the evidence a human keeps, piece by piece (the whole path: tests/e2e/test_skill_replay.py).

- the scripted model can tell whether a skill is in its context (``when`` variants);
- the figures: per arm goal rate, iterations to goal and tokens, with − without, measured only
  when both arms of an item ended;
- whether replays run at all ([learning]): never for a paid model unless the user says so;
- a candidate with nothing to replay does not hold its batch back;
- a replay's workspace is exactly the recorded baseline;
- candidate steps that say the same thing are one step citing both runs;
- no terminal control sequence and no sandbox network failure becomes knowledge.
"""
from __future__ import annotations

import json
import os

import pytest

from knowledge import findings
from knowledge.record import Check
from roles.workbench.scripted.script import ScriptError, parse_script, request_text
from skills import batches
from skills.drafting import merge_near
from skills.replay import Subject, enabled, line, summarise
from state_db.kernel.config import Config
from state_db.queries.replays import Replay, unmeasured_candidates
from state_db.vocab import Actor
from tests.test_skills_candidates import draft, propose

pytestmark = pytest.mark.timeout(60)


def _body(system: str, user: str) -> dict:
    return {"system": [{"type": "text", "text": system}], "messages": [{"role": "user", "content": f"Iteration: 1\n{user}"}]}


def test_a_script_variant_serves_the_request_whose_prompt_holds_its_text():
    script = parse_script(json.dumps({
        "acts": [[{"text": "slow path"}]],
        "when": [{"prompt_contains": "## Skill: ", "acts": [[{"text": "fast path"}]]},
                 {"prompt_contains": "note-42", "default": [{"text": "noted"}]}]}))
    assert script.for_request(_body("You are a doer.", "fix it")).step(1, 0).text == "slow path"
    assert script.for_request(_body("You are a doer.\n## Skill: retry\nsteps", "fix it")).step(1, 0).text == "fast path"
    assert script.for_request(_body("sys", "see note-42")).step(7, 0).text == "noted"
    assert "note-42" in request_text(_body("sys", "see note-42"))


@pytest.mark.parametrize("when, field", [
    ([{"acts": []}], "when[0].prompt_contains"),
    ([{"prompt_contains": "", "acts": []}], "when[0].prompt_contains"),
    ([{"prompt_contains": "x", "acts": [], "when": []}], "when[0]"),
    ([{"prompt_contains": "x", "acts": "nope"}], "when[0].acts"),
    ({"prompt_contains": "x"}, "when"),
])
def test_a_bad_variant_is_refused_with_its_place(when, field):
    with pytest.raises(ScriptError) as err:
        parse_script(json.dumps({"acts": [], "when": when}))
    assert err.value.code == "script_field" and err.value.field == field


def _run(source, arm, *, status="ended", reason="goal_met", iterations=1, tokens=100):
    return Replay(f"w-{source}-{arm}", "c-1", "candidate", source, "source", arm, "skill", status, reason,
                  iterations, tokens, 0.0)


def test_the_figures_compare_the_arms_of_items_whose_both_runs_ended():
    runs = [_run("a", "with", iterations=1, tokens=100), _run("a", "without", iterations=3, tokens=400),
            _run("b", "with", iterations=2, tokens=200), _run("b", "without", reason="max_iterations", iterations=5,
                                                            tokens=900),
            _run("c", "with"), _run("c", "without", status="running", reason=None)]   # c: not measured yet
    s = summarise(runs)
    assert s["measured"] and s["items"] == 3 and s["items_measured"] == 2 and s["running"] == 1
    assert s["with"] == {"runs": 2, "ended": 2, "goals": 2, "goal_rate": 1.0, "iterations_to_goal": 1.5,
                         "tokens": 150.0}
    assert s["without"]["goal_rate"] == 0.5 and s["without"]["iterations_to_goal"] == 3.0
    assert s["delta"] == {"goal_rate": 0.5, "iterations_to_goal": -1.5, "tokens": -500.0}
    text = line({**s, "plan": None})
    assert "with: 2/2 goals, 1.5 iterations to goal" in text and "Δ goal rate +0.5" in text
    assert "1 run(s) still going" in text


def test_nothing_is_called_measured_before_both_arms_of_an_item_ended():
    s = summarise([_run("a", "with"), _run("a", "without", status="running", reason=None)])
    assert not s["measured"] and s["delta"]["goal_rate"] is None
    assert line({**s, "plan": None}).startswith("replaying: 1 run(s) going")
    assert line({**summarise([]), "plan": {"status": "skipped", "reason": "why", "items": []}}) == "not replayed: why"


@pytest.mark.parametrize("data, on", [
    ({}, False),                                                             # a paid model, no budget
    ({"model": {"backend": "scripted"}}, True),
    ({"model": {"name": "local"}, "prices": {"local": {"input": 0, "output": 0, "cache_write": 0,
                                                       "cache_read": 0}}}, True),
    ({"learning": {"replay_budget_usd": 2.5}}, True),
    ({"learning": {"replay": "on"}}, True),
    ({"model": {"backend": "scripted"}, "learning": {"replay": "off"}}, False),
])
def test_replays_never_spend_on_a_paid_model_unless_the_user_says_so(data, on):
    ok, why = enabled(Config(data))
    assert ok is on and why


def test_a_candidate_with_nothing_to_replay_is_not_held_back_and_one_waiting_is(writer_for, org_home):
    from roles.operations.replays import plan
    curator = writer_for(Actor.CURATOR)
    waiting, _ = propose(curator, draft(writer_for, "waits-for-replays", ["r1", "r2", "r3"]))
    lonely, _ = propose(curator, draft(writer_for, "nothing-to-replay", ["r4", "r5", "r6"]))
    coordinator = writer_for(Actor.COORDINATOR)
    # the notes' runs were cancelled before any baseline was recorded: nothing can be replayed
    p = plan(coordinator, org_home, Subject(lonely, "candidate", "nothing-to-replay", "text", ("rn-r4-0",)), 2)
    assert p.status == "skipped" and p.items == () and "no ended item" in p.reason
    assert unmeasured_candidates(curator.conn) == {waiting}
    with curator.transaction() as tx:
        bid = batches.open_if_due(tx, 1, wait_for_replays=True)
    members = [r[0] for r in curator.conn.execute("SELECT id FROM skill_candidates WHERE batch_id = ?", (bid,))]
    assert members == [lonely]


def test_a_replay_workspace_is_the_recorded_baseline_exactly(tmp_path):
    from roles.workbench.workspace.copy import write_commit
    from roles.workbench.workspace.errors import HistoryError
    from roles.workbench.workspace.history import WorkspaceHistory
    from roles.workbench.workspace.views import BASELINE_REF
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "mod.py").write_text("x = 1\n")
    (ws / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(ws / "run.sh", 0o755)
    os.symlink("/etc/passwd", ws / "link")
    history = WorkspaceHistory(tmp_path / "h.git", ws)
    history.baseline()
    (ws / "pkg" / "mod.py").write_text("x = 2\n")          # later edits are not the baseline
    dest = tmp_path / "replay"
    assert write_commit(tmp_path / "h.git", BASELINE_REF, dest) == 3
    assert (dest / "pkg" / "mod.py").read_text() == "x = 1\n"
    assert os.access(dest / "run.sh", os.X_OK)
    assert os.path.islink(dest / "link") and os.readlink(dest / "link") == "/etc/passwd"
    with pytest.raises(HistoryError) as err:
        write_commit(tmp_path / "h.git", BASELINE_REF, dest)
    assert err.value.code == "dest_exists"


def test_steps_that_say_the_same_thing_are_one_step_citing_every_run():
    merged = merge_near([
        ("Look at settings.json first: changing it resolved this failure (timeout written as 30)", ["w1"]),
        ("Look at settings.json first: changing it resolved this failure (timeout written as 45)", ["w2"]),
        ("Look at settings.json first: changing it resolved this failure (timeout written as 90)", ["w3", "w1"]),
        ("Pin the interpreter version in .python-version before running the tests", ["w4"]),
    ])
    assert [runs for _, runs in merged] == [["w1", "w2", "w3"], ["w4"]]


def test_no_control_sequence_enters_a_note_and_no_network_failure_is_the_works(writer_for):
    from tests.test_knowledge_helpers import note, put_notes
    put_notes(writer_for, "ansi-run", [note("\x1b[31mFAILED\x1b[0m test_x \x1b]52;c;ZXZpbA==\x07done",
                                            "When \x1b[1mit\x1b[0m fails, read the log.")])
    row = writer_for(Actor.CURATOR).conn.execute("SELECT fact, judgment FROM raw_notes WHERE run_id='ansi-run'").fetchone()
    assert "\x1b" not in row["fact"] + row["judgment"] and "FAILED test_x" in row["fact"]
    dns = Check(name="uv run pytest -q", passed=False, signature="s", timed_out=False, exit_code=2,
                output_tail="error: Failed to fetch: `https://pypi.org/simple/pytest/`\n  Caused by: "
                            "failed to lookup address information: Temporary failure in name resolution")
    assert findings.environment_failure(dns)
    work = Check(name="pytest -q", passed=False, signature="s", timed_out=False, exit_code=1,
                 output_tail="FAILED tests/test_a.py::test_a")
    assert findings.environment_failure(work) is None


def _planned(writer, subject: str, items: list[str]) -> None:
    with writer.transaction() as tx:
        tx.insert("replay_plans", {"subject": subject, "subject_kind": "candidate", "status": "planned",
                                   "name": "a-skill", "skill_text": "text",
                                   "items": [{"id": i, "relation": "source"} for i in items],
                                   "planned_by": "coordinator", "created_at": tx.now})


def test_a_submit_that_fails_once_is_tried_again_and_one_that_keeps_failing_leaves_the_plan(
        writer_for, org_home, monkeypatch):
    from roles.operations import replays as ops
    from state_db.kernel.config import load_config
    from state_db.kernel.errors import StateError
    from state_db.queries import replays as R

    coordinator = writer_for(Actor.COORDINATOR)
    _planned(coordinator, "sc-1", ["w-flaky", "w-gone"])
    calls = []

    def submit_run(writer, home, cfg, subject, source, relation, arm, runs):
        calls.append((source, arm))
        if source == "w-gone":
            raise ops.ReplayError(f"work item {source} is gone", code="replay_source_missing")
        if calls.count((source, arm)) == 1:
            raise StateError("database is locked")              # passes: the next pass submits it
        return None                      # as for a run already submitted: each pass asks again, none fails

    monkeypatch.setattr(ops, "submit_run", submit_run)
    cfg = load_config(org_home)
    for _ in range(ops.SUBMIT_TRIES):
        ops.submit_due(coordinator, org_home, cfg)
    items = [e["id"] for e in R.plan(coordinator.conn, "sc-1").items]
    assert items == ["w-flaky"]                                  # the flaky item stays in the measurement
    assert calls[:2] == [("w-flaky", "with"), ("w-gone", "with")]     # the first pass: both fail
    assert calls.count(("w-flaky", "without")) == ops.SUBMIT_TRIES - 1  # the flaky one went on from pass 2
    assert calls.count(("w-gone", "with")) == ops.SUBMIT_TRIES  # tried, then left out with its reason
    assert "w-gone left out: work item w-gone is gone" in R.plan(coordinator.conn, "sc-1").reason
    assert not ops._FAILED
