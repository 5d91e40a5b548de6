"""Canary tests: a report forged inside the test process is caught, an honest run is never
called forged, and the doer never sees a canary. Real pytest runs on real snapshots."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from roles.eval_agent import canaries
from roles.eval_agent.verifier import Verifier
from state_db.queries import work as work_q
from state_db.vocab import Actor, StopReason
from state_db.writer import StateWriter
from tests.support.loop import commit_iteration, submit

pytestmark = pytest.mark.timeout(240)

CALC = "def mean(xs):\n    return sum(xs) / (len(xs) + 1)\n"
FIXED = "def mean(xs):\n    return sum(xs) / len(xs)\n"
TESTS = ("import os, sys\nsys.path.insert(0, os.getcwd())\nfrom calc import mean\n\n\n"
         "def test_mean():\n    assert mean([1, 2]) == 1.5\n\n\n"
         "def test_single():\n    assert mean([3]) > 0\n")
OTHER = "def test_other():\n    assert 1 + 1 == 2\n"
PYTEST = f"{sys.executable} -m pytest -q -p no:cacheprovider"

# code under test that rewrites pytest's JUnit report once pytest has written it, and exits 0:
# every failure taken out (what a forger does who knows the runner, not the verifier)
FLIP = '''
import atexit, os, re
def _forge():
    opts = os.environ.get("PYTEST_ADDOPTS", "")
    m = re.search(r"--junitxml=(\\S+)", opts)
    if m and os.path.exists(m.group(1)):
        text = open(m.group(1)).read()
        text = re.sub(r"<failure[^>]*>.*?</failure>|<failure[^>]*/>", "", text, flags=re.S)
        text = re.sub(r'failures="\\d+"', 'failures="0"', text)
        open(m.group(1), "w").write(text)
    os._exit(0)
atexit.register(_forge)
'''
# a forger that writes a fresh report of the tests it knows, all passed
FRESH = '''
import atexit, os, re
def _forge():
    m = re.search(r"--junitxml=(\\S+)", os.environ.get("PYTEST_ADDOPTS", ""))
    if m:
        cases = "".join(f'<testcase classname="tests.{f}" name="{t}" time="0.001"/>'
                        for f, t in (("test_calc", "test_mean"), ("test_calc", "test_single"),
                                     ("test_other", "test_other")))
        open(m.group(1), "w").write('<?xml version="1.0"?><testsuites><testsuite name="pytest" errors="0" '
                                    'failures="0" skipped="0" tests="3">' + cases + '</testsuite></testsuites>')
    os._exit(0)
atexit.register(_forge)
'''


def _repo(root: Path) -> Path:
    ws = root / "ws"
    (ws / "tests").mkdir(parents=True)
    (ws / "calc.py").write_text(CALC)
    (ws / "tests" / "test_calc.py").write_text(TESTS)
    (ws / "tests" / "test_other.py").write_text(OTHER)
    return ws


def _verify(org_home, ws, change, *, verify=(PYTEST,), canaries_on=True, wid="w1", default_protect=True,
            scope=()):
    submit(org_home, ws, work_id=wid, verify=verify)
    if not default_protect or scope:
        w = StateWriter(org_home.db_path, Actor.COORDINATOR)
        with w.transaction() as tx:
            tx.update("work_items", wid, default_protect=int(default_protect), scope=list(scope))
        w.close()
    verifier = Verifier(org_home, StateWriter(org_home.db_path, Actor.EVAL_AGENT, "eval-agent"), timeout_s=120,
                        canaries=canaries_on)
    pre = verifier.verify(wid, 0)
    change(ws)
    commit_iteration(org_home, ws, wid)
    v = verifier.verify(wid, 1)
    return pre, v, work_q.item(verifier.writer.conn, wid)


def _fix(ws):
    (ws / "calc.py").write_text(FIXED)


def test_an_honest_fix_passes_with_canaries_that_no_output_or_count_shows(org_home, tmp_path):
    pre, v, work = _verify(org_home, _repo(tmp_path), _fix)
    assert pre.checks[0]["canary"] == {"hosts": ["tests/test_calc.py", "tests/test_other.py"], "failing": True}
    assert "1 of 3 tests fail" in pre.detail                     # the project's tests only
    assert set(pre.checks[0]["junit"]["ids"]) == {"tests.test_calc::test_mean", "tests.test_calc::test_single",
                                               "tests.test_other::test_other"}
    assert v.outcome == "pass" and v.goal_met and work.stop_reason == StopReason.GOAL_MET
    check = v.checks[0]
    assert check.canary["planted"] >= 3 and check.canary["forged"] is None
    assert check.tests["passed"] == 3 and check.tests["failed"] == 0
    assert "3 passed" in check.output_tail and "failed" not in check.output_tail
    assert "test_" not in check.output_tail


def test_a_report_rewritten_inside_the_test_process_ends_the_run_evidence_forged(org_home, tmp_path):
    """The doer leaves the bug and makes the code under test take every failure out of the
    report and exit 0: the must-fail canary comes out passed."""
    _, v, work = _verify(org_home, _repo(tmp_path), lambda ws: (ws / "calc.py").write_text(CALC + FLIP))
    assert v.checks[0].exit_code == 0 and not v.goal_met and v.outcome == "fail"
    assert v.checks[0].canary["forged"] == "a test that cannot pass is reported as passed"
    assert work.stop_reason == StopReason.EVIDENCE_FORGED and "was not written by an honest run" in work.stop_detail
    assert v.ended == StopReason.EVIDENCE_FORGED


def test_a_fresh_report_of_the_projects_tests_misses_the_canaries_and_is_forged(org_home, tmp_path):
    _, v, work = _verify(org_home, _repo(tmp_path), lambda ws: (ws / "calc.py").write_text(CALC + FRESH))
    assert work.stop_reason == StopReason.EVIDENCE_FORGED
    assert "missing from its report" in v.checks[0].canary["forged"] or "cannot pass" in v.checks[0].canary["forged"]


@pytest.mark.parametrize("forger", [FLIP, FRESH], ids=["flip", "fresh"])
def test_control_without_canaries_the_same_forgeries_reach_goal_met(org_home, tmp_path, forger):
    """The attack works against the verifier without the defence: the bug is still there."""
    _, v, work = _verify(org_home, _repo(tmp_path), lambda ws: (ws / "calc.py").write_text(CALC + forger),
                         canaries_on=False)
    assert v.goal_met and work.stop_reason == StopReason.GOAL_MET


def test_the_must_fail_canary_changes_no_exit_status_so_x_and_chained_commands_run_as_written(org_home, tmp_path):
    """``-x`` stops at the first failure and ``&&`` runs what follows only after a pass: with
    canaries planted, every project test still runs and the chained command still runs."""
    marker = tmp_path / "chained-ran"
    ws = _repo(tmp_path)
    (ws / "tests" / "test_calc.py").rename(ws / "tests" / "test_zlast.py")   # the failing test runs last
    verify = (f"{PYTEST} -x && touch {marker}",)
    pre, v, work = _verify(org_home, ws, _fix, verify=verify)
    assert pre.checks[0]["canary"]["hosts"] == ["tests/test_other.py"]          # -x stopped before the last file's
    assert v.goal_met and v.checks[0].canary == {"planted": 2, "forged": None} and marker.exists()
    assert v.checks[0].tests["passed"] == 3


def test_a_doer_whose_change_breaks_a_test_module_fails_and_is_not_called_forged(org_home, tmp_path):
    """The canaries of a module that no longer imports are missing from the report: the check
    fails, as it should, and the run goes on (no forgery is claimed where the check fails)."""
    _, v, work = _verify(org_home, _repo(tmp_path), lambda ws: (ws / "calc.py").write_text("def mean(:\n"))
    assert v.outcome == "fail" and v.checks[0].canary["forged"] is None
    assert work.stop_reason is None


def test_a_k_selection_that_leaves_the_canaries_out_on_the_baseline_calibrates_no_host(org_home, tmp_path):
    """What the baseline's run did not collect is never expected later: an honest pass."""
    verify = (f"{PYTEST} -k 'mean or single'",)
    pre, v, work = _verify(org_home, _repo(tmp_path), _fix, verify=verify)
    assert pre.checks[0]["canary"] == {"hosts": [], "failing": False}
    assert v.goal_met and v.checks[0].canary is None


