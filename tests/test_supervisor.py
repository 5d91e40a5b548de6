"""Supervisor and role processes with real processes on ipc:// (issue 3 proof)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from scripts import control
from roles.supervisor import procs
from state_db.bootstrap import init_home
from state_db.kernel.home import OrgHome
from tests.support.org import cleanup, query, roles, short_home_dir, wait_for, write_config

FAST = """
[org]
loop_agents = 2
[supervisor]
heartbeat_s = 0.2
heartbeat_timeout_s = 5.0
restart_max = 3
restart_window_s = 30.0
stop_timeout_s = 5.0
"""


@pytest.fixture
def org(monkeypatch):
    home = OrgHome(short_home_dir() / "org")
    write_config(home, FAST)
    init_home(home)
    monkeypatch.setenv("ORG_HOME", str(home.root))
    yield home
    cleanup(home)


def all_ready(home, n=5):
    rs = roles(home)
    return len([r for r in rs.values() if r["status"] == "ready"]) == n and rs


def test_start_org_runs_every_role_as_a_process_and_stop_ends_them(org):
    info = control.start_background(org, timeout_s=20)
    # a loop-agent forked before the template was warm is re-forked from it once idle (on purpose,
    # not a restart): the roles are taken once each is ready in a live process
    def settled():
        got = roles(org)
        return got if all(r["status"] == "ready" and r["heartbeat_at"] and r["pid"]
                          and procs.is_alive(r["pid"], r["pid_start"]) for r in got.values()) else None
    rs = wait_for(settled, what="every role ready in a live process")
    assert set(rs) == {"coordinator", "loop-agent-1", "loop-agent-2", "eval-agent", "curator"}
    pids = {name: (r["pid"], r["pid_start"]) for name, r in rs.items()}
    assert all(procs.is_alive(*p) for p in pids.values())
    assert info["pid"] and query(org, "SELECT status FROM org_session")[0]["status"] == "running"
    # heartbeats advance
    first = {n: r["heartbeat_at"] for n, r in rs.items()}
    wait_for(lambda: all((roles(org)[n]["heartbeat_at"] or 0) > first[n] for n in first), what="heartbeats to advance")
    result = control.request(org, "stop", timeout_s=20)
    assert result["status"] == "stopped"
    assert not any(procs.is_alive(*p) for p in pids.values())
    assert {r["status"] for r in roles(org).values()} == {"stopped"}
    assert not (org.run_dir / "supervisor.pid").exists()


def test_every_role_answers_ping_over_the_transport(org):
    from roles.supervisor.ping import ping_all
    from state_db.kernel import config

    control.start_background(org, timeout_s=20)
    rows = ping_all(org, config.load(org.config_path), timeout_s=5)
    assert [r["instance"] for r in rows if r["ms"] is None] == []


def test_kill_9_of_a_role_is_restarted_with_a_new_pid(org):
    control.start_background(org, timeout_s=20)
    victim = roles(org)["loop-agent-1"]
    os.kill(victim["pid"], signal.SIGKILL)
    after = wait_for(lambda: (r := roles(org)["loop-agent-1"])["status"] == "ready" and r["pid"] != victim["pid"] and r,
                     what="loop-agent-1 to come back")
    assert after["restarts"] == 1
    assert procs.is_alive(after["pid"], after["pid_start"])


def test_a_role_crashing_repeatedly_is_marked_failed_and_not_restarted(org):
    control.start_background(org, timeout_s=20)
    for attempt in range(3):
        current = wait_for(lambda: (r := roles(org)["curator"])["status"] in ("ready", "failed") and r,
                           what=f"curator up before kill {attempt}")
        if current["status"] == "failed":
            break
        os.kill(current["pid"], signal.SIGKILL)
        wait_for(lambda: roles(org)["curator"]["pid"] != current["pid"] or roles(org)["curator"]["status"] == "failed",
                 what="curator exit noticed")
    failed = wait_for(lambda: (r := roles(org)["curator"])["status"] == "failed" and r, what="curator failed")
    assert "crashes" in failed["last_exit"]
    time.sleep(0.5)  # restart backoff would have fired by now; it must not
    assert roles(org)["curator"]["status"] == "failed"
    out = subprocess.run([sys.executable, "-m", "scripts.cli.main", "status"], capture_output=True, text=True,
                         timeout=30, env={**os.environ, "ORG_HOME": str(org.root)})
    assert "failed role(s), not restarted: curator" in out.stdout


def test_a_reused_pid_is_never_signalled(org):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # a stale row claims the bystander's pid, with the start time of some earlier process
        real = procs.start_time(bystander.pid)
        assert not procs.signal_if_same(bystander.pid, str(int(real) - 1), signal.SIGKILL)
        from state_db.writer import StateWriter
        w = StateWriter(org.db_path, "supervisor")
        with w.transaction() as tx:
            tx.insert("role_instances", {"instance": "loop-agent-1", "role": "loop-agent", "status": "ready",
                                         "pid": bystander.pid, "pid_start": str(int(real) - 1), "updated_at": 0})
        w.close()
        control.start_background(org, timeout_s=20)  # clears leftovers of "the previous run"
        control.request(org, "stop", force=True, timeout_s=20)
        assert bystander.poll() is None, "the supervisor killed a process that merely reused a pid"
    finally:
        bystander.kill()
        bystander.wait()


def test_supervisor_kill_9_takes_roles_down_and_resume_restores_the_org(org):
    control.start_background(org, timeout_s=20)
    before = roles(org)
    sup = procs.read_pidfile(org.run_dir / "supervisor.pid")
    os.kill(sup[0], signal.SIGKILL)
    wait_for(lambda: not any(procs.is_alive(r["pid"], r["pid_start"]) for r in before.values()),
             what="roles to die with their supervisor")
    control.start_background(org, timeout_s=20)
    after = wait_for(lambda: all_ready(org), what="all roles ready after resume")
    assert all(after[n]["pid"] != before[n]["pid"] for n in before)


def test_stop_without_a_supervisor_still_ends_the_session(org):
    control.start_background(org, timeout_s=20)
    sup = procs.read_pidfile(org.run_dir / "supervisor.pid")
    os.kill(sup[0], signal.SIGKILL)
    wait_for(lambda: not procs.is_alive(*sup), what="the supervisor to die")
    result = control.request(org, "stop", timeout_s=10)
    assert result == {**result, "status": "stopped", "supervisor": "absent"}


def test_suspend_marks_the_session_suspended_and_resume_runs_again(org):
    control.start_background(org, timeout_s=20)
    assert control.request(org, "suspend", timeout_s=20)["status"] == "suspended"
    control.start_background(org, timeout_s=20)
    assert query(org, "SELECT status FROM org_session")[0]["status"] == "running"


def test_a_second_start_is_refused_while_one_runs(org):
    control.start_background(org, timeout_s=20)
    proc = subprocess.run([sys.executable, "-m", "roles.supervisor.main", "--home", str(org.root)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and proc.stderr.startswith("error[already_running]")
