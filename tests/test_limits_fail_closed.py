"""Every bound on the verification path fails closed: past it the verdict is "could not verify"
(a coded error that ends the run for a human), never a pass and never a skipped comparison. And
the reviewer is on by default wherever a review model can be reached, sees the whole change, or
cannot approve."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from roles.eval_agent import review as review_mod
from roles.eval_agent.checks import CheckResult
from roles.eval_agent.review import DIFF_CHARS, Reviewer, ReviewFailed, ReviewSettings
from roles.eval_agent.verifier import Verifier
from roles.workbench.sandbox import reports
from roles.workbench.workspace.history import WorkspaceHistory
from state_db.kernel.config import DEFAULT_PRICES
from state_db.queries.work import WorkItem
from state_db.vocab import Actor
from state_db.writer import StateWriter
from tests.support.loop import record_iteration, submit

pytestmark = pytest.mark.timeout(120)

CALC_BUGGY = "def mean(xs):\n    return sum(xs) // len(xs)\n"
CALC_FIXED = "def mean(xs):\n    return sum(xs) / len(xs)\n"
TESTS = ("from calc import mean\n\n\ndef test_mean():\n    assert mean([1, 2]) == 1.5\n\n\n"
         "def test_one():\n    assert mean([3]) == 3\n")


def _verify(org_home, root: Path, wid: str):
    ws = root / "ws"
    ws.mkdir(parents=True)
    (ws / "calc.py").write_text(CALC_BUGGY)
    (ws / "test_calc.py").write_text(TESTS)
    submit(org_home, ws, work_id=wid, verify=(f"{sys.executable} -m pytest -q -p no:cacheprovider",))
    verifier = Verifier(org_home, StateWriter(org_home.db_path, Actor.EVAL_AGENT, "eval-agent"), timeout_s=60)
    verifier.verify(wid, 0)
    (ws / "calc.py").write_text(CALC_FIXED)
    checkpoint = WorkspaceHistory(org_home.history_dir / f"{wid}.git", ws).checkpoint(1)
    record_iteration(org_home, wid, checkpoint)
    v = verifier.verify(wid, 1)
    row = StateWriter(org_home.db_path, Actor.COORDINATOR).conn.execute(
        "SELECT stop_reason, stop_detail FROM work_items WHERE id=?", (wid,)).fetchone()
    return v, row


def test_a_report_with_more_tests_than_are_compared_is_could_not_verify(org_home, tmp_path, monkeypatch):
    """Past the report's bound the per-test comparison with the baseline cannot be whole: the
    verdict is an error coded verify_limit and the run ends for a human — never a pass."""
    monkeypatch.setattr(reports, "MAX_IDS", 1)
    v, (reason, detail) = _verify(org_home, tmp_path / "over", "w1")
    assert v.outcome == "error" and not v.goal_met
    assert v.checks[0].code == "verify_limit" and not v.checks[0].passed
    assert reason == "verify_unrunnable" and "could not be verified (verify_limit)" in detail
    # the control: within the bound the same fix is a pass
    monkeypatch.setattr(reports, "MAX_IDS", 5000)
    v, (reason, _) = _verify(org_home, tmp_path / "within", "w2")
    assert v.outcome == "pass" and v.goal_met and reason == "goal_met"


class _Client:
    def __init__(self, calls):
        self.messages = self
        self.calls = calls

    def create(self, **kw):
        self.calls.append(kw)
        raise RuntimeError("no server in this test")


def _item(backend="anthropic", review=None) -> WorkItem:
    return WorkItem(id="w", goal="g", workspace="/nowhere", backend=backend, status="running", created_by="human",
                    created_at=0.0, updated_at=0.0, review=review or {})


def _reviewer(environ, calls=None, writer=None, **settings) -> Reviewer:
    calls = [] if calls is None else calls
    return Reviewer(ReviewSettings(prices=DEFAULT_PRICES, model="scripted", retries=0, **settings), writer,
                    environ=environ, client_factory=lambda url, key, t: _Client(calls), sleep=lambda s: None)


def test_a_diff_larger_than_the_review_reads_cannot_be_approved_and_no_model_is_asked(org_home):
    calls = []
    reviewer = _reviewer({"ANTHROPIC_API_KEY": "k"}, calls,
                         writer=StateWriter(org_home.db_path, Actor.EVAL_AGENT, "eval-agent"))
    with pytest.raises(ReviewFailed) as got:
        reviewer.review(_item(), 1, diff="+x\n" * (DIFF_CHARS // 3 + 10), checks=[])
    assert got.value.code == "review_too_large" and calls == []
    # the control: a diff within the bound is sent whole (and here the model fails: a retry, then review_failed)
    with pytest.raises(ReviewFailed) as small:
        reviewer.review(_item(), 1, diff="+x\n", checks=[], held=("notes.txt",))
    assert small.value.code == "review_failed" and len(calls) == 1
    prompt = calls[0]["messages"][0]["content"]
    assert "+x" in prompt and "Held back from verification" in prompt and "notes.txt" in prompt


def test_the_review_is_on_by_default_where_a_model_can_be_reached(tmp_path):
    with_key = _reviewer({"ANTHROPIC_API_KEY": "k"})
    assert with_key.wanted(_item(), passed=True, claim=None)
    assert not with_key.wanted(_item(review={"off": True}), passed=True, claim=None)      # --no-review
    assert not with_key.wanted(_item(), passed=False, claim=None)
    assert _reviewer({"ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}).wanted(_item(), passed=True, claim=None)
    assert not _reviewer({}).wanted(_item(), passed=True, claim=None)                     # nothing to reach
    assert not _reviewer({"ANTHROPIC_API_KEY": "k"}, default_on=False).wanted(_item(), passed=True, claim=None)
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"version": 1, "acts": [], "reviews": [{"text": "x"}]}))
    assert _reviewer({}).wanted(_item(backend=f"scripted:{script}"), passed=True, claim=None)
    script.write_text(json.dumps({"version": 1, "acts": []}))
    assert not _reviewer({}).wanted(_item(backend=f"scripted:{script}"), passed=True, claim=None)


def test_a_truncated_baseline_report_is_never_compared_in_part():
    from roles.eval_agent.verifier import _judged
    junit = {"counts": {"runner": "pytest", "passed": 2, "failed": 0, "errors": 0, "skipped": 0, "deselected": 0},
             "ids": {"a::x": "passed"}, "truncated": True}
    check = CheckResult(name="c", command="c", passed=True, exit_code=0, timed_out=False, signature=None,
                        output_tail="", duration_ms=1.0, tests=junit["counts"], junit=junit)
    base = replace(check, junit={**junit, "truncated": False, "ids": {"a::x": "passed", "a::y": "passed"}})
    assert _judged(check, {"c": base}).code == "verify_limit"
    assert _judged(replace(check, junit={**junit, "truncated": False}), {"c": replace(check)}).code == "verify_limit"
    assert review_mod.DIFF_CHARS > 0


def test_a_pass_whose_printed_output_was_cut_is_could_not_verify(tmp_path):
    """No report to rest on and the output past its bound: never a pass (the control, within the
    bound, is one)."""
    from roles.eval_agent.checks import run_check
    from roles.eval_agent.verifier import _judged
    loud = f"{sys.executable} -c \"print('x' * 5000); print('1 passed in 0.01s')\""
    cut = _judged(run_check(loud, tmp_path, timeout_s=30, max_output=1000), None)
    assert not cut.passed and cut.code == "verify_limit" and "was cut" in cut.output_tail
    whole = _judged(run_check(loud, tmp_path, timeout_s=30, max_output=100_000), None)
    assert whole.passed and whole.code is None
