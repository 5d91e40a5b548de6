"""The running loop's history (``WorkspaceHistory(defer=True)``): its checkpoints are git's own
commits, each named by its own ref, the moment they are recorded; its index (the stat cache) is
written out now and then and its branch when the run stops; a kill -9 at any moment leaves a history git accepts and the next run reads."""
from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from roles.workbench.workspace import shadow
from roles.workbench.workspace.history import HEAD_REF, WorkspaceHistory, iteration_ref
from tests.test_history_fast import GIT_ENV, files_of, git, git_tree_of

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def ws(tmp_path) -> Path:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (ws / "README").write_text("r\n")
    return ws


def _in_child(code: str) -> str:
    """Run ``code`` in a fresh Python process (as another role would) and return its stdout."""
    full = f"import sys; sys.path.insert(0, {str(ROOT)!r})\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", full], capture_output=True, text=True, timeout=30,
                          check=True).stdout


def _fsck(git_dir: Path) -> None:
    """``git fsck --full --strict`` accepts the history (objects no ref names are fine)."""
    proc = subprocess.run(["git", "--git-dir", str(git_dir), "fsck", "--full", "--strict", "--no-dangling"],
                          env=GIT_ENV, capture_output=True, text=True)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_a_running_loops_checkpoints_are_gits_own_at_once(tmp_path, ws):
    writer = WorkspaceHistory(tmp_path / "h.git", ws, defer=True)
    gd = ["--git-dir", str(writer.git_dir)]
    base = writer.baseline()
    commits = []
    for n in (1, 2, 3):
        (ws / "src" / "calc.py").write_text(f"def add(a, b):\n    return a + b  # {n}\n")
        commits.append(writer.checkpoint(n))
        # git's own files, before anything is written out
        assert git(*gd, "cat-file", "-t", commits[-1]).strip() == "commit"
        assert git(*gd, "rev-parse", iteration_ref(n)).strip() == commits[-1]
    # each checkpoint's parent is the one before; the branch moves when the run stops
    assert git(*gd, "rev-list", commits[-1]).split() == [*reversed(commits), base]
    assert git(*gd, "rev-parse", HEAD_REF).strip() == base
    _fsck(writer.git_dir)
    # another process (the eval-agent, org diff) reads them, with the writer's index not yet out
    out = _in_child(f"""
        from pathlib import Path
        from roles.workbench.workspace.history import WorkspaceHistory
        h = WorkspaceHistory(Path({str(writer.git_dir)!r}), Path({str(ws)!r}))
        print(h.iteration_commit(2), h.fingerprint_of_workspace(), h.changed_paths({commits[0]!r}, {commits[1]!r}))
        h.materialize({commits[-1]!r}, Path({str(tmp_path / "snap")!r}))
    """).split()
    assert out[:2] == [commits[1], git_tree_of(ws, tmp_path)] and "src/calc.py" in out[2]
    assert files_of(tmp_path / "snap") == files_of(ws)
    assert b"+    return a + b  # 3" in writer.diff_bytes(base, commits[-1])
    writer.flush_pending()                  # the run stops: the branch and the index are written out
    assert git(*gd, "rev-list", HEAD_REF).split() == [*reversed(commits), base]
    assert "loop-org: checkpoints of the run" in git(*gd, "reflog", "show", HEAD_REF)
    (ws / "README").write_text("after the stop\n")
    out = _in_child(f"""
        from pathlib import Path
        from roles.workbench.workspace.history import WorkspaceHistory
        print(WorkspaceHistory(Path({str(writer.git_dir)!r}), Path({str(ws)!r})).fingerprint_of_workspace())
    """)
    assert out.split()[-1] == git_tree_of(ws, tmp_path)


