"""The sandbox's allow-listed view, its system-call filter and its file and disk limits, tried as a
hostile doer would, through real bubblewrap. Each refusal has a positive control: the same read
or call works outside the sandbox (or for a shown neighbour), so the test can fail."""
from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bench.common import unix_listener
from roles.workbench.sandbox import Toolchain, bubblewrap, exposed, runner_from_config
from state_db.bootstrap import init_home
from state_db.kernel.config import Config, ConfigError, defaults, load
from state_db.kernel.home import OrgHome
from tests.support.pg import pg_server  # noqa: F401 - fixture
from state_db.queries.work import Caps

pytestmark = pytest.mark.skipif(bubblewrap() is None, reason="bubblewrap (bwrap) is not installed")
PY = sys.executable
SECRET = "sk-ant-secret-of-another-org"


def config(**sandbox) -> Config:
    data = defaults()
    data["sandbox"].update(sandbox)
    return Config(data)


def sh(runner, line: str, cwd: Path | None = None, timeout_s: float = 20.0) -> str:
    got = runner.run(line, cwd or runner.workspace, timeout_s, 200_000)
    return got.output


@pytest.fixture
def org_b(tmp_path):
    """This org (B): its home, and a workspace outside it."""
    home = OrgHome(tmp_path / "b")
    init_home(home)
    ws = tmp_path / "ws"
    ws.mkdir()
    return home, ws


def test_a_second_org_home_is_hidden_even_inside_a_folder_the_sandbox_shows(tmp_path, org_b):
    """Org A's home lies in a folder org B's org.toml shows read-only: its state.db is still absent."""
    shared = tmp_path / "shared"
    a = OrgHome(shared / "org-a")
    init_home(a)
    (shared / "tool.txt").write_text("a shown neighbour\n")
    (a.root / "notes.txt").write_text(SECRET)
    home, ws = org_b
    runner = runner_from_config(config(readonly_binds=[str(shared)]), home, ws)
    out = sh(runner, f"cat {shared}/tool.txt; head -c 16 {a.db_path}; cat {a.root}/notes.txt; ls -A {a.root}; "
                     f"head -c 16 {home.db_path}")
    assert "a shown neighbour" in out                            # control: the folder is shown
    assert a.db_path.read_bytes().startswith(b"SQLite format 3")   # control: readable outside
    assert "SQLite format 3" not in out and SECRET not in out, out


