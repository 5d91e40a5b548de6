"""The history on libgit2: git's exact trees and commits, the index as stat cache, crash safety,
no processes."""
from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roles.workbench.workspace import shadow
from roles.workbench.workspace.errors import HistoryError
from roles.workbench.workspace.history import HEAD_REF, WorkspaceHistory

ROOT = Path(__file__).resolve().parents[1]
GIT_ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
           "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}


def git(*args: str, env: dict | None = None, input: bytes | None = None) -> str:
    return subprocess.run(["git", *args], env={**GIT_ENV, **(env or {})}, check=True, input=input,
                          capture_output=True).stdout.decode("utf-8", "surrogateescape")


def git_tree_of(workspace: Path, scratch: Path) -> str:
    """The tree ``git add --all --force && git write-tree`` records for ``workspace``."""
    repo = scratch / "reference.git"
    if not repo.exists():
        git("init", "-q", "--bare", str(repo))
    env = {"GIT_INDEX_FILE": str(scratch / "reference.index")}
    (scratch / "reference.index").unlink(missing_ok=True)
    base = ["--git-dir", str(repo), "--work-tree", str(workspace)]
    git(*base, "add", "--all", "--force", env=env)
    return git(*base, "write-tree", env=env).strip()


def files_of(root: Path) -> dict[bytes, tuple]:
    """path -> (kind, content or link target, executable) of everything below root but .git."""
    out = {}
    top = os.fsencode(root)
    for dirpath, dirnames, filenames in os.walk(top):
        if b".git" in dirnames and dirpath == top:
            dirnames.remove(b".git")
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, top)
            s = os.lstat(p)
            if stat.S_ISLNK(s.st_mode):
                out[rel] = ("link", os.readlink(p), False)
            elif stat.S_ISDIR(s.st_mode):
                out[rel] = ("dir", b"", False)
            else:
                with open(p, "rb") as f:
                    out[rel] = ("file", f.read(), bool(s.st_mode & stat.S_IXUSR))
    return out


