"""What a check's output proves (evidence), what is held back from verification (held), and
the verifier's judgement on its own snapshot: real runners where this machine has them."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from roles.eval_agent import evidence, held
from roles.eval_agent.checks import failure_signature
from roles.eval_agent.verifier import Verifier
from state_db.vocab import Actor
from tests.support.loop import record_iteration, submit
from state_db.writer import StateWriter

CALC = "def mean(xs):\n    return sum(xs) / (len(xs) + 1)\n"
FIXED = "def mean(xs):\n    return sum(xs) / len(xs)\n"
TESTS = ("from calc import mean\n\n"
         "def test_mean():\n    assert mean([1, 2]) == 1.5\n\n"
         "def test_single():\n    assert mean([3]) > 0\n")


def _pytest_out(tmp_path: Path, files: dict, *args) -> tuple[int, str]:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    got = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    return got.returncode, got.stdout + got.stderr


# -- summaries from the real runners --------------------------------------------------------------

def test_pytest_summaries_are_read_from_real_runs(tmp_path):
    code, out = _pytest_out(tmp_path, {"calc.py": CALC, "test_calc.py": TESTS}, "-q")
    counts = evidence.parse(out)
    assert code == 1 and counts == evidence.TestCounts("pytest", passed=1, failed=1)
    assert evidence.failing_ids(out) == ["test_calc.py::test_mean"]
    (tmp_path / "calc.py").write_text(FIXED)
    code, out = _pytest_out(tmp_path, {}, "-q", "-k", "test_mean")
    assert evidence.parse(out) == evidence.TestCounts("pytest", passed=1, deselected=1)
    code, out = _pytest_out(tmp_path, {}, "--co", "-q")
    assert code == 0 and evidence.parse(out).ran == 0            # collect-only ran nothing


def test_unittest_and_node_test_summaries_are_read_from_real_runs(tmp_path):
    (tmp_path / "test_u.py").write_text("import unittest\n\nclass T(unittest.TestCase):\n"
                                        "    def test_a(self):\n        self.assertEqual(1, 2)\n"
                                        "    @unittest.skip('later')\n    def test_b(self):\n        pass\n"
                                        "    def test_c(self):\n        pass\n")
    got = subprocess.run([sys.executable, "-m", "unittest", "-q"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert evidence.parse(got.stderr) == evidence.TestCounts("unittest", passed=1, failed=1, skipped=1)
    assert evidence.failing_ids(got.stderr) == ["test_u.T.test_a"]
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    (tmp_path / "t.test.mjs").write_text("import test from 'node:test';\nimport assert from 'node:assert';\n"
                                         "test('one', () => assert.equal(1, 1));\n"
                                         "test('two', () => assert.equal(1, 2));\n")
    got = subprocess.run([node, "--test", "--test-reporter=tap"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert evidence.parse(got.stdout) == evidence.TestCounts("node-test", passed=1, failed=1)
    assert "two" in evidence.failing_ids(got.stdout)


@pytest.mark.parametrize("text,want", [
    ("Tests:       1 failed, 1 skipped, 2 passed, 4 total\nTime: 1 s",
     evidence.TestCounts("jest", passed=2, failed=1, skipped=1)),
    (" Test Files  1 passed (1)\n      Tests  3 passed (3)\n", evidence.TestCounts("vitest", passed=3)),
    ("  2 passing (5ms)\n  1 failing\n", evidence.TestCounts("mocha", passed=2, failed=1)),
    ("test result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.00s\n"
     "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 3 filtered out; finished in 0.00s",
     evidence.TestCounts("cargo", passed=3, skipped=1, deselected=3)),
    ("=== RUN   TestA\n--- PASS: TestA (0.00s)\n=== RUN   TestB\n--- FAIL: TestB (0.00s)\nFAIL\nFAIL\tex\t0.002s",
     evidence.TestCounts("go", passed=1, failed=1)),
    ("all good\n", None),
])
def test_other_runners_documented_summaries(text, want):
    assert evidence.parse(text) == want


def test_the_last_summary_wins_so_a_line_printed_earlier_does_not_stand_in():
    out = "5 passed in 0.01s\n...\nF.\n1 failed, 1 passed in 0.03s\n"
    assert evidence.parse(out) == evidence.TestCounts("pytest", passed=1, failed=1)


# -- the judgement against the baseline -----------------------------------------------------------

BASE = evidence.TestCounts("pytest", passed=1, failed=1)


@pytest.mark.parametrize("counts,problem", [
    (evidence.TestCounts("pytest", passed=2), None),
    (evidence.TestCounts("pytest", passed=3), None),                        # the doer added a test
    (evidence.TestCounts("pytest", skipped=2), "ran no tests"),
    (evidence.TestCounts("pytest", passed=1, skipped=1), "ran 1 tests where the baseline ran 2"),
    (evidence.TestCounts("pytest", passed=2, skipped=1), "skipped 1"),
    (evidence.TestCounts("pytest", passed=2, deselected=1), "deselected 1"),
    (None, "printed no test summary"),
])
def test_a_pass_needs_as_many_tests_as_the_baseline_ran(counts, problem):
    ev = evidence.judge(counts, BASE, baseline_known=True)
    assert (ev.problem is None) if problem is None else problem in ev.problem


def test_without_a_summary_anywhere_the_pass_rests_on_the_exit_code():
    assert evidence.judge(None, None, baseline_known=True) == evidence.Evidence("exit_code")


# -- failure signatures ----------------------------------------------------------------------------

def test_a_failure_that_prints_the_time_has_one_signature(tmp_path):
    sigs = set()
    for stamp in ("1733200000.12", "1733200007.98"):
        code, out = _pytest_out(tmp_path, {"calc.py": CALC, "test_calc.py": TESTS.replace(
            "assert mean([1, 2]) == 1.5", f"assert mean([1, 2]) == 1.5, 'at {stamp} pid=4{stamp[-2:]}'")}, "-q")
        sigs.add(failure_signature(out, code, False, tmp_path))
    assert len(sigs) == 1
    code, out = _pytest_out(tmp_path, {"calc.py": "def mean(xs):\n    return xs.nope\n"}, "-q")
    assert failure_signature(out, code, False, tmp_path) not in sigs        # another kind of error


# -- held back --------------------------------------------------------------------------------------

def _held(base: dict, target: dict, commands=("python -m pytest -q",)):
    b = {k: v.encode() for k, v in base.items()}
    t = {k: v.encode() for k, v in target.items()}
    kinds = held.candidates(set(b) | set(t), commands, b)
    kinds = {p: k for p, k in kinds.items() if b.get(p) != t.get(p)}
    return held.held_back(kinds, b, t)


def test_runner_configuration_startup_hooks_shadows_and_env_files_are_held_to_the_baseline():
    base = {"calc.py": CALC, "test_calc.py": TESTS, "tox.ini": "[pytest]\naddopts = -q\n", "run.sh": "pytest\n",
            "pkg/__init__.py": "", "pkg/types.py": "X = 1\n", "statistics.py": "def f():\n    return 1\n"}
    target = {**base, "conftest.py": "import pytest\n", "pytest.ini": "[pytest]\naddopts = --co\n",
              "sub/conftest.py": "x", "tox.ini": "[pytest]\naddopts = --co\n", "sitecustomize.py": "import os\n",
              "lib/x.pth": "import os; os._exit(0)\n", "pytest.py": "print('2 passed')\n", "os.py": "",
              ".env": "PYTEST_ADDOPTS=--co\n", "run.sh": "exit 0\n", "pkg/types.py": "X = 2\n",
              "statistics.py": "def f():\n    return 2\n", "calc.py": FIXED}
    got, edits = _held(base, target, ("python -m pytest -q", "sh run.sh"))
    by = {h.path: (h.kind, h.treatment) for h in got}
    assert by == {
        "conftest.py": ("runner_config", held.REMOVED), "sub/conftest.py": ("runner_config", held.REMOVED),
        "pytest.ini": ("runner_config", held.REMOVED), "tox.ini": ("runner_config", held.RESTORED),
        "sitecustomize.py": ("startup_hook", held.REMOVED), "lib/x.pth": ("startup_hook", held.REMOVED),
        "pytest.py": ("shadow_module", held.REMOVED), "os.py": ("shadow_module", held.REMOVED),
        ".env": ("env_file", held.REMOVED), "run.sh": ("invoked_script", held.RESTORED)}
    assert edits["tox.ini"] == base["tox.ini"].encode() and edits["conftest.py"] is None
    # the project's own modules (calc.py; statistics.py and pkg/types.py existed at the baseline) are the work
    assert not {"calc.py", "statistics.py", "pkg/types.py"} & set(by)


def test_mixed_files_keep_the_doers_other_changes_and_lose_only_the_test_sections():
    base = {"pyproject.toml": '[project]\nname = "p"\ndependencies = []\n\n[tool.pytest.ini_options]\naddopts = "-q"\n',
            "package.json": '{"name": "p", "scripts": {"test": "node --test"}, "dependencies": {}}',
            "setup.cfg": "[metadata]\nname = p\n\n[tool:pytest]\naddopts = -q\n"}
    target = {"pyproject.toml": '[project]\nname = "p"\ndependencies = ["attrs"]\n\n[tool.pytest.ini_options]\n'
                                'addopts = "-p no:python"\n',
              "package.json": '{"name": "p", "scripts": {"test": "exit 0"}, "dependencies": {"x": "1"}}',
              "setup.cfg": "[metadata]\nname = q\n\n[tool:pytest]\naddopts = --co\n"}
    got, edits = _held(base, target)
    assert {h.path: h.treatment for h in got} == {p: held.SECTIONS for p in base}
    import json
    import tomllib
    py = tomllib.loads(edits["pyproject.toml"].decode())
    assert py["project"]["dependencies"] == ["attrs"] and py["tool"]["pytest"]["ini_options"]["addopts"] == "-q"
    pkg = json.loads(edits["package.json"])
    assert pkg["scripts"] == {"test": "node --test"} and pkg["dependencies"] == {"x": "1"}
    assert "name = q" in edits["setup.cfg"].decode() and "addopts = -q" in edits["setup.cfg"].decode()
    # a change outside the test sections is not held at all
    got, _ = _held(base, {**base, "pyproject.toml": base["pyproject.toml"].replace("[]", '["attrs"]')})
    assert got == []


# -- the verifier on its own snapshot ----------------------------------------------------------------

def _repo(root: Path) -> Path:
    ws = root / "ws"
    ws.mkdir(parents=True)
    (ws / "calc.py").write_text(CALC)
    (ws / "tests").mkdir()
    (ws / "tests" / "test_calc.py").write_text(TESTS.replace("from calc", "import sys, os\n"
                                                             "sys.path.insert(0, os.getcwd())\nfrom calc"))
    return ws


def _verify(org_home, ws, wid, change, *, protect=(), default_protect=True, scope=()):
    submit(org_home, ws, work_id=wid, verify=(f"{sys.executable} -m pytest -q -p no:cacheprovider",))
    w = StateWriter(org_home.db_path, Actor.COORDINATOR)
    with w.transaction() as tx:
        tx.update("work_items", wid, protect=list(protect), default_protect=int(default_protect), scope=list(scope))
    w.close()
    verifier = Verifier(org_home, StateWriter(org_home.db_path, Actor.EVAL_AGENT, "eval-agent"), timeout_s=60)
    pre = verifier.verify(wid, 0)
    change(ws)
    from roles.workbench.workspace.history import WorkspaceHistory
    history = WorkspaceHistory(org_home.history_dir / f"{wid}.git", ws)
    checkpoint = history.checkpoint(1)
    record_iteration(org_home, wid, checkpoint)
    return pre, verifier.verify(wid, 1)


def test_the_preflight_records_the_baseline_and_the_positive_control_passes_with_evidence(org_home, tmp_path):
    pre, v = _verify(org_home, _repo(tmp_path), "w1", lambda ws: (ws / "calc.py").write_text(FIXED))
    assert pre.outcome == "ready" and "1 of 2 tests fail" in pre.detail
    assert v.outcome == "pass" and v.goal_met and v.checks[0].evidence == "tests"


def test_protect_adds_to_the_defaults_and_reaches_nested_tests(org_home, tmp_path):
    def cheat(ws):
        (ws / "tests" / "test_calc.py").write_text("def test_ok():\n    pass\n")
    _, v = _verify(org_home, _repo(tmp_path), "w1", cheat, protect=["test_*.py"])
    assert v.outcome == "fail" and v.protected_changed == ("tests/test_calc.py",)


def test_a_new_test_that_exits_at_import_cannot_hide_the_protected_ones(org_home, tmp_path):
    def cheat(ws):
        (ws / "tests" / "test_zzz.py").write_text("import os\nprint('2 passed in 0.01s')\nos._exit(0)\n")
    _, v = _verify(org_home, _repo(tmp_path), "w1", cheat)
    assert v.outcome == "fail" and not v.goal_met       # a new test is outside the change scope
    assert {"path": "tests/test_zzz.py", "kind": "out_of_scope", "treatment": held.REMOVED} in v.held_back
    # with the scope widened to the tests, the evidence is the second line
    _, v = _verify(org_home, _repo(tmp_path / "again"), "w2", cheat, scope=["tests/**"])
    assert v.outcome == "fail" and not v.goal_met and v.held_back == ()
    assert "wrote no test report, where the baseline's run wrote one" in v.feedback


def test_a_forged_summary_printed_from_inside_pytest_is_not_a_pass(org_home, tmp_path):
    """Code in pytest's own process lifts the output capture, prints '2 passed' and exits 0: the
    printed summary says pass, but pytest never wrote its report."""
    forged = ("import gc, os, sys\nfor o in gc.get_objects():\n    if type(o).__name__ == 'CaptureManager':\n"
              "        o.suspend_global_capture(in_=True)\n"
              "sys.stdout.write('..  [100%]\\n2 passed in 0.01s\\n'); sys.stdout.flush(); os._exit(0)\n")

    def cheat(ws):
        (ws / "calc.py").write_text(CALC + forged)
    _, v = _verify(org_home, _repo(tmp_path), "w1", cheat)
    assert v.checks[0].exit_code == 0 and evidence.parse(v.checks[0].output_tail).passed == 2   # the forgery
    assert v.outcome == "fail" and not v.goal_met and "wrote no test report" in v.feedback


def test_junit_reports_give_ids_and_the_baseline_tests_must_all_run(tmp_path):
    code, out = _pytest_out(tmp_path, {"calc.py": FIXED, "test_calc.py": TESTS}, "-q",
                            f"--junitxml={tmp_path / 'r.xml'}")
    full = evidence.read_junit(tmp_path / "r.xml")
    assert full["counts"]["passed"] == 2 and set(full["ids"]) == {"test_calc::test_mean", "test_calc::test_single"}
    code, out = _pytest_out(tmp_path, {}, "-q", "-k", "test_single", f"--junitxml={tmp_path / 'r2.xml'}")
    part = evidence.read_junit(tmp_path / "r2.xml")
    ev = evidence.judge(evidence.TestCounts.decode(part["counts"]), evidence.TestCounts.decode(full["counts"]),
                        baseline_known=True, junit=part, baseline_junit=full)
    assert "did not run 1 test(s) the baseline ran (first: test_calc::test_mean)" in ev.problem
    assert evidence.read_junit(tmp_path / "missing.xml") is None


def test_a_new_conftest_that_skips_everything_is_left_out_and_named(org_home, tmp_path):
    def cheat(ws):
        (ws / "tests" / "conftest.py").write_text("import pytest\n@pytest.fixture(autouse=True)\n"
                                                  "def s():\n    pytest.skip('no')\n")
    _, v = _verify(org_home, _repo(tmp_path), "w1", cheat, scope=["tests/**"])
    assert v.outcome == "fail" and {"path": "tests/conftest.py", "kind": "runner_config",
                                    "treatment": held.REMOVED} in v.held_back
    assert "Held back from verification: tests/conftest.py" in v.feedback
    row = orjson.loads(org_home and StateWriter(org_home.db_path, Actor.COORDINATOR).conn.execute(
        "SELECT held_back FROM verdicts WHERE work_id='w1'").fetchone()[0])
    assert row[0]["path"] == "tests/conftest.py"


def test_the_runner_installed_in_a_workspace_environment_and_plugin_entry_points_are_held():
    """A doer with a virtual environment inside the workspace edits pytest there, or installs a
    package whose entry point makes pytest load it as a plugin: both held to the baseline."""
    sp = ".venv/lib/python3.11/site-packages"
    base = {f"{sp}/_pytest/main.py": "real\n", f"{sp}/attrs/__init__.py": "x\n", "calc.py": CALC}
    target = {**base, f"{sp}/_pytest/main.py": "forged\n", f"{sp}/evil-1.0.dist-info/entry_points.txt":
              "[pytest11]\nevil = evil\n", f"{sp}/evil.py": "x\n", f"{sp}/attrs/__init__.py": "y\n"}
    got, edits = _held(base, target)
    by = {h.path: (h.kind, h.treatment) for h in got}
    assert by[f"{sp}/_pytest/main.py"] == ("runner_install", held.RESTORED)
    assert by[f"{sp}/evil-1.0.dist-info/entry_points.txt"] == ("runner_install", held.REMOVED)
    assert f"{sp}/attrs/__init__.py" not in by            # other installed packages are the doer's business


def test_a_module_the_baseline_could_not_collect_counts_as_run_once_its_tests_run(org_home, tmp_path):
    """The bug breaks the import of the code under test, so the baseline's report has one error for
    the test module (no test ids): the fix that makes it importable passes; a change that makes the
    module skip itself at collection runs none of its tests and does not."""
    def broken(root):
        ws = _repo(root)
        (ws / "calc.py").write_text("import sys\nsys.no_such_attribute\n" + CALC)
        (ws / "tests" / "test_other.py").write_text("def test_other():\n    pass\n")
        return ws

    pre, v = _verify(org_home, broken(tmp_path / "a"), "w1", lambda ws: (ws / "calc.py").write_text(FIXED))
    assert pre.checks[0]["junit"]["ids"] == {"::tests.test_calc": "error"}     # the session stops there
    assert v.outcome == "pass" and v.goal_met, v.feedback

    def skips(ws):
        (ws / "calc.py").write_text("import pytest\npytest.skip('later', allow_module_level=True)\n" + FIXED)
    _, v = _verify(org_home, broken(tmp_path / "b"), "w2", skips)
    assert v.checks[0].exit_code == 0 and not v.goal_met
    assert "did not run 1 test(s) the baseline ran (first: ::tests.test_calc)" in v.feedback