def test_a_test_file_the_doer_changed_hosts_no_canary(org_home, tmp_path):
    """(Without the default protection: a protected file is restored, and hosts again; with the
    tests in the change scope: a test file outside it is held back, so the baseline's hosts.)"""
    def change(ws):
        _fix(ws)
        (ws / "tests" / "test_other.py").write_text(OTHER + "\n\ndef test_more():\n    assert True\n")
    _, v, work = _verify(org_home, _repo(tmp_path), change, default_protect=False, scope=("tests/**",))
    assert v.goal_met and v.checks[0].canary == {"planted": 2, "forged": None}     # test_calc.py's two


def test_scrub_takes_out_canary_lines_and_failure_blocks_and_fixes_the_summary():
    planted = canaries.Planted((canaries.Canary("tests/test_a.py", "test_keeps_order", canaries.MUST_PASS),
                                canaries.Canary("tests/test_a.py", "test_rejects_zero", canaries.MUST_FAIL)))
    out = ("tests/test_a.py ..F.\n"
           "=================================== FAILURES ===================================\n"
           "_______________________________ test_rejects_zero _______________________________\n"
           "    def settle():\n        assert 3 + 4 == 9\nE   assert 7 == 9\n"
           "_______________________________ test_real _______________________________\n"
           "E   assert real\n"
           "=========================== short test summary info ============================\n"
           "FAILED tests/test_a.py::test_rejects_zero - assert 7 == 9\n"
           "FAILED tests/test_a.py::test_real - assert real\n"
           "========================= 2 failed, 3 passed in 0.12s =========================\n")
    seen = {"test_keeps_order": "passed", "test_rejects_zero": "failed"}
    got = canaries.scrub(out, planted, seen)
    assert "rejects_zero" not in got and "settle" not in got and "7 == 9" not in got
    assert "test_real" in got and "E   assert real" in got
    assert "1 failed, 2 passed in 0.12s" in got


