"""Roles forked from the supervisor's pre-imported template (roles/supervisor/forkserver.py).

Real processes throughout: the template is a real interpreter, every role a real fork of it.
"""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from scripts import control
from roles.supervisor import procs
from roles.supervisor.forkserver import ForkServer
from state_db.bootstrap import init_home
from state_db.kernel.home import OrgHome
from tests.support.org import cleanup, query, roles, short_home_dir, wait_for, write_config
from state_db.queries.work import Caps

pytestmark = pytest.mark.timeout(120)

CONFIG = """
[org]
loop_agents = 2
[supervisor]
heartbeat_s = 0.2
heartbeat_timeout_s = 5.0
restart_max = 5
restart_window_s = 30.0
stop_timeout_s = 5.0
"""


@pytest.fixture
def org(monkeypatch):
    home = OrgHome(short_home_dir() / "org")
    write_config(home, CONFIG)
    init_home(home)
    monkeypatch.setenv("ORG_HOME", str(home.root))
    yield home
    cleanup(home)


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# -- the template alone --------------------------------------------------------------------------

@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))       # where the probe module is written
    fs = ForkServer(preload=("json", "--", "email.parser"), pidfile=tmp_path / "fs.pid")
    fs.start()
    yield fs
    fs.close()


def test_a_forked_module_runs_with_its_arguments_environment_and_output_file(server, tmp_path):
    out = tmp_path / "out.txt"
    probe = tmp_path / "probe.py"
    probe.write_text("import json, os, sys\nprint(json.dumps({'argv': sys.argv[1:], 'v': os.environ.get('V'),"
                     " 'keys': sorted(os.environ)}))\nsys.exit(7)\n")
    role = server.spawn("probe", ["--home", "/x"], {"V": "yes"}, out)
    assert role.wait(20) == 7
    printed = json.loads(out.read_text().strip().splitlines()[-1])
    assert printed["argv"] == ["--home", "/x"] and printed["v"] == "yes"
    assert printed["keys"] == ["V"]                      # exactly the environment given, nothing inherited


def test_exit_codes_are_reported_as_popen_reports_them(server, tmp_path):
    out = tmp_path / "out.txt"
    ok = server.spawn("platform", [], {}, out)
    assert ok.wait(20) == 0
    missing = server.spawn("no_such_module_here", [], {}, out)
    assert missing.wait(20) == 1
    assert "No module named no_such_module_here" in out.read_text()
    sleeper = server.spawn("http.server", ["0", "--bind", "127.0.0.1"], {}, out)
    wait_for(lambda: _alive(sleeper.pid), what="the forked server to run")
    assert sleeper.poll() is None
    os.kill(sleeper.pid, signal.SIGKILL)
    assert sleeper.wait(20) == -signal.SIGKILL


def test_roles_asked_for_together_are_forked_in_one_exchange_each_with_its_own_request(server, tmp_path):
    """``spawn_many`` (the org's start-up): the requests go out together and come back in order,
    one role each, with its own arguments, environment and output file; a role that fails is its own."""
    probe = tmp_path / "probe.py"
    probe.write_text("import os, sys\nprint(sys.argv[1], os.environ['V'])\nsys.exit(int(sys.argv[1]))\n")
    asks = [("probe", [str(k)], {"V": f"v{k}"}, tmp_path / f"out{k}") for k in range(4)]
    asks.append(("no_such_module_here", [], {}, tmp_path / "out-missing"))
    got = server.spawn_many(asks)
    assert len({r.pid for r in got}) == 5
    assert [r.wait(20) for r in got] == [0, 1, 2, 3, 1]
    assert [(tmp_path / f"out{k}").read_text().split() for k in range(4)] == [[str(k), f"v{k}"] for k in range(4)]
    assert "No module named no_such_module_here" in (tmp_path / "out-missing").read_text()
    assert server.spawn("platform", [], {}, tmp_path / "o").wait(20) == 0     # the exchange is over


def test_an_exit_read_together_with_its_forks_answer_is_not_lost(tmp_path):
    """A role that ends at once: the template's answer and the role's exit can arrive in one
    read; the exit belongs to the role the answer names, whoever reads it."""
    import socket
    import subprocess
    ours, theirs = socket.socketpair()
    stand_in = subprocess.Popen(["sleep", "60"])             # the template, alive, answering nothing itself
    fs = ForkServer()
    fs.adopt(stand_in, ours)
    try:
        theirs.sendall(b'{"pid": 4242, "warm": false}\n{"exit": 4242, "code": 3}\n')
        role = fs.spawn("platform", [], {}, tmp_path / "o")
        assert role.pid == 4242 and role.poll() == 3
    finally:
        fs.close()
        theirs.close()


