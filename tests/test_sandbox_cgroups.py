"""The per-command pids groups: groups a crashed parent left are swept, now and then."""
from __future__ import annotations

import subprocess
import time

import pytest

from roles.workbench.sandbox import limits
from roles.workbench.sandbox.limits import Limits, PidsCgroup


@pytest.mark.timeout(30)
def test_a_group_left_by_a_dead_parent_is_swept_at_a_later_command_not_at_every_one(monkeypatch):
    base = limits._pids_base()
    if base is None:
        pytest.skip("no writable pids cgroup hierarchy on this machine")
    gone = subprocess.Popen(["true"])
    gone.wait()
    left = base / f"run-{gone.pid}-deadbeef0000"
    left.mkdir()
    try:
        monkeypatch.setattr(limits, "_swept_at", time.monotonic())               # swept just now
        made = PidsCgroup.create(Limits())
        assert made is not None and made.path.is_dir()
        made.close()
        assert left.is_dir()                                       # not at every command
        monkeypatch.setattr(limits, "_swept_at", time.monotonic() - limits.SWEEP_EVERY_S)  # as long ago as the interval
        made = PidsCgroup.create(Limits())
        made.close()
        assert not left.exists()                                   # its parent is gone: swept
        assert not made.path.exists()                              # an empty group goes at close
    finally:
        if left.exists():
            left.rmdir()
