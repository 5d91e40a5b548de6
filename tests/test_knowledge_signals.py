"""The five signals, each a stated predicate at its boundaries, and the tiers they lead to."""
from __future__ import annotations

import pytest

from knowledge import consolidate as K
from knowledge import signals as S
from knowledge.notes import RawNote
from knowledge.patterns import score_patterns
from knowledge.thresholds import Thresholds
from state_db.queries.knowledge import curated_notes
from roles.curator.pipeline import Pipeline
from state_db.vocab import Actor
from tests.test_knowledge_helpers import BAD, BAD_AGAIN, note, put_notes, rows, run_loop


def raw(run="r1", k=0, fact="A fact.", judgment="A judgment.", rationale="A rationale.",
        applicability="Anywhere.", **evidence) -> RawNote:
    return RawNote(f"rn-{run}-{k}", run, fact, judgment, rationale, applicability, evidence, "archived", None, 0.0)


def test_recurrence_counts_distinct_runs_so_one_runs_notes_count_once():
    assert not S.recurrence([raw("a"), raw("b")], 3).ok
    assert not S.recurrence([raw("a", 0), raw("a", 1), raw("b")], 3).ok
    sig = S.recurrence([raw("a"), raw("b"), raw("c")], 3)
    assert sig.ok and sig.why.startswith("3 distinct run(s) (needs 3)")


def test_multi_step_needs_three_steps_and_a_conditional_judgment():
    two = "Iteration 1 changed calc.py. Iteration 2 changed calc.py."
    three = two + " Iteration 3 changed util.py."
    assert not S.multi_step([raw(rationale=two, judgment="When it fails twice, stop.")]).ok
    assert not S.multi_step([raw(rationale=three, judgment="It failed twice.")]).ok
    assert S.multi_step([raw(rationale=three, judgment="When it fails twice, stop.")]).ok
    assert S.multi_step([raw(rationale="まずログを確認した。次に設定を直した。最後にテストを再実行した。",
                             judgment="タイムアウトが続く場合はループを疑うべき。")]).ok


def test_trigger_needs_a_concrete_term_in_at_least_half_of_the_applicability_statements():
    concrete, vague = raw(applicability="Runs verified by `pytest -q`."), raw(applicability="When needed.")
    assert S.trigger([concrete, vague]).ok                      # 1 of 2: half, rounded up = 1
    assert not S.trigger([concrete, vague, vague]).ok           # 1 of 3: needs 2
    assert S.trigger([concrete, raw(applicability="Reading config.toml fails."), vague]).ok
    assert S.trigger([raw(applicability="ModuleNotFoundError in tests")]).ok
    assert not S.trigger([raw(applicability="必要なとき")]).ok


@pytest.mark.parametrize("text, ok", [
    ("Stop when it fails twice.", True), ("Stop when it fails two or more times.", False),
    ("Retry at least 3 times.", True), ("Keep coverage ≥ 80.", True), ("Over 95 % of runs pass.", True),
    ("Use either a mock or a fixture file.", True), ("3回以上失敗したら方針を変える。", True),
    ("方針を見直すべき。", False), ("Change the approach after the first failure.", True),
])
def test_criteria_needs_a_threshold_or_a_classification_rule(text, ok):
    assert S.criteria([raw(judgment=text)]).ok is ok


def test_reusable_output_needs_a_named_artefact():
    assert not S.reusable_output([raw(fact="The run failed.", judgment="Think harder.")]).ok
    assert S.reusable_output([raw(fact="Changing calc.py fixed it.")]).ok
    assert S.reusable_output([raw(rationale="Run `pytest -x` first.")]).ok
    assert not S.reusable_output([raw(judgment="Run `pytest -x` first.")]).ok     # judgments are criteria
    assert S.reusable_output([raw(rationale="出力はテンプレートに従う。")]).ok


@pytest.mark.parametrize("points, tier", [(5, "recommended"), (3, "recommended"), (2, "queued"), (1, "curated"),
                                          (0, "curated")])
def test_score_three_recommends_two_queues_one_or_less_stays_curated(points, tier):
    assert S.tier_of(points) == tier


def test_a_pattern_is_scored_only_with_enough_independent_runs_and_keeps_its_evidence(writer_for):
    curator = writer_for(Actor.CURATOR)
    judgment = "When `pytest -q` fails twice with ModuleNotFoundError, vendor the module instead."
    steps = "Iteration 1 changed setup.py. Iteration 2 changed conftest.py. Iteration 3 vendored yaml.py."
    for k, run in enumerate(["r1", "r1b", "r2"]):
        put_notes(writer_for, run, [note("`pytest -q` failed with ModuleNotFoundError.", judgment, steps,
                                         "Work verified by `pytest -q`.")])
    result = K.consolidate(curator, Thresholds(raw_notes_to_consolidate=3))
    t = Thresholds(notes_per_pattern=4)
    assert score_patterns(curator, list(result.touched), t) == []           # 3 runs < 4: curated only
    (cn,) = curated_notes(curator.conn)
    assert cn.tier == "curated" and cn.score is None
    (p,) = score_patterns(curator, list(result.touched), Thresholds(notes_per_pattern=3))
    assert p.score.score == 5 and p.score.tier == "recommended"
    (cn,) = curated_notes(curator.conn)
    assert cn.tier == "recommended" and cn.score == 5
    assert cn.signals["criteria"]["ok"] and "'twice'" in cn.signals["criteria"]["why"]
    assert cn.signals["recurrence"]["notes"] == ["rn-r1-0", "rn-r1b-0", "rn-r2-0"]


def test_recurring_failures_in_three_runs_become_a_pending_candidate_and_two_runs_do_not(org_home, tmp_path,
                                                                                         writer_for):
    pipe = Pipeline(writer_for(Actor.CURATOR), Thresholds(raw_notes_to_consolidate=1), org_home.skills_dir)
    for run in ("w1", "w2"):
        run_loop(org_home, tmp_path, run, [[BAD], [BAD_AGAIN]])
    report = pipe.run()
    assert report.retros == ["w1", "w2"] and report.proposed == []
    assert rows(pipe.w, "SELECT * FROM skill_candidates") == []
    run_loop(org_home, tmp_path, "w3", [[BAD], [BAD_AGAIN]])
    report = pipe.run()
    assert report.proposed == [("handle-assertionerror-import-calc-assert", "created")]
    (c,) = rows(pipe.w, "SELECT * FROM skill_candidates")
    assert c["status"] == "pending" and c["score"] >= 3
    failure = [cn for cn in curated_notes(pipe.w.conn) if cn.kind == "failure"]
    assert failure[0].tier == "recommended" and len(failure[0].source_notes) == 3
    outcome = [cn for cn in curated_notes(pipe.w.conn) if cn.kind == "outcome"]
    assert outcome[0].tier in ("curated", "queued")                 # "ended with repeated_failure" is no skill
