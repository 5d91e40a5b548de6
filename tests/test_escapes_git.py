"""Host git never runs what a doer stored in a repository (issue 15).

The doer's commands can write anything in the workspace: its ``.git/config`` and hooks, a
``.gitattributes``, a repository nested below it. Each test plants one payload that touches a
marker file when git runs it, proves the payload is live (plain git on a copy of the repository
runs it), then runs the org's real operations on the repository — ``submit --worktree`` and the
shadow history's baseline, checkpoint, diff, materialize and reset — and checks the marker was
never written and the operations still did their job.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from roles.operations.submit import SubmitError, SubmitRequest, submit
from roles.workbench.workspace.history import WorkspaceHistory
from state_db.bootstrap import init_home
from state_db.kernel.home import OrgHome
from state_db.queries.work import Caps

pytestmark = pytest.mark.timeout(30)

FILES = {"a.txt": "alpha\n", "d/b.txt": "beta\n", ".gitattributes": "* filter=x diff=x\n"}


def plain_git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Git as a user runs it: the repository's own configuration applies (the host's does not)."""
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": os.devnull, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=20)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


class Plant:
    """One hostile repository under ``root``: ``ws`` holds it, ``marks`` the markers its
    payloads touch, ``pay`` the payload program (``pay NAME [FILE]``)."""

    def __init__(self, root: Path) -> None:
        self.root, self.ws, self.marks = root, root / "ws", root / "marks"
        self.marks.mkdir()
        self.pay = root / "pay"
        self.pay.write_text(textwrap.dedent(f"""\
            #!/bin/sh
            touch "{self.marks}/pwned-$1"
            case "$1" in
              textconv) cat "$2" ;;
              smudge|clean) cat ;;
            esac
            exit 0
            """))
        self.pay.chmod(0o755)
        self.ws.mkdir()
        for name, text in FILES.items():
            (self.ws / name).parent.mkdir(parents=True, exist_ok=True)
            (self.ws / name).write_text(text)
        plain_git(self.ws, "init", "-q", "-b", "main")
        plain_git(self.ws, "add", "-A")
        plain_git(self.ws, "commit", "-qm", "start")

    def cmd(self, name: str) -> str:
        return f"{self.pay} {name}"

    def config(self, key: str, value: str, repo: Path | None = None) -> None:
        plain_git(repo or self.ws, "config", key, value)

    def hook(self, name: str, hooks: Path | None = None) -> None:
        hooks = hooks or self.ws / ".git" / "hooks"
        hooks.mkdir(parents=True, exist_ok=True)
        (hooks / name).write_text(f"#!/bin/sh\n{self.pay} {name}\n")
        (hooks / name).chmod(0o755)

    def fired(self) -> list[str]:
        return sorted(p.name.removeprefix("pwned-") for p in self.marks.iterdir())

    def control(self, *commands: tuple[str, ...]) -> list[str]:
        """Run plain git ``commands`` on a copy of the repository with one file edited; the
        markers they wrote (cleared again, so the org's operations start with none)."""
        copy = self.root / "control"
        shutil.copytree(self.ws, copy, symlinks=True)
        (copy / "a.txt").write_text("ALPHA\n")
        for args in commands:
            plain_git(copy, *args, check=False)
        seen = self.fired()
        for mark in self.marks.iterdir():
            mark.unlink()
        shutil.rmtree(copy)
        return seen


WORKTREE_ADD = ("worktree", "add", "-q", "-b", "control", "../control-wt")


@dataclass(frozen=True)
class Payload:
    """What a doer plants: ``config`` keys of the workspace repository (``{pay}`` is the payload
    program, ``{root}`` the test's folder, ``{cfg}`` a config file that names a hooks folder of
    its own and a fsmonitor), ``hooks`` in ``.git/hooks``; ``control`` are plain git commands
    that run it, writing at least the markers ``fires``."""

    name: str
    fires: frozenset[str]
    config: tuple[tuple[str, str], ...] = ()
    hooks: tuple[str, ...] = ()
    control: tuple[tuple[str, ...], ...] = (WORKTREE_ADD,)

    def plant(self, p: Plant) -> None:
        hooks = p.root / "cfg-hooks"
        p.hook("post-checkout", hooks)
        cfg = p.root / "payload.cfg"
        cfg.write_text(f"[core]\n\thooksPath = {hooks}\n\tfsmonitor = {p.pay} cfg-fsmonitor\n")
        for key, value in self.config:
            p.config(key.format(root=p.root), value.format(pay=p.pay, cfg=cfg))
        for name in self.hooks:
            p.hook(name)


