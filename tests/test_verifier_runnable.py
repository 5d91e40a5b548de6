"""A verify command that never reached its tests is the machine's failure: on the baseline the
work item ends ``verify_unrunnable`` at the preflight, quoting the tool and the fix; during the
run an environment that lost what the baseline had is an ``environment_failed`` error verdict,
never the doer's failure. Real pytest runs, in-process verifier."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from roles.eval_agent import runnable
from roles.eval_agent.checks import CheckResult
from roles.eval_agent.verifier import Verifier
from state_db.queries import work as work_q
from state_db.vocab import Actor, StopReason
from state_db.writer import StateWriter
from tests.support.loop import commit_iteration, submit

pytestmark = pytest.mark.timeout(240)

CALC = "def mean(xs):\n    return sum(xs) / (len(xs) + 1)\n"
FIXED = "def mean(xs):\n    return sum(xs) / len(xs)\n"
TESTS = ("import os, sys\nsys.path.insert(0, os.getcwd())\nfrom calc import mean\n\n\n"
         "def test_mean():\n    assert mean([1, 2]) == 1.5\n")
PYTEST = f"{sys.executable} -m pytest -q -p no:cacheprovider"


def _ws(root: Path, extra: dict[str, str] | None = None) -> Path:
    ws = root / "ws"
    for rel, text in {"calc.py": CALC, "tests/test_calc.py": TESTS, **(extra or {})}.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    return ws


def _verifier(org_home) -> Verifier:
    return Verifier(org_home, StateWriter(org_home.db_path, Actor.EVAL_AGENT, "eval-agent"), timeout_s=120)


def _preflight(org_home, ws, verify):
    submit(org_home, ws, work_id="w1", verify=(verify,))
    v = _verifier(org_home)
    return v.verify("w1", 0), work_q.item(v.writer.conn, "w1")


def _check(output: str, *, exit_code: int = 2, command: str = "uv run pytest -q", **kw) -> CheckResult:
    return CheckResult(name=command, command=command, passed=False, exit_code=exit_code, timed_out=False,
                       signature="x", output_tail=output, duration_ms=1.0, **kw)


# -- the baseline: never reached its runner ----------------------------------------------------------

UV_OFFLINE = ("Using CPython 3.11.7\nCreating virtual environment at: .venv\n"
              "error: Failed to fetch: `https://pypi.org/simple/pytest/`\n  Caused by: Request failed after 3 retries\n"
              "  Caused by: error sending request for url (https://pypi.org/simple/pytest/)\n"
              "  Caused by: dns error: failed to lookup address information: Temporary failure in name resolution\n")


def test_uv_that_cannot_reach_the_network_never_ran_the_tests_and_says_how_to_run_offline():
    what, hint = runnable.why_not_ran(_check(UV_OFFLINE), dependencies=set(), workspace_modules=set())
    assert what.startswith("it needed the network (") and "Failed to fetch" in what
    assert "--frozen --no-sync" in hint


def test_a_baseline_that_ran_its_tests_and_failed_is_the_work_to_do():
    ran = _check("F\n1 failed in 0.1s\n", exit_code=1, command=PYTEST,
                 tests={"runner": "pytest", "passed": 0, "failed": 1, "errors": 0, "skipped": 0, "deselected": 0})
    assert runnable.why_not_ran(ran, dependencies=set(), workspace_modules={"calc"}) is None
    # the project's own module that the work is to write is the doer's, not the machine's
    own = _check("E   ModuleNotFoundError: No module named 'newmod'\n1 error in 0.1s\n", exit_code=2, command=PYTEST,
                 junit={"counts": {"runner": "pytest", "errors": 1}, "ids": {}, "truncated": False},
                 tests={"runner": "pytest", "errors": 1})
    assert runnable.why_not_ran(own, dependencies=set(), workspace_modules={"calc"}) is None


def test_declared_dependencies_are_read_from_pyproject_poetry_setup_cfg_and_requirements():
    files = {"pyproject.toml": b'[project]\nname = "x"\ndependencies = ["text-unidecode>=1.3", "Requests[socks]"]\n'
                               b'[tool.poetry.dependencies]\npython = "^3.11"\nattrs = "*"\n',
             "setup.cfg": b"[options]\ninstall_requires =\n    click>=8\n",
             "requirements-dev.txt": b"hypothesis==6.0\n# comment\n", "docs/requirements.txt": b"sphinx\n"}
    got = runnable.declared(files.get, files)
    assert {"text_unidecode", "requests", "attrs", "click", "hypothesis"} <= got and "sphinx" not in got


def test_a_missing_declared_dependency_on_the_baseline_is_unrunnable_naming_the_module(org_home, tmp_path):
    ws = _ws(tmp_path, {"pyproject.toml": '[project]\nname = "calc"\nversion = "1"\n'
                                          'dependencies = ["no-such-dependency-xyz"]\n',
                        "tests/test_dep.py": "import no_such_dependency_xyz\n\n\ndef test_dep():\n    pass\n"})
    pre, work = _preflight(org_home, ws, PYTEST)
    assert pre.outcome == "unrunnable" and work.stop_reason == StopReason.VERIFY_UNRUNNABLE
    assert "the interpreter lacks the module 'no_such_dependency_xyz'" in work.stop_detail
    assert "No module named 'no_such_dependency_xyz'" in work.stop_detail and "interpreter that has" in work.stop_detail


@pytest.mark.parametrize("args,said", [("tests/no_such_dir", "pytest was called wrongly (usage error)"),
                                       ("-k no_test_matches_this", "pytest collected no tests")])
def test_pytest_usage_errors_and_no_tests_on_the_baseline_are_unrunnable(org_home, tmp_path, args, said):
    pre, work = _preflight(org_home, _ws(tmp_path), f"{PYTEST} {args}")
    assert pre.outcome == "unrunnable" and said in work.stop_detail, work.stop_detail


def test_a_runner_that_never_started_and_left_no_report_or_summary_is_unrunnable(org_home, tmp_path):
    """A wrapper that dies before pytest runs (what ``uv run`` does offline): no report, no summary."""
    pre, work = _preflight(org_home, _ws(tmp_path), "sh -c 'echo resolving environment...; exit 2' pytest")
    assert pre.outcome == "unrunnable" and "its test runner never ran" in work.stop_detail
    assert "resolving environment..." in work.stop_detail


def test_the_positive_control_baseline_is_ready(org_home, tmp_path):
    pre, work = _preflight(org_home, _ws(tmp_path), PYTEST)
    assert pre.outcome == "ready" and work.stop_reason is None


# -- during the run: the environment lost what the baseline had ----------------------------------------

def test_an_installed_package_that_lost_its_module_during_the_run_is_the_machines_failure(org_home, tmp_path):
    """The tests import an installed library; after the baseline the library's own dependency
    disappears from the environment: an error verdict coded environment_failed, not a failure
    of the doer, and the run ends verify_unrunnable."""
    site = tmp_path / "env" / "lib" / "site-packages"
    (site / "helperlib").mkdir(parents=True)
    (site / "helperlib" / "__init__.py").write_text("import helperdep\n")
    (site / "helperdep.py").write_text("X = 1\n")
    ws = _ws(tmp_path, {"tests/test_lib.py": "import helperlib\n\n\ndef test_lib():\n    pass\n"})
    submit(org_home, ws, work_id="w1", verify=(f"PYTHONPATH={site} {PYTEST}",))
    verifier = _verifier(org_home)
    assert verifier.verify("w1", 0).outcome == "ready"
    (site / "helperdep.py").unlink()
    (ws / "calc.py").write_text(FIXED)
    commit_iteration(org_home, ws, "w1")
    v = verifier.verify("w1", 1)
    work = work_q.item(verifier.writer.conn, "w1")
    assert v.outcome == "error" and v.checks[0].code == "environment_failed"
    assert work.stop_reason == StopReason.VERIFY_UNRUNNABLE and "the machine's failure, not the doer's" in work.stop_detail
    assert "helperdep" in work.stop_detail


def test_a_module_the_doers_change_stops_importing_is_the_doers_failure():
    """The project's own module, or a declared dependency the doer's code newly imports, fails
    the check as usual (the doer can fix it)."""
    base = _check("1 failed in 0.1s", exit_code=1, command=PYTEST, tests={"runner": "pytest", "failed": 1})
    now = _check("tests/test_calc.py:3: in <module>\n    import requests\nE   ModuleNotFoundError: No module named "
                 "'requests'\n1 error in 0.1s", exit_code=2, command=PYTEST, tests={"runner": "pytest", "errors": 1})
    assert runnable.environment_failed(now, base, workspace_modules={"calc"}) is None


# -- forced colour: no terminal control sequence is stored or sent to a model -----------------------

def test_forced_colour_reaches_no_verdict_feedback_or_prompt(org_home, tmp_path):
    """The project's pytest configuration forces colour: the words of the failure reach the
    feedback, its escape sequences do not; nor do they reach a prompt built from it."""
    from roles.loop_agent.context import assemble
    ws = _ws(tmp_path, {"pytest.ini": "[pytest]\naddopts = --color=yes\n"})
    submit(org_home, ws, work_id="w1", verify=(PYTEST,))
    verifier = _verifier(org_home)
    pre = verifier.verify("w1", 0)
    assert pre.outcome == "ready" and "\x1b" not in pre.checks[0]["output_tail"]
    (ws / "calc.py").write_text(CALC + "\n# still wrong\n")
    commit_iteration(org_home, ws, "w1")
    v = verifier.verify("w1", 1)
    assert v.outcome == "fail" and "assert" in v.feedback and "\x1b" not in v.feedback
    prompt = assemble("fix \x1b[31mmean\x1b[0m", "instructions", [], [("k1", "note \x1b]52;c;eA==\x07")], [], [],
                      "\x1b[1mFAILED\x1b[0m test_mean", 2)
    assert "\x1b" not in prompt.variable and "\x07" not in prompt.variable and "FAILED test_mean" in prompt.variable


def test_a_runtime_the_memory_bound_stopped_before_any_test_is_the_machines():
    """vitest's bundler under the sandbox's address-space limit: no summary, the runtime's words."""
    wasm = _check("RangeError: WebAssembly.instantiate(): Out of memory: Cannot allocate Wasm memory for new "
                  "instance\n\nNode.js v20.20.2\n", exit_code=1, command="npm test")
    what, hint = runnable.why_not_ran(wasm, dependencies=set(), workspace_modules=set())
    assert what.startswith("the sandbox's memory bound stopped it (") and "sandbox.memory_mb" in hint
    ran = _check("Cannot allocate memory\nTests:       1 failed, 1 total\n", exit_code=1, command="npm test",
                 tests={"runner": "jest", "failed": 1})
    assert runnable.why_not_ran(ran, dependencies=set(), workspace_modules=set()) is None