def test_an_orphan_of_a_role_is_adopted_and_reaped_by_the_template_and_not_reported(server, tmp_path):
    """A process a role's child leaves behind (as bubblewrap leaves its sandbox's first process
    for every command) is given to the template, not to the machine's init, and is reaped there
    when it exits: no zombie is left, and the supervisor hears of no exit but its roles'."""
    out = tmp_path / "out.txt"
    probe = tmp_path / "orphaner.py"
    probe.write_text("import subprocess, sys\n"
                     "subprocess.run(['/bin/sh', '-c', 'sleep 1.5 >/dev/null 2>&1 & echo $!'], stdout=sys.stdout)\n"
                     "sys.stdout.flush()\n"
                     "import time; time.sleep(30)\n")
    role = server.spawn("orphaner", [], {}, out)
    wait_for(lambda: out.exists() and out.read_text().strip(), what="the orphan's pid")
    orphan = int(out.read_text().split()[0])
    assert _ppid(orphan) == server.proc.pid                 # adopted by the template, not by pid 1
    wait_for(lambda: not Path(f"/proc/{orphan}").exists(), timeout=10, what="the orphan to exit and be reaped")
    assert role.poll() is None                               # its exit was not taken for the role's
    assert set(server._roles) == {role.pid}
    os.kill(role.pid, signal.SIGKILL)
    assert role.wait(20) == -signal.SIGKILL


def test_the_template_warms_up_when_idle_and_later_forks_say_so(server, tmp_path):
    first = server.spawn("platform", [], {}, tmp_path / "o")
    first.wait(20)
    wait_for(lambda: server.pump(0.05) or server.warm, timeout=30, what="the heavy stage")
    assert first.warm is False
    later = server.spawn("platform", [], {}, tmp_path / "o")
    assert later.wait(20) == 0 and later.warm is True


def test_the_heavy_stage_waits_until_the_roles_forked_cold_are_ready(server, tmp_path):
    """A role that takes longer than the pause in the requests to start keeps the template from
    its heavy stage (~2 s of CPU in an org) until it says it is ready."""
    trigger = tmp_path / "go"
    probe = tmp_path / "slowrole.py"
    probe.write_text("import os, sys, time\n"
                     "from roles.base import readiness\n"
                     f"while not os.path.exists({str(trigger)!r}):\n"
                     "    time.sleep(0.02)\n"
                     "print(readiness.tell_template(), flush=True)\n"
                     "time.sleep(60)\n")
    out = tmp_path / "out"
    role = server.spawn("slowrole", [], {}, out)
    deadline = time.monotonic() + 1.5                  # 7 times the pause the old template waited for
    while time.monotonic() < deadline:
        server.pump(0.05)
    assert not server.warm and role.poll() is None
    trigger.touch()
    wait_for(lambda: server.pump(0.05) or server.warm, timeout=30, what="the heavy stage once the role is ready")
    assert out.read_text().split() == ["True"]          # it closed the pipe it was given
    os.kill(role.pid, signal.SIGKILL)
    assert role.wait(20) == -signal.SIGKILL


def test_roles_die_with_a_killed_template(server, tmp_path):
    role = server.spawn("http.server", ["0", "--bind", "127.0.0.1"], {}, tmp_path / "o")
    wait_for(lambda: _alive(role.pid), what="the role to run")
    os.kill(server.proc.pid, signal.SIGKILL)
    wait_for(lambda: not _alive(role.pid), timeout=10, what="the role to die with its template")
    assert role.wait(10) < 0
    again = server.spawn("platform", [], {}, tmp_path / "o")     # a new template on demand
    assert again.wait(20) == 0


# -- the org -----------------------------------------------------------------------------------