PAYLOADS = [
    Payload("post_checkout_hook", frozenset({"post-checkout"}), hooks=("post-checkout",)),
    Payload("other_hooks", frozenset({"pre-commit", "post-commit", "reference-transaction", "post-index-change"}),
            hooks=("pre-commit", "post-commit", "reference-transaction", "post-index-change"),
            control=(WORKTREE_ADD, ("commit", "-q", "--allow-empty", "-m", "x"))),
    Payload("fsmonitor", frozenset({"fsmonitor"}), config=(("core.fsmonitor", "{pay} fsmonitor"),)),
    Payload("filter_smudge_clean", frozenset({"smudge", "clean"}),
            config=(("filter.x.smudge", "{pay} smudge"), ("filter.x.clean", "{pay} clean")),
            control=(WORKTREE_ADD, ("add", "-A"))),
    Payload("filter_process", frozenset({"process"}), config=(("filter.x.process", "{pay} process"),)),
    Payload("textconv_and_diff_driver", frozenset({"textconv", "diffcmd"}),
            config=(("diff.x.textconv", "{pay} textconv"), ("diff.x.command", "{pay} diffcmd")),
            control=(("show", "HEAD"), ("diff",))),
    Payload("include", frozenset({"post-checkout", "cfg-fsmonitor"}), config=(("include.path", "{cfg}"),)),
    Payload("include_if_gitdir", frozenset({"post-checkout", "cfg-fsmonitor"}),
            config=(("includeIf.gitdir:{root}/.path", "{cfg}"),)),
    Payload("ssh_command", frozenset({"ssh"}),
            config=(("core.sshCommand", "{pay} ssh"), ("remote.origin.url", "ssh://git@example.invalid/r.git")),
            control=(("fetch", "-q", "origin"),)),
    Payload("alias", frozenset({"alias"}),
            config=(("alias.worktree", "!{pay} alias"), ("alias.co", "!{pay} alias")),
            control=(WORKTREE_ADD, ("co",))),
]


@pytest.fixture(scope="module")
def org(tmp_path_factory):
    root = tmp_path_factory.mktemp("org")
    home = OrgHome(root / "org")
    cfg, _ = init_home(home)
    return home, cfg


def submit_worktree(org, ws: Path) -> dict:
    home, cfg = org
    # no run starts here: the command backend only spares the anthropic backend's key check
    return submit(home, cfg, SubmitRequest(goal="g", workspace=str(ws), verify=["true"],
                                           caps=Caps(max_iterations=1), worktree=True, backend="command"))


def assert_worktree(ws: Path, item: dict) -> None:
    """The worktree holds the committed files on branch loop-org/<id> at the workspace's HEAD."""
    import pygit2

    dest = Path(item["workspace"])
    assert item["branch"] == f"loop-org/{item['id']}"
    for name, text in FILES.items():
        assert (dest / name).read_text() == text
    repo = pygit2.Repository(str(ws))
    assert repo.branches.local[item["branch"]].target == repo.head.target
    linked = pygit2.Repository(str(dest))
    assert linked.head.name == f"refs/heads/{item['branch']}" and not linked.head_is_detached
    gitdir = (dest / ".git").read_text().removeprefix("gitdir:").strip()
    assert Path(gitdir) == ws / ".git" / "worktrees" / item["id"]


def run_history(workspace: Path, git_dir: Path, snap: Path) -> None:
    """Every shadow-history operation that hands a workspace to git; the workspace's own
    ``.git`` (a folder, or a worktree's file) comes out as it went in."""
    dot_git = workspace / ".git"
    before = dot_git.read_bytes() if dot_git.is_file() else sorted(os.listdir(dot_git))
    history = WorkspaceHistory(git_dir, workspace)
    base = history.baseline()
    (workspace / "a.txt").write_text("changed by the doer\n")
    (workspace / "new.txt").write_text("new\n")
    first = history.checkpoint(1)
    assert "changed by the doer" in history.diff(base, first)
    history.materialize(first, snap)
    assert (snap / "a.txt").read_text() == "changed by the doer\n"
    history.reset_to(base)
    assert (workspace / "a.txt").read_text() == FILES["a.txt"] and not (workspace / "new.txt").exists()
    assert before == (dot_git.read_bytes() if dot_git.is_file() else sorted(os.listdir(dot_git)))


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda payload: payload.name)
def test_payload_in_the_workspace_repository_never_runs(payload, org, tmp_path):
    """Plain git runs the payload; submit --worktree and the shadow history never do."""
    p = Plant(tmp_path)
    payload.plant(p)
    live = set(p.control(*payload.control))
    assert payload.fires <= live, "the payload must be live for this test to mean anything"

    item = submit_worktree(org, p.ws)
    assert p.fired() == []
    assert_worktree(p.ws, item)
    run_history(p.ws, tmp_path / "h.git", tmp_path / "snap")
    run_history(Path(item["workspace"]), tmp_path / "h2.git", tmp_path / "snap2")
    assert p.fired() == []


