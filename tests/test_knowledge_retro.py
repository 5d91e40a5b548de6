"""Retros: written by the curator from a run's own record, deterministically, exactly once."""
from __future__ import annotations

import sys

import orjson
import pytest

from knowledge import findings, record
from knowledge.errors import RetroExists
from knowledge.notes import write_retro
from knowledge.retro import derive
from knowledge.retro_model import model_author, parse_notes, prompt_for
from knowledge.thresholds import Thresholds
from roles.curator.pipeline import Pipeline
from roles.loop_agent.engine import LoopSettings
from state_db.vocab import Actor
from tests.test_knowledge_helpers import BAD, BAD2, BAD_AGAIN, GOOD, rows, run_loop


@pytest.fixture
def curator(org_home, writer_for):
    return Pipeline(writer_for(Actor.CURATOR), Thresholds(raw_notes_to_consolidate=100), org_home.skills_dir)


def notes_of(writer, run_id):
    out = rows(writer, "SELECT * FROM raw_notes WHERE run_id = ? ORDER BY id", (run_id,))
    for r in out:
        r["evidence"] = orjson.loads(r["evidence"])
    return {r["evidence"]["kind"]: r for r in out}


def test_retro_of_a_run_with_repeated_failures_names_checks_iterations_steps_and_the_fix(org_home, tmp_path, curator):
    assert run_loop(org_home, tmp_path, "w1", [[BAD], [BAD2], [GOOD]]).reason == "goal_met"
    assert curator.retros() == ["w1"]
    notes = notes_of(curator.w, "w1")
    assert set(notes) == {"outcome", "failure", "fix"}
    for n in notes.values():
        assert all(n[p].strip() for p in ("fact", "judgment", "rationale", "applicability"))
        assert n["run_id"] == "w1" and n["evidence"]["run"] == "w1" and n["status"] == "pending"
    fail = notes["failure"]
    assert fail["evidence"]["iterations"] == [1, 2] and fail["evidence"]["resolved_at"] == 3
    assert "calc.add" in fail["evidence"]["checks"][0] and len(fail["evidence"]["signatures"]) == 2
    assert "iterations 1, 2 of run w1" in fail["fact"] and "AssertionError: N" in fail["fact"]   # the value is not the lesson
    assert "Iteration 1 changed calc.py" in fail["rationale"] and "Iteration 2 changed calc.py" in fail["rationale"]
    assert fail["judgment"].startswith("Repeating the approach did not help until iteration 3 changed calc.py")
    assert "2 written (after iterations 1, 2)" in fail["rationale"]
    fix = notes["fix"]
    assert fix["evidence"]["changed_paths"] == ["calc.py"] and fix["evidence"]["iterations"] == [1, 2, 3]
    assert fix["judgment"].startswith("Changing calc.py resolved the failure")
    out = notes["outcome"]
    assert out["judgment"] == "The stop reason fits: iteration 3 passed every check."
    assert "Goal verifiable as stated: yes" in out["rationale"] and "3/6 iterations (50%)" in out["rationale"]
    assert out["evidence"]["usage"]["calls"] == 3 and out["evidence"]["fits"] is True


def test_a_repeated_failure_stop_fits_and_the_failure_note_says_retrying_did_not_help(org_home, tmp_path, curator):
    assert run_loop(org_home, tmp_path, "w1", [[BAD], [BAD_AGAIN]]).reason == "repeated_failure"
    curator.retros()
    notes = notes_of(curator.w, "w1")
    assert set(notes) == {"outcome", "failure"}
    judgment = notes["outcome"]["judgment"]
    assert judgment.startswith("The stop reason fits: iterations 1 and 2 failed `python")
    assert "calc.add(2, 3)'` with the same signature" in judgment
    assert notes["failure"]["judgment"].startswith("Retrying did not help: the same failure came back 2 times")
    assert len(notes["failure"]["evidence"]["signatures"]) == 1
    assert "not heeded after 1" in notes["failure"]["rationale"]


