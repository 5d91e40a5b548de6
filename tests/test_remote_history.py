"""Workspace histories across hosts: a worker's RemoteHistory against the coordinator's history
served by a real ``git daemon`` on 127.0.0.1 (``roles.workbench.serve.gitserve``). The coordinator
and the worker share no path: everything goes through git's protocol."""
from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from roles.workbench.serve.gitserve import GitServeError, GitServer
from roles.workbench.workspace import shadow
from roles.workbench.workspace.errors import HistoryError
from roles.workbench.workspace.history import WorkspaceHistory
from roles.workbench.workspace.remote import RemoteHistory, git_env
from roles.workbench.workspace.views import BASELINE_REF, HEAD_REF


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def git(*args: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
    env = git_env(10)
    env.update(GIT_AUTHOR_NAME="x", GIT_AUTHOR_EMAIL="x@x", GIT_COMMITTER_NAME="x",
               GIT_COMMITTER_EMAIL="x@x")
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=30, check=check)


def plant_own_hooks(git_dir: Path, marker: Path, names) -> None:
    """Hooks in a served repository's own ``hooks/`` that leave ``marker`` if they ever run."""
    for name in names:
        hook = git_dir / "hooks" / name
        hook.parent.mkdir(exist_ok=True)
        hook.write_text(f"#!/bin/sh\ntouch {marker}\nexit 0\n")
        hook.chmod(0o755)


def weakened_repository(path: Path) -> Path:
    """A hostile worker's repository: one commit whose test asserts nothing."""
    git("init", "-q", str(path))
    (path / "tests").mkdir()
    (path / "tests" / "test_app.py").write_text("def test(): assert True  # weakened\n")
    git("add", "-A", cwd=path)
    git("commit", "-qm", "evil", cwd=path)
    return path


def remote_ref(git_dir: Path, ref: str) -> str | None:
    out = git(f"--git-dir={git_dir}", "rev-parse", "--verify", "--quiet", ref, check=False)
    return out.stdout.strip() or None


def fsck(git_dir: Path) -> None:
    out = git(f"--git-dir={git_dir}", "fsck", "--full", "--strict", "--no-dangling", check=False)
    assert out.returncode == 0, out.stderr + out.stdout


@pytest.fixture
def coord(tmp_path):
    """The coordinator host: its home, a served history folder, its workspace with files."""
    home = tmp_path / "coord"
    ws = tmp_path / "coord_ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "app.py").write_text("print('v0')\n")
    (ws / "tests").mkdir()
    (ws / "tests" / "test_app.py").write_text("def test(): pass\n")
    server = GitServer(home / "history", "127.0.0.1", free_port())
    try:
        server.start()
        yield home, ws, server
    finally:
        server.stop()
    assert not server.alive()


def coordinator_history(coord) -> WorkspaceHistory:
    home, ws, _ = coord
    return WorkspaceHistory(home / "history" / "w1.git", ws)


def worker(tmp_path: Path, server: GitServer, name: str = "worker", **kw) -> RemoteHistory:
    root = tmp_path / name
    return RemoteHistory(root / "history" / "w1.git", root / "ws", remote=server.url("w1"), **kw)


@pytest.mark.timeout(60)
def test_worker_fetches_the_coordinators_baseline(tmp_path, coord):
    base = coordinator_history(coord).baseline()
    steps: list[str] = []
    rh = worker(tmp_path, coord[2], on_step=steps.append)
    assert not rh.workspace.exists()
    assert rh.baseline() == base
    assert "fetched" in steps
    assert files_of(rh.workspace) == files_of(coord[1])
    assert rh.baseline_commit() == base and rh._ref(HEAD_REF) == base
    steps.clear()
    assert rh.baseline() == base and "fetched" not in steps   # recorded: no exchange
    fsck(rh.git_dir)


@pytest.mark.timeout(60)
def test_leftovers_in_the_worker_workspace_are_never_the_baseline(tmp_path, coord):
    base = coordinator_history(coord).baseline()
    rh = worker(tmp_path, coord[2])
    rh.workspace.mkdir(parents=True)
    (rh.workspace / "stale.txt").write_text("from an earlier run\n")
    assert rh.baseline() == base
    assert files_of(rh.workspace) == files_of(coord[1])


@pytest.mark.timeout(60)
def test_no_baseline_before_the_coordinator_records_it(tmp_path, coord):
    rh = worker(tmp_path, coord[2])
    assert rh.baseline() is None                                  # no repository yet
    shadow.create(coord[0] / "history" / "w1.git", HEAD_REF)      # a repository, no baseline
    assert rh.baseline() is None
    assert rh.baseline_commit() is None
    base = coordinator_history(coord).baseline()
    assert rh.baseline() == base                                  # called again later
    assert files_of(rh.workspace) == files_of(coord[1])


