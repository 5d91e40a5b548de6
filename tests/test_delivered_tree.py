"""At goal_met the workspace holds the verified tree byte for byte: the doer's changes outside the
scope are kept apart (refs/held/<n>), caches and nested repositories the doer made are gone, and a
content comparison — not a stat — proves it."""
from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest

from roles.workbench.workspace.delivered import deliver, differences
from roles.workbench.workspace.history import WorkspaceHistory

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def ws(tmp_path) -> Path:
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "__init__.py").write_text("")
    (ws / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    (ws / "data.json").write_text("[1]\n")
    return ws


def _hist(tmp_path, ws) -> WorkspaceHistory:
    return WorkspaceHistory(tmp_path / "org" / "history" / "w.git", ws)


def test_delivery_keeps_the_out_of_scope_changes_apart_and_proves_the_tree(tmp_path, ws):
    hist = _hist(tmp_path, ws)
    base = hist.baseline()
    (ws / "pkg" / "mod.py").write_text("def f():\n    return 2\n")          # in scope
    (ws / "data.json").write_text("[2]\n")                                  # out of scope
    (ws / "notes.txt").write_text("mine\n")                                 # out of scope
    nested = ws / "pkg" / "vendored"
    subprocess.run(["git", "init", "-q", str(nested)], check=True)
    (nested / "evil.py").write_text("x = 1\n")
    c1 = hist.checkpoint(1)
    verified = hist.derive(c1, {"data.json": hist.entries(base)["data.json"], "notes.txt": None,
                                "pkg/vendored": None}, "verified")
    # compiled code planted after the checkpoint, in a cache the history never records
    (ws / "pkg" / "__pycache__").mkdir()
    (ws / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\x00planted")
    got = deliver(hist, verified, 1)
    assert got.proved and got.differs == ()
    assert set(got.held_paths) == {"data.json", "notes.txt", "pkg/vendored/evil.py"}
    assert (ws / "pkg" / "mod.py").read_text().endswith("return 2\n") and (ws / "data.json").read_text() == "[1]\n"
    assert not (ws / "notes.txt").exists() and not (ws / "pkg" / "__pycache__").exists() and not nested.exists()
    patch = hist.diff(verified, got.held)
    assert "notes.txt" in patch and "+[2]" in patch
    assert got.removed == ("pkg/__pycache__/mod.cpython-311.pyc", "pkg/vendored/")   # never recorded: named
    # once: the same result again, with nothing left to take out
    assert deliver(hist, verified, 1) == dataclasses.replace(got, removed=())


def test_the_comparison_reads_content_not_stat(tmp_path, ws):
    hist = _hist(tmp_path, ws)
    base = hist.baseline()
    target = ws / "pkg" / "mod.py"
    st = os.stat(target)
    target.write_text("def f():\n    return 9\n")                           # same size
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert differences(ws, hist._repo, hist.tree_id(base)) == ["pkg/mod.py"]
    os.chmod(target, 0o755)
    (ws / "extra.py").write_text("")
    os.mkfifo(ws / "pipe")
    assert differences(ws, hist._repo, hist.tree_id(base)) == ["extra.py", "pipe", "pkg/mod.py"]
    (ws / "data.json").unlink()
    assert "data.json" in differences(ws, hist._repo, hist.tree_id(base))


def test_a_change_inside_a_repository_nested_at_the_baseline_is_seen(tmp_path, ws):
    """The history records a nested repository as its HEAD only: a file the doer changes in its
    work tree after the baseline is found by its ctime, which the writer cannot set back."""
    import time

    nested = ws / "vendor" / "lib"
    subprocess.run(["git", "init", "-q", str(nested)], check=True)
    (nested / "mod.py").write_text("x = 1\n")
    git = ["git", "-C", str(nested), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    hist = _hist(tmp_path, ws)
    hist.baseline()
    time.sleep(2.1)                                 # past the baseline's second
    c1 = hist.checkpoint(1)
    (nested / "__pycache__").mkdir()
    (nested / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"cache")   # a test run's cache: not a change
    assert hist.nested_touched(c1) == []            # the control: untouched
    st = os.stat(nested / "mod.py")
    (nested / "mod.py").write_text("x = 2\n")
    os.utime(nested / "mod.py", ns=(st.st_atime_ns, st.st_mtime_ns))     # mtime put back; ctime cannot be
    c2 = hist.checkpoint(2)
    assert hist.tree_id(c1) == hist.tree_id(c2)     # the history cannot tell
    assert hist.nested_touched(c2) == ["vendor/lib/mod.py"]


def test_a_host_without_the_verified_commit_makes_the_same_tree_again(tmp_path, ws):
    """The eval-agent may verify on another host: the verdict's list of what was held makes the
    same tree here (and a part-rewritten file, which cannot be made again, says so)."""
    from roles.eval_agent.scope import Scope, construct
    from roles.workbench.workspace.delivered import rebuild
    hist = _hist(tmp_path, ws)
    base = hist.baseline()
    (ws / "pkg" / "mod.py").write_text("def f():\n    return 2\n")
    (ws / "data.json").write_text("[2]\n")
    (ws / "notes.txt").write_text("mine\n")
    c1 = hist.checkpoint(1)
    built = construct(hist.entries(base), hist.entries(c1), scope=Scope(), protected=[], commands=["pytest"],
                      read_base=lambda p: hist.read_path(base, p), read_target=lambda p: hist.read_path(c1, p))
    there = hist.derive(c1, built.edits, "verified")
    here = rebuild(hist, c1, [h.encode() for h in built.held], 1)
    assert hist.tree_id(here) == hist.tree_id(there) != hist.tree_id(c1)
    assert rebuild(hist, c1, [{"path": "x", "kind": "mixed_config", "treatment": "sections"}], 1) is None


def test_what_the_runtime_would_load_beside_the_verified_tree_is_taken_out_and_named(tmp_path, ws):
    """An unchecked compiled cache that keeps the old code and a repository the doer nested (with a
    commit: the history records its HEAD only) are what the user's interpreter loads before the
    verified source; delivery takes them out, names them in the proof, and the interpreter then
    runs the verified code."""
    import py_compile
    import sys

    hist = _hist(tmp_path, ws)
    hist.baseline()
    (ws / "pkg" / "mod.py").write_text("try:\n    from pkg.impl import f\nexcept ImportError:\n"
                                       "    def f():\n        return 2\n")
    nested = ws / "pkg" / "impl"
    nested.mkdir()
    (nested / "__init__.py").write_text("def f():\n    return 1\n")
    git = ["git", "-C", str(nested), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(nested)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    (ws / "old.py").write_text("def f():\n    return 1\n")
    (ws / "pkg" / "__pycache__").mkdir()
    pyc = f"pkg/__pycache__/mod.{sys.implementation.cache_tag}.pyc"
    py_compile.compile(str(ws / "old.py"), cfile=str(ws / pyc), dfile="pkg/mod.py",
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    (ws / "old.py").unlink()
    c1 = hist.checkpoint(1)
    assert hist.entries(c1)["pkg/impl"][0] == 0o160000        # a gitlink: its files are not recorded

    def runs() -> str:
        return subprocess.run([sys.executable, "-c", "from pkg.mod import f; print(f())"], cwd=ws,
                              capture_output=True, text=True, timeout=30, check=True).stdout.strip()

    assert runs() == "1"                                       # what the user would get without delivery
    verified = hist.derive(c1, {"pkg/impl": None}, "verified")
    got = deliver(hist, verified, 1)
    assert got.proved and got.held_paths == ("pkg/impl",)
    assert got.removed == (pyc, "pkg/impl/")
    assert got.encode()["removed"] == got.removed
    assert runs() == "2"                                       # the verified code, and nothing else
    from scripts.cli.commands.show import delivered_lines
    lines = delivered_lines({"id": "w", "delivered": got.encode()})
    assert lines[-1] == f"taken out (never recorded, so never verified): {pyc}, pkg/impl/"


def test_compiled_code_planted_in_a_repository_nested_at_the_baseline_is_taken_out(tmp_path, ws):
    """The user's own nested checkout is left as it is, but for its build caches: an unchecked
    compiled module there is what the interpreter loads instead of the checkout's source."""
    import py_compile
    import sys

    nested = ws / "vendor"
    nested.mkdir()
    (nested / "__init__.py").write_text("")
    (nested / "lib.py").write_text("def g():\n    return 'source'\n")
    git = ["git", "-C", str(nested), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(nested)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    hist = _hist(tmp_path, ws)
    hist.baseline()
    (tmp_path / "planted.py").write_text("def g():\n    return 'planted'\n")
    pyc = f"vendor/__pycache__/lib.{sys.implementation.cache_tag}.pyc"
    (ws / "vendor" / "__pycache__").mkdir()
    py_compile.compile(str(tmp_path / "planted.py"), cfile=str(ws / pyc), dfile="vendor/lib.py",
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)

    def runs() -> str:
        return subprocess.run([sys.executable, "-c", "from vendor.lib import g; print(g())"], cwd=ws,
                              capture_output=True, text=True, timeout=30, check=True).stdout.strip()

    assert runs() == "planted"
    c1 = hist.checkpoint(1)
    assert "vendor/__pycache__/" in differences(ws, hist._repo, hist.tree_id(c1))
    got = deliver(hist, c1, 1)
    assert got.proved and got.removed == ("vendor/__pycache__/",)
    assert runs() == "source" and (nested / "lib.py").exists() and (nested / ".git").is_dir()