def test_the_retro_is_written_exactly_once_even_by_a_restarted_curator(org_home, tmp_path, writer_for, curator):
    run_loop(org_home, tmp_path, "w1", [[BAD], [GOOD]])
    assert curator.retros() == ["w1"]
    before = rows(curator.w, "SELECT id FROM raw_notes ORDER BY id")
    assert curator.retros() == []
    restarted = Pipeline(writer_for(Actor.CURATOR, "curator"), Thresholds(), org_home.skills_dir)
    assert restarted.retros() == []
    rec = record.load(restarted.w.conn, "w1")
    with pytest.raises(RetroExists) as err:
        with restarted.w.transaction() as tx:                 # even a direct second write is refused
            write_retro(tx, "w1", derive(rec))
    assert err.value.code == "retro_exists"
    assert rows(curator.w, "SELECT id FROM raw_notes ORDER BY id") == before
    assert len(rows(curator.w, "SELECT * FROM events WHERE kind = 'retro.written'")) == 1


def test_skills_in_the_prompts_are_reported_with_the_used_and_helped_predicates(org_home, tmp_path, curator):
    skill = [("fix-calc", "When calc.add fails, read calc.py.")]
    run_loop(org_home, tmp_path, "won", [[BAD], [GOOD]], settings=LoopSettings(skills=skill))
    run_loop(org_home, tmp_path, "lost", [[BAD], [BAD_AGAIN]], settings=LoopSettings(skills=skill))
    curator.retros()
    won, lost = notes_of(curator.w, "won")["context"], notes_of(curator.w, "lost")["context"]
    assert won["evidence"]["iterations"] == [1, 2] and won["evidence"]["helped"] is True
    assert won["judgment"] == ("Skill fix-calc helped: the run reached goal_met with it in the prompt "
                              "(no act refers to it).")
    assert lost["evidence"]["used"] is False
    assert lost["judgment"].startswith("Skill fix-calc was not used: no act refers to it")


def test_used_means_an_act_refers_to_the_item_even_when_the_run_fails(org_home, tmp_path, writer_for):
    run_loop(org_home, tmp_path, "w1", [[BAD], [BAD_AGAIN]], settings=LoopSettings(skills=[("fix-calc", "x")]))
    rec = record.load(writer_for(Actor.CURATOR).conn, "w1")
    terms = {"fix-calc": ("fix-calc", "iteration 2 done")}           # the scripted act's own summary
    (c,) = findings.carried(rec, terms)
    assert c.used and not c.helped and c.evidence == "iteration 2 refers to 'iteration 2 done'"


def test_a_run_whose_checks_cannot_run_ends_before_any_act_and_never_becomes_knowledge(org_home, tmp_path, curator):
    """A verify command that cannot start is the machine's fault: the preflight ends the run
    (verify_unrunnable) before any act, and the curator writes no retro of it."""
    from tests.support.loop import ScriptedActs, engine, make_workspace, submit
    ws = make_workspace(tmp_path / "w1")
    submit(org_home, ws, work_id="w1", verify=("no-such-command-xyz",), caps={"max_iterations": 2})
    decision = engine(org_home, "w1", ScriptedActs([[BAD], [BAD2]])).run()
    assert decision.reason == "verify_unrunnable" and "no-such-command-xyz" in decision.detail
    assert rows(curator.w, "SELECT COUNT(*) AS c FROM iterations WHERE work_id='w1'")[0]["c"] == 0
    assert curator.retros() == []
    assert rows(curator.w, "SELECT COUNT(*) AS c FROM raw_notes")[0]["c"] == 0


def test_a_run_cancelled_before_it_started_gets_a_one_note_retro(writer_for, curator):
    from tests.test_knowledge_helpers import ended_run
    ended_run(writer_for, "c1")
    assert curator.retros() == ["c1"]
    (n,) = notes_of(curator.w, "c1").values()
    assert n["fact"].startswith("Run c1 ended with cancelled after 0 iteration(s)")
    assert n["judgment"] == "The stop reason fits: a human cancelled the run."
    assert "never run (no iteration was verified)" in n["rationale"]