@pytest.mark.timeout(60)
def test_checkpoint_is_on_the_coordinator_when_it_returns(tmp_path, coord):
    ch = coordinator_history(coord)
    base = ch.baseline()
    ch.materialize(base, tmp_path / "snap")   # the coordinator's repository is open and read
    rh = worker(tmp_path, coord[2])
    rh.baseline()
    (rh.workspace / "src" / "app.py").write_text("print('v1')\n")
    for i in range(150):   # enough objects that the coordinator keeps a pack, not loose objects
        (rh.workspace / "data" / f"{i:03}.txt").parent.mkdir(exist_ok=True)
        (rh.workspace / "data" / f"{i:03}.txt").write_text(f"row {i}\n")
    c1 = rh.checkpoint(1)
    assert remote_ref(ch.git_dir, "refs/iterations/1") == c1
    assert list((ch.git_dir / "objects" / "pack").glob("*.pack"))
    ch.materialize(c1, tmp_path / "snap")      # same process, same open repository
    assert (tmp_path / "snap" / "src" / "app.py").read_text() == "print('v1')\n"
    assert files_of(tmp_path / "snap") == files_of(rh.workspace)
    assert remote_ref(ch.git_dir, BASELINE_REF) == base
    fsck(ch.git_dir)
    fsck(rh.git_dir)


@pytest.mark.timeout(60)
def test_a_second_attempt_replaces_the_remote_ref_and_keeps_the_old_one(tmp_path, coord):
    ch = coordinator_history(coord)
    ch.baseline()
    rh = worker(tmp_path, coord[2])
    rh.baseline()
    (rh.workspace / "a.txt").write_text("first attempt\n")
    first = rh.checkpoint(1)
    assert rh.checkpoint(1) == first           # the same step again: unchanged, pushed again
    rh.reset_to(rh.baseline_commit())
    (rh.workspace / "a.txt").write_text("second attempt\n")
    second = rh.checkpoint(1)
    assert second != first
    assert remote_ref(ch.git_dir, "refs/iterations/1") == second
    assert remote_ref(ch.git_dir, f"refs/discarded/1/{first}") == first
    assert ch.read_path(second, "a.txt") == b"second attempt\n"
    fsck(ch.git_dir)


@pytest.mark.timeout(60)
def test_action_and_checkpoints_branch_are_pushed(tmp_path, coord):
    ch = coordinator_history(coord)
    ch.baseline()
    rh = worker(tmp_path, coord[2], defer=True)
    rh.baseline()
    (rh.workspace / "a.txt").write_text("1\n")
    c1 = rh.checkpoint(1)
    (rh.workspace / "deploy.txt").write_text("approved\n")
    act = rh.checkpoint_action("d-1")
    assert remote_ref(ch.git_dir, "refs/actions/d-1") == act
    (rh.workspace / "a.txt").write_text("2\n")
    c2 = rh.checkpoint(2)
    rh.flush_pending()
    assert remote_ref(ch.git_dir, HEAD_REF) == c2
    assert ch.iteration_commit(1) == c1


@pytest.mark.timeout(60)
def test_a_fresh_worker_resumes_from_a_checkpoint(tmp_path, coord):
    ch = coordinator_history(coord)
    base = ch.baseline()
    first = worker(tmp_path, coord[2], "worker1")
    first.baseline()
    (first.workspace / "src" / "app.py").write_text("print('v1')\n")
    (first.workspace / "notes.md").write_text("step 1\n")
    c1 = first.checkpoint(1)
    c1_files = files_of(first.workspace)
    (first.workspace / "notes.md").write_text("step 2\n")
    first.checkpoint(2)

    second = worker(tmp_path, coord[2], "worker2")   # an empty folder: no history, no workspace
    second.reset_to(c1)
    assert files_of(second.workspace) == c1_files
    assert second.baseline() == base                # the resumed state stays
    assert files_of(second.workspace) == c1_files
    (second.workspace / "notes.md").write_text("step 2 again\n")
    c2 = second.checkpoint(2)
    assert remote_ref(ch.git_dir, "refs/iterations/2") == c2
    with pytest.raises(HistoryError) as err:
        second.reset_to("0" * 40)                   # nowhere: fetched for once, then unknown
    assert err.value.code == "unknown_commit"


@pytest.mark.timeout(60)
def test_an_open_repository_sees_objects_the_git_executable_fetched(tmp_path, coord):
    ch = coordinator_history(coord)
    ch.baseline()
    a = worker(tmp_path, coord[2], "a")
    a.baseline()
    a.file_ids(a.baseline_commit())               # libgit2 has the repository open and read
    b = worker(tmp_path, coord[2], "b")
    b.baseline()
    for i in range(150):
        (b.workspace / f"f{i:03}.txt").write_text(f"{i}\n")
    c1 = b.checkpoint(1)
    a.reset_to(c1)                                # a miss: one fetch, a kept pack, then found
    assert len(list((a.git_dir / "objects" / "pack").glob("*.pack"))) >= 1
    assert files_of(a.workspace) == files_of(b.workspace)
    assert a.iteration_commit(1) == c1