def test_plant_is_appended_to_unchanged_hosts_and_compiles(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "test_x.py").write_bytes(b"def test_a():\n    pass")
    (tmp_path / "t" / "test_y.py").write_bytes(b"def test_b():\n    pass\n")
    base = {"t/test_x.py": b"def test_a():\n    pass", "t/test_y.py": b"def test_b():\n    pass\n# changed\n"}
    planted = canaries.plant(tmp_path, ["t/test_x.py", "t/test_y.py"], base, random.Random(1))
    assert {c.host for c in planted.canaries} == {"t/test_x.py"}
    text = (tmp_path / "t" / "test_x.py").read_text()
    compile(text, "x", "exec")
    assert all(f"def {c.name}(" in text for c in planted.canaries)
    assert (tmp_path / "t" / "test_y.py").read_bytes() == b"def test_b():\n    pass\n"
    assert canaries.candidates({"t/test_x.py": "100644 a", ".venv/lib/test_z.py": "100644 b",
                                "node_modules/p/test_q.py": "100644 c", "t/link_test.py": "120000 d",
                                "t/helper.py": "100644 e"}) == ["t/test_x.py"]


def test_under_xdist_must_fail_canaries_skip_and_the_command_is_held_to_the_must_pass_ones():
    """A pytest-xdist worker's failure count is not the exit status's: there the must-fail canary
    skips; the baseline learns so, and a skip is then what an honest run reports."""
    planted = canaries.Planted((canaries.Canary("t/test_a.py", "test_keeps_order", canaries.MUST_PASS),
                                canaries.Canary("t/test_a.py", "test_rejects_zero", canaries.MUST_FAIL),
                                canaries.Canary("t/test_b.py", "test_reads_ascii", canaries.MUST_PASS)))
    junit = {"counts": {}, "ids": {}, "truncated": False}
    xdist = {"test_keeps_order": "passed", "test_rejects_zero": "skipped", "test_reads_ascii": "passed"}
    cal = canaries.calibrate(planted, xdist, junit)
    assert cal == {"hosts": ["t/test_a.py", "t/test_b.py"], "failing": False}
    assert canaries.forged(planted, cal["hosts"], xdist, would_pass=True, failing=False) is None
    flipped = {**xdist, "test_rejects_zero": "passed"}
    assert canaries.forged(planted, cal["hosts"], flipped, would_pass=True, failing=False) is not None
    plain = {**xdist, "test_rejects_zero": "failed"}
    assert canaries.calibrate(planted, plain, junit)["failing"] is True
    assert canaries.forged(planted, cal["hosts"], xdist, would_pass=True, failing=True) is not None
    assert canaries.calibrate(planted, plain, None) == {"hosts": [], "failing": False}


def test_canary_names_avoid_the_words_of_a_k_expression_so_selection_depends_on_the_file_only(tmp_path):
    """``-k "parse or format"`` would select a canary named test_parses_… at one verification and
    leave out test_keeps_… at the next: names never contain a -k word."""
    avoid = canaries.keyword_words([f"{PYTEST} -k 'parse or format and not slow'", "make test"])
    assert avoid == {"parse", "format", "slow"}
    (tmp_path / "test_x.py").write_bytes(b"def test_a():\n    pass\n")
    for seed in range(30):
        (tmp_path / "test_x.py").write_bytes(b"def test_a():\n    pass\n")
        planted = canaries.plant(tmp_path, ["test_x.py"], {"test_x.py": b"def test_a():\n    pass\n"},
                                 random.Random(seed), avoid=avoid)
        assert planted.canaries and not any(w in c.name for c in planted.canaries for w in avoid)


