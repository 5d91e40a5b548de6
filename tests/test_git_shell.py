"""Workspace histories over ssh://: a real OpenSSH server on 127.0.0.1 whose only authorized key
runs the forced command ``org git-shell`` (``roles.workbench.serve.gitshell``), a worker's
``RemoteHistory`` and plain ``git`` as clients. The hostile cases of the git daemon's tests
(tests/test_remote_history.py) hold over ssh as well: the baseline, deletions, refs outside the
list and a repository's own hooks are guarded the same way, and nothing outside the history
folder is reached. The request parser and path mapping are checked on their own too."""
from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roles.workbench.serve.githooks import hook_text, hooks_dir_for, receive_config
from roles.workbench.serve.gitserve import GitServer
from roles.workbench.serve.gitshell import GitShellError, authorized_keys_line, command, parse, prepare, resolve
from roles.workbench.workspace.history import WorkspaceHistory
from roles.workbench.workspace.remote import RemoteHistory, git_env
from roles.workbench.workspace.views import BASELINE_REF, HEAD_REF
from tests.support import install_current
from tests.test_remote_history import (files_of, free_port, fsck, git, plant_own_hooks, remote_ref,
                                       weakened_repository)

ROOT = Path(__file__).resolve().parents[1]
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
# the checkout's org CLI, as scripts/org runs it (sshd passes no environment: this checkout's code,
# whatever the virtualenv's own install points at)
ORG = ["env", f"PYTHONPATH={ROOT}", sys.executable, "-m", "scripts.cli.main"]
USER = getpass.getuser()


def cannot_serve() -> str | None:
    """Why this machine cannot run the ssh tests, or None."""
    import pwd
    if not os.path.exists(SSHD):
        return f"OpenSSH's server is not installed ({SSHD}): apt-get install openssh-server (.ci/run does)"
    shell = pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh"
    if os.path.basename(shell) in ("nologin", "false") or not os.access(shell, os.X_OK):
        return f"sshd runs the forced command through {USER}'s login shell, and {shell} is none"
    return None


def keygen(path: Path, comment: str = "test") -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, timeout=30, stdin=subprocess.DEVNULL)
    return path.with_suffix(".pub").read_text()


