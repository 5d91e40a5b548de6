"""Workspace history: baseline, checkpoints, reset, diff/export, protected snapshots."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roles.workbench.workspace.history import (
    HistoryError, NoBaseline, UnknownCommit, WorkspaceHistory, WorkspaceMissing,
)
from bench.history_bench import bench_checkpoint
from roles.workbench.workspace.protect import DEFAULT_PROTECTED_PATTERNS, match_paths

GIT_ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
           "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True,
                          capture_output=True, text=True).stdout


def tree_of(root: Path, *, skip_git: bool = True) -> dict[str, tuple[bytes, bool]]:
    """path -> (content, executable) of every file under root (``.git`` left out)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if skip_git and ".git" in dirnames:
            dirnames.remove(".git")
        for name in filenames:
            p = Path(dirpath, name)
            out[p.relative_to(root).as_posix()] = (p.read_bytes(),
                                                   bool(p.stat().st_mode & stat.S_IXUSR))
    return out


def raw_state(root: Path) -> dict[str, tuple[bytes, int]]:
    """path -> (content, mtime_ns) of every file and dir under root, for untouched-ness checks."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = p.lstat()
            body = p.read_bytes() if stat.S_ISREG(st.st_mode) else b""
            out[p.relative_to(root).as_posix()] = (body, st.st_mtime_ns)
    return out


@pytest.fixture
def ws(tmp_path) -> Path:
    ws = tmp_path / "workspace"
    (ws / "src").mkdir(parents=True)
    (ws / "tests").mkdir()
    (ws / "pkg").mkdir()
    (ws / "src" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (ws / "tests" / "test_calc.py").write_text("from src.calc import add\n\n"
                                               "def test_add():\n    assert add(1, 2) == 3\n")
    (ws / "pkg" / "util_test.py").write_text("def test_util():\n    pass\n")
    (ws / "data.bin").write_bytes(bytes(range(256)) * 4)
    (ws / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (ws / "run.sh").chmod(0o755)
    (ws / "README.md").write_text("calc\n")
    return ws


@pytest.fixture
def hist(tmp_path, ws) -> WorkspaceHistory:
    return WorkspaceHistory(tmp_path / "org" / "history" / "w1.git", ws)


def test_baseline_is_idempotent_and_writes_nothing_into_the_workspace(hist, ws):
    before = raw_state(ws)
    first = hist.baseline()
    assert hist.baseline() == first == hist.baseline_commit()
    assert raw_state(ws) == before
    assert (hist.git_dir / "HEAD").exists() and not (ws / ".git").exists()


def test_checkpoint_records_iteration_ref_and_is_idempotent_for_the_same_tree(hist, ws):
    base = hist.baseline()
    (ws / "src" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    c1 = hist.checkpoint(1)
    assert hist.checkpoint(1) == c1 == hist.iteration_commit(1)
    message = git("--git-dir", str(hist.git_dir), "cat-file", "-p", c1, cwd=hist.git_dir)
    assert f"parent {base}" in message and "iteration: 1" in message
    assert hist.iteration_commit(2) is None
    assert hist.changed_paths(base, c1) == ["src/calc.py"]


def test_checkpoint_of_a_reattempted_iteration_replaces_the_discarded_one(hist, ws):
    hist.baseline()
    c1 = hist.checkpoint(1)
    (ws / "attempt.txt").write_text("first attempt, cut by a crash before the db commit\n")
    discarded = hist.checkpoint(2)
    hist.reset_to(c1)
    (ws / "attempt.txt").write_text("second attempt\n")
    c2 = hist.checkpoint(2)
    assert c2 != discarded and hist.iteration_commit(2) == c2
    assert git("--git-dir", str(hist.git_dir), "rev-parse", f"{c2}^", cwd=hist.git_dir).strip() == c1
    refs = git("--git-dir", str(hist.git_dir), "for-each-ref", "--format=%(refname)",
               "refs/discarded", cwd=hist.git_dir).split()
    assert refs == [f"refs/discarded/2/{discarded}"]


def test_checkpoint_without_baseline_is_a_coded_error_and_creates_no_history(hist):
    with pytest.raises(NoBaseline) as err:
        hist.checkpoint(1)
    assert err.value.code == "no_baseline" and not hist.git_dir.exists()


def test_reset_restores_modified_and_deleted_and_removes_new_files(hist, ws):
    hist.baseline()
    (ws / "src" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    c1 = hist.checkpoint(1)
    expected = tree_of(ws)
    (ws / "src" / "calc.py").write_text("broken\n")
    (ws / "README.md").unlink()
    (ws / "run.sh").chmod(0o644)
    (ws / "new_dir" / "deep").mkdir(parents=True)
    (ws / "new_dir" / "deep" / "x.py").write_text("x = 1\n")
    (ws / ".gitignore").write_text("*.log\n")
    (ws / "debug.log").write_text("ignored by the workspace, removed all the same\n")
    (ws / "empty_new").mkdir()
    hist.reset_to(c1)
    assert tree_of(ws) == expected
    assert not (ws / "new_dir").exists() and not (ws / "empty_new").exists()


def test_reset_to_an_unknown_commit_is_a_coded_error(hist):
    hist.baseline()
    with pytest.raises(UnknownCommit) as err:
        hist.reset_to("0" * 40)
    assert err.value.code == "unknown_commit"


def test_a_workspace_that_is_a_git_repo_keeps_its_own_git_untouched(tmp_path, ws):
    git("init", "-q", cwd=ws)
    (ws / ".gitignore").write_text("build/\n")
    git("add", "-A", cwd=ws)
    git("commit", "-qm", "own history", cwd=ws)
    (ws / "build").mkdir()
    (ws / "build" / "out.txt").write_text("ignored by the repo's own .gitignore\n")
    own_git = raw_state(ws / ".git")
    hist = WorkspaceHistory(tmp_path / "org" / "history" / "w2.git", ws)
    base = hist.baseline()
    (ws / "src" / "calc.py").write_text("changed\n")
    (ws / "build" / "out.txt").write_text("rebuilt\n")
    c1 = hist.checkpoint(1)
    hist.fingerprint_of_workspace()
    hist.reset_to(base)
    hist.materialize(c1, tmp_path / "snap")
    assert raw_state(ws / ".git") == own_git
    recorded = git("--git-dir", str(hist.git_dir), "ls-tree", "-r", "--name-only", c1,
                   cwd=tmp_path).split()
    assert "build/out.txt" in recorded  # ignored files are part of the workspace too
    assert not any(p == ".git" or p.startswith(".git/") for p in recorded)
    assert (ws / "build" / "out.txt").read_text() == "ignored by the repo's own .gitignore\n"
    assert git("status", "--porcelain", cwd=ws) == ""


def test_diff_is_binary_safe_and_the_exported_patch_rebuilds_the_checkpoint(hist, ws, tmp_path):
    base = hist.baseline()
    (ws / "data.bin").write_bytes(bytes(reversed(range(256))) * 3 + b"\0\xff")
    (ws / "src" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (ws / "README.md").unlink()
    (ws / "notes.txt").write_text("caf\xe9 \u2603\n")
    c1 = hist.checkpoint(1)
    text = hist.diff()
    assert text == hist.diff(base, c1)
    assert "GIT binary patch" in text and "+    return a + b" in text
    assert hist.diff(c1, c1) == ""
    patch = hist.export_patch(tmp_path / "w1.patch")
    copy = tmp_path / "copy"
    hist.materialize(base, copy, paths=[])
    subprocess.run(["git", "apply", "--binary", str(patch)], cwd=copy, env=GIT_ENV, check=True)
    assert tree_of(copy) == tree_of(ws)
    assert hist.changed_paths(base, c1) == ["README.md", "data.bin", "notes.txt", "src/calc.py"]


def test_fingerprint_is_the_tree_id_and_follows_content(hist, ws):
    hist.baseline()
    c1 = hist.checkpoint(1)
    assert hist.fingerprint_of_workspace() == hist.tree_id(c1)
    (ws / "README.md").write_text("changed\n")
    changed = hist.fingerprint_of_workspace()
    assert changed != hist.tree_id(c1)
    (ws / "README.md").write_text("calc\n")
    assert hist.fingerprint_of_workspace() == hist.tree_id(c1)


def test_default_protected_patterns_match_the_usual_test_files():
    paths = ["tests/test_a.py", "tests/data/fixture.json", "src/app/tests/helpers.py",
             "test/x.c", "lib/test_b.py", "lib/b_test.py", "conftest.py", "go/pkg/x_test.go",
             "web/a.test.ts", "web/b.spec.js", "web/__tests__/c.js", "spec/models/u_spec.rb",
             "src/calc.py", "src/testing.py", "contest.py", "latest/x.py", "web/a.ts",
             "docs/test.md"]
    assert match_paths(paths, DEFAULT_PROTECTED_PATTERNS) == sorted(
        ["tests/test_a.py", "tests/data/fixture.json", "src/app/tests/helpers.py", "test/x.c",
         "lib/test_b.py", "lib/b_test.py", "conftest.py", "go/pkg/x_test.go", "web/a.test.ts",
         "web/b.spec.js", "web/__tests__/c.js", "spec/models/u_spec.rb"])
    assert match_paths(["a/b/c.txt", "c.txt", "a/c.txt"], ["a/*.txt"]) == ["a/c.txt"]
    assert match_paths(["x1.py", "x2.py", "xa.py"], ["x[!a].py"]) == ["x1.py", "x2.py"]


def test_materialize_restores_protected_paths_and_reports_those_that_differed(hist, ws, tmp_path):
    hist.baseline()
    assert hist.protected_paths() == ["pkg/util_test.py", "tests/test_calc.py"]
    (ws / "tests" / "test_calc.py").write_text("def test_add():\n    assert True\n")
    (ws / "pkg" / "util_test.py").unlink()
    (ws / "tests" / "test_new.py").write_text("def test_new():\n    pass\n")
    (ws / "src" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    c1 = hist.checkpoint(1)
    snap = tmp_path / "snapshots" / "v1"
    differing = hist.materialize(c1, snap)
    assert differing == ["pkg/util_test.py", "tests/test_calc.py"]
    expected = tree_of(ws)
    base_files = {"tests/test_calc.py": ("from src.calc import add\n\ndef test_add():\n"
                                         "    assert add(1, 2) == 3\n"),
                  "pkg/util_test.py": "def test_util():\n    pass\n"}
    for path, body in base_files.items():
        expected[path] = (body.encode(), False)
    assert tree_of(snap) == expected
    assert (ws / "tests" / "test_calc.py").read_text() == "def test_add():\n    assert True\n"


def test_materialize_replaces_a_protected_file_turned_into_a_directory(hist, ws, tmp_path):
    hist.baseline()
    (ws / "tests" / "test_calc.py").unlink()
    (ws / "tests" / "test_calc.py").mkdir()
    (ws / "tests" / "test_calc.py" / "inner.py").write_text("x = 1\n")
    c1 = hist.checkpoint(1)
    assert hist.materialize(c1, tmp_path / "snap") == ["tests/test_calc.py"]
    assert (tmp_path / "snap" / "tests" / "test_calc.py").read_text().startswith("from src")


def test_materialize_into_its_previous_snapshot_rewrites_changes_and_drops_strays(hist, ws, tmp_path):
    hist.baseline()
    c1 = hist.checkpoint(1)
    snap = tmp_path / "snap"
    hist.materialize(c1, snap)
    (snap / "src" / "calc.py").write_text("tampered by a verify command\n")
    (snap / "__pycache__").mkdir()
    (snap / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (ws / "README.md").write_text("second\n")
    c2 = hist.checkpoint(2)
    assert hist.materialize(c2, snap) == []
    assert tree_of(snap) == tree_of(ws)


def test_materialize_refuses_a_foreign_directory_and_one_inside_the_workspace(hist, ws, tmp_path):
    hist.baseline()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("not ours\n")
    with pytest.raises(HistoryError) as err:
        hist.materialize(hist.baseline(), foreign)
    assert err.value.code == "dest_not_empty" and (foreign / "keep.txt").exists()
    with pytest.raises(HistoryError) as err:
        hist.materialize(hist.baseline(), ws / "snap")
    assert err.value.code == "dest_inside_workspace"
    hist.materialize(hist.baseline(), tmp_path / "s")
    hist.discard_snapshot(tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_missing_workspace_and_bad_location_are_coded_errors(tmp_path, ws):
    hist = WorkspaceHistory(tmp_path / "h.git", tmp_path / "gone")
    with pytest.raises(WorkspaceMissing) as err:
        hist.baseline()
    assert err.value.code == "workspace_missing"
    with pytest.raises(HistoryError) as err:
        WorkspaceHistory(ws / ".history.git", ws)
    assert err.value.code == "history_inside_workspace"


def test_workspace_vanishing_after_baseline_is_a_coded_error(hist, ws):
    hist.baseline()
    os.rename(ws, ws.with_name("moved"))
    for step in (lambda: hist.checkpoint(1), hist.fingerprint_of_workspace,
                 lambda: hist.reset_to(hist.baseline())):
        with pytest.raises(WorkspaceMissing):
            step()
    assert hist.diff() == ""  # the history itself still answers


def test_delete_removes_the_history_and_leaves_the_workspace(hist, ws):
    hist.baseline()
    before = tree_of(ws)
    hist.delete()
    assert not hist.git_dir.exists() and tree_of(ws) == before
    assert hist.baseline_commit() is None


def test_the_checkpoint_bench_runs_on_a_large_workspace(tmp_path):
    """The function bench/loop.py calls works on thousands of files (its 10,000-file figure is
    measured there, not asserted here)."""
    figures = bench_checkpoint(tmp_path, files=2_000, repeats=3)
    assert figures["files"] == 2_000
    assert all(v > 0 for k, v in figures.items() if k.endswith("_ms_10k_files"))


def test_locks_left_by_a_killed_writer_are_cleared_when_the_run_restarts(hist, ws, tmp_path):
    base = hist.baseline()
    c1 = hist.checkpoint(1)
    for lock in ("index.lock", "refs/heads/checkpoints.lock", "refs/iterations/2.lock"):
        (hist.git_dir / lock).write_text("")
    (ws / "README.md").write_text("after the crash\n")
    with pytest.raises(HistoryError):
        hist.checkpoint(2)
    assert hist.baseline() == base
    hist.reset_to(c1)
    (ws / "README.md").write_text("after the restart\n")
    assert hist.checkpoint(2) == hist.iteration_commit(2)


_SNAPSHOT_WRITER = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from roles.workbench.workspace.history import WorkspaceHistory
hist = WorkspaceHistory(Path({git_dir!r}), Path({ws!r}), on_step=lambda step: print(step, flush=True))
hist.materialize({commit!r}, Path({snap!r}))
print("done", flush=True)
"""