class _Files:
    """A baseline's files, as ``history.read_path(None, name)`` reads them."""

    def __init__(self, files):
        self.files = files

    def read_path(self, commit, name):
        return self.files.get(name)

    def file_ids(self, commit):
        return {name: f"100644 {i}" for i, name in enumerate(self.files)}


@pytest.mark.parametrize("command, words", [
    (f"{PYTEST} -kparse", {"parse"}),
    (f"{PYTEST} -k=parse", {"parse"}),
    (f"{PYTEST} -vk 'parse or keeps'", {"parse", "keeps"}),
    (f"{PYTEST} -xqkparse", {"parse"}),
    ("bash -c \"pytest -k 'parse and not keeps'\"", {"parse", "keeps"}),
    ("PYTEST_ADDOPTS='-k parse' pytest", {"parse"}),
    ("env PYTEST_ADDOPTS=\"-q -k 'parse or keeps'\" python -m pytest", {"parse", "keeps"}),
    (f"{PYTEST} -k 'parse or keeps", {"parse", "keeps"}),          # the shell cannot split it
    (f"{PYTEST} -p no:cacheprovider --tb=short tests", set()),
])
def test_a_k_is_found_wherever_a_shell_or_pytest_reads_one(command, words):
    assert canaries.keyword_words([command]) == words


@pytest.mark.parametrize("name, text", [
    ("pytest.ini", '[pytest]\naddopts = -k "parse or keeps"\n'),
    ("pytest.ini", "[pytest]\naddopts =\n    -q\n    -k 'parse or keeps'\n"),
    ("tox.ini", "[pytest]\naddopts = -q -k 'parse or keeps'\n"),
    ("setup.cfg", "[tool:pytest]\naddopts = -k \"parse or keeps\"\n"),
    ("pyproject.toml", '[tool.pytest.ini_options]\naddopts = "-k \'parse or keeps\'"\n'),
    ("pyproject.toml", '[tool.pytest.ini_options]\naddopts = ["-q", "-k", "parse or keeps"]\n'),
    ("pyproject.toml", '[tool.pytest]\naddopts = [\n  "-k",\n  "parse or keeps",\n]\n'),
    ("sub/pytest.ini", "[pytest]\naddopts = -k 'parse or keeps'\n"),       # pytest sub/ reads it
])
def test_a_k_in_any_pytest_config_form_is_read_whole(name, text):
    """A quoted expression, a value over several lines, a TOML list: every word of the ``-k``
    is avoided, not only the first (a canary named with another word was selected on the
    baseline by chance, and the next verification's names were not: an honest fix failed)."""
    got = canaries.keyword_words(canaries._selections(_Files({name: text.encode()}), [PYTEST]))
    assert {"parse", "keeps"} <= got


def test_a_k_in_a_config_or_arguments_file_the_command_names_is_read_too():
    files = _Files({"ci/pytest.cfg": b"[pytest]\naddopts = -k 'parse or keeps'\n",
                    "ci/args.txt": b"-q\n-k\nformat or limits\n"})
    for command, words in ((f"{PYTEST} -c ci/pytest.cfg", {"parse", "keeps"}),
                           (f"{PYTEST} --config-file=./ci/pytest.cfg", {"parse", "keeps"}),
                           (f"{PYTEST} @ci/args.txt", {"format", "limits"}),
                           ("bash -c 'pytest -q -c ci/pytest.cfg'", {"parse", "keeps"})):
        assert canaries.keyword_words(canaries._selections(files, [command])) >= words, command


# twelve of the words canary names are drawn from: a name that does not avoid them is selected
_MANY = "handles or returns or accepts or rejects or keeps or parses or formats or matches or preserves " \
        "or normalizes or supports or ignores"
_SEEN = "import os\n\ndef pytest_collection_finish(session):\n" \
        "    open(os.environ['SEEN'], 'w').write('\\n'.join(i.name for i in session.items))\n"