def test_a_killed_deferred_writer_leaves_what_the_next_one_reads(tmp_path, ws):
    git_dir = tmp_path / "h.git"
    code = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from roles.workbench.workspace.history import WorkspaceHistory
        ws = Path({str(ws)!r})
        h = WorkspaceHistory(Path({str(git_dir)!r}), ws, defer=True)
        h.baseline()
        for n in (1, 2):
            (ws / "README").write_text(f"r{{n}}\\n")
            print("checkpoint", h.checkpoint(n), flush=True)
        (ws / "README").write_text("being worked on when the process died\\n")
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    c1, c2 = [ln.split()[1] for ln in proc.stdout.decode().splitlines() if ln.startswith("checkpoint ")]
    _fsck(git_dir)
    shadow.forget(git_dir)                  # what a new process starts with
    restarted = WorkspaceHistory(git_dir, ws, defer=True)
    assert restarted.iteration_commit(2) == c2 and restarted.baseline_commit()
    restarted.reset_to(c2)
    assert (ws / "README").read_text() == "r2\n"
    (ws / "README").write_text("r3\n")
    c3 = restarted.checkpoint(3)
    gd = ["--git-dir", str(git_dir)]
    assert git(*gd, "rev-parse", iteration_ref(1), iteration_ref(2), iteration_ref(3)).split() == [c1, c2, c3]
    assert git(*gd, "rev-parse", f"{c3}^").strip() == c2
    assert restarted.tree_id(c3) == git_tree_of(ws, tmp_path)
    _fsck(git_dir)


_LOOP = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from roles.workbench.workspace.history import WorkspaceHistory
ws = Path({ws!r})
h = WorkspaceHistory(Path({git_dir!r}), ws, defer=True)
h.baseline()
n = {start}
while True:
    for i in range(0, 120, 7):
        (ws / "bulk" / f"f{{(i + n) % 120}}.txt").write_text(f"{{n}}-{{i}}\\n" * 20)
    (ws / "README").write_text(f"iteration {{n}}\\n")
    if n % 3 == 0:
        (ws / "bulk" / f"new{{n}}").mkdir()
        (ws / "bulk" / f"new{{n}}" / "x.txt").write_text("x\\n")
    print(n, h.checkpoint(n), flush=True)
    if n % 4 == 0:
        h.reset_to(h.baseline_commit())   # an attempt cut and its workspace put back
        h.reset_to(h.iteration_commit(n))
    n += 1
"""


def _checkpoint_line(line: str, recorded: dict[int, str]) -> int:
    """Note ``<n> <commit>`` lines (the child's logs go to the same stream)."""
    parts = line.split()
    if len(parts) == 2 and parts[0].isdigit() and len(parts[1]) == 40:
        recorded[int(parts[0])] = parts[1]
        return 1
    return 0


@pytest.mark.timeout(180)
def test_kill_9_at_any_moment_of_a_running_loop_leaves_a_sound_history(tmp_path, ws):
    """A loop-agent killed at random moments (mid-write of objects, refs, the index, a reset):
    after each kill git accepts the history, the next run finds the last checkpoint it recorded
    (and at most one more, with the right parent), and carries on from it."""
    (ws / "bulk").mkdir()
    for i in range(120):
        (ws / "bulk" / f"f{i}.txt").write_text(f"{i}\n" * 20)
    git_dir = tmp_path / "h.git"
    gd = ["--git-dir", str(git_dir)]
    rng = random.Random(17)
    start, recorded = 1, {}
    for _ in range(12):
        code = _LOOP.format(root=str(ROOT), ws=str(ws), git_dir=str(git_dir), start=start)
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            seen = 0
            while seen < 2:                             # a couple of checkpoints, then the kill
                line = proc.stdout.readline()
                assert line, "the loop stopped on its own"
                seen += _checkpoint_line(line, recorded)
            time.sleep(rng.uniform(0, 0.06))
        finally:
            proc.kill()
            proc.wait(timeout=30)
            for line in proc.stdout.read().splitlines():  # printed just before the kill
                _checkpoint_line(line, recorded)
            proc.stdout.close()
        _fsck(git_dir)
        shadow.forget(git_dir)                      # a new process's view
        history = WorkspaceHistory(git_dir, ws, defer=True)
        history.baseline()                          # what a restarted run does first
        last = max(recorded)
        assert history.iteration_commit(last) == recorded[last]
        assert git(*gd, "rev-parse", f"{recorded[last]}^").strip() == (
            recorded.get(last - 1) or history.baseline_commit())
        unprinted = history.iteration_commit(last + 1)   # recorded, killed before it said so
        if unprinted is not None:
            assert git(*gd, "rev-parse", f"{unprinted}^").strip() == recorded[last]
        history.reset_to(recorded[last])
        assert history.fingerprint_of_workspace() == history.tree_id(recorded[last])
        start = last + 1
    assert len(recorded) >= 24
    _fsck(git_dir)
