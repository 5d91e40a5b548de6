"""Files a sandbox leaves are read on the host as hostile input: no link followed, nothing but a
regular file, never blocking, bounded in size — and a runner's report cannot be swapped at all."""
from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from roles.eval_agent.checks import run_check
from roles.workbench.sandbox import BwrapRunner, Limits, bubblewrap
from roles.workbench.sandbox.hostile import HostileFile, read_regular
from roles.workbench.sandbox.mode import UnsandboxedRunner, default_visible
from roles.workbench.sandbox.reports import ReportFile

needs_bwrap = pytest.mark.skipif(bubblewrap() is None,
                                 reason="bubblewrap (bwrap) is not installed: apt-get install -y bubblewrap")
SECRET = "host-only-secret-7f3a"
PY = str(Path(sys.prefix).resolve() / "bin" / "python")      # the venv at its real path, which the view shows
REPORT = ('<testsuites><testsuite name="pytest"><testcase classname="t" name="test_a"/>'
          '<testcase classname="t" name="test_b"/></testsuite></testsuites>')


def _refused(path, code: str, **kw) -> None:
    t0 = time.monotonic()
    with pytest.raises(HostileFile) as got:
        read_regular(path, limit=1 << 20, **kw)
    assert got.value.code == code, (got.value.code, str(got.value))
    assert time.monotonic() - t0 < 2.0                      # refused at once, never waited on


@pytest.mark.timeout(30)
def test_links_fifos_sockets_folders_and_hard_links_are_refused_and_a_regular_file_is_read(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    left = tmp_path / "left"
    left.mkdir()
    (left / "plain").write_text("ok")
    assert read_regular(left / "plain", limit=10) == b"ok"
    (left / "link").symlink_to(secret)
    _refused(left / "link", "file_link")
    os.mkfifo(left / "fifo")                                 # an open for reading would wait for a writer
    _refused(left / "fifo", "file_not_regular")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(left / "sock"))
        _refused(left / "sock", "file_not_regular")
    finally:
        sock.close()
    (left / "dir").mkdir()
    _refused(left / "dir", "file_not_regular")
    os.link(secret, left / "hard")
    _refused(left / "hard", "file_linked")
    _refused(left / "nothing", "file_missing")
    if os.path.exists("/dev/zero"):
        os.symlink("/dev/zero", left / "dev")
        _refused(left / "dev", "file_link")


@pytest.mark.timeout(30)
def test_a_link_on_the_way_below_the_trusted_folder_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "r.xml").write_text(SECRET)
    top = tmp_path / "snap"
    (top / "a").mkdir(parents=True)
    (top / "a" / "b").symlink_to(outside)                    # snap/a/b/r.xml reads the host's file
    assert (top / "a" / "b" / "r.xml").read_text() == SECRET  # the control: a plain open follows it
    _refused(top / "a" / "b" / "r.xml", "file_link", beneath=top)
    _refused(Path("a/../../outside/r.xml"), "file_link", beneath=top)
    _refused(outside / "r.xml", "file_link", beneath=top)          # absolute, but not below it
    (top / "a" / "r.xml").write_text("inside")
    assert read_regular(top / "a" / "r.xml", limit=100, beneath=top) == b"inside"
    assert read_regular(Path("a/r.xml"), limit=100, beneath=top) == b"inside"


@pytest.mark.timeout(30)
def test_a_sparse_file_past_the_bound_is_refused_after_reading_the_bound_only(tmp_path):
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as f:
        f.truncate(64 * 2**30)                               # 64 GB apparent, no block used
    t0 = time.monotonic()
    with pytest.raises(HostileFile) as got:
        read_regular(sparse, limit=2**20)
    assert got.value.code == "file_too_large" and time.monotonic() - t0 < 2.0
    small = tmp_path / "small"
    small.write_bytes(b"x" * 2**20)
    assert len(read_regular(small, limit=2**20)) == 2**20   # exactly the bound is read


@pytest.mark.timeout(60)
def test_a_report_left_as_a_link_or_fifo_by_a_plain_runner_is_not_followed(tmp_path):
    """Without a sandbox the report is still read as hostile input: a command that replaces it
    with a link to a host file or a FIFO gets no report, and the check ends at once."""
    secret = tmp_path / "secret.xml"
    secret.write_text(REPORT)
    ws = tmp_path / "ws"
    ws.mkdir()
    for swap in (f"ln -sf {secret} \"$R\"", "rm -f \"$R\" && mkfifo \"$R\""):
        report = ReportFile.create(tmp_path / "reports", UnsandboxedRunner(ws))
        t0 = time.monotonic()
        got = run_check(f"R=${{PYTEST_ADDOPTS#--junitxml=}}; {swap}; exit 0", ws, timeout_s=20,
                        runner=UnsandboxedRunner(ws), report=report)
        assert time.monotonic() - t0 < 10
        assert got.junit is None and not got.passed and "file_" in got.output_tail, got
        report.discard()