def test_an_environment_failure_during_a_run_is_no_lesson_and_no_repeated_failure(org_home, tmp_path):
    """Through the loop engine: the doer's act fixes the code while the environment loses a module
    an installed package imports; the verdict is the machine's error, the run ends
    verify_unrunnable, and the iteration carries no lesson."""
    from tests.support.loop import BUGGY, FIXED, ScriptedActs, engine, make_workspace
    from tests.support.org import query
    site = tmp_path / "env" / "lib" / "site-packages"
    (site / "helperlib").mkdir(parents=True)
    (site / "helperlib" / "__init__.py").write_text("import helperdep\n")
    (site / "helperdep.py").write_text("X = 1\n")
    ws = make_workspace(tmp_path)
    (ws / "tests" / "test_lib.py").write_text("import helperlib\n\n\ndef test_lib():\n    pass\n")
    submit(org_home, ws, verify=(f"cd {ws} && PYTHONPATH={site}:{ws} {PYTEST}",))

    class LosesItsEnvironment(ScriptedActs):
        def act(self, ctx, *, on_usage, budget_left):
            (site / "helperdep.py").unlink(missing_ok=True)
            return super().act(ctx, on_usage=on_usage, budget_left=budget_left)
    assert (ws / "calc.py").read_text() == BUGGY
    decision = engine(org_home, "w1", LosesItsEnvironment([[{"write": {"calc.py": FIXED}}]])).run()
    assert decision.reason == StopReason.VERIFY_UNRUNNABLE
    rows = query(org_home, "SELECT n, lesson FROM iterations WHERE work_id='w1'")
    assert rows == [{"n": 1, "lesson": None}]
    verdict = query(org_home, "SELECT outcome, checks FROM verdicts WHERE work_id='w1'")[0]
    assert verdict["outcome"] == "error" and "environment_failed" in verdict["checks"]