@pytest.mark.timeout(60)
def test_hostile_pushes_are_refused(tmp_path, coord):
    ch = coordinator_history(coord)
    base = ch.baseline()
    rh = worker(tmp_path, coord[2])
    rh.baseline()
    (rh.workspace / "a.txt").write_text("1\n")
    c1 = rh.checkpoint(1)
    url = coord[2].url("w1")
    marker = tmp_path / "repository-hook-ran"
    plant_own_hooks(ch.git_dir, marker, ("pre-receive",))     # a repository's own hook is never run
    evil = weakened_repository(tmp_path / "evil")
    for spec in ("+HEAD:refs/loop-org/baseline", "HEAD:refs/loop-org/other", "HEAD:refs/heads/evil",
                 "HEAD:refs/tags/evil", ":refs/iterations/1"):
        out = git("push", "--force", url, spec, cwd=evil, check=False)
        assert out.returncode != 0, spec
        assert "loop-org: refusing" in out.stderr, out.stderr
    # a worker's own shadow, pushing the baseline ref itself
    out = git(f"--git-dir={rh.git_dir}", "push", "--force", url, f"{c1}:{BASELINE_REF}", check=False)
    assert out.returncode != 0 and "the baseline belongs to the coordinator host" in out.stderr
    assert remote_ref(ch.git_dir, BASELINE_REF) == base
    assert remote_ref(ch.git_dir, "refs/heads/evil") is None
    assert remote_ref(ch.git_dir, "refs/loop-org/other") is None
    assert remote_ref(ch.git_dir, "refs/iterations/1") == c1
    assert not marker.exists()
    # no repository is made by a push, and nothing outside the history folder is served
    out = git("push", url.replace("w1.git", "w2.git"), "HEAD:refs/iterations/1", cwd=evil, check=False)
    assert out.returncode != 0 and "no such repository" in out.stderr
    assert not (coord[0] / "history" / "w2.git").exists()
    out = git("ls-remote", url.replace("/w1.git", "/../evil/.git"), check=False)
    assert out.returncode != 0


@pytest.mark.timeout(30)
def test_unreachable_remote_fails_in_one_line_within_the_timeout(tmp_path):
    port = free_port()                                  # nothing listens there
    rh = RemoteHistory(tmp_path / "w" / "history" / "w1.git", tmp_path / "w" / "ws",
                       remote=f"git://127.0.0.1:{port}/w1.git", timeout_s=5)
    started = time.monotonic()
    with pytest.raises(HistoryError) as err:
        rh.baseline()
    assert time.monotonic() - started < 5
    assert err.value.code == "git_remote_failed"
    assert "\n" not in str(err.value) and f"127.0.0.1:{port}" in str(err.value)
    assert "reachable" in str(err.value)