@needs_bwrap
@pytest.mark.timeout(90)
def test_the_sandboxed_report_is_a_host_file_the_command_can_write_but_not_replace(tmp_path):
    """Inside, the report is a bind-mounted host file in the private /tmp: pytest writes it; a
    command cannot unlink it, rename over it or turn it into a link or FIFO; the host reads it."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "test_t.py").write_text("def test_a():\n    assert True\n\ndef test_b():\n    assert True\n")
    runner = BwrapRunner(ws, readonly_binds=default_visible(), limits=Limits(cpu_s=60))
    report = ReportFile.create(tmp_path / "home" / "eval-reports", runner)
    assert str(report.inside).startswith("/tmp/") and report.host.parent == tmp_path / "home" / "eval-reports"
    got = run_check(f"{PY} -m pytest -q -p no:cacheprovider", ws, timeout_s=60, runner=runner,
                    report=report)
    assert got.passed and got.junit["counts"]["passed"] == 2, got.output_tail
    report.discard()
    attack = ('R=${PYTEST_ADDOPTS#--junitxml=}; '
              'rm -f "$R" 2>&1; ln -sf /etc/hostname "$R" 2>&1; mv /tmp/x "$R" 2>&1; '
              'mkfifo /tmp/f; mv /tmp/f "$R" 2>&1; test -f "$R" && ! test -L "$R" && echo STILL-A-FILE; '
              f"printf '%s' '{REPORT}' > \"$R\"; exit 0")
    report = ReportFile.create(tmp_path / "home" / "eval-reports", runner)
    got = run_check(attack, ws, timeout_s=30, runner=runner, report=report)
    assert "STILL-A-FILE" in got.output_tail, got.output_tail
    assert report.host.is_file() and not report.host.is_symlink()
    assert got.junit is not None and got.junit["counts"]["passed"] == 2    # its bytes, not a host file's
    assert not any(p.name.startswith("junit-") for p in ws.iterdir())      # nothing left in the workspace
    report.discard()


@needs_bwrap
@pytest.mark.timeout(90)
def test_a_report_past_its_bound_fails_the_check_whatever_the_exit_code(tmp_path, monkeypatch):
    import roles.workbench.sandbox.reports as reports
    monkeypatch.setattr(reports, "MAX_REPORT_BYTES", 4096)
    ws = tmp_path / "ws"
    ws.mkdir()
    runner = BwrapRunner(ws, readonly_binds=default_visible(), limits=Limits(cpu_s=60))
    report = ReportFile.create(tmp_path / "reports", runner)
    got = run_check('head -c 10000 /dev/zero > "${PYTEST_ADDOPTS#--junitxml=}"; exit 0', ws, timeout_s=30,
                    runner=runner, report=report)
    assert got.exit_code == 0 and not got.passed and "file_too_large" in got.output_tail, got
    report.discard()


@pytest.mark.timeout(30)
def test_the_file_tools_read_through_the_hostile_reader(tmp_path):
    """read_file never waits on a FIFO nor follows a link out; a hard-linked file of the
    workspace's own (uv links its cache into .venv) is still read."""
    from roles.loop_agent.tools import WorkspaceTools
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("x = 1\n")
    os.link(ws / "a.py", ws / "b.py")
    os.mkfifo(ws / "pipe")
    tools = WorkspaceTools(ws)
    assert "x = 1" in tools.call("read_file", {"path": "b.py"}).content
    t0 = time.monotonic()
    got = tools.call("read_file", {"path": "pipe"})
    assert got.is_error and time.monotonic() - t0 < 2.0


@pytest.mark.timeout(30)
def test_report_files_a_killed_process_left_are_swept_and_fresh_ones_kept(tmp_path):
    folder = tmp_path / "eval-reports"
    old = ReportFile.create(folder)
    os.utime(old.host, (time.time() - 7200, time.time() - 7200))
    fresh = ReportFile.create(folder)
    assert ReportFile.sweep(folder) == 1
    assert not old.host.exists() and fresh.host.exists()
