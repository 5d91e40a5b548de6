"""A role's heartbeat: the beat file at every beat, the heartbeat row a quarter of the timeout
apart while the file is written (every reader on this host takes the later of the two), and at
every beat when the file cannot be written (the row is then the only proof of life)."""
from __future__ import annotations

import shutil

import pytest

from roles.base import beat
from roles.base.runtime import RoleProcess
from state_db.bootstrap import init_home
from state_db.connection import read_rows
from state_db.kernel.config import load_config
from state_db.kernel.home import OrgHome
from state_db.vocab import Actor
from state_db.writer import StateWriter
from tests.support.org import short_home_dir
from transport.stub import StubTransport

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def role():
    root = short_home_dir()
    home = OrgHome(root / "org")
    init_home(home)
    cfg = load_config(home)
    assert (cfg.supervisor.heartbeat_s, cfg.supervisor.heartbeat_timeout_s) == (1.0, 10.0)   # the defaults
    sup = StateWriter(home.db_path, Actor.SUPERVISOR)
    with sup.transaction() as tx:
        tx.insert("role_instances", {"instance": "loop-agent-1", "role": "loop-agent", "status": "starting",
                                     "updated_at": tx.now})
    sup.close()
    now = [1000.0]
    proc = RoleProcess(home, "loop-agent-1", cfg=cfg, clock=lambda: now[0], monotonic=lambda: now[0],
                       transport=StubTransport("loop-agent-1"))
    proc.handle = lambda env: None
    proc.start()
    yield proc, home, now
    proc.close()
    shutil.rmtree(root, ignore_errors=True)


def _row_at(home) -> float:
    return read_rows(home.db_path, "SELECT heartbeat_at FROM role_instances WHERE instance = 'loop-agent-1'")[0][
        "heartbeat_at"]


def _beat_at(proc, now, t):
    now[0] = t
    proc.step(max_wait_ms=0)


def test_the_row_follows_every_quarter_timeout_while_the_file_beats_every_second(role):
    proc, home, now = role
    assert proc.row_beat_s == 2.5
    assert _row_at(home) == 1000.0                          # ready: the row, at once
    rows, files = [], []
    for t in range(1001, 1011):
        _beat_at(proc, now, float(t))
        rows.append(_row_at(home))
        files.append(beat.last(home.run_dir, "loop-agent-1"))
    assert files == [float(t) for t in range(1001, 1011)]    # the file: every beat
    assert sorted(set(rows)) == [1000.0, 1003.0, 1006.0, 1009.0]   # the row: 2.5 s apart at least
    # what every reader on this host sees: never older than a beat
    assert beat.latest(rows[-1], home.run_dir, "loop-agent-1") == 1010.0


def test_without_a_beat_file_every_beat_writes_the_row(role):
    proc, home, now = role
    proc.beat.close()                                       # the file cannot be written any more
    for t in (1001.0, 1002.0, 1003.0):
        _beat_at(proc, now, t)
        assert _row_at(home) == t
