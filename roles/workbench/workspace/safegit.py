"""Git on repositories a doer could have written, done so that nothing stored in them runs.

A doer's commands run in the sandbox with the workspace writable, so everything under a
workspace is the doer's: its ``.git/config``, ``.git/hooks``, ``.gitattributes`` and any
repository nested below it. Git executes what a repository's configuration names — hooks,
``core.fsmonitor``, filter drivers (``filter.<x>.clean``/``smudge``/``process``), diff drivers
(``diff.<x>.textconv``/``command``), ``core.sshCommand``, pagers and editors, aliases — and it
reads whatever files ``[include]`` and ``[includeIf]`` point at. The org runs git outside the
sandbox (as root on a typical host), so any of these would be host code execution.

Git always reads ``$GIT_DIR/config`` with its includes and has no switch to ignore it; ``-c``
can override a key it knows, not the filter or diff driver a doer names. So the org never runs
the git executable on such a repository. Every repository it touches is read and written with
libgit2 (pygit2): the user's own (``open_repository``, ``add_worktree``) and the shadow history
of a workspace (``shadow``), which reads the workspace's files, its ``.gitattributes`` and the
repositories nested in it. libgit2 runs no hook, no fsmonitor, no filter, textconv or diff
driver, no alias, no pager or editor, and no transport unless asked to fetch or push; it reads a
repository's configuration as data only and applies only git's built-in conversions (``text``,
``eol``, ``ident``). Its global, XDG and system levels and its home directory are pointed at
nothing (``libgit2``), so only a repository's own settings count.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

from roles.workbench.workspace.errors import RepositoryError

if TYPE_CHECKING:
    import pygit2


@functools.cache
def libgit2() -> "pygit2":
    """pygit2 with every configuration level but the repository's own pointed at nothing, for
    the whole process: the org never wants a user's or the system's git configuration.
    Imported on first use: most org commands never open a user's repository."""
    import pygit2
    from pygit2.enums import ConfigLevel

    for level in (ConfigLevel.PROGRAMDATA, ConfigLevel.SYSTEM, ConfigLevel.XDG, ConfigLevel.GLOBAL):
        pygit2.settings.search_path[level] = ""
    pygit2.settings.homedir = os.devnull  # ~ in an include path leads nowhere
    # The org writes objects only into its own shadow repositories, always the objects first and
    # then what names them: libgit2's check that every entry of a new tree exists (it reads each
    # one back, a whole tree's worth per checkpoint) proves nothing here.
    pygit2.settings.enable_strict_object_creation(False)
    return pygit2


def open_repository(path: Path) -> "pygit2.Repository":
    """Open the repository ``path`` belongs to (``path`` or a parent of it) with libgit2.

    Raises:
        RepositoryError(code="not_a_repository"): no repository contains ``path``.
        RepositoryError(code="repository_not_owned"): it belongs to another user (git's own
            ownership rule; the org never trusts such a repository).
    """
    pygit2 = libgit2()
    found = pygit2.discover_repository(str(path))
    if found is None:
        raise RepositoryError(f"{path} is not in a git repository", code="not_a_repository",
                              hint="run 'git init' and commit there first")
    try:
        return pygit2.Repository(found)
    except pygit2.GitError as exc:
        if "not owned by current user" in str(exc):
            raise RepositoryError(f"the repository at {found} belongs to another user",
                                  code="repository_not_owned",
                                  hint="submit as the repository's owner") from None
        raise RepositoryError(f"cannot open the repository at {found}: {exc}",
                              hint="check it with 'git status' there") from None


def add_worktree(workspace: Path, dest: Path, branch: str) -> None:
    """Create branch ``branch`` at the current commit of ``workspace``'s repository and a
    linked worktree of it at ``dest``, its admin directory named after ``dest``; as
    ``git worktree add -b BRANCH DEST`` does, with nothing stored in the repository run.

    Raises:
        RepositoryError: ``open_repository``'s codes, ``no_commit`` (nothing to branch from),
            ``worktree_failed`` (the branch or the worktree could not be made; the branch is
            removed again).
    """
    repo = open_repository(workspace)
    pygit2 = libgit2()
    try:
        commit = repo.head.peel(pygit2.Commit)
    except (pygit2.GitError, KeyError, ValueError):
        raise RepositoryError(f"the repository of {workspace} has no commit to branch from",
                              code="no_commit", hint="commit once, or drop --worktree") from None
    try:
        ref = repo.branches.local.create(branch, commit)
    except (pygit2.GitError, ValueError) as exc:
        raise RepositoryError(f"cannot create branch {branch}: {exc}", code="worktree_failed",
                              hint="check the repository with 'git status'") from None
    try:
        repo.add_worktree(dest.name, str(dest), ref)
    except (pygit2.GitError, ValueError, OSError) as exc:
        ref.delete()
        raise RepositoryError(f"cannot create a worktree at {dest}: {exc}", code="worktree_failed",
                              hint="check that the folder is free and the repository is writable") from None