@pytest.mark.timeout(120)
def test_a_snapshot_whose_writer_was_killed_is_finished_exactly(hist, ws, tmp_path):
    """An eval-agent killed while writing its snapshot (at several moments of the write): the
    next one makes the directory exactly the checkpoint, strays and half-written files gone."""
    hist.baseline()
    (ws / "many").mkdir()
    for i in range(200):
        (ws / "many" / f"f{i}.txt").write_text(f"{i}\n" * 50)
    commits = [hist.checkpoint(1)]
    for i in range(0, 200, 2):
        (ws / "many" / f"f{i}.txt").write_text("changed\n")
    (ws / "many" / "f1.txt").unlink()
    commits.append(hist.checkpoint(2))
    snap = tmp_path / "snap"
    hist.materialize(commits[0], snap)
    root = str(Path(__file__).resolve().parents[1])
    for n, delay in enumerate((0.0, 0.002, 0.01, 0.03, 0.08)):
        commit = commits[(n + 1) % 2]
        code = _SNAPSHOT_WRITER.format(root=root, git_dir=str(hist.git_dir), ws=str(ws), commit=commit,
                                       snap=str(snap))
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "snapshot_writing"
            time.sleep(delay)
            proc.kill()
        finally:
            proc.wait(timeout=30)
            proc.stdout.close()
        (snap / "half-written").write_text("")
        assert hist.materialize(commit, snap) == []
        fresh = tmp_path / f"fresh{n}"
        hist.materialize(commit, fresh)
        assert tree_of(snap) == tree_of(fresh)
        assert tree_of(snap)["many/f0.txt"][0] == (b"changed\n" if commit == commits[1] else b"0\n" * 50)
