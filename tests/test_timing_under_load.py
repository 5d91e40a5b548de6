"""Waits allow for a busy host: the support waits and every test's pytest-timeout bound stretch
with the host's load (or ORG_TEST_TIMEOUT_SCALE), and a wait that runs out says what it saw."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.org import wait_for
from tests.support.timing import ENV, MAX_SCALE, scale, scaled

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(60)


def test_the_scale_is_the_larger_of_the_load_and_the_variable_and_never_below_one(monkeypatch):
    monkeypatch.setenv(ENV, str(MAX_SCALE))
    assert scale() == MAX_SCALE and scaled(2.0) == 2.0 * MAX_SCALE
    monkeypatch.setenv(ENV, "not a number")
    assert 1.0 <= scale() <= MAX_SCALE
    monkeypatch.delenv(ENV)
    assert 1.0 <= scale() <= MAX_SCALE


def test_a_support_wait_allows_for_a_slow_host(monkeypatch):
    monkeypatch.setenv(ENV, str(MAX_SCALE))
    ready_at = time.monotonic() + 0.5
    assert wait_for(lambda: time.monotonic() >= ready_at, timeout=0.15, what="half a second") is True


def test_a_wait_that_runs_out_says_what_it_saw_last():
    with pytest.raises(AssertionError, match=r"no rows not reached within .* s; last seen: \[\]"):
        wait_for(lambda: [], timeout=0.1, what="no rows")


def test_each_tests_pytest_timeout_is_stretched_by_the_scale(tmp_path):
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_collection_modifyitems  # noqa\n")
    (tmp_path / "test_bounds.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.timeout(10)
        def test_marked(request):
            print("bound", request.node.get_closest_marker("timeout").args[0])

        def test_default(request):
            print("bound", request.node.get_closest_marker("timeout").args[0])
    """))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-o", "timeout=7",
                          str(tmp_path)], capture_output=True, text=True, timeout=scaled(60), cwd=ROOT,
                         env={**os.environ, ENV: str(MAX_SCALE), "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert sorted(float(x) for x in re.findall(r"bound (\S+)", out.stdout)) == \
        [7 * MAX_SCALE, 10 * MAX_SCALE], out.stdout


def test_the_busy_suite_spins_real_cores_stops_them_and_reads_pytests_summary():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import busy_suite
    finally:
        sys.path.remove(str(ROOT / "bench"))

    def cpu_ticks(pid: int) -> int:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    procs = busy_suite.start_busy(2)
    try:
        wait_for(lambda: all(cpu_ticks(p.pid) >= 20 for p in procs) or None, timeout=10,
                 what="two spinning processes using CPU")
    finally:
        busy_suite.stop_busy(procs)
    assert [p.returncode for p in procs] == [-9, -9]
    got = busy_suite.summary("FAILED tests/test_a.py::test_x - AssertionError: 'org> ' did not appear\n"
                             "ERROR tests/test_b.py::test_y\n1 failed, 1 error, 1204 passed, 3 skipped in 900.1s\n")
    assert {k: got[k] for k in ("passed", "failed", "errors", "skipped")} == \
        {"passed": 1204, "failed": 1, "errors": 1, "skipped": 3}
    assert got["failed_tests"] == ["tests/test_a.py::test_x", "tests/test_b.py::test_y"]


def test_a_child_process_that_runs_out_of_time_shows_what_it_printed(tmp_path):
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_runtest_makereport  # noqa\n")
    (tmp_path / "test_slow.py").write_text(textwrap.dedent("""
        import subprocess, sys

        def test_slow_child():
            subprocess.run([sys.executable, "-c", "import time; print('half way there', flush=True); time.sleep(30)"],
                           capture_output=True, text=True, timeout=1.5)
    """))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         capture_output=True, text=True, timeout=scaled(60), cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "what the timed-out process printed (stdout)" in out.stdout and "half way there" in out.stdout, out.stdout
