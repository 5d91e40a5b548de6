"""Writing a recorded commit of a shadow history into a new, empty folder (a replay's workspace).

Only what the history recorded is written: regular files with their executable bit and symbolic
links as links (their target is text; nothing is followed while writing, and the folder is
created here, so no planted link can redirect a write). Submodule entries are skipped.
"""
from __future__ import annotations

import os
from pathlib import Path

import pygit2
from pygit2.enums import FileMode

from roles.workbench.workspace import shadow
from roles.workbench.workspace.errors import HistoryError


def write_commit(git_dir: Path, rev: str, dest: Path) -> int:
    """Write the tree of ``rev`` (a commit id or ref) of the history at ``git_dir`` into ``dest``,
    which must not exist. Returns the number of entries written.

    Raises HistoryError: ``dest_exists``, ``unknown_commit``.
    """
    dest = Path(dest)
    if os.path.lexists(dest):
        raise HistoryError(f"{dest} already exists; a replay's workspace is always new", code="dest_exists")
    repo = shadow.open_repository(git_dir)
    try:
        commit = repo.revparse_single(rev).peel(pygit2.Commit)
    except (KeyError, ValueError, pygit2.GitError):
        raise HistoryError(f"{rev} is not a commit of {git_dir}", code="unknown_commit") from None
    dest.mkdir(parents=True, mode=0o755)
    root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    written = 0
    try:
        for path, (mode, oid) in sorted(shadow.files(repo, commit.tree.id).items()):
            if mode == FileMode.COMMIT:
                continue
            parts = path.split("/")
            parent = root
            opened = []
            try:
                for name in parts[:-1]:
                    try:
                        os.mkdir(name, 0o755, dir_fd=parent)
                    except FileExistsError:
                        pass
                    parent = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
                    opened.append(parent)
                data = repo[oid].data
                if mode == FileMode.LINK:
                    os.symlink(data, parts[-1], dir_fd=parent)
                else:
                    perm = 0o755 if mode == FileMode.BLOB_EXECUTABLE else 0o644
                    fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, perm,
                                 dir_fd=parent)
                    with os.fdopen(fd, "wb") as out:
                        out.write(data)
                written += 1
            finally:
                for fd in reversed(opened):
                    os.close(fd)
    finally:
        os.close(root)
    return written
