"""The running loop's history defers its objects and refs (``WorkspaceHistory(defer=True)``):
readers see them at once, git sees them once they are written out, and a killed writer loses
nothing that a later writer cannot write out."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from roles.workspace import objects, refs, statcache
from roles.workspace.history import HEAD_REF, WorkspaceHistory, iteration_ref
from roles.workspace.pending import PENDING_OBJECTS
from tests.test_history_fast import files_of, git, git_tree_of

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def ws(tmp_path) -> Path:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (ws / "README").write_text("r\n")
    return ws


def _fresh_process_caches(git_dir: Path) -> None:
    """What another process starts with: no parsed objects, no stat caches."""
    statcache._MEMORY.clear()
    objects.forget(git_dir)


def _pending(git_dir: Path) -> list[str]:
    return sorted(p.name for p in git_dir.iterdir() if p.name.startswith("loop-org-pending"))


def test_deferred_checkpoints_are_read_at_once_and_given_to_git_when_written_out(tmp_path, ws):
    writer = WorkspaceHistory(tmp_path / "h.git", ws, defer=True)
    gd = ["--git-dir", str(writer.git_dir)]
    base = writer.baseline()
    commits = []
    for n in (1, 2, 3):
        (ws / "src" / "calc.py").write_text(f"def add(a, b):\n    return a + b  # {n}\n")
        commits.append(writer.checkpoint(n))
    # nothing of it is a file git reads yet: no loose object, no loose ref
    assert _pending(writer.git_dir) == [PENDING_OBJECTS, refs.PENDING]
    assert subprocess.run(["git", *gd, "cat-file", "-e", commits[-1]], capture_output=True).returncode != 0
    # another reader (the eval-agent) sees every pending object and ref
    _fresh_process_caches(writer.git_dir)
    reader = WorkspaceHistory(writer.git_dir, ws)
    assert reader.iteration_commit(2) == commits[1] and reader.baseline_commit() == base
    assert reader.tree_id(commits[-1]) == git_tree_of(ws, tmp_path)
    assert reader.changed_paths(commits[0], commits[1]) == ["src/calc.py"]
    snap = tmp_path / "snap"
    reader.materialize(commits[-1], snap)
    assert files_of(snap) == files_of(ws)
    # a reader running git (org diff) writes the objects out first, and leaves the rest alone
    assert b"+    return a + b  # 3" in reader.diff_bytes(base, commits[-1])
    assert git(*gd, "cat-file", "-t", commits[-1]).strip() == "commit"
    assert refs.PENDING in _pending(writer.git_dir)
    # the writer writes everything out: git's own refs, reflogs and objects, nothing pending
    writer.flush_pending()
    assert _pending(writer.git_dir) == []
    assert git(*gd, "rev-list", HEAD_REF).split() == [*reversed(commits), base]
    assert git(*gd, "rev-parse", iteration_ref(2)).strip() == commits[1]
    assert "loop-org: checkpoint of iteration 3" in git(*gd, "reflog", "show", HEAD_REF)
    git(*gd, "fsck", "--strict", "--no-dangling")


def test_a_killed_deferred_writer_leaves_what_the_next_one_writes_out(tmp_path, ws):
    git_dir = tmp_path / "h.git"
    code = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from roles.workspace.history import WorkspaceHistory
        ws = Path({str(ws)!r})
        h = WorkspaceHistory(Path({str(git_dir)!r}), ws, defer=True)
        h.baseline()
        for n in (1, 2):
            (ws / "README").write_text(f"r{{n}}\\n")
            print("checkpoint", h.checkpoint(n), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    c1, c2 = [ln.split()[1] for ln in proc.stdout.decode().splitlines() if ln.startswith("checkpoint ")]
    # and a third checkpoint was being appended when it died: a torn record and a torn line
    with open(git_dir / PENDING_OBJECTS, "ab") as f:
        f.write(b"LOOB\x00\x00\x01\x00" + b"\x07" * 30)
    with open(git_dir / refs.PENDING, "ab") as f:
        f.write(b'["refs/iterations/3","0000')
    _fresh_process_caches(git_dir)
    assert WorkspaceHistory(git_dir, ws).iteration_commit(2) == c2   # readable before any repair
    restarted = WorkspaceHistory(git_dir, ws, defer=True)
    (ws / "README").write_text("r3\n")
    c3 = restarted.checkpoint(3)            # appended after cutting the torn tail, not behind it
    _fresh_process_caches(git_dir)
    reader = WorkspaceHistory(git_dir, ws)
    assert reader.iteration_commit(3) == c3 and reader.tree_id(c3) == git_tree_of(ws, tmp_path)
    restarted.reset_to(c3)                  # a restarted loop's first step writes it all out
    assert _pending(git_dir) == []
    gd = ["--git-dir", str(git_dir)]
    assert git(*gd, "rev-parse", iteration_ref(1), iteration_ref(2), iteration_ref(3)).split() == [c1, c2, c3]
    assert git(*gd, "rev-parse", f"{c3}^").strip() == c2
    git(*gd, "fsck", "--strict", "--no-dangling")


def test_a_reader_follows_the_pending_refs_as_they_grow_and_are_written_out(tmp_path, ws):
    writer = WorkspaceHistory(tmp_path / "h.git", ws, defer=True)
    reader = WorkspaceHistory(writer.git_dir, ws)
    base = writer.baseline()
    assert reader.baseline_commit() == base
    pending = writer.git_dir / refs.PENDING
    commits = []
    for n in (1, 2, 3):
        (ws / "README").write_text(f"r{n}\n")
        commits.append(writer.checkpoint(n))
        assert reader.iteration_commit(n) == commits[-1]
        assert reader._refs._pending_at[1] == pending.stat().st_size   # read up to the end, once
    with open(pending, "ab") as f:
        f.write(b'["refs/iterations/4"')                               # being appended right now
    assert reader.iteration_commit(4) is None and reader.iteration_commit(3) == commits[-1]
    pending.write_bytes(pending.read_bytes()[: reader._refs._pending_at[1]])
    writer.flush_pending()                    # the run stops: git's own refs, the file gone
    assert not pending.exists() and reader.iteration_commit(3) == commits[-1]
    (ws / "README").write_text("r4\n")
    c4 = writer.checkpoint(4)                 # a new pending file: read from its start
    assert reader.iteration_commit(4) == c4 and reader.iteration_commit(1) == commits[0]
    gd = ["--git-dir", str(writer.git_dir)]
    assert git(*gd, "rev-parse", iteration_ref(3)).strip() == commits[-1]


def test_git_run_by_the_writer_sees_its_pending_refs(tmp_path, ws):
    writer = WorkspaceHistory(tmp_path / "h.git", ws, defer=True)
    base = writer.baseline()
    (ws / "README").write_text("changed\n")
    c1 = writer.checkpoint(1)
    (ws / ".gitattributes").write_text("*.py diff=python\n")   # git records this one
    c2 = writer.checkpoint(2)
    assert writer.iteration_commit(2) == c2
    gd = ["--git-dir", str(writer.git_dir)]
    assert git(*gd, "rev-list", HEAD_REF).split() == [c2, c1, base]
    assert writer.tree_id(c2) == git_tree_of(ws, tmp_path)


def test_a_reader_tells_a_new_pending_file_from_the_old_one_whatever_its_inode(tmp_path, ws):
    from roles.workspace.pending import PendingObjects

    git_dir = tmp_path / "h.git"
    writer = WorkspaceHistory(git_dir, ws, defer=True)
    writer.baseline()
    other = PendingObjects(os.fsencode(git_dir))      # another process's view of the objects
    reader = WorkspaceHistory(git_dir, ws)            # and of the refs
    store = objects.store_for(git_dir)
    seen = []
    for n in range(1, 5):
        (ws / "README").write_text(f"r{n}\n" * n)
        commit = writer.checkpoint(n)
        assert reader.iteration_commit(n) == commit
        assert other.get(bytes.fromhex(commit)) == store.pending.get(bytes.fromhex(commit))
        seen.append(commit)
        writer.flush_pending()                        # written out; the next file is a new one
    assert other.get(bytes.fromhex(seen[0])) is None  # gone from the pending file: loose now
    assert [reader.iteration_commit(n) for n in range(1, 5)] == seen
    git(*["--git-dir", str(git_dir)], "fsck", "--strict", "--no-dangling")