def test_every_role_is_a_fork_of_the_template_and_idle_loop_agents_are_reforked_warm(org):
    control.start_background(org, timeout_s=60)
    template = procs.read_pidfile(org.run_dir / "forkserver.pid")
    assert template is not None
    rs = roles(org)
    assert all(_ppid(r["pid"]) == template[0] for r in rs.values())
    wait_for(lambda: all((r["last_exit"] or "").startswith("replaced") and r["status"] == "ready"
                         for n, r in roles(org).items() if n.startswith("loop-agent")),
             timeout=60, what="idle loop-agents forked again from the warm template")
    rs = roles(org)
    assert all(_ppid(r["pid"]) == template[0] for r in rs.values())
    assert {n: r["restarts"] for n, r in rs.items()} == {n: 0 for n in rs}     # replaced, not crashed
    assert control.request(org, "stop", timeout_s=30)["status"] == "stopped"
    assert not _alive(template[0])


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def _environ(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")


def test_the_template_is_the_supervisor_forked_not_a_second_interpreter(org):
    """No second interpreter starts and imports what the supervisor already has: the template is
    a fork of the supervisor (template.launch(fork=True))."""
    control.start_background(org, timeout_s=60)
    sup = procs.read_pidfile(org.run_dir / "supervisor.pid")
    template = procs.read_pidfile(org.run_dir / "forkserver.pid")
    assert _ppid(template[0]) == sup[0]
    assert "roles.supervisor.main" in _cmdline(template[0]) and "roles.supervisor.forkserver" not in _cmdline(template[0])
    assert all(_ppid(r["pid"]) == template[0] for r in roles(org).values())


def test_with_an_org_key_in_its_environment_the_template_is_a_new_interpreter_without_it(org):
    """A fork keeps the environment its process started with (/proc/PID/environ): a supervisor
    given an ORG_KEY* starts the template as an interpreter of its own, and neither the template
    nor any role (all forks of it) holds the key anywhere."""
    control.start_background(org, timeout_s=60, env={"ORG_KEY_PROBE": "do-not-pass"})
    sup = procs.read_pidfile(org.run_dir / "supervisor.pid")
    template = procs.read_pidfile(org.run_dir / "forkserver.pid")
    assert any(e.startswith("ORG_KEY_PROBE=") for e in _environ(sup[0]))
    assert "roles.supervisor.forkserver" in _cmdline(template[0])
    for pid in [template[0], *(r["pid"] for r in roles(org).values())]:
        assert not any("do-not-pass" in e for e in _environ(pid)), pid


def test_killing_the_supervisor_takes_the_template_and_every_role_with_it(org):
    control.start_background(org, timeout_s=60)
    template = procs.read_pidfile(org.run_dir / "forkserver.pid")
    pids = [r["pid"] for r in roles(org).values()]
    sup = procs.read_pidfile(org.run_dir / "supervisor.pid")
    os.kill(sup[0], signal.SIGKILL)
    wait_for(lambda: not any(_alive(p) for p in [template[0], *pids]), timeout=20,
             what="the template and every role to die with the supervisor")


def test_a_killed_template_is_replaced_and_its_roles_restarted(org):
    control.start_background(org, timeout_s=60)
    old = procs.read_pidfile(org.run_dir / "forkserver.pid")
    before = {n: r["pid"] for n, r in roles(org).items()}
    os.kill(old[0], signal.SIGKILL)
    wait_for(lambda: (rs := roles(org)) and all(r["status"] == "ready" and r["pid"] != before[n]
                                                for n, r in rs.items()),
             timeout=60, what="every role restarted through a new template")
    new = procs.read_pidfile(org.run_dir / "forkserver.pid")
    assert new[0] != old[0]
    assert all(_ppid(r["pid"]) == new[0] for r in roles(org).values())


# What stands in for the machine's init: a child subreaper that starts the supervisor, so every
# process of the org left without a parent is given to it, reaped there and named (its comm, read
# while it is a zombie); it prints them once the supervisor has exited.
_INIT = """
import ctypes, json, os, subprocess, sys
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0     # PR_SET_CHILD_SUBREAPER
with open(sys.argv[2], "ab") as log:
    sup = subprocess.Popen([sys.executable, "-m", "roles.supervisor.main", "--home", sys.argv[1]],
                           stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
left = []
while True:
    pid = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT).si_pid
    try:
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
    except OSError:
        name = "?"
    os.waitpid(pid, 0)
    if pid == sup.pid:
        break
    left.append(name)
print(json.dumps(left))
"""


def _left_to_init(org, tmp_path, spawn: str) -> tuple[list[str], dict]:
    """Run one item with a sandboxed verify through an org started under ``_INIT``; returns what
    the org left to it and the item's row."""
    import subprocess
    import sys
    from roles.operations.submit import SubmitRequest, submit
    from state_db.kernel.config import load_config

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "answer.txt").write_text("unset\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"version": 1, "acts": [[
        {"text": "Writing the answer.", "tool_uses": [{"name": "write_file",
                                                      "input": {"path": "answer.txt", "content": "right\n"}}]},
        {"text": "Done."}]]}))
    init = subprocess.Popen([sys.executable, "-c", _INIT, str(org.root), str(org.logs_dir / "supervisor.out")],
                            cwd=Path(__file__).resolve().parents[1], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "ORG_SPAWN": spawn})
    try:
        control.wait_ready(org, timeout_s=60)
        wid = submit(org, load_config(org), SubmitRequest(
            goal="make answer.txt say right", workspace=str(ws), caps=Caps(max_iterations=2),
            verify=['test "$(cat answer.txt)" = right'], scope=["answer.txt"],
            backend=f"scripted:{script}"))["id"]
        wait_for(lambda: query(org, "SELECT status FROM work_items WHERE id = ?", (wid,))[0]["status"] == "ended",
                 timeout=60, what="the item to end")
        assert control.request(org, "stop", timeout_s=30)["status"] == "stopped"
        out, _ = init.communicate(timeout=30)
    finally:
        if init.poll() is None:
            init.kill()
            init.wait(10)
    return json.loads(out), query(org, "SELECT * FROM work_items WHERE id = ?", (wid,))[0]