def nested_repository(p: Plant) -> Path:
    """A repository nested in the workspace, with hooks, fsmonitor and a filter of its own."""
    sub = p.ws / "sub"
    sub.mkdir()
    (sub / "s.txt").write_text("sub\n")
    (sub / ".gitattributes").write_text("* filter=y\n")
    plain_git(sub, "init", "-q", "-b", "main")
    plain_git(sub, "add", "-A")
    plain_git(sub, "commit", "-qm", "sub")
    for name in ("post-index-change", "reference-transaction", "post-checkout"):
        p.hook(name, sub / ".git" / "hooks")
    p.config("core.fsmonitor", p.cmd("fsmonitor"), repo=sub)
    p.config("filter.y.clean", p.cmd("clean"), repo=sub)
    p.config("filter.y.smudge", p.cmd("smudge"), repo=sub)
    return sub


def stage_twice_as_before(p: Plant) -> None:
    """What the shadow history ran before: ``add --all`` into a private index, twice."""
    shadow = p.root / "control.git"
    plain_git(p.root, "init", "-q", "--bare", str(shadow))
    for _ in range(2):
        plain_git(p.root, f"--git-dir={shadow}", f"--work-tree={p.ws}", "add", "--all", "--force")
        later = os.stat(p.ws / "sub" / "s.txt").st_mtime + 5
        os.utime(p.ws / "sub" / "s.txt", (later, later))
    shutil.rmtree(shadow)


def test_nested_repository_payloads_never_run_in_the_shadow_history(tmp_path):
    """Staging a workspace that holds a nested repository runs nothing of that repository."""
    p = Plant(tmp_path)
    sub = nested_repository(p)
    stage_twice_as_before(p)
    assert {"fsmonitor", "clean", "post-index-change"} <= set(p.fired())
    for mark in p.marks.iterdir():
        mark.unlink()

    history = WorkspaceHistory(tmp_path / "h.git", p.ws)
    base = history.baseline()
    for n in (1, 2):  # the second checkpoint finds the nested repository in its index
        (p.ws / "a.txt").write_text(f"change {n}\n")
        later = os.stat(sub / "s.txt").st_mtime + 5
        os.utime(sub / "s.txt", (later, later))
        last = history.checkpoint(n)
    recorded = plain_git(tmp_path, f"--git-dir={history.git_dir}", "ls-tree", last, "sub").stdout
    assert recorded.startswith("160000 commit ") and history.changed_paths(base, last) == ["a.txt"]
    history.materialize(last, tmp_path / "snap")
    history.reset_to(base)
    assert p.fired() == []


def test_worktree_is_a_working_checkout_of_a_new_branch(org, tmp_path):
    """The worktree git sees: on loop-org/<id>, clean, listed by the repository."""
    p = Plant(tmp_path)
    item = submit_worktree(org, p.ws)
    assert_worktree(p.ws, item)
    dest = Path(item["workspace"])
    assert plain_git(dest, "status", "--porcelain").stdout == ""
    assert plain_git(dest, "rev-parse", "--abbrev-ref", "HEAD").stdout.strip() == item["branch"]
    assert str(dest) in plain_git(p.ws, "worktree", "list").stdout


def test_worktree_of_a_folder_that_is_no_repository_is_refused(org, tmp_path):
    with pytest.raises(SubmitError) as err:
        submit_worktree(org, tmp_path)
    assert err.value.code == "not_a_repository" and "git init" in err.value.hint


def test_worktree_of_a_repository_without_a_commit_is_refused(org, tmp_path):
    plain_git(tmp_path, "init", "-q")
    with pytest.raises(SubmitError) as err:
        submit_worktree(org, tmp_path)
    assert err.value.code == "no_commit"
