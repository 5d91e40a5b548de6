"""Git on repositories a doer could have written, run so that nothing stored in them runs.

A doer's commands run in the sandbox with the workspace writable, so everything under a
workspace is the doer's: its ``.git/config``, ``.git/hooks``, ``.gitattributes`` and any
repository nested below it. Git executes what a repository's configuration names — hooks,
``core.fsmonitor``, filter drivers (``filter.<x>.clean``/``smudge``/``process``), diff drivers
(``diff.<x>.textconv``/``command``), ``core.sshCommand``, pagers and editors, aliases — and it
reads whatever files ``[include]`` and ``[includeIf]`` point at. The org runs git outside the
sandbox (as root on a typical host), so any of these would be host code execution.

Git always reads ``$GIT_DIR/config`` with its includes and has no switch to ignore it; ``-c``
can override a key it knows, not the filter or diff driver a doer names. So there are two
ways in, one per kind of repository:

``open_repository`` / ``add_worktree``: the user's repository (the workspace's own) is read and
extended with libgit2 (pygit2), never with the git executable. libgit2 runs no hook, no
fsmonitor, no filter, textconv or diff driver, no alias, no pager or editor, and no transport
unless asked to fetch or push; it reads the repository's configuration as data only. Its
global, XDG and system levels and its home directory are pointed at nothing, so only the
repository's own settings count.

``environment`` + ``CONFIG_ARGS``: the git executable, only ever pointed at a git dir the org
owns (the shadow history: ``GIT_DIR`` in the org home, ``GIT_WORK_TREE`` the workspace). Its own
config is the org's, so no filter or diff driver is defined; what remains reachable is outside
configuration (global, system, the user's home) and repositories nested in the workspace, which
git enters itself (a ``git status`` in each nested repository while staging). ``-c`` settings
travel to those child processes in ``GIT_CONFIG_PARAMETERS`` and outrank every config file, so
they close hooks, fsmonitor and transports there too; the shadow's staging never lets git enter
a nested repository's work tree (``gitpath``), since a filter driver the nested config names
cannot be closed by name.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

from roles.workspace.errors import RepositoryError

if TYPE_CHECKING:
    import pygit2

# (key, value, what it blocks). Command-line settings outrank every config file and include.
CONFIG: tuple[tuple[str, str, str], ...] = (
    ("core.hooksPath", os.devnull,
     "every hook (post-checkout, pre-commit, post-commit, reference-transaction, "
     "post-index-change, ...): git looks for them under a path that cannot hold a file"),
    ("core.fsmonitor", "false",
     "the fsmonitor hook command or daemon git starts to refresh an index"),
    ("core.attributesFile", os.devnull,
     "the user's global attributes file, read even when the global config is not"),
    ("core.sshCommand", "false", "an ssh command named by config"),
    ("protocol.allow", "never",
     "every transport: ssh, ext:: and other remote helpers, proxies, credential helpers"),
    ("submodule.recurse", "false", "descending into a nested repository's own checkout"),
    ("commit.gpgSign", "false", "gpg.program"),
    ("core.pager", "cat", "a pager named by config (output is never a terminal anyway)"),
)

CONFIG_ARGS: tuple[str, ...] = tuple(arg for key, value, _ in CONFIG for arg in ("-c", f"{key}={value}"))

# Environment that outranks config or removes it. HOME and XDG_CONFIG_HOME are /dev/null: no
# file can ever exist below it, where an empty directory could be written to later.
ENV: dict[str, str] = {
    "GIT_CONFIG_NOSYSTEM": "1",       # /etc/gitconfig
    "GIT_CONFIG_GLOBAL": os.devnull,  # ~/.gitconfig and $XDG_CONFIG_HOME/git/config
    "GIT_ATTR_NOSYSTEM": "1",         # /etc/gitattributes
    "HOME": os.devnull,               # ~ in paths, ~/.config/git/{ignore,attributes,credentials}
    "XDG_CONFIG_HOME": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",       # never wait on a prompt
    "GIT_PAGER": "cat",               # outranks core.pager and pager.<cmd>
    "GIT_EDITOR": "true",             # outranks core.editor
    "GIT_SEQUENCE_EDITOR": "true",
}


def environment(**extra: str) -> dict[str, str]:
    """The environment to run the git executable with: the caller's without any ``GIT_*``
    variable (``GIT_DIR``, ``GIT_CONFIG_PARAMETERS``, ``GIT_EXEC_PATH`` ... would redirect it),
    plus ``ENV`` and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(ENV)
    env.update(extra)
    return env


@functools.cache
def _libgit2() -> "pygit2":
    """pygit2 with every configuration level but the repository's own pointed at nothing, for
    the whole process: the org never wants a user's or the system's git configuration.
    Imported on first use: most org commands never open a user's repository."""
    import pygit2
    from pygit2.enums import ConfigLevel

    for level in (ConfigLevel.PROGRAMDATA, ConfigLevel.SYSTEM, ConfigLevel.XDG, ConfigLevel.GLOBAL):
        pygit2.settings.search_path[level] = ""
    pygit2.settings.homedir = os.devnull  # ~ in an include path leads nowhere
    return pygit2


def open_repository(path: Path) -> "pygit2.Repository":
    """Open the repository ``path`` belongs to (``path`` or a parent of it) with libgit2.

    Raises:
        RepositoryError(code="not_a_repository"): no repository contains ``path``.
        RepositoryError(code="repository_not_owned"): it belongs to another user (git's own
            ownership rule; the org never trusts such a repository).
    """
    pygit2 = _libgit2()
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
    pygit2 = _libgit2()
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
