"""A repository's own metadata (``.git``) is the user's: a hook or a config written there runs at
the user's next git command, outside every sandbox. The doer's file tools refuse to write it, and
a sandboxed command sees it read-only (it may still read the history)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from roles.loop_agent.commands import SubprocessRunner
from roles.loop_agent.tools import ToolLimits, WorkspaceTools
from roles.workbench.sandbox import BwrapRunner, bubblewrap, default_hidden, default_visible

pytestmark = pytest.mark.timeout(60)
needs_bwrap = pytest.mark.skipif(bubblewrap() is None, reason="bubblewrap (bwrap) is not installed")


def _repo(ws: Path) -> Path:
    ws.mkdir(parents=True)
    (ws / "app.py").write_text("x = 1\n")
    env = {"GIT_CONFIG_NOSYSTEM": "1", "HOME": str(ws.parent), "PATH": "/usr/bin:/bin"}
    for argv in (["init", "-q"], ["add", "app.py"],
                 ["-c", "user.name=u", "-c", "user.email=u@x", "commit", "-qm", "one"]):
        subprocess.run(["git", "-C", str(ws), *argv], check=True, env=env)
    return ws


@pytest.mark.parametrize("path", [".git/hooks/post-checkout", ".git/config", "vendor/lib/.git/config",
                                  ".git", "sub/.git"])
def test_the_file_tools_refuse_to_write_a_repositorys_own_metadata(tmp_path, path):
    ws = _repo(tmp_path / "ws")
    config = (ws / ".git" / "config").read_text()
    tools = WorkspaceTools(ws, SubprocessRunner(), ToolLimits())
    for name, args in (("write_file", {"path": path, "content": "[core]\n\tfsmonitor = touch /tmp/pwned\n"}),
                       ("edit_file", {"path": path, "old_string": "[core]", "new_string": "[core]\n\thooksPath = x"})):
        result = tools.call(name, args)
        assert result.is_error and result.code == "path_protected", (name, result)
    assert (ws / ".git" / "config").read_text() == config
    assert not (ws / ".git" / "hooks" / "post-checkout").exists()
    assert tools.call("read_file", {"path": ".git/HEAD"}).is_error is False      # reading stays open
    assert not tools.call("write_file", {"path": "app.py", "content": "x = 2\n"}).is_error
    assert not tools.call("write_file", {"path": "gitnotes/.gitkeep", "content": ""}).is_error


@needs_bwrap
def test_a_sandboxed_command_reads_the_history_and_cannot_change_it(tmp_path):
    ws = _repo(tmp_path / "org" / "demo" / "ws")
    hooks = ws / ".git" / "hooks"
    before = sorted(p.name for p in hooks.iterdir())
    config = (ws / ".git" / "config").read_text()
    r = BwrapRunner(ws, hide=default_hidden(tmp_path / "org"), readonly_binds=default_visible())
    got = r.run("echo 'touch /tmp/pwned' > .git/hooks/post-checkout; chmod +x .git/hooks/post-checkout; "
                "git config core.fsmonitor 'touch /tmp/pwned'; echo '[alias]' >> .git/config; "
                "git log --format=%s; echo y > app.py && echo WROTE-WORKSPACE", ws, 20, 20_000)
    assert "one" in got.output.splitlines(), got.output                 # the history reads
    assert "WROTE-WORKSPACE" in got.output and (ws / "app.py").read_text() == "y\n"
    assert sorted(p.name for p in hooks.iterdir()) == before, got.output
    assert (ws / ".git" / "config").read_text() == config, got.output
