"""The supervisor's restart policy with an injected spawner and clock: each "role" is a real
process that exits at once, so crashes, backoff and the ``failed`` mark are exercised without
starting the org, and without waiting out the backoff."""
from __future__ import annotations

import subprocess

import pytest

from roles.supervisor.supervisor import Supervisor
from state_db.kernel import config as config_mod
from tests.support.org import roles, wait_for


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


class Crashing:
    """A spawner whose roles exit with ``code`` at once; records what it was asked to start."""

    def __init__(self, code: int = 3):
        self.code = code
        self.started: list[tuple[str, list[str]]] = []
        self.procs: list[subprocess.Popen] = []

    def __call__(self, spec, argv, env, out_path):
        self.started.append((spec.instance, argv))
        with open(out_path, "ab") as out:
            proc = subprocess.Popen(["/bin/sh", "-c", f"exit {self.code}"], stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=out, env=env)
        self.procs.append(proc)
        return proc


@pytest.fixture
def sup(org_home):
    cfg = config_mod.Config({"org": {"loop_agents": 1},
                             "supervisor": {"restart_max": 3, "restart_window_s": 60.0}})
    spawner, clock = Crashing(), Clock()
    s = Supervisor(org_home, cfg, clock=clock, spawner=spawner)
    s.issue_keys()
    s.open_session()
    yield s, spawner, clock
    for p in spawner.procs:
        p.wait(timeout=10)
    s.writer.close()


def crash_all(s, spawner) -> None:
    """Wait until every spawned role has exited, then let the supervisor notice."""
    wait_for(lambda: all(p.poll() is not None for p in spawner.procs), timeout=10, what="the roles to exit")
    s.reap_and_restart()


def test_the_injected_spawner_starts_every_instance_with_its_module_arguments(sup, org_home):
    s, spawner, _ = sup
    for child in s.children.values():
        s.spawn(child)
    assert sorted(name for name, _ in spawner.started) == ["coordinator", "curator", "eval-agent", "loop-agent-1"]
    assert all(argv == ["--home", str(org_home.root), "--instance", name] for name, argv in spawner.started)
    assert s.forks is None                          # a spawner given: no fork server is started


def test_a_crashing_role_is_restarted_after_its_backoff_then_marked_failed(sup, org_home):
    s, spawner, clock = sup
    child = s.children["eval-agent"]
    s.spawn(child)
    crash_all(s, spawner)
    assert roles(org_home)["eval-agent"]["status"] == "crashed" and child.restart_at == clock() + 0.2
    s.reap_and_restart()
    assert len(spawner.started) == 1                # the backoff has not passed
    clock.advance(0.2)
    s.reap_and_restart()
    assert len(spawner.started) == 2
    crash_all(s, spawner)                           # second crash: the backoff doubles
    assert child.restart_at == clock() + 0.4
    clock.advance(0.4)
    s.reap_and_restart()
    crash_all(s, spawner)                           # third crash within the window: restart_max
    row = roles(org_home)["eval-agent"]
    assert row["status"] == "failed" and "3 crashes" in row["last_exit"] and child.failed
    clock.advance(3600)
    s.reap_and_restart()
    assert len(spawner.started) == 3                # a failed role is not started again


def test_crashes_further_apart_than_the_window_never_fail_a_role(sup, org_home):
    s, spawner, clock = sup
    child = s.children["curator"]
    s.spawn(child)
    for n in range(5):
        crash_all(s, spawner)
        assert roles(org_home)["curator"]["status"] == "crashed", n
        clock.advance(61.0)                         # past restart_window_s: older crashes are forgotten
        s.reap_and_restart()
    assert len(spawner.started) == 6 and not child.failed
    assert roles(org_home)["curator"]["restarts"] == 5


def test_a_crash_reaped_while_the_store_stays_busy_is_written_later_and_the_role_restarted_after_it(sup, org_home, monkeypatch):
    """The store held past its wait when a role's exit is reaped: the supervisor does not end
    (its end takes the org down); the exit is kept and written at a later round, and the role is
    started again only once its exit is written."""
    import sqlite3

    from state_db import writer as writer_mod
    monkeypatch.setattr(writer_mod, "BUSY_TIMEOUT_MS", 300)
    s, spawner, clock = sup
    child = s.children["eval-agent"]
    s.spawn(child)
    wait_for(lambda: all(p.poll() is not None for p in spawner.procs), timeout=10, what="the role to exit")
    other = sqlite3.connect(org_home.db_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        s.reap_and_restart()                        # waits out the store, then goes on
        assert roles(org_home)["eval-agent"]["status"] == "starting" and s._unwritten
        clock.advance(5)
        s.reap_and_restart()                        # still busy: nothing started over an unwritten exit
        assert len(spawner.started) == 1
    finally:
        other.execute("ROLLBACK")
        other.close()
    s.reap_and_restart()
    row = roles(org_home)["eval-agent"]
    assert row["restarts"] == 1 and not s._unwritten
    assert len(spawner.started) == 2
    crash_all(s, spawner)
    assert roles(org_home)["eval-agent"]["restarts"] == 2