@pytest.mark.parametrize("files, command", [
    ({"pytest.ini": f'[pytest]\naddopts = -q -k "{_MANY}"\n'}, PYTEST),
    ({"pytest.ini": f"[pytest]\naddopts =\n    -q\n    -k '{_MANY}'\n"}, PYTEST),
    ({"tox.ini": f"[pytest]\naddopts = -k '{_MANY}'\n"}, PYTEST),
    ({"setup.cfg": f'[tool:pytest]\naddopts = -k "{_MANY}"\n'}, PYTEST),
    ({"pyproject.toml": f'[tool.pytest.ini_options]\naddopts = ["-k", "{_MANY}"]\n'}, PYTEST),
    ({"pyproject.toml": f'[tool.pytest]\naddopts = ["-q", "-k", "{_MANY}"]\n'}, PYTEST),
    ({"ci/checks.ini": f"[pytest]\naddopts = -k '{_MANY}'\n"}, f"{PYTEST} -c ci/checks.ini --rootdir=. tests"),
    ({"args.txt": f"-q\n-k\n{_MANY}\n"}, f"{PYTEST} @args.txt"),
    ({}, f"PYTEST_ADDOPTS='-k \"{_MANY}\"' {PYTEST}"),
    ({}, f"bash -c \"{PYTEST} -vk '{_MANY}'\""),
])
def test_what_real_pytest_selects_of_the_canaries_depends_on_their_file_never_their_name(tmp_path, files, command):
    """The hostile case is the honest project: whatever form its ``-k`` takes, real pytest must
    select no canary by its name (a canary selected by chance on the baseline and not at the next
    verification fails an honest fix). Module names here match no word, so no canary may run."""
    hosts = [f"tests/test_mod{i}.py" for i in range(6)]
    base = {h: f"def test_own_{i}():\n    pass\n".encode() for i, h in enumerate(hosts)}
    for name, text in {**{h: b.decode() for h, b in base.items()}, **files, "tests/conftest.py": _SEEN}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    history = _Files({name: (tmp_path / name).read_bytes() for name in [*hosts, *files]})
    avoid = canaries.keyword_words(canaries._selections(history, [command]))
    planted = canaries.plant(tmp_path, hosts, base, random.Random(7), failing=0, avoid=avoid)
    assert len(planted.canaries) == len(hosts)
    import os
    import subprocess
    seen = tmp_path / "seen.txt"
    subprocess.run(command, shell=True, cwd=tmp_path, env={**os.environ, "SEEN": str(seen)}, capture_output=True,
                   timeout=60)
    assert seen.exists(), command
    assert not planted.names & set(seen.read_text().split()), command


def test_a_k_in_the_projects_pytest_addopts_is_avoided_too(org_home, tmp_path):
    """``addopts = -k "parse or keeps"`` in pytest.ini: the canaries' names avoid its words, so
    the ones the baseline ran run at every verification, and an honest fix passes."""
    ws = _repo(tmp_path)
    (ws / "pytest.ini").write_text('[pytest]\naddopts = -k "mean or single or other or parse or keeps"\n')
    pre, v, work = _verify(org_home, ws, _fix)
    assert pre.checks[0]["canary"]["hosts"] == ["tests/test_other.py"]       # "other" selects that file's tests
    assert v.goal_met and v.checks[0].canary == {"planted": 2, "forged": None}


def test_every_canary_name_is_its_own_in_the_snapshot_so_the_report_maps_back_one_to_one(tmp_path):
    """A canary is read back from the report by its name: a name two hosts share (a must-fail
    counted once, a failure left in the counts) or that a project test elsewhere has (taken out
    of the comparison with the baseline) made an honest fix fail now and then. Real pytest."""
    import subprocess

    from roles.eval_agent import evidence
    hosts = [f"test_m{i}.py" for i in range(40)]
    base = {h: f"def test_own_{i}():\n    pass\n".encode() for i, h in enumerate(hosts)}
    known = {"test_keeps_order", "test_reads_ascii", "test_handles_unicode"}
    for h in hosts:
        (tmp_path / h).write_bytes(base[h])
    planted = canaries.plant(tmp_path, hosts, base, random.Random(3), known=known)
    names = [c.name for c in planted.canaries]
    assert len(names) == len(set(names)) and len(names) >= 40 and not known & set(names)
    report = tmp_path / "r.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"],
                   cwd=tmp_path, capture_output=True, timeout=120)
    junit = evidence.read_junit(report)
    seen = canaries.observe(report, planted)
    assert len(seen) == len(planted.canaries)
    own = canaries.strip(junit, planted, seen)
    assert own["counts"]["passed"] == 40 and own["counts"]["failed"] == 0
    assert set(own["ids"]) == {f"test_m{i}::test_own_{i}" for i in range(40)}