def test_an_org_home_registered_after_a_command_is_hidden_from_the_next_one(tmp_path, org_b):
    """The registered homes are read once and kept while the registry is unchanged: a home a new
    org registers between two commands of the same process must still be hidden from the second."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "tool.txt").write_text("a shown neighbour\n")
    home, ws = org_b
    runner = runner_from_config(config(readonly_binds=[str(shared)]), home, ws)
    assert "a shown neighbour" in sh(runner, f"cat {shared}/tool.txt")     # the homes are read and kept now
    late = OrgHome(shared / "org-late")
    init_home(late)                                                         # registers itself
    (late.root / "notes.txt").write_text(SECRET)
    out = sh(runner, f"cat {shared}/tool.txt; head -c 16 {late.db_path}; cat {late.root}/notes.txt")
    assert "a shown neighbour" in out
    assert "SQLite format 3" not in out and SECRET not in out, out


def test_another_project_in_the_real_home_is_absent(org_b):
    project = Path(tempfile.mkdtemp(prefix="other-project-", dir=Path.home()))
    try:
        (project / "secret.py").write_text(SECRET)
        runner = runner_from_config(config(), org_b[0], org_b[1])
        out = sh(runner, f"cat {project}/secret.py; ls -A {project}")
        assert (project / "secret.py").read_text() == SECRET       # control
        assert SECRET not in out and "No such file or directory" in out, out
    finally:
        shutil.rmtree(project)


@pytest.mark.parametrize("top", ["/srv", "/mnt", "/media", "/var/lib"])
def test_machine_folders_outside_the_allow_list_are_absent(org_b, top):
    made = None
    if os.access(top, os.W_OK):
        made = Path(tempfile.mkdtemp(prefix="lo-view-", dir=top))
        (made / "data").write_text(SECRET)
    try:
        runner = runner_from_config(config(), org_b[0], org_b[1])
        out = sh(runner, f"ls -A {top}; cat {made}/data" if made else f"ls -A {top}")
        assert SECRET not in out and "No such file or directory" in out, out
    finally:
        if made:
            shutil.rmtree(made)


def test_the_deny_list_is_hidden_inside_a_shown_home_folder(tmp_path, org_b):
    home_dir = tmp_path / "someone"
    files = {".ssh/id_ed25519": "PRIVATE KEY", ".netrc": "machine x password p", ".npmrc": "//r/:_authToken=t",
             ".pypirc": "password = p", ".git-credentials": "https://u:p@h", ".config/git/credentials": "c",
             ".docker/config.json": '{"auths": 1}', ".aws/credentials": "aws_secret", ".bash_history": "history",
             ".zsh_history": "history", ".config/gcloud/creds.db": "gcloud", ".gnupg/secring.gpg": "gpg"}
    for rel, text in files.items():
        (home_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (home_dir / rel).write_text(f"DENIED {text}")
    (home_dir / "bin").mkdir()
    (home_dir / "bin" / "tool").write_text("SHOWN tool\n")
    runner = runner_from_config(config(readonly_binds=[str(home_dir)]), org_b[0], org_b[1])
    out = sh(runner, "; ".join(f"cat {home_dir}/{rel} 2>/dev/null" for rel in files) + f"; cat {home_dir}/bin/tool")
    assert "SHOWN tool" in out
    assert "DENIED" not in out, out


def test_pid_1_and_the_environment_name_no_hidden_host_path(tmp_path, org_b):
    """bubblewrap reads its options from a descriptor: pid 1's command line holds no mount list;
    a PATH entry inside an org home is dropped from the sandbox's PATH."""
    home, ws = org_b
    hidden_bin = home.root / "run" / "bin"
    hidden_bin.mkdir(parents=True)
    toolchain = Toolchain(f"{hidden_bin}:/usr/bin:/bin", str(tmp_path))
    runner = runner_from_config(config(), home, ws)
    runner.toolchain_of = lambda _ws: toolchain
    out = sh(runner, "tr '\\0' ' ' </proc/1/cmdline; echo; env")
    assert "bwrap" in out.splitlines()[0]                          # control: it is bubblewrap's
    assert str(home.root) not in out and "--ro-bind" not in out and "--tmpfs" not in out, out
    env = dict(line.split("=", 1) for line in out.splitlines()[1:] if "=" in line)
    assert env["PATH"] == "/usr/bin", env
    assert not any(k.startswith(("ORG_", "ANTHROPIC")) for k in env)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["HOME"].startswith("/tmp/")


def test_a_200_mb_file_is_refused_by_the_file_size_limit(org_b):
    runner = runner_from_config(config(), org_b[0], org_b[1])
    ws = org_b[1]
    out = sh(runner, "dd if=/dev/zero of=small bs=1M count=1 2>&1 | tail -1; "
                     "dd if=/dev/zero of=big bs=1M count=200 2>&1; echo EXIT=$?")
    assert (ws / "small").stat().st_size == 2**20                 # control: writing works
    assert "EXIT=0" not in out and (ws / "big").stat().st_size <= 128 * 2**20, out


def test_a_workspace_over_its_disk_quota_fails_the_command_with_a_coded_line(org_b):
    runner = runner_from_config(config(disk_mb=16), org_b[0], org_b[1])
    fine = runner.run("head -c 1000000 /dev/zero > a", org_b[1], 20, 10_000)
    assert fine.exit_code == 0                                      # control
    over = runner.run("head -c 20000000 /dev/zero > b", org_b[1], 20, 10_000)
    assert over.exit_code == 1 and "error[disk_quota]" in over.output, over.output


def test_nested_user_namespaces_are_refused(org_b):
    assert subprocess.run(["unshare", "-r", "true"]).returncode == 0   # control: allowed on this host
    runner = runner_from_config(config(), org_b[0], org_b[1])
    got = runner.run("unshare -r true; echo EXIT=$?", org_b[1], 20, 10_000)
    assert "EXIT=0" not in got.output and "Operation not permitted" in got.output, got.output


PROBE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
keyctl = libc.syscall(int(sys.argv[1]), 0, ctypes.c_long(-3), 0)
print("keyctl", keyctl, ctypes.get_errno())
pid = os.fork()
if pid == 0:
    os._exit(0 if libc.ptrace(0, 0, 0, 0) == 0 else ctypes.get_errno())
print("ptrace", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_ptrace_and_keyctl_are_refused(org_b):
    import errno

    import pyseccomp
    number = str(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, "keyctl"))
    outside = subprocess.run([PY, "-c", PROBE, number], capture_output=True, text=True).stdout
    assert "keyctl -1" not in outside and "ptrace 0" in outside, outside   # control
    runner = runner_from_config(config(), org_b[0], org_b[1])
    got = runner.run([PY, "-c", PROBE, number], org_b[1], 20, 10_000)
    assert f"keyctl -1 {errno.EPERM}" in got.output and f"ptrace {errno.EPERM}" in got.output, got.output


