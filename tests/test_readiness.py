"""Waking whoever waits for the roles' status (roles/base/readiness.py) instead of polling."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time

import pytest

from roles.base import readiness
from scripts import control
from state_db.bootstrap import init_home
from state_db.kernel.home import OrgHome
from tests.support.org import cleanup, short_home_dir, write_config

pytestmark = pytest.mark.timeout(120)


def test_a_poke_from_another_process_wakes_every_waiter(tmp_path):
    first, second = readiness.Waiter(tmp_path), readiness.Waiter.__new__(readiness.Waiter)
    try:
        # a second waiter (another 'org start' or a test) has its own FIFO: one byte each
        second.path = tmp_path / readiness.WAKE_DIR / "other"
        os.mkfifo(second.path, 0o600)
        second.fd = os.open(second.path, os.O_RDWR | os.O_NONBLOCK)
        assert first.wait(0) is False and second.wait(0) is False
        poke = subprocess.run([sys.executable, "-c", "import sys; from roles.base import readiness; "
                               "print(readiness.poke(sys.argv[1]))", str(tmp_path)],
                              capture_output=True, text=True, timeout=30)
        assert poke.stdout.strip() == "2", poke.stderr
        assert first.wait(5) is True and second.wait(5) is True
        assert first.wait(0) is False                    # drained: the next wait waits again
    finally:
        first.close()
        second.close()
    assert not first.path.exists()


def test_a_poke_skips_a_waiter_that_is_gone_and_never_blocks(tmp_path):
    assert readiness.poke(tmp_path) == 0                 # nobody ever waited: no folder
    gone = tmp_path / readiness.WAKE_DIR / "12345"        # its waiter was killed: no reader
    gone.parent.mkdir()
    os.mkfifo(gone, 0o600)
    (tmp_path / readiness.WAKE_DIR / "plain").write_text("")   # never anything but a FIFO is written
    t0 = time.monotonic()
    assert readiness.poke(tmp_path) == 0
    assert time.monotonic() - t0 < 1
    assert (tmp_path / readiness.WAKE_DIR / "plain").read_text() == ""


def test_org_start_returns_when_the_last_role_is_ready_not_at_its_next_look(monkeypatch):
    """With its looks at state.db made rare (30 s), 'org start' still returns as soon as every
    role is ready: each role's ready row wakes it. Polling alone would wait the 30 s."""
    home = OrgHome(short_home_dir() / "org")
    write_config(home, "[org]\nloop_agents = 2\n")
    init_home(home)
    monkeypatch.setenv("ORG_HOME", str(home.root))
    monkeypatch.setattr(control, "POLL_S", 30.0)
    monkeypatch.setattr(control, "WAKE_FALLBACK_S", 30.0)
    try:
        t0 = time.monotonic()
        info = control.start_background(home, timeout_s=60)
        assert time.monotonic() - t0 < 20, info
        assert {r["status"] for r in info["roles"]} == {"ready"} and len(info["roles"]) == 5
        assert list((home.run_dir / readiness.WAKE_DIR).iterdir()) == []     # its FIFO went with it
    finally:
        cleanup(home)


def test_org_start_reports_a_supervisor_that_exits_at_once_not_at_its_next_look(monkeypatch):
    home = OrgHome(short_home_dir() / "org")
    write_config(home, "[org]\nloop_agents = 2\n")
    init_home(home)
    lock = os.open(home.run_dir / "supervisor.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)                         # another supervisor holds the org
    monkeypatch.setattr(control, "POLL_S", 30.0)
    monkeypatch.setattr(control, "WAKE_FALLBACK_S", 30.0)
    try:
        t0 = time.monotonic()
        with pytest.raises(control.ControlError, match="the supervisor exited with 1.*already_running"):
            control.start_background(home, timeout_s=60)
        assert time.monotonic() - t0 < 20
    finally:
        os.close(lock)
        cleanup(home)
