"""The git executable, run with a clean environment against the shadow repository.

The history answers most calls in-process (``objects``, ``refs``, ``scan``, ``checkout``); git
creates the repository, renders diffs and handles what the in-process path refuses.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Callable, Sequence

from roles.workspace import safegit
from roles.workspace.errors import GitFailed, GitMissing, WorkspaceMissing

# Repository settings that keep a checkpoint proportional to what changed, and keep user or
# system configuration (hooks, autocrlf, fsmonitor daemons, excludes) out of the picture. The
# workspace is the doer's: every command also runs with ``safegit``'s environment and ``-c``
# settings, which outrank this file and reach the git processes git starts itself.
REPO_CONFIG = (
    ("core.untrackedCache", "true"),
    ("core.fsmonitor", "false"),
    ("core.autocrlf", "false"),
    ("core.safecrlf", "false"),
    ("core.symlinks", "true"),
    ("core.fileMode", "true"),
    ("core.quotePath", "false"),
    ("core.logAllRefUpdates", "always"),
    ("gc.auto", "0"),
    ("index.version", "4"),
    # Writing a fresh snapshot is I/O bound: parallel workers help even on 2 cores.
    ("checkout.workers", "4"),
    ("advice.addEmbeddedRepo", "false"),
    ("commit.gpgSign", "false"),
)

IDENTITY = {"GIT_AUTHOR_NAME": "loop-org", "GIT_AUTHOR_EMAIL": "loop-org@localhost",
            "GIT_COMMITTER_NAME": "loop-org", "GIT_COMMITTER_EMAIL": "loop-org@localhost"}


class GitCli:
    """Runs ``git --git-dir=<git_dir>`` with no user or system configuration, no hook, no
    fsmonitor and no transport (``safegit``).

    Args:
        git_dir: the repository.
        exe: the git executable.
    """

    def __init__(self, git_dir: Path, exe: str = "git") -> None:
        self.git_dir = git_dir
        self.exe = exe
        self._env: dict[str, str] | None = None
        self.before_run: Callable[[], None] | None = None

    @property
    def env(self) -> dict[str, str]:
        """The environment git runs with (built on first use: the steady state runs no git)."""
        if self._env is None:
            self._env = safegit.environment(**IDENTITY)
        return self._env

    def run(
        self,
        args: Sequence[str],
        *,
        work_tree: Path | None = None,
        input: bytes | None = None,
        env: dict[str, str] | None = None,
        ok: tuple[int, ...] = (0,),
        git_dir: Path | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run one git command. Raises: GitMissing, WorkspaceMissing, GitFailed."""
        if self.before_run is not None:
            self.before_run()  # e.g. write deferred refs out: git must see the current ones
        cmd = [self.exe, *safegit.CONFIG_ARGS, f"--git-dir={git_dir or self.git_dir}"]
        if work_tree is not None:
            cmd.append(f"--work-tree={work_tree}")
        try:
            proc = subprocess.run(cmd + list(args), input=input, capture_output=True,
                                  env=env or self.env, cwd=work_tree or "/")
        except FileNotFoundError as exc:
            if work_tree is not None and not work_tree.is_dir():
                raise WorkspaceMissing(f"workspace {work_tree} does not exist") from exc
            raise GitMissing(
                f"git executable {self.exe!r} not found; install git to record workspaces"
            ) from exc
        if proc.returncode not in ok:
            raise GitFailed(args, proc.returncode, proc.stderr.decode("utf-8", "replace"))
        return proc

    def out(self, args: Sequence[str], **kw) -> str:
        return self.run(args, **kw).stdout.decode("utf-8", "surrogateescape").strip()

    def init(self, head_ref: str) -> None:
        """Create the bare repository with ``REPO_CONFIG``; atomic (built beside, renamed)."""
        self.git_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.git_dir.with_name(f".{self.git_dir.name}.init-{uuid.uuid4().hex[:8]}")
        try:
            self.run(["init", "--quiet", "--bare"], git_dir=tmp)
            # One write instead of a git process per key: repeated sections are valid git config.
            with open(tmp / "config", "a", encoding="utf-8") as f:
                for key, value in REPO_CONFIG:
                    section, name = key.split(".")
                    f.write(f"[{section}]\n\t{name} = {value}\n")
            self.run(["symbolic-ref", "HEAD", head_ref], git_dir=tmp)
            # Every fan-out directory now, once: creating one costs as much as a few loose
            # objects on a journaling filesystem, and would otherwise land on the checkpoints
            # of a young history, one in two of them.
            for n in range(256):
                os.mkdir(tmp / "objects" / f"{n:02x}")
            try:
                os.rename(tmp, self.git_dir)
            except OSError:
                if not (self.git_dir / "HEAD").exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