def test_the_eval_snapshot_appears_at_the_workspaces_own_path(tmp_path, org_b):
    home, ws = org_b
    snapshot = home.root / "eval" / "w-1"
    (snapshot / "pkg").mkdir(parents=True)
    (snapshot / "pkg" / "mark").write_text("from the snapshot\n")
    (ws / "live-only").write_text("live\n")
    runner = runner_from_config(config(), home, snapshot, present_at=ws)
    out = sh(runner, "pwd; cat mark; ls ..; touch written", cwd=snapshot / "pkg")
    assert out.splitlines()[0] == str(ws / "pkg") and "from the snapshot" in out
    assert "live-only" not in out and (snapshot / "pkg" / "written").exists()
    assert str(home.root) not in out


SOCKET_PROBE = """
import socket, sys
for path in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        print("CONNECTED", path, s.recv(64).decode())
    except OSError as exc:
        print("refused", path, exc.errno)
own = "/tmp/own.sock"                  # a command's own socket, as a project's tests may make
server = socket.socket(socket.AF_UNIX)
server.bind(own)
server.listen(1)
client = socket.socket(socket.AF_UNIX)
client.connect(own)
server.accept()[0].sendall(b"own-ok")
print("OWN", client.recv(16).decode())
"""


@contextlib.contextmanager
def listening(*paths: Path):
    """A host process's Unix sockets at ``paths``, each answering HOST to whoever connects."""
    servers = [unix_listener(path, b"HOST") for path in paths]
    try:
        yield
    finally:
        for server, path in zip(servers, paths):
            server.close()
            path.unlink(missing_ok=True)


