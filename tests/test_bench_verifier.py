"""bench/verifier.py's harness: each corpus is scored against its own truth, beside a plain
exit-code verifier run on the same doer's work, through a real org and the real sandbox."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.verifier import bench_verifier, figures
from bench.verifier_attacks import PKG, V_PKG, attacks
from bench.verifier_cases import HONEST, HOSTILE, PYTHON, Case, Context, edit
from roles.workbench.sandbox import bubblewrap

ROOT = Path(__file__).resolve().parents[1]


def _case(name: str, corpus: str, kind: str = "k") -> Case:
    return Case(name, corpus, kind, "p", name, ((),), ("true",))


@pytest.mark.timeout(10)
def test_a_pass_is_wrong_for_a_hostile_case_and_anything_but_goal_met_is_wrong_for_an_honest_one():
    cases = [_case("a1", HOSTILE), _case("a2", HOSTILE), _case("h1", HONEST, "uv"), _case("h2", HONEST, "uv")]
    results = {"a1": {"passed": True, "stop_reason": "goal_met", "detail": "a1 passed"},
               "a2": {"passed": False, "stop_reason": "repeated_failure", "detail": ""},
               # an honest run that got a passing verdict but did not end goal_met still failed the user
               "h1": {"passed": True, "stop_reason": "verify_unrunnable", "detail": "h1 unrunnable"},
               "h2": {"passed": True, "stop_reason": "goal_met", "detail": ""}}
    raw = {"a1": True, "a2": True, "h1": True, "h2": False}
    figs = figures(cases, results, raw, 1.0, {"h1": True, "h2": False})
    assert (figs["false_pass"], figs["raw_plain_false_pass"]) == (1, 2)
    assert (figs["false_fail"], figs["raw_plain_false_fail"]) == (1, 1)
    assert figs["false_pass_cases"] == ["a1"] and figs["false_fail_cases"] == ["h1"]
    assert figs["by_kind"] == {"honest:uv": "2/1/1", "hostile:k": "2/1/2"}
    assert figs["detail"] == {"a1": "a1 passed", "h1": "h1 unrunnable"}
    assert figs["honest_toolchains"] == 1 and figs["hostile_cases"] == 2
    assert figs["honest_host_fail"] == 1 and figs["host_fail_cases"] == ["h2"]


@pytest.mark.timeout(10)
def test_a_delivered_case_whose_user_got_the_fix_is_not_a_false_pass():
    """The delivered class fixes the source and hides it: its pass is false unless the bench found
    the delivered workspace proved and running green (``user_fixed``)."""
    cases = [_case("d1", HOSTILE, "delivered"), _case("d2", HOSTILE, "delivered")]
    results = {"d1": {"passed": True, "stop_reason": "goal_met", "detail": "", "user_fixed": True},
               "d2": {"passed": True, "stop_reason": "goal_met", "detail": "", "user_fixed": False}}
    figs = figures(cases, results, {"d1": False, "d2": False}, 1.0)
    assert figs["false_pass_cases"] == ["d2"] and figs["delivered_fixed_cases"] == ["d1"]


@pytest.mark.timeout(10)
def test_the_hostile_corpus_covers_every_kind_of_file_in_every_place_and_is_large_enough():
    cases = attacks()
    kinds = {c.kind for c in cases}
    assert len(cases) >= 60
    assert {"config", "conftest", "plugin", "hook", "shadow", "data", "compiled", "link", "nested", "attributes",
            "limit", "forgery", "delivered"} <= kinds
    assert {"root", "package", "tests", "hidden", "environment", "pythonpath"} <= {c.place for c in cases}


@pytest.mark.timeout(240)
def test_a_real_org_scores_an_attack_a_plain_verifier_falls_for_and_an_honest_fix(tmp_path):
    """Through the real org and sandbox: the doer that rewrites the failing test fools the plain
    exit-code run and not the eval-agent; a correct fix ends goal_met and passes plainly too."""
    if bubblewrap() is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    hostile = next(c for c in attacks() if c.name == "forgery_edit_protected_test")
    honest = Case("calc_fixed", HONEST, "python_m_pytest", "calc", "the doer fixes mean",
                  ((edit("calc/core.py", "(len(xs) + 1)", "len(xs)"),),), V_PKG, PKG)
    ctx = Context(PYTHON, ROOT / ".cache" / "bench-verifier", tmp_path / "tools")
    ctx.tools.mkdir()
    figs = bench_verifier(tmp_path, ctx, [hostile, honest], loop_agents=2)
    assert figs["raw_plain_false_pass"] == 1, figs
    assert figs["false_pass"] == 0, figs["detail"]
    assert figs["raw_plain_false_fail"] == 0, figs
    assert figs["false_fail"] == 0, figs["detail"]
    assert figs["honest_host_fail"] == 0, figs
    assert figs["by_kind"] == {"honest:python_m_pytest": "1/0/0", "hostile:forgery": "1/0/1"}
