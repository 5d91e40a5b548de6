"""Each joined host reaches only its own work: two hosts in network namespaces of their own reach
the coordinator host's real OpenSSH server over veth links, each with its own key whose forced
command names it (``org hosts ssh-line KEYFILE --host NAME``). The store says host-a holds w1 and
host-b holds w2.

- host-a fetches w1, pushes the iteration it is about to commit, and nothing else: not w2's
  history, not ``refs/iterations/99``, not a rewrite of a committed iteration, not a push larger
  than ``[hosts] git_max_push_mb``;
- host-b cannot push into w1;
- the control: an unscoped key (what every host had before) from host-a's namespace does clone
  w2, the history it never worked on."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from roles.workbench.serve.gitshell import authorized_keys_line
from roles.workbench.workspace.history import WorkspaceHistory
from state_db.bootstrap import init_home
from state_db.kernel.home import OrgHome
from state_db.vocab import Actor, WorkStatus
from state_db.writer import StateWriter
from tests.test_git_shell import ORG, USER, Sshd, cannot_serve, keygen

pytestmark = pytest.mark.timeout(240)
HOSTS = {"host-a": ("loop-agent-1", 1), "host-b": ("loop-agent-2", 2)}


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=check)


class Namespaces:
    """One network namespace per host, each joined to this one by a veth pair on 10.231.<k>.0/30."""

    def __init__(self, tag: str):
        self.tag = tag
        self.made: list[str] = []
        self.links: list[str] = []

    def add(self, k: int) -> tuple[str, str]:
        """Namespace k; returns (its name, the address of this side it reaches)."""
        ns, here, there = f"lo{self.tag}{k}", f"vh{self.tag}{k}", f"vn{self.tag}{k}"
        _sh("ip", "netns", "add", ns)
        self.made.append(ns)
        _sh("ip", "link", "add", here, "type", "veth", "peer", "name", there)
        self.links.append(here)
        _sh("ip", "link", "set", there, "netns", ns)
        _sh("ip", "addr", "add", f"10.231.{k}.1/30", "dev", here)
        _sh("ip", "link", "set", here, "up")
        _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"10.231.{k}.2/30", "dev", there)
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", there, "up")
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        return ns, f"10.231.{k}.1"

    def close(self) -> None:
        for link in self.links:
            _sh("ip", "link", "del", link, check=False)
        for ns in self.made:
            _sh("ip", "netns", "del", ns, check=False)


def _why_not() -> str | None:
    if cannot_serve():
        return cannot_serve()
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return "network namespaces need root and iproute2"
    return None


@pytest.fixture
def two_hosts(tmp_path):
    why = _why_not()
    if why:
        pytest.skip(why)
    home = OrgHome(tmp_path / "coord")
    init_home(home)
    home.config_path.write_text('[hosts]\ngit_max_push_mb = 1\n')
    sup = StateWriter(home.db_path, Actor.SUPERVISOR)
    human = StateWriter(home.db_path, Actor.HUMAN)
    co = StateWriter(home.db_path, Actor.COORDINATOR)
    now = time.time()
    for host, (instance, k) in HOSTS.items():
        with sup.transaction() as tx:
            tx.insert("peers", {"instance": instance, "host": host, "role": "loop-agent",
                                "endpoint": f"tcp://10.231.{k}.2:7000", "curve_public": f"{k}" * 40,
                                "hmac_key": f"{k}" * 64, "registered_at": now, "updated_at": now})
        wid = f"w{k}"
        ws = tmp_path / f"ws{k}"
        (ws / "src").mkdir(parents=True)
        (ws / "src" / "app.py").write_text(f"print('secret of {wid}')\n")
        with human.transaction() as tx:
            tx.insert("work_items", {"id": wid, "goal": "g", "workspace": str(ws), "verify": ["true"],
                                     "caps": {"max_iterations": 5}, "backend": "anthropic",
                                     "status": WorkStatus.QUEUED, "created_by": "human",
                                     "created_at": now, "updated_at": now})
        with co.transaction() as tx:
            tx.set_status("work_items", wid, WorkStatus.DISPATCHED, assigned_to=instance)
        WorkspaceHistory(home.history_dir / f"{wid}.git", ws).baseline()
    for w in (sup, human, co):
        w.close()
    nets = Namespaces(str(os.getpid() % 10000))
    server = Sshd(tmp_path, home.root)
    try:
        addresses = {host: nets.add(k) for host, (_, k) in HOSTS.items()}
        keys, lines = {}, []
        for host in [*HOSTS, "unscoped"]:
            pub = keygen(tmp_path / f"key-{host}", host)
            keys[host] = tmp_path / f"key-{host}"
            lines.append(authorized_keys_line(ORG, home.root, pub, None if host == "unscoped" else host))
        (server.dir / "authorized_keys").write_text("\n".join(lines) + "\n")
        text = server.config.read_text().replace(f"ListenAddress 127.0.0.1:{server.port}\n", "".join(
            f"ListenAddress {addr}:{server.port}\n" for _, addr in addresses.values()))
        server.config.write_text(text)
        server.start = _start_on(server, addresses["host-a"][1])
        server.start()
        yield home, server, addresses, keys
    finally:
        server.stop()
        nets.close()


def _start_on(server: Sshd, address: str):
    """``Sshd.start``, waiting for the port on ``address`` (it listens on the veth links only)."""
    import socket

    def start() -> None:
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        with open(server.log, "wb") as out:
            server.proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(server.config)],
                                           stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and server.proc.poll() is None:
            try:
                with socket.create_connection((address, server.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"sshd did not start: {server.log.read_text(errors='replace')}")
    return start


def _git(ns: str, key: Path, *argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """git run inside namespace ``ns`` with ``key`` as its ssh identity."""
    ssh = (f"ssh -i {key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes "
           f"-o LogLevel=ERROR -o IdentitiesOnly=yes")
    env = {**os.environ, "GIT_SSH_COMMAND": ssh, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
           "GIT_AUTHOR_NAME": "w", "GIT_AUTHOR_EMAIL": "w@x", "GIT_COMMITTER_NAME": "w",
           "GIT_COMMITTER_EMAIL": "w@x"}
    return subprocess.run(["ip", "netns", "exec", ns, "git", *argv], capture_output=True, text=True, timeout=60,
                          env=env, cwd=cwd)


def _commit(repo: Path, name: str, data: bytes) -> str:
    (repo / name).write_bytes(data)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True, capture_output=True)
    subprocess.run(["git", "-c", "user.name=w", "-c", "user.email=w@x", "commit", "-qm", name], cwd=repo,
                   check=True, capture_output=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def _ref(home: OrgHome, wid: str, ref: str) -> str | None:
    out = subprocess.run(["git", f"--git-dir={home.history_dir / f'{wid}.git'}", "rev-parse", "-q", "--verify", ref],
                         capture_output=True, text=True)
    return out.stdout.strip() or None


def test_each_host_reaches_only_the_histories_of_its_own_work(two_hosts, tmp_path):
    home, server, addresses, keys = two_hosts
    (ns_a, addr_a), (ns_b, addr_b) = addresses["host-a"], addresses["host-b"]
    url = lambda addr, wid: f"ssh://{USER}@{addr}:{server.port}/{wid}.git"   # noqa: E731

    # host-a fetches its own work item's history
    mine = tmp_path / "a-w1"
    got = _git(ns_a, keys["host-a"], "clone", "-q", url(addr_a, "w1"), str(mine))
    assert got.returncode == 0, got.stderr + server.log.read_text(errors="replace")[-1500:]
    subprocess.run(["git", "checkout", "-q", "-B", "work", "refs/remotes/origin/HEAD"], cwd=mine, capture_output=True)
    # ... and never another's: one coded line, nothing of it disclosed
    other = _git(ns_a, keys["host-a"], "clone", "-q", url(addr_a, "w2"), str(tmp_path / "a-w2"))
    assert other.returncode != 0 and "error[git_shell_not_yours]" in other.stderr, other.stderr
    assert not (tmp_path / "a-w2" / "src").exists()
    listed = _git(ns_a, keys["host-a"], "ls-remote", url(addr_a, "w2"))
    assert listed.returncode != 0 and listed.stdout == ""

    # host-a pushes the iteration it is about to commit (1), not one it invents
    c1 = _commit(mine, "one.txt", b"1\n")
    ok = _git(ns_a, keys["host-a"], "push", "-q", url(addr_a, "w1"), f"{c1}:refs/iterations/1", cwd=mine)
    assert ok.returncode == 0, ok.stderr
    planted = _git(ns_a, keys["host-a"], "push", "-q", url(addr_a, "w1"), f"{c1}:refs/iterations/99", cwd=mine)
    assert planted.returncode != 0 and "about to commit (1)" in planted.stderr
    assert _ref(home, "w1", "refs/iterations/99") is None

    # iteration 1 is committed: its ref never moves again, even by its own host
    with StateWriter(home.db_path, Actor.LOOP_AGENT, "loop-agent-1").transaction() as tx:
        tx.insert("iterations", {"work_id": "w1", "n": 1, "attempt": 1, "act_status": "ok",
                                 "checkpoint": c1, "committed_at": time.time()})
    subprocess.run(["git", "reset", "-q", "--hard", "HEAD~1"], cwd=mine, check=True)
    forged = _commit(mine, "forged.txt", b"x\n")
    rewrite = _git(ns_a, keys["host-a"], "push", "-q", "--force", url(addr_a, "w1"),
                   f"{forged}:refs/iterations/1", f"{c1}:refs/discarded/1/{c1}", cwd=mine)
    assert rewrite.returncode != 0 and "loop-org: refusing refs/iterations/1" in rewrite.stderr
    assert _ref(home, "w1", "refs/iterations/1") == c1

    # a push larger than [hosts] git_max_push_mb (1 MB here) is refused whole
    big = _commit(mine, "big.bin", os.urandom(3 * 1024 * 1024))
    large = _git(ns_a, keys["host-a"], "push", "-q", url(addr_a, "w1"), f"{big}:refs/iterations/2", cwd=mine)
    assert large.returncode != 0 and _ref(home, "w1", "refs/iterations/2") is None, large.stderr
    assert "maximum allowed size" in large.stderr, large.stderr

    # host-b, which holds w2, pushes nothing into w1
    theirs = _git(ns_b, keys["host-b"], "push", "-q", url(addr_b, "w1"), f"{c1}:refs/iterations/2", cwd=mine)
    assert theirs.returncode != 0 and "error[git_shell_not_yours]" in theirs.stderr, theirs.stderr

    # the control: a key without a host (every host's key before) clones w2 from host-a's namespace
    leaked = _git(ns_a, keys["unscoped"], "clone", "-q", url(addr_a, "w2"), str(tmp_path / "leaked"))
    assert leaked.returncode == 0, leaked.stderr
    assert b"secret of w2" in (tmp_path / "leaked" / "src" / "app.py").read_bytes()


def test_an_honest_worker_works_through_its_scoped_key(two_hosts, tmp_path, monkeypatch):
    """The loop-agent's own history client (``RemoteHistory``) with host-a's key: it takes the
    baseline, pushes an iteration, replaces it by a second attempt (the old one kept in the discard
    area), pushes an approved action's checkpoint and, once iteration 1 is committed, iteration 2."""
    from roles.workbench.workspace.remote import RemoteHistory
    home, server, addresses, keys = two_hosts
    monkeypatch.setenv("GIT_SSH_COMMAND", f"ssh -i {keys['host-a']} -o StrictHostKeyChecking=no "
                                          "-o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR "
                                          "-o IdentitiesOnly=yes")
    url = f"ssh://{USER}@{addresses['host-a'][1]}:{server.port}/w1.git"
    rh = RemoteHistory(tmp_path / "wa" / "history" / "w1.git", tmp_path / "wa" / "ws", remote=url, timeout_s=60)
    assert rh.baseline() == _ref(home, "w1", "refs/loop-org/baseline")
    (rh.workspace / "a.txt").write_text("first attempt\n")
    first = rh.checkpoint(1)
    rh.reset_to(rh.baseline_commit())
    (rh.workspace / "a.txt").write_text("second attempt\n")
    second = rh.checkpoint(1)
    assert _ref(home, "w1", "refs/iterations/1") == second != first
    assert _ref(home, "w1", f"refs/discarded/1/{first}") == first
    (rh.workspace / "deploy.txt").write_text("approved\n")
    act = rh.checkpoint_action("d-1")
    assert _ref(home, "w1", "refs/actions/d-1") == act
    with StateWriter(home.db_path, Actor.LOOP_AGENT, "loop-agent-1").transaction() as tx:
        tx.insert("iterations", {"work_id": "w1", "n": 1, "attempt": 2, "act_status": "ok",
                                 "checkpoint": second, "committed_at": time.time()})
    (rh.workspace / "a.txt").write_text("2\n")
    c2 = rh.checkpoint(2)
    assert _ref(home, "w1", "refs/iterations/2") == c2