def test_no_process_of_a_sandboxed_command_is_left_to_the_machines_init(org, tmp_path):
    """A real org verifies a run through real bubblewrap (its preflight and its verdict, each a
    sandboxed command that leaves the sandbox's first process behind): the template adopts and
    reaps every such process, so the machine's init is left none."""
    left, item = _left_to_init(org, tmp_path, "fork")
    assert item["stop_reason"] == "goal_met", item["stop_detail"]
    assert left == []


def test_exec_mode_roles_leave_the_sandboxes_first_processes_to_init(org, tmp_path):
    """The control for the test above, and what the README says of ``spawn = "exec"``: roles
    started as their own interpreters have no subreaper above them, so the sandboxes' first
    processes go to whatever reaps for the machine."""
    write_config(org, CONFIG.replace("heartbeat_timeout_s = 5.0", "heartbeat_timeout_s = 30.0"))
    left, item = _left_to_init(org, tmp_path, "exec")
    assert item["stop_reason"] == "goal_met", item["stop_detail"]
    assert left.count("bwrap") >= 2, left


def test_exec_mode_starts_each_role_as_its_own_interpreter(org, monkeypatch):
    monkeypatch.setenv("ORG_SPAWN", "exec")
    # five interpreters importing at once on a busy 2-core host can take longer than 5 s
    write_config(org, CONFIG.replace("heartbeat_timeout_s = 5.0", "heartbeat_timeout_s = 30.0"))
    control.start_background(org, timeout_s=60)
    sup = procs.read_pidfile(org.run_dir / "supervisor.pid")
    assert not (org.run_dir / "forkserver.pid").exists()
    assert all(_ppid(r["pid"]) == sup[0] for r in roles(org).values())


def test_the_template_is_forked_from_the_supervisor_before_it_opens_anything(org):
    """The supervisor imports what it and every role need (template.COMMON) once, then forks the
    template: the template and every role hold no file of the supervisor's (its store, its log,
    its lock), and the supervisor itself holds them all."""
    control.start_background(org, timeout_s=60)
    sup = procs.read_pidfile(org.run_dir / "supervisor.pid")
    template = procs.read_pidfile(org.run_dir / "forkserver.pid")

    def files(pid):
        out = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                out.add(os.readlink(fd))
            except OSError:
                pass
        return out
    theirs = {f for f in files(sup[0]) if f.startswith(str(org.root))}
    assert {str(org.run_dir / "supervisor.lock"), str(org.logs_dir / "supervisor.log"), str(org.db_path)} <= theirs
    assert not any(f.startswith(str(org.root)) and not f.startswith(str(org.logs_dir / "supervisor.out"))
                   for f in files(template[0])), files(template[0])
    for r in roles(org).values():
        # the store's files each process opens for itself (the gate: state_db/gate.py)
        own = {str(org.db_path) + suffix for suffix in ("", "-wal", "-shm", "-writers")}
        assert not theirs & files(r["pid"]) - own
