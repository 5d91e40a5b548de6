"""No content conversion between workspace, history and snapshot: whatever a .gitattributes asks
for (line endings, keyword expansion, filters, encodings), every byte the checks run on is a
byte of the workspace, and a reset gives back the bytes recorded."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from roles.workbench.workspace import shadow
from roles.workbench.workspace.history import WorkspaceHistory

pytestmark = pytest.mark.timeout(60)

# every conversion git knows, asked for by the doer's own attribute files (the top one and a nested one)
ATTRS = ("* text eol=crlf ident working-tree-encoding=UTF-16\n"
         "*.dat filter=lfs diff=lfs merge=lfs -text\n"
         "*.py text eol=lf ident\n")
CONTENT = {
    "mixed.txt": b"unix\nwindows\r\nold mac\rend",
    "keyword.py": b"# $Id$\r\nVALUE = 1\r\n",
    "pointer.dat": b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 12\n",
    "pkg/nested.txt": b"line\r\n$Id: stale $\n",
    "utf8.txt": "héllo\r\n".encode(),
}


def _tree(ws: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(ws):
        for name in filenames:
            p = Path(dirpath, name)
            out[p.relative_to(ws).as_posix()] = p.read_bytes()
    return out


@pytest.fixture
def ws(tmp_path) -> Path:
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / ".gitattributes").write_text(ATTRS)
    (ws / "pkg" / ".gitattributes").write_text("*.txt text eol=crlf ident\n")
    for rel, data in CONTENT.items():
        (ws / rel).write_bytes(data)
    return ws


def test_workspace_history_snapshot_and_reset_hold_the_same_bytes(tmp_path, ws):
    hist = WorkspaceHistory(tmp_path / "org" / "history" / "w.git", ws)
    base = hist.baseline()
    want = _tree(ws)
    for rel, data in CONTENT.items():
        assert hist.read_path(base, rel) == data, rel           # recorded as the workspace holds it
    (ws / "keyword.py").write_bytes(b"# $Id$\r\nVALUE = 2\r\n")
    c1 = hist.checkpoint(1)
    snap = tmp_path / "snap"
    hist.materialize(c1, snap, paths=[])
    assert _tree(snap) == {**want, "keyword.py": b"# $Id$\r\nVALUE = 2\r\n"}
    hist.reset_to(base)
    assert _tree(ws) == want                                    # written back as recorded
    # git itself, on the same repository, sees the same bytes (its info/attributes wins too)
    out = subprocess.run(["git", "--git-dir", str(hist.git_dir), "--work-tree", str(ws), "diff", "--stat", base],
                         capture_output=True, env={"PATH": os.environ["PATH"], "GIT_CONFIG_NOSYSTEM": "1",
                                                   "GIT_CONFIG_GLOBAL": os.devnull}, check=True)
    assert out.stdout == b""


def test_control_without_the_attribute_file_git_converts(tmp_path, ws):
    """The control: the same repository without info/attributes records other bytes than the
    workspace holds (the attack this closes is real)."""
    git_dir = tmp_path / "plain.git"
    shadow.create(git_dir, "refs/heads/checkpoints")
    (git_dir / "info" / "attributes").unlink()
    import pygit2
    repo = pygit2.Repository(str(git_dir))
    repo.workdir = str(ws)
    repo.index.add("mixed.txt")
    assert repo[repo.index["mixed.txt"].id].data != CONTENT["mixed.txt"]


def test_a_history_made_before_keeps_no_conversion(tmp_path, ws):
    """A repository whose info/attributes is missing or was changed gets it back when opened."""
    git_dir = tmp_path / "org" / "history" / "w.git"
    WorkspaceHistory(git_dir, ws).baseline()
    (git_dir / "info" / "attributes").write_text("* text\n")
    shadow.forget(git_dir)
    hist = WorkspaceHistory(git_dir, ws)
    (ws / "mixed.txt").write_bytes(b"a\r\nb\n")
    c1 = hist.checkpoint(1)
    assert hist.read_path(c1, "mixed.txt") == b"a\r\nb\n"
    assert (git_dir / "info" / "attributes").read_bytes() == shadow.ATTRIBUTES
