"""Escape attempts from an agent command: each runs through a loop-agent's real tool runner
(the sandbox org.toml asks for, its environment, working directory and file-system view), and
each must fail — checked by its effect, not by the command's exit code alone."""
from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time

import pytest

from roles.loop_agent.tools import WorkspaceTools
from roles.workbench.sandbox import bubblewrap, runner_from_config
from state_db.bootstrap import init_home
from state_db.kernel.home import OrgHome
from tests.support.org import short_home_dir

pytestmark = pytest.mark.skipif(bubblewrap() is None, reason="bubblewrap (bwrap) is not installed; "
                                "scripts/test on CI installs it — these tests need the real sandbox")
FAKE_KEY = "sk-ant-FAKE-escape-0123456789"


@pytest.fixture(scope="module")
def world():
    root = short_home_dir()
    home = OrgHome(root / "org")
    cfg, _ = init_home(home)
    from transport.keys import Keyring, keyring_path
    Keyring.create(keyring_path(home.run_dir)).issue("coordinator")
    (home.outbox_dir / "coordinator").mkdir(parents=True, exist_ok=True)
    ws = root / "ws"
    ws.mkdir()
    (ws / "app.py").write_text("print('hi')\n")
    outside = root / "outside.txt"
    outside.write_text("outside secret\n")
    (ws / "link_out").symlink_to(outside)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    unix_path = str(home.run_dir / "s" / "coordinator")
    (home.run_dir / "s").mkdir(exist_ok=True)
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(unix_path)
    unix.listen(1)
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                              env={**os.environ, "ANTHROPIC_API_KEY": FAKE_KEY})
    os.environ["ANTHROPIC_API_KEY"] = FAKE_KEY
    tools = WorkspaceTools(ws, runner_from_config(cfg, home))
    yield {"home": home, "ws": ws, "tools": tools, "outside": outside, "port": listener.getsockname()[1],
           "unix": unix_path, "victim": victim, "root": root}
    victim.kill()
    victim.wait()
    listener.close()
    unix.close()
    os.environ.pop("ANTHROPIC_API_KEY", None)


def run(world, command, timeout_s=10):
    res = world["tools"].call("run_command", {"command": command, "timeout_s": timeout_s})
    return res.content, res.is_error


def between(out: str, begin: str, end: str) -> list[str]:
    """The words a command printed between two marker lines."""
    return out.split(begin + "\n", 1)[1].split(end, 1)[0].split()


def absent_or_empty(listing: str) -> bool:
    """What ``ls -A`` printed shows a folder that is not there or holds nothing."""
    return listing.split() == [] or "No such file or directory" in listing


def db_tables(home):
    conn = sqlite3.connect(home.db_path)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    finally:
        conn.close()


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "link_out", "./../ws/../outside.txt"])
def test_file_tools_refuse_paths_leading_out(world, path):
    res = world["tools"].call("read_file", {"path": path})
    assert res.is_error and "outside secret" not in res.content


def test_cannot_read_state_db_by_absolute_path(world):
    out, _ = run(world, f"head -c 100 {world['home'].db_path}; echo; echo LISTING; ls -A {world['home'].root}")
    assert "SQLite format 3" not in out
    assert absent_or_empty(out.split("LISTING", 1)[1]), "the org home is not empty inside the sandbox"


def test_find_cannot_locate_the_org(world):
    out, _ = run(world, "find / -name state.db -not -path '/proc/*' 2>/dev/null | head", timeout_s=20)
    assert str(world["home"].db_path) not in out


def test_cannot_write_state_db_with_sqlite3(world):
    before = db_tables(world["home"])
    run(world, f"python3 -c \"import sqlite3; c=sqlite3.connect('{world['home'].db_path}'); "
               "c.execute('create table pwned(x)'); c.execute(\\\"insert into verdicts(id) values ('x')\\\"); c.commit()\"")
    assert db_tables(world["home"]) == before


def test_cannot_read_role_keys(world):
    from transport.keys import Keyring, keyring_path
    key = Keyring.load(keyring_path(world["home"].run_dir)).key_for("coordinator")
    out, _ = run(world, f"cat {world['home'].run_dir}/keys.json; cat {world['home'].run_dir}/*")
    raw = keyring_path(world["home"].run_dir).read_text()
    assert raw[:40] not in out and key.hex() not in out


def test_cannot_read_other_processes_environment(world):
    out, _ = run(world, f"cat /proc/{world['victim'].pid}/environ; grep -a sk-ant /proc/*/environ; env")
    assert FAKE_KEY not in out and "sk-ant" not in out


def test_cannot_connect_to_a_role_socket(world):
    out, _ = run(world, f"python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('{world['unix']}'); print('CONNECTED')\"")
    assert "CONNECTED" not in out