@pytest.mark.timeout(30)
def test_a_silent_remote_is_cut_at_the_timeout(tmp_path):
    """Something accepts the connection and never answers: the git process is killed."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        held: list[socket.socket] = []
        stop = threading.Event()

        def accept() -> None:
            silent.settimeout(0.2)
            while not stop.is_set():
                try:
                    held.append(silent.accept()[0])
                except OSError:
                    pass

        t = threading.Thread(target=accept, daemon=True)
        t.start()
        try:
            rh = RemoteHistory(tmp_path / "h.git", tmp_path / "ws",
                               remote=f"git://127.0.0.1:{silent.getsockname()[1]}/w1.git", timeout_s=1.5)
            started = time.monotonic()
            with pytest.raises(HistoryError) as err:
                rh.baseline()
            took = time.monotonic() - started
        finally:
            stop.set()
            t.join(5)
            for conn in held:
                conn.close()
    assert 1.4 < took < 5
    assert err.value.code == "git_remote_failed" and "no answer within 1.5s" in str(err.value)


@pytest.mark.timeout(60)
def test_push_to_a_stopped_server_raises_and_the_retry_pushes(tmp_path, coord):
    ch = coordinator_history(coord)
    ch.baseline()
    rh = worker(tmp_path, coord[2], timeout_s=5)
    rh.baseline()
    (rh.workspace / "a.txt").write_text("1\n")
    coord[2].stop()
    with pytest.raises(HistoryError) as err:
        rh.checkpoint(1)
    assert err.value.code == "git_remote_failed" and "push to" in str(err.value)
    rh.flush_pending()                                  # best effort: logs, never raises
    coord[2].start()
    c1 = rh.checkpoint(1)                               # the same step again
    assert remote_ref(ch.git_dir, "refs/iterations/1") == c1


@pytest.mark.timeout(30)
def test_git_server_on_a_taken_port_says_so(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        server = GitServer(tmp_path / "home" / "history", "127.0.0.1", taken.getsockname()[1])
        try:
            with pytest.raises(GitServeError) as err:
                server.start()
        finally:
            server.stop()
    assert err.value.code == "git_port_taken"
    assert "taken" in str(err.value) and "\n" not in str(err.value)
    assert not server.alive()


@pytest.mark.timeout(60)
def test_a_refused_push_and_a_vanished_repository_fail_in_one_line(tmp_path, coord):
    ch = coordinator_history(coord)
    ch.baseline()
    a = worker(tmp_path, coord[2], "a")
    b = worker(tmp_path, coord[2], "b")
    a.baseline()
    b.baseline()
    (a.workspace / "x.txt").write_text("a\n")
    approved = a.checkpoint_action("d-1")
    (b.workspace / "x.txt").write_text("b\n")
    with pytest.raises(HistoryError) as err:      # an approved action's checkpoint is never replaced
        b.checkpoint_action("d-1")
    assert err.value.code == "git_remote_failed"
    assert "rejected" in str(err.value) and "\n" not in str(err.value)
    assert remote_ref(ch.git_dir, "refs/actions/d-1") == approved
    shutil.rmtree(ch.git_dir)
    with pytest.raises(HistoryError) as err:
        a.checkpoint(1)
    assert err.value.code == "git_remote_failed" and "no such repository" in str(err.value)


class Killed(Exception):
    """Stands for a kill at a write step."""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("step", ["fetched", f"ref_updated:{HEAD_REF}"])
def test_a_worker_killed_while_taking_the_baseline_takes_it_again(tmp_path, coord, step):
    base = coordinator_history(coord).baseline()

    def kill_at(name: str) -> None:
        if name == step:
            raise Killed(name)

    with pytest.raises(Killed):
        worker(tmp_path, coord[2], on_step=kill_at).baseline()
    restarted = worker(tmp_path, coord[2])
    assert restarted.baseline_commit() is None        # never recorded before its checkout
    assert restarted.baseline() == base
    assert files_of(restarted.workspace) == files_of(coord[1])


@pytest.mark.timeout(60)
def test_an_eval_agents_copy_fetches_the_checkpoint_and_the_baseline_and_verifies_from_them(tmp_path, coord):
    """A joined eval-agent's history (``ensure_held``): the checkpoint a worker pushed and the
    coordinator's baseline are fetched into a copy of its own, with no workspace; the snapshot
    it writes restores protected files from that baseline; a commit the coordinator does not
    hold, and a coordinator that cannot be reached, are one coded line."""
    ch = coordinator_history(coord)
    base = ch.baseline()
    rh = worker(tmp_path, coord[2])
    rh.baseline()
    (rh.workspace / "src" / "app.py").write_text("print('v1')\n")
    (rh.workspace / "tests" / "test_app.py").write_text("def test(): assert True  # edited\n")
    c1 = rh.checkpoint(1)

    ev = RemoteHistory(tmp_path / "eval-host" / "eval-history" / "w1.git", tmp_path / "eval-host" / "workspaces" / "w1",
                       remote=coord[2].url("w1"), timeout_s=10)
    assert ev.baseline_commit() is None
    ev.ensure_held(c1)
    assert ev.baseline_commit() == base and not ev.workspace.exists()
    protected = ev.protected_paths(patterns=("tests/**",))
    changed = ev.materialize(c1, tmp_path / "eval-host" / "eval" / "w1", paths=protected)
    assert changed == ["tests/test_app.py"]
    snap = tmp_path / "eval-host" / "eval" / "w1"
    assert (snap / "src" / "app.py").read_text() == "print('v1')\n"
    assert (snap / "tests" / "test_app.py").read_text() == "def test(): pass\n"      # the baseline's
    ev.ensure_held(c1)                                    # held: nothing fetched again
    with pytest.raises(HistoryError) as err:
        ev.ensure_held("1" * 40)
    assert err.value.code == "git_remote_failed" and "not in the coordinator's history" in str(err.value)
    fsck(ev.git_dir)

    coord[2].stop()
    gone = RemoteHistory(tmp_path / "other" / "w1.git", tmp_path / "other" / "ws", remote=coord[2].url("w1"),
                         timeout_s=5)
    started = time.monotonic()
    with pytest.raises(HistoryError) as err:
        gone.ensure_held(c1)
    assert time.monotonic() - started < 6
    assert err.value.code == "git_remote_failed" and "\n" not in str(err.value)