def test_deny_listed_files_made_after_a_command_are_hidden_from_the_next_one(tmp_path, org_b):
    """The view is kept between commands while nothing it was made from changed: a key, a
    credential or a history written into a shown home folder between two commands of one
    runner, at once and at every depth of the deny-list, is hidden from the second command."""
    home_dir = tmp_path / "someone"
    (home_dir / "bin").mkdir(parents=True)
    (home_dir / "bin" / "tool").write_text("SHOWN tool\n")
    (home_dir / ".config").mkdir()                        # a parent that exists before, one that does not
    runner = runner_from_config(config(readonly_binds=[str(home_dir)]), org_b[0], org_b[1])
    late = {".netrc": "machine x password p", ".config/gh/hosts.yml": "oauth_token: t",
            ".config/git/credentials": "https://u:p@h", ".local/share/keyrings/login.keyring": "k",
            ".ssh/id_ed25519": "PRIVATE KEY"}
    line = "; ".join(f"cat {home_dir}/{rel} 2>/dev/null" for rel in late) + f"; cat {home_dir}/bin/tool"
    assert "SHOWN tool" in sh(runner, line)               # the view is made and kept now
    for rel, text in late.items():
        (home_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (home_dir / rel).write_text(f"DENIED {text}")
    out = sh(runner, line)
    assert "SHOWN tool" in out
    assert "DENIED" not in out, out


def test_a_host_socket_bound_after_a_command_cannot_be_reached_from_the_next_one(tmp_path, org_b):
    """Sockets are read for every command, not kept with the view: one a host process binds in
    a shown folder between two commands of one runner is covered in the second."""
    home, ws = org_b
    shown = tmp_path / "shown"
    shown.mkdir()
    (ws / "probe.py").write_text(SOCKET_PROBE)
    runner = runner_from_config(config(readonly_binds=[str(shown)]), home, ws)
    late = shown / "late.sock"
    assert "No such file" in sh(runner, f"{PY} probe.py {late}; ls {late}")      # made and kept now
    with listening(late):
        out = sh(runner, f"{PY} probe.py {late}")
    assert "CONNECTED" not in out and "refused" in out, out


def test_a_host_socket_in_a_shown_folder_or_the_workspace_cannot_be_reached(tmp_path, org_b):
    """A read-only mount does not stop connect() on a socket and the sandbox's uid is the host
    user's: a host process listening in a shown folder (an agent, a container engine, a
    database) or in the workspace would answer the doer as the org. Each is covered; a socket
    the command makes itself still works."""
    home, ws = org_b
    shown = tmp_path / "shown"
    (shown / "deep" / "er").mkdir(parents=True)
    (shown / "closed").mkdir()
    paths = [shown / "agent.sock", shown / "deep" / "er" / "engine.sock", ws / "dev-server.sock",
             shown / "closed" / "private.sock"]
    (ws / "probe.py").write_text(SOCKET_PROBE)
    with listening(*paths):
        for path in paths:                      # control: reachable from outside
            c = socket.socket(socket.AF_UNIX)
            c.connect(str(path))
            assert c.recv(8) == b"HOST"
            c.close()
        # a folder the org's user may not enter (another user's, 0700): out of reach inside,
        # and nothing can be mounted over what it holds; the sandbox must still start
        os.chown(shown / "closed", 65533, 65533)
        os.chmod(shown / "closed", 0o700)
        runner = runner_from_config(config(readonly_binds=[str(shown)]), home, ws)
        out = sh(runner, f"{PY} probe.py " + " ".join(map(str, paths)) + f"; ls {shown}")
    assert "agent.sock" in out                   # control: the folder is shown
    assert "CONNECTED" not in out and out.count("refused") == 4, out
    assert "OWN own-ok" in out, out


def test_the_postgresql_store_cannot_be_reached_from_inside_even_with_its_socket_folder_shown(org_b, pg_server):
    """A doer that reaches the store writes its own verdicts: the org's Python (psycopg
    included) is shown, so the only thing between them is the socket."""
    home, ws = org_b
    url = pg_server.url()
    probe = ("import psycopg, sys\n"
             "try:\n"
             "    print('ANSWER', psycopg.connect(sys.argv[1], connect_timeout=5).execute('SELECT 41 + 1').fetchone()[0])\n"
             "except Exception as exc:\n"
             "    print('refused', type(exc).__name__)\n")
    (ws / "store.py").write_text(probe)
    control = subprocess.run([PY, str(ws / "store.py"), url], capture_output=True, text=True, timeout=30)
    assert "ANSWER 42" in control.stdout, control.stdout + control.stderr
    folder = pg_server.socket_dir
    mode = stat.S_IMODE(folder.stat().st_mode)
    os.chmod(folder, 0o755)                      # open to all, as Debian's /var/run/postgresql
    try:
        runner = runner_from_config(config(readonly_binds=[str(folder)]), home, ws)
        out = sh(runner, f"{PY} store.py '{url}'; ls -a {folder}", timeout_s=30)
    finally:
        os.chmod(folder, mode)
    assert ".s.PGSQL" in out                     # control: the socket's folder is shown
    assert "ANSWER" not in out and "refused" in out, out


def test_org_homes_are_owner_only_and_state_db_0600(tmp_path):
    home = OrgHome(tmp_path / "fresh")
    init_home(home)
    assert stat.S_IMODE(home.root.stat().st_mode) == 0o700
    assert stat.S_IMODE(home.db_path.stat().st_mode) == 0o600


def test_config_check_refuses_a_readonly_bind_that_is_relative_or_missing(tmp_path):
    for value in ('["relative/path"]', f'["{tmp_path}/missing"]', '["/"]'):
        path = tmp_path / "org.toml"
        path.write_text(f"[sandbox]\nreadonly_binds = {value}\n")
        with pytest.raises(ConfigError, match="sandbox.readonly_binds"):
            load(path, env={})


def test_doctor_lists_what_the_sandbox_shows_and_hides_with_reasons(tmp_path, org_b):
    shown = tmp_path / "tools"
    shown.mkdir()
    pairs = dict(exposed(config(readonly_binds=[str(shown)]), org_b[0]))
    assert pairs["/usr"] == "system folder" and "readonly_binds" in pairs[str(shown)]
    assert pairs["/tmp"].startswith("private")
    assert all(not p.startswith(str(org_b[0].root)) for p in pairs if not pairs[p].startswith("hidden"))


def test_a_verify_command_run_from_a_venv_outside_the_workspace_sees_that_venv(tmp_path, org_b):
    """The work item names /…/venv/bin/python; that venv (under the private /tmp otherwise) is shown."""
    from roles.workbench.sandbox.toolchains import at_submit
    venv = tmp_path / "venv"
    subprocess.run([PY, "-m", "venv", "--without-pip", str(venv)], check=True)
    home, ws = org_b
    toolchain = at_submit({"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, [f"{venv}/bin/python -c 'print(1)'"], ws)
    runner = runner_from_config(config(), home, ws)
    assert "not found" in sh(runner, f"{venv}/bin/python -c 'print(\"RAN\")'")   # control: not shown by default
    runner.toolchain_of = lambda _ws: toolchain
    assert "RAN" in sh(runner, f"{venv}/bin/python -c 'print(\"RAN\")'")


def test_org_show_lists_what_a_runs_sandbox_shows_and_hides(tmp_path):
    """What the sandbox shows is the submitter's toolchain, recorded with the work item: `org show
    --sandbox` lists each path with its reason, and the org home among what stays hidden."""
    import json
    import subprocess
    import sys
    from roles.operations.submit import SubmitRequest, submit
    from state_db.kernel import config as config_mod
    from state_db.bootstrap import init_home
    from state_db.kernel.home import OrgHome
    home = OrgHome(tmp_path / "org")
    init_home(home)
    ws = tmp_path / "ws"
    ws.mkdir()
    script = Path(__file__).resolve().parents[1] / "scripts" / "demo" / "script.json"
    item = submit(home, config_mod.load(None), SubmitRequest(goal="g", workspace=str(ws), verify=["true"],
                                                            caps=Caps(max_iterations=1), backend=f"scripted:{script}"))
    got = subprocess.run([sys.executable, "-m", "scripts.cli.main", "--home", str(home.root), "show", item["id"],
                          "--sandbox", "--json"], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1])
    assert got.returncode == 0, got.stderr
    view = {e["path"]: e["reason"] for e in json.loads(got.stdout)["sandbox_view"]}
    assert view["/usr"] and view["/tmp"].startswith("private")
    assert any(p.startswith(sys.prefix) or sys.prefix.startswith(p) for p in view)     # the org's Python
    assert all(not p.startswith(str(home.root)) or r.startswith("hidden") for p, r in view.items())


@pytest.mark.timeout(30)
def test_socket_paths_are_resolved_as_realpath_resolves_them(tmp_path):
    """host_sockets resolves each folder once; a path through a linked folder, a socket's name
    that is itself a link, and a '..' still resolve exactly as os.path.realpath does."""
    from roles.workbench.sandbox.view import host_sockets
    real = tmp_path / "real"
    (real / "s").mkdir(parents=True)
    (tmp_path / "linked").symlink_to(real)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (real / "s" / "named-link").symlink_to(elsewhere / "target")
    paths = [f"{tmp_path}/linked/s/a", f"{tmp_path}/linked/s/b", f"{real}/s/named-link",
             f"{tmp_path}/linked/s/../s/c", f"{tmp_path}/linked/s/..", "/no/such/folder/d"]
    table = tmp_path / "unix"
    table.write_text("Num RefCount Protocol Flags Type St Inode Path\n" + "".join(
        f"0000: 00000002 00000000 00010000 0001 01 {1000 + i} {p}\n" for i, p in enumerate(paths))
        + "0000: 00000002 00000000 00010000 0001 01 9 @abstract\n")
    assert host_sockets(str(table)) == list(dict.fromkeys(os.path.realpath(p) for p in paths))
    assert f"{elsewhere}/target" in host_sockets(str(table))


def test_the_socket_table_is_read_as_the_kernel_writes_it_and_hidden_folders_are_left_out(tmp_path):
    """``host_sockets`` reads each bound path whole (spaces and all), leaves abstract and unnamed
    sockets out, resolves each folder once, and drops the sockets of a folder ``skip_folder``
    names (a hidden place: an org home's run/s holds most of the table at a hundred agents)."""
    from roles.workbench.sandbox.view import host_sockets

    org = tmp_path / "org" / "run" / "s"
    shown = tmp_path / "shown dir"
    org.mkdir(parents=True)
    shown.mkdir()
    rows = ["Num       RefCount Protocol Flags    Type St Inode Path",
            *(f"0000000000000000: 00000003 00000000 00010000 0001 01 {900 + i} {org}/loop-agent-{i % 7}"
              for i in range(50)),
            "0000000000000000: 00000002 00000000 00010000 0001 01 11 @/abstract/name",
            "0000000000000000: 00000002 00000000 00000000 0001 03 12",
            f"0000000000000000: 00000002 00000000 00010000 0001 01 13 {shown}/a socket"]
    table = tmp_path / "unix"
    table.write_text("\n".join(rows) + "\n")
    every = host_sockets(str(table))
    assert sorted(every) == sorted([*(f"{org}/loop-agent-{i}" for i in range(7)), f"{shown}/a socket"])
    assert host_sockets(str(table), skip_folder=lambda folder: folder == str(org)) == [f"{shown}/a socket"]