def test_cost_is_judged_against_each_cap_that_was_set(org_home, tmp_path, curator):
    run_loop(org_home, tmp_path, "w1", [[BAD], [BAD2], [BAD]], caps={"max_iterations": 3, "budget_tokens": 400})
    curator.retros()
    out = notes_of(curator.w, "w1")["outcome"]
    assert "3/3 iterations (100%)" in out["rationale"] and "360/400 tokens (90%)" in out["rationale"]
    assert out["evidence"]["near_cap"] == ["max_iterations", "budget_tokens"]


def test_a_model_written_retro_goes_through_the_same_notes_and_falls_back_when_the_model_fails(
        org_home, tmp_path, writer_for):
    run_loop(org_home, tmp_path, "w1", [[BAD], [GOOD]])
    rec = record.load(writer_for(Actor.CURATOR).conn, "w1")
    system, user = prompt_for(rec)
    assert "four parts" in system and orjson.loads(user)["id"] == "w1"
    answer = ('Sure: {"notes": [{"fact": "f", "judgment": "j", "rationale": "r", "applicability": "a", '
              '"kind": "failure", "iterations": [1], "checks": ["c"]}]}')
    (n,) = model_author(lambda s, u: answer)(rec)
    assert (n.fact, n.kind, n.evidence["iterations"]) == ("f", "failure", [1])
    with pytest.raises(Exception) as err:
        parse_notes('{"notes": [{"fact": "only a fact"}]}', rec)
    assert err.value.code == "note_invalid"
    fallback = model_author(lambda s, u: "no JSON at all")(rec)
    assert [d.kind for d in fallback] == [d.kind for d in derive(rec)]


def test_the_eval_agent_records_failing_test_ids_and_the_retro_reads_them_from_state(org_home, tmp_path, curator):
    """The failing ids come from the check record the eval-agent wrote, not from a parser run by knowledge."""
    from tests.support.loop import ScriptedActs, engine, make_workspace, submit
    submit(org_home, make_workspace(tmp_path / "w1"), work_id="w1",
           verify=(f"{sys.executable} -m pytest -q -p no:cacheprovider tests/test_calc.py",))
    assert engine(org_home, "w1", ScriptedActs([[BAD], [GOOD]])).run().reason == "goal_met"
    stored = [c for r in rows(curator.w, "SELECT checks FROM verdicts WHERE work_id = 'w1' ORDER BY iteration")
              for c in orjson.loads(r["checks"])]
    failing = [c for c in stored if not c["passed"]]
    assert failing and all(c["failing_tests"] for c in failing)
    assert all(c["failing_tests"] == [] for c in stored if c["passed"])
    rec = record.load(curator.w.conn, "w1")
    first = rec.iterations[0].failing[0]
    assert findings.test_ids(first) == failing[0]["failing_tests"]
    assert findings.failure_why(first).startswith(failing[0]["failing_tests"][0])


def test_a_check_record_written_before_failing_ids_were_recorded_names_no_test():
    """An old row without ``failing_tests`` names no test ids (its output is not parsed here): the
    retro says why from the output's salient line instead."""
    old = record.Check.decode({"name": "pytest -q", "passed": False, "signature": "s", "exit_code": 1,
                               "timed_out": False, "output_tail": "FAILED tests/test_a.py::test_a - AssertionError"})
    assert old.tests == () and findings.test_ids(old) == []
    assert findings.failure_why(old) == "FAILED tests/test_a.py::test_a - AssertionError"
    new = record.Check.decode({"name": "pytest -q", "passed": False, "signature": "s", "exit_code": 1,
                               "timed_out": False, "output_tail": "no ids printed here",
                               "failing_tests": ["tests/test_a.py::test_a"]})
    assert findings.test_ids(new) == ["tests/test_a.py::test_a"]
    assert findings.failure_why(new) == "tests/test_a.py::test_a fail"