def test_cannot_write_an_outbox_file(world):
    target = world["home"].outbox_dir / "coordinator" / "forged.msg"
    run(world, f"echo '{{\"kind\":\"verdict_ready\"}}' > {target}")
    assert not target.exists()


def test_no_network_to_loopback_or_outside(world):
    out, _ = run(world, f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {world['port']}), 2); print('CONNECTED')\"; "
                        "getent hosts example.com && echo RESOLVED")
    assert "CONNECTED" not in out and "RESOLVED" not in out


def test_cannot_signal_org_processes(world):
    run(world, f"kill -9 {world['victim'].pid}; kill -9 -1")
    time.sleep(0.2)
    assert world["victim"].poll() is None, "a process outside the sandbox was killed"


def test_cannot_write_outside_the_workspace(world):
    root = world["root"]
    run(world, f"echo x > {root}/escaped.txt; cd .. && echo x > escaped2.txt; echo x > /tmp/../etc/evil; touch ~/evil")
    assert not (root / "escaped.txt").exists() and not (root / "escaped2.txt").exists()
    assert not os.path.exists("/etc/evil")


def test_hard_link_to_outside_fails(world):
    out, _ = run(world, f"ln {world['outside']} hard && cat hard; ln /etc/hostname host2 && echo LINKED")
    assert "outside secret" not in out and not (world["ws"] / "hard").exists()


def test_fork_bomb_is_contained(world):
    t0 = time.monotonic()
    out, _ = run(world, "for i in $(seq 1 2000); do sleep 30 & done; echo spawned", timeout_s=5)
    assert time.monotonic() - t0 < 30
    leftovers = subprocess.run(["pgrep", "-f", "sleep 30"], capture_output=True, text=True).stdout.split()
    assert len(leftovers) < 50, f"{len(leftovers)} sleepers survived the sandbox"


def test_endless_output_is_cut(world):
    out, is_error = run(world, "yes loop-org", timeout_s=3)
    assert len(out) < 2_000_000


def test_sleep_past_the_time_limit_is_killed(world):
    t0 = time.monotonic()
    out, is_error = run(world, "sleep 60; echo WOKE", timeout_s=2)
    assert "WOKE" not in out and time.monotonic() - t0 < 20


def test_the_real_home_shows_only_the_read_only_toolchain(world):
    from pathlib import Path

    from roles.workbench.sandbox.view import build
    home = Path.home()
    shown = [Path(e.path) for e in build(None, own_home=world["home"].root).readonly]
    allowed = {p.relative_to(home).parts[0] for p in shown if p.is_relative_to(home)}
    out, _ = run(world, f"ls -A {home}; echo END")
    entries = set(out.split("END")[0].split()) - {"exit", "code", "0"}
    assert entries <= allowed, f"the real home shows {entries - allowed}"
    run(world, f"touch {home}/.escape-probe")
    assert not (home / ".escape-probe").exists()


def test_cannot_read_what_only_the_hosts_root_may_read(world):
    """Running as root, the sandbox's uid maps to the host's root underneath: owner bits alone
    would let it read /etc/shadow and private keys."""
    from pathlib import Path

    out, _ = run(world, "cat /etc/shadow /etc/gshadow; echo BEGIN; ls -A /etc/ssl/private; echo END")
    shadow = Path("/etc/shadow")
    if os.geteuid() == 0 and shadow.exists() and not shadow.stat().st_mode & 0o004:
        first_user = shadow.read_text().split(":", 1)[0]
        assert f"{first_user}:" not in out, "the host's /etc/shadow was readable"
    private = Path("/etc/ssl/private")
    if private.is_dir() and not private.stat().st_mode & 0o004:
        assert between(out, "BEGIN", "END") == [], "a root-only folder was listed"


def test_org_processes_cannot_be_found(world):
    out, _ = run(world, f"ls /proc; cat /proc/{world['victim'].pid}/cmdline; echo; ps -eo pid,args 2>&1")
    pids = {int(x) for x in out.split() if x.isdigit()}
    assert world["victim"].pid not in pids and str(os.getpid()) not in out.split()
    assert "sleep(120)" not in out


def test_cannot_reach_host_service_sockets(world):
    """/run (and /var/run through its link) holds the host's service sockets — docker's among
    them, which would be root on the host."""
    out, _ = run(world, "for s in /var/run/docker.sock /run/docker.sock /run/dbus/system_bus_socket; do "
                        "python3 -c \"import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
                        "print('CONNECTED', sys.argv[1])\" $s 2>/dev/null; done; echo BEGIN; ls -A /run; echo END")
    assert "CONNECTED" not in out
    assert absent_or_empty(out.split("BEGIN\n", 1)[1].split("END", 1)[0]), "the host's /run is visible in the sandbox"