class Sshd:
    """``sshd -D -e`` on 127.0.0.1:<free port> with a throwaway host key; the one authorized key
    (a throwaway client key) runs ``org git-shell --home <home>`` and nothing else."""

    def __init__(self, tmp: Path, home: Path, org: list = ORG) -> None:
        self.dir = tmp / "sshd"
        self.dir.mkdir()
        self.home = home
        self.port = free_port()
        keygen(self.dir / "host_key", "host")
        self.client_key = self.dir / "client_key"
        pub = keygen(self.client_key, "worker-1")
        self.line = authorized_keys_line(org, home, pub)
        (self.dir / "authorized_keys").write_text(self.line + "\n")
        os.chmod(self.dir / "authorized_keys", 0o600)
        self.config = self.dir / "sshd_config"
        self.config.write_text("\n".join([
            f"ListenAddress 127.0.0.1:{self.port}",
            f"HostKey {self.dir / 'host_key'}",
            f"PidFile {self.dir / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
            "AuthorizedKeysCommand none",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "HostbasedAuthentication no",
            "PermitRootLogin forced-commands-only",   # root may log in only to a forced command
            "StrictModes no",
            "UsePAM no",
            "PrintMotd no",
            "AcceptEnv GIT_PROTOCOL",                 # git asks for protocol v2 through it
            "LogLevel VERBOSE",
            "MaxStartups 50",
            "",
        ]))
        self.log = self.dir / "sshd.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)   # the privilege separation folder
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)], stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=out, start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        why = self.log.read_text(errors="replace").strip()
        if os.geteuid() != 0:
            pytest.skip(f"sshd cannot run as {USER} here: {why.splitlines()[-1] if why else 'no message'}")
        raise AssertionError(f"sshd did not start:\n{why}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)

    @property
    def ssh_command(self) -> str:
        return (f"ssh -i {self.client_key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                f"-o BatchMode=yes -o LogLevel=ERROR -o IdentitiesOnly=yes -p {self.port}")

    def url(self, path: str) -> str:
        return f"ssh://{USER}@127.0.0.1:{self.port}{path}"

    def ssh(self, *remote: str, tty: bool = False) -> subprocess.CompletedProcess:
        argv = [*self.ssh_command.split(), "-T", f"{USER}@127.0.0.1", *remote]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)


@pytest.fixture
def coord(tmp_path):
    """The coordinator host: its home (history/ below it), its workspace, its sshd."""
    if cannot_serve():
        pytest.skip(cannot_serve())
    home = tmp_path / "coord"
    (home / "history").mkdir(parents=True)
    ws = tmp_path / "coord_ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "app.py").write_text("print('v0')\n")
    (ws / "tests").mkdir()
    (ws / "tests" / "test_app.py").write_text("def test(): pass\n")
    server = Sshd(tmp_path, home)
    server.start()
    try:
        yield home, ws, server
    finally:
        server.stop()
    assert server.proc is None


@pytest.fixture
def over_ssh(coord, monkeypatch):
    """Workers and plain git reach the coordinator with the throwaway key (as a worker host's
    ``GIT_SSH_COMMAND`` or ssh config would)."""
    monkeypatch.setenv("GIT_SSH_COMMAND", coord[2].ssh_command)
    return coord


def coordinator_history(coord) -> WorkspaceHistory:
    home, ws, _ = coord
    return WorkspaceHistory(home / "history" / "w1.git", ws)


def worker(tmp_path: Path, remote: str, name: str = "worker", **kw) -> RemoteHistory:
    root = tmp_path / name
    return RemoteHistory(root / "history" / "w1.git", root / "ws", remote=remote, timeout_s=30, **kw)


def one_error_line(stderr: str, code: str) -> str:
    """The one line git-shell wrote (git adds its own lines below it on a client)."""
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error[")]
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"error[{code}]: ") and " — " in lines[0], stderr
    assert "Traceback" not in stderr, stderr
    return lines[0]


# -- over a real sshd ---------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_a_worker_fetches_and_pushes_over_ssh_end_to_end(tmp_path, over_ssh):
    ch = coordinator_history(over_ssh)
    base = ch.baseline()
    sshd = over_ssh[2]
    assert not (over_ssh[0] / "run" / "git-hooks").exists()
    rh = worker(tmp_path, sshd.url("/w1.git"))
    assert rh.baseline() == base
    assert files_of(rh.workspace) == files_of(over_ssh[1])
    assert (hooks_dir_for(over_ssh[0] / "history") / "pre-receive").read_text() == hook_text()   # written on use
    (rh.workspace / "src" / "app.py").write_text("print('v1')\n")
    c1 = rh.checkpoint(1)
    assert remote_ref(ch.git_dir, "refs/iterations/1") == c1
    assert ch.read_path(c1, "src/app.py") == b"print('v1')\n"
    (rh.workspace / "deploy.txt").write_text("approved\n")
    act = rh.checkpoint_action("d-1")
    assert remote_ref(ch.git_dir, "refs/actions/d-1") == act
    rh.flush_pending()
    assert remote_ref(ch.git_dir, HEAD_REF) == rh._ref(HEAD_REF)
    # a second worker names the history by its absolute path, as [hosts] git_url = "ssh://host/<home>/history" does
    second = worker(tmp_path, sshd.url(f"{over_ssh[0] / 'history'}/w1.git"), "worker2")
    second.reset_to(c1)
    assert files_of(second.workspace)["src/app.py"] == b"print('v1')\n"
    assert second.baseline() == base
    (second.workspace / "notes.md").write_text("2\n")
    c2 = second.checkpoint(2)
    assert remote_ref(ch.git_dir, "refs/iterations/2") == c2
    assert remote_ref(ch.git_dir, BASELINE_REF) == base
    fsck(ch.git_dir)
    fsck(second.git_dir)


@pytest.mark.timeout(120)
def test_the_url_a_coordinator_advertises_reaches_git_shell(tmp_path, over_ssh):
    """``[hosts] git_url = "ssh://user@host:port/"``: the registered URL plus ``/<id>.git``."""
    from roles.supervisor.hosts import git_url
    from state_db.kernel import config
    sshd = over_ssh[2]
    (tmp_path / "org.toml").write_text(f'[hosts]\ngit_url = "{sshd.url("/")}"\ngit_listen = "127.0.0.1:9418"\n')
    advertised = git_url(config.load(tmp_path / "org.toml", env={}))
    assert advertised == sshd.url("")
    rh = worker(tmp_path, f"{advertised}/w1.git")
    assert rh.baseline() is None                         # no repository yet: "no such repository"
    base = coordinator_history(over_ssh).baseline()
    assert rh.baseline() == base
    (rh.workspace / "a.txt").write_text("1\n")
    c1 = rh.checkpoint(1)
    assert remote_ref(over_ssh[0] / "history" / "w1.git", "refs/iterations/1") == c1


@pytest.mark.timeout(120)
def test_hostile_pushes_over_ssh_are_refused(tmp_path, over_ssh):
    ch = coordinator_history(over_ssh)
    base = ch.baseline()
    url = over_ssh[2].url("/w1.git")
    rh = worker(tmp_path, url)
    rh.baseline()
    (rh.workspace / "a.txt").write_text("1\n")
    c1 = rh.checkpoint(1)
    marker = tmp_path / "repository-hook-ran"
    # a repository's own hooks are never run
    plant_own_hooks(ch.git_dir, marker, ("pre-receive", "update", "post-receive", "post-update", "pre-upload-pack"))
    evil = weakened_repository(tmp_path / "evil")
    for spec in ("+HEAD:refs/loop-org/baseline", "HEAD:refs/loop-org/other", "HEAD:refs/heads/evil",
                 "HEAD:refs/tags/evil", ":refs/iterations/1", "+HEAD:refs/heads/main"):
        out = git("push", "--force", url, spec, cwd=evil, check=False)
        assert out.returncode != 0, spec
        assert "loop-org: refusing" in out.stderr, out.stderr
    out = git(f"--git-dir={rh.git_dir}", "push", "--force", url, f"{c1}:{BASELINE_REF}", check=False)
    assert out.returncode != 0 and "the baseline belongs to the coordinator host" in out.stderr
    out = git(f"--git-dir={rh.git_dir}", "push", url, ":refs/iterations/1", check=False)
    assert out.returncode != 0 and "histories only grow" in out.stderr
    assert remote_ref(ch.git_dir, BASELINE_REF) == base
    assert remote_ref(ch.git_dir, "refs/heads/evil") is None
    assert remote_ref(ch.git_dir, "refs/loop-org/other") is None
    assert remote_ref(ch.git_dir, "refs/iterations/1") == c1
    # an allowed ref is taken, and fetching works, with the repository's hooks still in place
    (rh.workspace / "a.txt").write_text("2\n")
    c2 = rh.checkpoint(2)
    assert remote_ref(ch.git_dir, "refs/iterations/2") == c2
    out = git("ls-remote", url, check=False)
    assert out.returncode == 0 and f"{base}\t{BASELINE_REF}" in out.stdout and c2 in out.stdout
    fetched = tmp_path / "fetched.git"
    git("init", "-q", "--bare", str(fetched))
    git(f"--git-dir={fetched}", "fetch", "-q", url, "+refs/iterations/*:refs/iterations/*")
    assert remote_ref(fetched, "refs/iterations/2") == c2
    assert not marker.exists()
    fsck(ch.git_dir)


@pytest.mark.timeout(120)
def test_no_path_outside_the_history_folder_is_reached(tmp_path, over_ssh):
    home, _, sshd = over_ssh
    coordinator_history(over_ssh).baseline()
    outside = tmp_path / "outside"
    git("init", "-q", "--bare", str(outside / "evil.git"))
    (home / "history" / "link.git").symlink_to(outside / "evil.git")
    (home / "history" / "w2.git").mkdir()                    # a folder, not a repository
    evil = tmp_path / "evil"
    git("init", "-q", str(evil))
    (evil / "x").write_text("x\n")
    git("add", "-A", cwd=evil)
    git("commit", "-qm", "x", cwd=evil)
    refused = {
        "/../outside/evil.git": "git_shell_path",
        "/history/../w1.git": "git_shell_path",
        f"{outside}/evil.git": "git_shell_path",
        f"{home}/run/../history/w1.git": "git_shell_path",
        "/link.git": "git_shell_path",
        "/w9.git": "git_no_such_repository",
        "/w2.git": "git_no_such_repository",
        "/w1.git/objects": "git_shell_path",
        "/": "git_shell_path",
    }
    for path, code in refused.items():
        for args in (["ls-remote", sshd.url(path)], ["push", sshd.url(path), "HEAD:refs/iterations/1"]):
            out = git(*args, cwd=evil, check=False)
            assert out.returncode != 0, (path, args)
            one_error_line(out.stderr, code)
    assert not (home / "history" / "w9.git").exists()
    assert git(f"--git-dir={outside / 'evil.git'}", "for-each-ref", check=False).stdout == ""
    # the worker's way of saying "no repository yet" is understood: a baseline that is not there
    assert worker(tmp_path, sshd.url("/w9.git")).baseline() is None


@pytest.mark.timeout(120)
def test_a_login_or_another_command_is_refused(tmp_path, coord):
    home, _, sshd = coord
    coordinator_history(coord).baseline()
    marker = tmp_path / "ran"
    for remote, code in (((), "git_shell_interactive"), (("id",), "git_shell_command"),
                         ((f"touch {marker}",), "git_shell_command"),
                         (("git-upload-archive '/w1.git'",), "git_shell_command"),
                         (("git upload-archive '/w1.git'",), "git_shell_command"),
                         (("git-receive-pack '/w1.git'; id",), "git_shell_command"),
                         (("sh", "-c", "id"), "git_shell_command"),
                         (("git-upload-pack", "'../coord_ws/.git'"), "git_shell_path")):
        out = sshd.ssh(*remote)
        assert out.returncode != 0, remote
        one_error_line(out.stderr, code)
        assert "uid=" not in out.stdout
    assert not marker.exists()
    # the key cannot forward connections either (restrict)
    out = subprocess.run([*sshd.ssh_command.split(), "-W", f"127.0.0.1:{sshd.port}", f"{USER}@127.0.0.1"],
                         capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert out.returncode != 0 and "SSH-2.0" not in out.stdout and "forwarding failed" in out.stderr
    assert "restrict" in sshd.line and sshd.line.startswith('command="')


@pytest.mark.timeout(120)
def test_the_line_org_hosts_prints_serves_through_scripts_org(tmp_path, monkeypatch):
    """The forced command as ``org hosts ssh-line`` writes it: ``<checkout>/scripts/org git-shell``."""
    if not install_current(ROOT):
        pytest.skip("scripts/org would install the project into .venv first (run scripts/org once)")
    if cannot_serve():
        pytest.skip(cannot_serve())
    home = tmp_path / "coord"
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("0\n")
    base = WorkspaceHistory(home / "history" / "w1.git", ws).baseline()
    server = Sshd(tmp_path, home, [ROOT / "scripts" / "org"])
    assert server.line.startswith(f'command="{ROOT}/scripts/org git-shell --home {home}",restrict ssh-ed25519 ')
    server.start()
    try:
        monkeypatch.setenv("GIT_SSH_COMMAND", server.ssh_command)
        rh = worker(tmp_path, server.url("/w1.git"))
        assert rh.baseline() == base
        (rh.workspace / "a.txt").write_text("1\n")
        c1 = rh.checkpoint(1)
        assert remote_ref(home / "history" / "w1.git", "refs/iterations/1") == c1
        one_error_line(server.ssh("id").stderr, "git_shell_command")
    finally:
        server.stop()


# -- the forced command on its own --------------------------------------------------------------

def run_git_shell(home: Path, original: str | None, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SSH_ORIGINAL_COMMAND"}
    if original is not None:
        env["SSH_ORIGINAL_COMMAND"] = original
    return subprocess.run([*ORG, "git-shell", "--home", str(home), *args], capture_output=True, text=True,
                          timeout=30, env=env, stdin=subprocess.DEVNULL, cwd="/")


@pytest.mark.parametrize("original, service, path", [
    ("git-upload-pack '/w1.git'", "upload-pack", "/w1.git"),
    ("git-receive-pack '/w1.git'", "receive-pack", "/w1.git"),
    ("git upload-pack '/w1.git'", "upload-pack", "/w1.git"),
    ("git receive-pack 'w1.git'", "receive-pack", "w1.git"),
    ("git-upload-pack '/w'\\''1.git'", "upload-pack", "/w'1.git"),
    ('git-receive-pack "/w1.git"', "receive-pack", "/w1.git"),
])
def test_parse_takes_the_two_git_services(original, service, path):
    assert parse(original) == (service, path)


@pytest.mark.parametrize("original, code", [
    (None, "git_shell_interactive"),
    ("", "git_shell_interactive"),
    ("   ", "git_shell_interactive"),
    ("git-upload-pack '/w1.git", "git_shell_command"),          # an unclosed quote
    ('git-upload-pack "/w1.git', "git_shell_command"),
    ("git-upload-pack", "git_shell_command"),                    # no path
    ("git upload-pack", "git_shell_command"),
    ("git-upload-pack '/w1.git' '/w2.git'", "git_shell_command"),  # extra arguments
    ("git-receive-pack --stateless-rpc '/w1.git'", "git_shell_command"),
    ("git-upload-pack '/w1.git'\nid", "git_shell_command"),
    ("git-upload-archive '/w1.git'", "git_shell_command"),       # another git command
    ("git upload-archive '/w1.git'", "git_shell_command"),
    ("git-shell -c \"git-upload-pack '/w1.git'\"", "git_shell_command"),
    ("git", "git_shell_command"),
    ("git -c core.hooksPath=/tmp receive-pack '/w1.git'", "git_shell_command"),
    ("/usr/bin/git-receive-pack '/w1.git'", "git_shell_command"),
    ("scp -t /tmp", "git_shell_command"),
    ("internal-sftp", "git_shell_command"),
    ("bash", "git_shell_command"),
])
def test_malformed_requests_are_one_coded_line(tmp_path, original, code):
    with pytest.raises(GitShellError) as err:
        parse(original)
    assert err.value.code == code and "\n" not in err.value.line()
    out = run_git_shell(tmp_path, original)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.count("\n") == 1, out.stderr
    one_error_line(out.stderr, code)


@pytest.mark.timeout(60)
def test_paths_map_to_repositories_directly_below_history_only(tmp_path):
    home = tmp_path / "home"
    history = home / "history"
    git("init", "-q", "--bare", str(history / "w1.git"))
    git("init", "-q", "--bare", str(tmp_path / "outside" / "evil.git"))
    (history / "link.git").symlink_to(tmp_path / "outside" / "evil.git")
    (history / "alias.git").symlink_to(history / "w1.git")     # a link to a history is that history
    (history / "empty.git").mkdir()
    real = history.resolve() / "w1.git"
    for path in ("/w1.git", "w1.git", f"{history}/w1.git", f"{history.resolve()}/w1.git", "/alias.git"):
        assert resolve(path, history) == real, path
    for path in ("../x.git", "/../x.git", "/../outside/evil.git", f"{tmp_path}/outside/evil.git", "/link.git",
                 f"{history}/../history/w1.git", "//w1.git", "/w1.git/", "w1.git/.", "/./w1.git", "/.git",
                 "/..git", "/-u.git", "/w1", "/w1.git/objects", "", "/", "~/w1.git", "/w 1.git", "/w1.git\0"):
        with pytest.raises(GitShellError) as err:
            resolve(path, history)
        assert err.value.code == "git_shell_path", path
    for path in ("/w9.git", "/empty.git"):
        with pytest.raises(GitShellError) as err:
            resolve(path, history)
        assert err.value.code == "git_no_such_repository" and "no such repository" in str(err.value)
    out = run_git_shell(home, "git-upload-pack '/link.git'")
    assert out.returncode == 1 and one_error_line(out.stderr, "git_shell_path")
    out = run_git_shell(tmp_path / "nowhere", "git-upload-pack '/w1.git'")
    assert out.returncode == 1 and one_error_line(out.stderr, "git_no_such_repository")


def test_the_served_command_has_the_daemons_settings_and_the_hook_is_written_when_missing_or_stale(tmp_path):
    home = tmp_path / "home"
    history = home / "history"
    git("init", "-q", "--bare", str(history / "w1.git"))
    hooks = hooks_dir_for(history)
    argv = prepare(home, "git-receive-pack '/w1.git'")
    assert argv == ["git", *receive_config(hooks), "receive-pack", str(history.resolve() / "w1.git")]
    assert argv == command("receive-pack", history.resolve() / "w1.git", hooks)
    for setting in ("receive.fsckObjects=true", "receive.denyDeletes=true", f"core.hooksPath={hooks}"):
        assert setting in argv
    daemon = GitServer(history, "127.0.0.1", 9418).command()
    assert daemon[:len(receive_config(hooks)) + 1] == ["git", *receive_config(hooks)]
    assert (hooks / "pre-receive").read_text() == hook_text() and os.access(hooks / "pre-receive", os.X_OK)
    (hooks / "pre-receive").write_text("#!/bin/sh\nexit 0\n")     # stale (or tampered with): written again
    assert prepare(home, "git upload-pack '/w1.git'")[-2:] == ["upload-pack", str(history.resolve() / "w1.git")]
    assert (hooks / "pre-receive").read_text() == hook_text()


def test_a_refused_request_writes_nothing(tmp_path):
    home = tmp_path / "home"
    (home / "history").mkdir(parents=True)
    out = run_git_shell(home, "git-receive-pack '/w1.git'")
    assert out.returncode == 1 and one_error_line(out.stderr, "git_no_such_repository")
    assert not (home / "run").exists() and os.listdir(home / "history") == []


def test_the_authorized_keys_line(tmp_path, capsys):
    pub = keygen(tmp_path / "k", "worker 1")
    line = authorized_keys_line([ROOT / "scripts" / "org"], tmp_path / "my home", pub)
    assert line == (f'command="{ROOT}/scripts/org git-shell --home \'{tmp_path}/my home\'",restrict '
                    f"{pub.strip()}")
    for bad in ("", "not a key", pub + pub, (tmp_path / "k").read_text()):
        with pytest.raises(GitShellError) as err:
            authorized_keys_line([ROOT / "scripts" / "org"], tmp_path, bad)
        assert err.value.code == "git_shell_key"
    with pytest.raises(GitShellError):
        authorized_keys_line([ROOT / "scripts" / "org"], tmp_path / 'a"b', pub)
    # org hosts ssh-line KEYFILE prints it for this home
    from scripts.cli import main as cli
    home = tmp_path / "home"
    home.mkdir()
    (home / "state.db").touch()
    assert cli.main(["--home", str(home), "hosts", "ssh-line", str(tmp_path / "k.pub"), "--host", "worker-1"]) == 0
    out = capsys.readouterr()
    assert out.out == authorized_keys_line([ROOT / "scripts" / "org"], home.resolve(), pub, "worker-1") + "\n"
    assert out.out.startswith(f'command="{ROOT}/scripts/org git-shell --home {home.resolve()} --host worker-1",')
    assert cli.main(["--home", str(home), "hosts", "ssh-line", str(tmp_path / "k.pub")]) == 2     # whose key?
    assert "error[bad_arguments]" in capsys.readouterr().err
    assert cli.main(["--home", str(home), "hosts", "ssh-line", str(tmp_path / "k.pub"), "--all-histories"]) == 0
    assert capsys.readouterr().out == authorized_keys_line([ROOT / "scripts" / "org"], home.resolve(), pub) + "\n"
    assert cli.main(["--home", str(home), "hosts", "ssh-line", str(tmp_path / "k"), "--host", "w"]) == 1
    assert capsys.readouterr().err.startswith("error[git_shell_key]: ")


def test_git_url_prefers_the_advertised_url_and_checks_its_scheme(tmp_path):
    from roles.supervisor.hosts import git_url
    from state_db.kernel import config
    from state_db.kernel.errors import ConfigError
    path = tmp_path / "org.toml"
    for text, want in (("", ""), ('git_listen = "10.0.0.5:9418"', "git://10.0.0.5:9418"),
                       ('git_listen = "10.0.0.5:9418"\ngit_url = "ssh://org@10.0.0.5:2222/"', "ssh://org@10.0.0.5:2222"),
                       ('git_url = "ssh://org@coord/srv/org/.org/history"', "ssh://org@coord/srv/org/.org/history"),
                       ('git_url = "git://10.0.0.5:9418/"', "git://10.0.0.5:9418")):
        path.write_text(f"[hosts]\n{text}\n")
        assert git_url(config.load(path, env={})) == want, text
    for bad in ("http://coord/", "org@coord:history", "ssh://", "ssh:///x", "ssh://a b/", "file:///srv"):
        path.write_text(f'[hosts]\ngit_url = "{bad}"\n')
        with pytest.raises(ConfigError) as err:
            config.load(path, env={})
        assert "hosts.git_url" in err.value.line() and "ssh://" in err.value.line()
        assert "\n" not in err.value.line()


def test_git_shell_starts_without_the_heavy_imports(tmp_path):
    code = ("import sys; from scripts.cli import main; rc = main.main(['git-shell', '--home', sys.argv[1]]); "
            "print(sorted(m for m in ('anthropic', 'zmq', 'pydantic', 'pygit2', 'orjson') if m in sys.modules))")
    env = {**os.environ, "SSH_ORIGINAL_COMMAND": "id"}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=30,
                         env=env, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    one_error_line(out.stderr, "git_shell_command")


def test_the_env_of_the_served_git(monkeypatch):
    from roles.workbench.serve.githooks import serve_env
    env = serve_env({"PATH": "/usr/bin", "GIT_DIR": "/x", "GIT_CONFIG_PARAMETERS": "'core.hooksPath'='/tmp'",
                     "GIT_PROTOCOL": "version=2"}, keep_protocol=True)
    assert env["GIT_PROTOCOL"] == "version=2" and "GIT_DIR" not in env and "GIT_CONFIG_PARAMETERS" not in env
    assert env["GIT_CONFIG_NOSYSTEM"] == "1" and env["GIT_CONFIG_GLOBAL"] == os.devnull
    assert "GIT_PROTOCOL" not in serve_env({"GIT_PROTOCOL": "version=2"})
    assert "GIT_PROTOCOL" not in serve_env({"GIT_PROTOCOL": "version=2 $(id)"}, keep_protocol=True)
    assert git_env(5)["GIT_TERMINAL_PROMPT"] == "0"