@pytest.fixture
def spawned(monkeypatch):
    """Every process started in this test (``subprocess.run`` goes through ``Popen``)."""
    calls = []
    real = subprocess.Popen

    class Counting(real):
        def __init__(self, args, *a, **kw):
            calls.append(list(args))
            super().__init__(args, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", Counting)
    return calls


@pytest.fixture
def ws(tmp_path) -> Path:
    ws = tmp_path / "ws"
    (ws / "src" / "deep").mkdir(parents=True)
    (ws / "tests").mkdir()
    (ws / "src" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (ws / "src" / "deep" / "x.bin").write_bytes(bytes(range(256)))
    (ws / "tests" / "test_calc.py").write_text("def test_add():\n    assert True\n")
    (ws / "run.sh").write_text("#!/bin/sh\n")
    (ws / "run.sh").chmod(0o755)
    (ws / "link").symlink_to("src/calc.py")
    (ws / "README").write_text("r\n")
    return ws


@pytest.fixture
def hist(tmp_path, ws) -> WorkspaceHistory:
    return WorkspaceHistory(tmp_path / "org" / "history" / "w.git", ws)


# -- git's exact objects -------------------------------------------------------------------------

_NAMES = st.sampled_from([b"a", b"a.b", b"a-b", b"a b", b"b", b"B", b"\xe9t\xe9", b"\xff", b".hidden",
                          b".gitignore", b".github", b"z~", b"x\ny", b"a\\b"])
_FILE = st.tuples(st.just("file"), st.binary(max_size=40), st.booleans())
_LINK = st.tuples(st.just("link"), st.sampled_from([b"a", b"../nowhere", b"/abs"]), st.just(False))
_TREE = st.recursive(
    st.dictionaries(_NAMES, st.one_of(_FILE, _LINK), max_size=4),
    lambda sub: st.dictionaries(_NAMES, st.one_of(_FILE, _LINK, st.tuples(st.just("dir"), sub, st.just(False))),
                                max_size=4),
    max_leaves=12)


def _build(root: bytes, spec: dict) -> None:
    os.makedirs(root, exist_ok=True)
    for name, (kind, body, exe) in spec.items():
        path = os.path.join(root, name)
        if kind == "dir":
            _build(path, body)  # an empty dict stays an empty directory: git does not record it
        elif kind == "link":
            os.symlink(body, path)
        else:
            with open(path, "wb") as f:
                f.write(body)
            os.chmod(path, 0o755 if exe else 0o644)


@settings(max_examples=25)
@given(spec=_TREE)
def test_trees_recorded_in_process_are_the_trees_git_writes(tmp_path_factory, spec):
    tmp = tmp_path_factory.mktemp("tree")
    ws = tmp / "ws"
    _build(os.fsencode(ws), spec)
    hist = WorkspaceHistory(tmp / "h.git", ws)
    assert hist.fingerprint_of_workspace() == git_tree_of(ws, tmp)
    subprocess.run(["git", f"--git-dir={tmp / 'h.git'}", "fsck", "--strict", "--no-dangling"],
                   env=GIT_ENV, check=True, capture_output=True)


def test_commits_are_byte_identical_to_git_commit_tree(hist, ws, tmp_path):
    """A checkpoint is the commit ``git commit-tree`` writes for the same tree, parent, message,
    identity and time."""
    base = hist.baseline()
    (ws / "README").write_text("changed\n")
    c1 = hist.checkpoint(3)
    gd = ["--git-dir", str(hist.git_dir)]
    raw = git(*gd, "cat-file", "commit", c1)
    committer = next(line for line in raw.splitlines() if line.startswith("committer "))
    when = " ".join(committer.split()[-2:])
    env = {"GIT_AUTHOR_NAME": "loop-org", "GIT_AUTHOR_EMAIL": "loop-org@localhost",
           "GIT_COMMITTER_NAME": "loop-org", "GIT_COMMITTER_EMAIL": "loop-org@localhost",
           "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}
    expected = git(*gd, "commit-tree", hist.tree_id(c1), "-p", base,
                   "-m", "loop-org checkpoint\n\niteration: 3", env=env).strip()
    assert expected == c1


def test_a_history_written_in_process_is_sound_for_git(hist, ws, tmp_path, spawned):
    base = hist.baseline()
    (ws / "src" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    c1 = hist.checkpoint(1)
    hist.reset_to(base)
    (ws / "new.txt").write_text("second attempt\n")
    c1b = hist.checkpoint(1)
    (ws / "README").unlink()
    c2 = hist.checkpoint(2)
    assert spawned == []
    gd = ["--git-dir", str(hist.git_dir)]
    git(*gd, "fsck", "--strict", "--no-dangling")
    assert git(*gd, "rev-list", "refs/heads/checkpoints").split() == [c2, c1b, base]
    assert git(*gd, "rev-parse", f"refs/discarded/1/{c1}").strip() == c1
    assert git(*gd, "rev-parse", "HEAD").strip() == c2
    assert git_tree_of(ws, tmp_path) == hist.tree_id(c2)
    assert "loop-org: checkpoint of iteration 2" in git(*gd, "reflog", "show", "refs/heads/checkpoints")
    archive = tmp_path / "archived"
    archive.mkdir()
    tar = subprocess.run(["git", *gd, "archive", c2], env=GIT_ENV, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(archive)], input=tar, check=True)
    assert files_of(archive) == files_of(ws)
    assert hist.changed_paths(base, c2) == sorted(
        p.decode() for p in git(*gd, "diff", "--name-only", "-z", base, c2).encode().split(b"\0") if p)


def test_refs_packed_by_git_are_read_and_overridden(hist, ws):
    hist.baseline()
    c1 = hist.checkpoint(1)
    git("--git-dir", str(hist.git_dir), "pack-refs", "--all")
    assert not (hist.git_dir / "refs" / "iterations" / "1").exists()
    assert hist.iteration_commit(1) == c1
    (ws / "README").write_text("two\n")
    c2 = hist.checkpoint(2)
    assert git("--git-dir", str(hist.git_dir), "rev-parse", HEAD_REF).strip() == c2


# -- the steady state runs no process -------------------------------------------------------------

def test_the_steady_state_spawns_no_process(hist, ws, tmp_path, spawned):
    last = hist.baseline()
    snap = tmp_path / "snap"
    hist.materialize(last, snap)
    spawned.clear()
    for n in range(1, 4):
        hist.reset_to(last)
        (ws / "src" / "calc.py").write_text(f"VALUE = {n}\n")
        commit = hist.checkpoint(n)
        assert hist.changed_paths(last, commit) == ["src/calc.py"]
        assert hist.tree_id(commit) == hist.fingerprint_of_workspace()
        verifier_side = WorkspaceHistory(hist.git_dir, ws)  # the eval-agent opens its own
        verifier_side.protected_paths(patterns=["tests/**"])
        assert verifier_side.materialize(commit, snap) == []
        assert hist.iteration_commit(n) == commit and hist.baseline() == hist.baseline_commit()
        last = commit
    assert spawned == []
    assert files_of(snap) == files_of(ws)


def test_a_reset_with_nothing_to_do_writes_nothing(hist, ws, spawned):
    hist.baseline()
    c1 = hist.checkpoint(1)
    before = {p: os.lstat(os.path.join(os.fsencode(ws), p)) for p in files_of(ws)}
    hist.reset_to(c1)
    after = {p: os.lstat(os.path.join(os.fsencode(ws), p)) for p in files_of(ws)}
    assert {p: (s.st_ino, s.st_mtime_ns, s.st_ctime_ns) for p, s in before.items()} == \
           {p: (s.st_ino, s.st_mtime_ns, s.st_ctime_ns) for p, s in after.items()}
    assert spawned == []


def test_a_reset_rewrites_only_what_differs(hist, ws):
    base = hist.baseline()
    expected = files_of(ws)
    keep = os.lstat(ws / "README").st_ino
    (ws / "src" / "calc.py").write_text("broken\n")
    (ws / "run.sh").chmod(0o644)
    (ws / "link").unlink()
    (ws / "link").write_text("a file where a symlink was\n")
    (ws / "tests").rename(ws / "moved")
    (ws / "extra" / "empty").mkdir(parents=True)
    (ws / "src" / "deep" / "new.pyc").write_bytes(b"\0")
    outside = ws.parent / "outside"
    outside.mkdir()
    (outside / "calc.py").write_text("not the workspace's\n")
    shutil.move(ws / "src", ws.parent / "src-moved")
    (ws / "src").symlink_to(outside)  # a directory replaced by a symlink leading out
    shutil.move(ws.parent / "src-moved" / "deep", outside / "deep")
    hist.reset_to(base)
    assert os.lstat(ws / "README").st_ino == keep  # untouched files stay as they are
    assert os.readlink(ws / "link") == "src/calc.py" and os.access(ws / "run.sh", os.X_OK)
    assert not (ws / "moved").exists() and not (ws / "extra").exists()
    assert (ws / "tests" / "test_calc.py").exists() and not (ws / "src" / "deep" / "new.pyc").exists()
    assert hist.fingerprint_of_workspace() == hist.tree_id(base) and files_of(ws) == expected
    assert (outside / "calc.py").read_text() == "not the workspace's\n"
    assert not (ws / "src").is_symlink()


def test_changed_paths_are_gits_name_only_diff(hist, ws):
    base = hist.baseline()
    (ws / "run.sh").chmod(0o644)
    (ws / "README").unlink()
    (ws / "README").mkdir()
    (ws / "README" / "inner").write_text("a directory where a file was\n")
    (ws / "link").unlink()
    (ws / "link").write_text("src/calc.py")  # same bytes, now a file
    (ws / "src" / "deep" / "x.bin").unlink()
    c1 = hist.checkpoint(1)
    raw = git("--git-dir", str(hist.git_dir), "diff", "--name-only", "-z", "--no-renames", base, c1)
    assert hist.changed_paths(base, c1) == sorted(p for p in raw.split("\0") if p)
    assert hist.changed_paths(c1, base) == hist.changed_paths(base, c1)


# -- racily clean entries and the index as stat cache -------------------------------------------

def test_a_file_rewritten_within_its_timestamp_tick_is_read_again(hist, ws, tmp_path):
    """Same size, mtime put back, written within the clock tick of its recorded stat (ctime
    equal too, on a coarse clock): only git's racy rule can catch it, in the workspace and in
    a snapshot."""
    hist.baseline()
    target, snap = ws / "README", tmp_path / "snap"
    for n in range(20):
        target.write_bytes(b"A%03d\n" % n)
        first = hist.fingerprint_of_workspace()
        st = os.lstat(target)
        target.write_bytes(b"B%03d\n" % n)
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert hist.fingerprint_of_workspace() == git_tree_of(ws, tmp_path) != first
        commit = hist.checkpoint(n + 1)
        hist.materialize(commit, snap)
        kept = snap / "README"
        st = os.lstat(kept)
        kept.write_bytes(b"C%03d\n" % n)
        os.utime(kept, ns=(st.st_atime_ns, st.st_mtime_ns))
        hist.materialize(commit, snap)
        assert kept.read_bytes() == b"B%03d\n" % n


def test_a_head_moved_by_another_writer_is_the_next_parent(hist, ws, tmp_path):
    base = hist.baseline()
    (ws / "README").write_text("one\n")
    c1 = hist.checkpoint(1)
    # another writer (git itself here) moves HEAD: the cache no longer describes the refs
    git("--git-dir", str(hist.git_dir), "update-ref", HEAD_REF, base)
    assert c1 != base
    (ws / "README").write_text("two\n")
    c2 = hist.checkpoint(2)
    assert hist.tree_id(c2) == git_tree_of(ws, tmp_path)
    assert git("--git-dir", str(hist.git_dir), "rev-parse", f"{c2}^").strip() == base


def test_an_index_written_by_one_process_is_read_by_the_next(tmp_path, ws):
    """A deferring writer's index, written out when the run stops, is what a new process
    records with: the same trees, the files it describes not read again."""
    hist = WorkspaceHistory(tmp_path / "h.git", ws, defer=True)
    hist.baseline()
    for n in range(1, 4):
        (ws / "src" / "deep" / "x.bin").write_bytes(bytes([n]) * 9)
        (ws / "tests" / f"t{n}.py").write_text("x\n")
        last = hist.checkpoint(n)
    hist.flush_pending()
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from pathlib import Path; "
            f"from roles.workbench.workspace.history import WorkspaceHistory; "
            f"print(WorkspaceHistory(Path({str(hist.git_dir)!r}), Path({str(ws)!r})).fingerprint_of_workspace())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.split()[-1] == hist.tree_id(last) == git_tree_of(ws, tmp_path)


@pytest.mark.parametrize("damage", ["torn", "garbage", "empty"])
def test_a_damaged_index_is_rebuilt(hist, ws, tmp_path, damage):
    hist.baseline()
    cache = hist.git_dir / "index"
    data = cache.read_bytes()
    shadow.forget(hist.git_dir)  # as a fresh process would see it
    cache.write_bytes({"torn": data[: len(data) // 2] + b"\0" * (len(data) // 2),
                       "garbage": os.urandom(200), "empty": b""}[damage])
    (ws / "src" / "calc.py").write_text("changed after the damage\n")
    assert hist.tree_id(hist.checkpoint(1)) == git_tree_of(ws, tmp_path)


def test_objects_packed_by_a_manual_gc_are_read(hist, ws, tmp_path):
    base = hist.baseline()
    (ws / "README").write_text("one\n")
    c1 = hist.checkpoint(1)
    git("--git-dir", str(hist.git_dir), "gc", "-q", "--prune=now")
    shadow.forget(hist.git_dir)
    assert hist.tree_id(c1) == git("--git-dir", str(hist.git_dir), "rev-parse", f"{c1}^{{tree}}").strip()
    assert hist.changed_paths(base, c1) == ["README"]
    hist.reset_to(base)
    assert (ws / "README").read_text() == "r\n"
    (ws / "tests" / "test_calc.py").write_text("def test_add():\n    assert False\n")
    c2 = hist.checkpoint(2)
    assert hist.materialize(c2, tmp_path / "snap") == ["tests/test_calc.py"]
    assert hist.tree_id(c2) == git_tree_of(ws, tmp_path)
    git("--git-dir", str(hist.git_dir), "fsck", "--strict", "--no-dangling")


# -- what git records differently, recorded as git does ---------------------------------------------

def test_a_nested_repository_is_recorded_as_a_gitlink(hist, ws, tmp_path, spawned):
    hist.baseline()
    inner = ws / "vendor" / "lib"
    inner.mkdir(parents=True)
    git("init", "-q", str(inner))
    (inner / "x.py").write_text("x = 1\n")
    git("-C", str(inner), "add", "-A")
    git("-C", str(inner), "commit", "-qm", "inner")
    spawned.clear()
    c1 = hist.checkpoint(1)
    assert spawned == []
    entry = git("--git-dir", str(hist.git_dir), "ls-tree", c1, "vendor/lib")
    assert entry.startswith("160000 commit ")
    hist.reset_to(hist.baseline_commit())
    assert not (ws / "vendor").exists()


def test_gitattributes_never_convert_content(hist, ws, tmp_path, spawned):
    """A .gitattributes that asks for line-ending conversion changes no byte on the way in or out."""
    hist.baseline()
    (ws / ".gitattributes").write_text("*.txt text eol=crlf\n")
    (ws / "dos.txt").write_bytes(b"one\r\ntwo\r\n")
    c1 = hist.checkpoint(1)
    blob = git("--git-dir", str(hist.git_dir), "cat-file", "-p", f"{c1}:dos.txt")
    assert blob == "one\r\ntwo\r\n"  # recorded as the workspace holds it
    (ws / "dos.txt").write_bytes(b"changed\n")
    spawned.clear()
    hist.reset_to(c1)
    assert (ws / "dos.txt").read_bytes() == b"one\r\ntwo\r\n" and spawned == []


def test_a_fifo_is_left_out_as_git_leaves_it_out(hist, ws, tmp_path, spawned):
    hist.baseline()
    os.mkfifo(ws / "pipe")
    spawned.clear()
    c1 = hist.checkpoint(1)
    assert spawned == [] and hist.tree_id(c1) == git_tree_of(ws, tmp_path)


# -- snapshots -----------------------------------------------------------------------------------

def test_materialize_repairs_tampering_and_removes_everything_else(hist, ws, tmp_path, spawned):
    base = hist.baseline()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the snapshot's\n")
    snap = tmp_path / "snap"
    hist.materialize(base, snap)
    spawned.clear()
    (snap / "tests" / "test_calc.py").write_text("def test_add():\n    pass  # weakened\n")
    (snap / "run.sh").chmod(0o644)
    os.utime(snap / "README", ns=(0, 0))
    (snap / "README").write_text("r\n")  # same content, new stat
    (snap / "src" / "calc.py").unlink()
    (snap / "src" / "deep" / "x.bin").unlink()
    os.rmdir(snap / "src" / "deep")
    (snap / "src" / "deep").symlink_to(outside)
    (snap / ".git").mkdir()
    (snap / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (snap / "__pycache__").mkdir()
    (snap / "__pycache__" / "m.pyc").write_bytes(b"\0")
    os.mkfifo(snap / "pipe")
    (ws / "tests" / "test_calc.py").write_text("def test_add():\n    assert 1\n")
    c1 = hist.checkpoint(1)
    assert WorkspaceHistory(hist.git_dir, ws).materialize(c1, snap) == ["tests/test_calc.py"]
    expected = files_of(ws)
    expected[b"tests/test_calc.py"] = ("file", b"def test_add():\n    assert True\n", False)
    assert files_of(snap) == expected
    assert (snap / ".git").exists() is False and (outside / "keep.txt").exists()
    assert spawned == []


def test_materialize_never_writes_through_a_link_a_verify_command_made(hist, ws, tmp_path):
    base = hist.baseline()
    snap = tmp_path / "snap"
    hist.materialize(base, snap)
    (snap / "src" / "link").hardlink_to(snap / "src" / "calc.py")   # a verify command's doing,
    second_name = tmp_path / "second-name"                          # and a name outside
    second_name.hardlink_to(snap / "src" / "calc.py")
    before = second_name.read_bytes()
    (snap / "run.sh").chmod(0o600)
    (ws / "README").write_text("shorter\n")
    (ws / "src" / "calc.py").write_text("def add(a, b):\n    return a + b  # changed\n")
    (ws / "run.sh").write_text("#!/bin/sh\necho changed\n")
    c1 = hist.checkpoint(1)
    hist.materialize(c1, snap)
    assert files_of(snap) == files_of(ws)
    # nothing is written through a second link; a changed mode is put back
    assert second_name.read_bytes() == before and os.access(snap / "run.sh", os.X_OK)
    assert not (snap / "src" / "link").exists()
    outside = tmp_path / "outside.txt"
    outside.write_text("not the snapshot's\n")
    (snap / "README").unlink()
    (snap / "README").symlink_to(outside)                      # swapped for a symlink
    (ws / "README").write_text("again\n")
    hist.materialize(hist.checkpoint(2), snap)
    assert files_of(snap) == files_of(ws) and outside.read_text() == "not the snapshot's\n"


def test_materialize_continues_a_snapshot_of_a_tree_with_attributes(hist, ws, tmp_path):
    base = hist.baseline()
    snap = tmp_path / "snap"
    (ws / ".gitattributes").write_text("*.py diff=python\n")
    c1 = hist.checkpoint(1)
    hist.materialize(c1, snap)
    (snap / "stray").write_text("x\n")
    hist.reset_to(base)
    (ws / "README").write_text("plain again\n")
    c2 = hist.checkpoint(2)
    assert hist.materialize(c2, snap) == []
    assert files_of(snap) == files_of(ws)


_BLOCKED_WRITER = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from roles.workbench.workspace.history import WorkspaceHistory

def step(name):
    if name == "snapshot_writing":
        print(name, flush=True)
        sys.stdin.readline()            # held here until the test lets go

WorkspaceHistory(Path({git_dir!r}), Path({ws!r}), on_step=step).materialize({commit!r}, Path({snap!r}))
print("done", flush=True)
"""


def test_a_second_writer_of_the_same_snapshot_is_refused(hist, ws, tmp_path):
    base = hist.baseline()
    snap = tmp_path / "snap"
    hist.materialize(base, snap)
    code = _BLOCKED_WRITER.format(root=str(ROOT), git_dir=str(hist.git_dir), ws=str(ws), commit=base,
                                  snap=str(snap))
    other = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert other.stdout.readline().strip() == "snapshot_writing"
        with pytest.raises(HistoryError) as err:
            hist.materialize(base, snap)
        assert err.value.code == "snapshot_busy"
        other.stdin.write("\n")
        other.stdin.flush()
        assert other.stdout.readline().strip() == "done"
    finally:
        other.kill()
        other.wait(timeout=30)
    assert hist.materialize(base, snap) == [] and files_of(snap) == files_of(ws)


# -- crash safety --------------------------------------------------------------------------------

_CRASHER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from pathlib import Path
    from roles.workbench.workspace.history import WorkspaceHistory

    def step(name):
        if name == {at!r}:
            os.kill(os.getpid(), signal.SIGKILL)

    hist = WorkspaceHistory(Path({git_dir!r}), Path({ws!r}), on_step=step)
    hist.{call}
    sys.exit(3)
""")


def _killed_at(at: str, call: str, hist: WorkspaceHistory, ws: Path) -> None:
    code = _CRASHER.format(root=str(ROOT), at=at, git_dir=str(hist.git_dir), ws=str(ws), call=call)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]


@pytest.mark.parametrize("at", ["commit_written", "ref_updated:refs/iterations/2",
                                "ref_updated:refs/heads/checkpoints", "index_written"])
def test_a_checkpoint_killed_midway_leaves_a_usable_history(hist, ws, tmp_path, at):
    hist.baseline()
    c1 = hist.checkpoint(1)
    (ws / "src" / "calc.py").write_text("attempt that gets killed\n")
    _killed_at(at, "checkpoint(2)", hist, ws)
    shadow.forget(hist.git_dir)  # what a new process starts with
    restarted = WorkspaceHistory(hist.git_dir, ws)  # what a restarted loop-agent does:
    restarted.baseline()                             # clears the killed writer's locks,
    restarted.reset_to(c1)                           # discards the cut attempt,
    assert restarted.fingerprint_of_workspace() == restarted.tree_id(c1)
    (ws / "src" / "calc.py").write_text("attempt that completes\n")
    c2 = restarted.checkpoint(2)                     # and records it again
    assert restarted.tree_id(c2) == git_tree_of(ws, tmp_path)
    assert restarted.iteration_commit(2) == c2
    gd = ["--git-dir", str(hist.git_dir)]
    assert git(*gd, "rev-parse", f"{c2}^").strip() == c1
    assert git(*gd, "rev-parse", HEAD_REF).strip() == c2
    git(*gd, "fsck", "--full", "--strict", "--no-dangling")


def test_a_baseline_killed_between_its_refs_is_taken_again(tmp_path, ws):
    hist = WorkspaceHistory(tmp_path / "h.git", ws)
    _killed_at("ref_updated:refs/heads/checkpoints", "baseline()", hist, ws)
    shadow.forget(hist.git_dir)
    base = WorkspaceHistory(hist.git_dir, ws).baseline()
    assert hist.baseline_commit() == base and hist.tree_id(base) == git_tree_of(ws, tmp_path)
    (ws / "README").write_text("after\n")
    assert hist.checkpoint(1)


def test_what_a_snapshot_checks_out_is_in_its_index_with_the_stat_it_was_written_with(hist, ws, tmp_path):
    """libgit2's checkout puts each file it writes in the snapshot's index, stat included, so
    the next snapshot reads none of them again (nothing re-adds them after the checkout)."""
    from roles.workbench.workspace import snapshot
    hist.baseline()
    dest = tmp_path / "snap"
    for n in range(1, 4):
        (ws / "README").write_text(f"{n}\n" * n)
        (ws / "tests" / f"t{n}.py").write_text("x\n")
        hist.materialize(hist.checkpoint(n), dest)
    snap_dir = snapshot.git_dir_of(hist.git_dir, dest.absolute())
    work = shadow.shadow_for(snap_dir, dest.absolute())
    work.save_index()
    listed = git("--git-dir", str(snap_dir), "--work-tree", str(dest), "ls-files", "--debug")
    entries, name = {}, None
    for line in listed.splitlines():
        if not line.startswith(" "):
            name = line
            continue
        for key, value in (part.split(":", 1) for part in line.split("\t")):
            entries.setdefault(name, {})[key.strip()] = value.strip()
    for rel in ("README", "tests/t3.py"):
        s = os.lstat(dest / rel)
        seen = entries[rel]
        assert seen["mtime"] == f"{s.st_mtime_ns // 10**9}:{s.st_mtime_ns % 10**9}"
        assert seen["ctime"] == f"{s.st_ctime_ns // 10**9}:{s.st_ctime_ns % 10**9}"
        assert (int(seen["ino"]), int(seen["size"])) == (s.st_ino, s.st_size)
    assert [(d.status, d.new_file.path) for d in work._index().diff_to_workdir(flags=shadow._SCAN).deltas] == []
