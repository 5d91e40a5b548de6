"""Held-out checks: tests the doer never sees, copied into the eval-agent's snapshot only.

``org submit --verify-hidden DIR`` (or ``[verify] hidden`` in org.toml) names a folder outside
the workspace. Its files are laid out as they should stand in the workspace (``DIR/tests/
test_api_hidden.py`` becomes ``tests/test_api_hidden.py``) and are written into the snapshot at
every verification — the baseline's preflight included, so the baseline's report lists them and
every later run must run them too — replacing whatever the doer put at those paths. The verify
commands run them as they run the project's tests (``pytest`` collects them where they stand).

Never shown to the doer, by construction:

- the folder may not lie in the workspace, and at submit it must not be inside anything the
  doer's sandbox shows (``check_folder`` builds the doer's view from the submitter's toolchain
  and refuses a folder it would show): the doer's commands cannot read it;
- it is copied into the snapshot, which is the eval-agent's (never the doer's workspace);
- what reaches the doer of a check's output (the verdict's feedback, hence its prompt) has every
  line naming a held-out file or one of its tests taken out, with the failure blocks of those
  tests (``canaries.without``); the check still fails, and its summary still counts them.

Copying reads the folder without following links, regular files only, within ``MAX_FILES`` and
``MAX_BYTES``: past either, the folder is refused at submit, and a folder that grew past them
since is "could not verify" (``HiddenError``), never a verification without it.
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from state_db.kernel.errors import OrgError

MAX_FILES = 500
MAX_BYTES = 20 * 1024 * 1024
_TEST_NAMES = re.compile(rb"^\s*(?:async\s+)?def\s+(test\w*)|^\s*class\s+(Test\w*)", re.MULTILINE)


class HiddenError(OrgError):
    """The held-out checks folder cannot be used (missing, too large, a link, visible to the doer)."""

    code = "bad_verify_hidden"


def _files(folder: Path) -> list[tuple[str, bytes, int]]:
    """(relative path, content, mode) of every file under ``folder``; links are refused."""
    if folder.is_symlink() or not folder.is_dir():
        raise HiddenError(f"the held-out checks folder {folder} is missing or not a plain folder",
                          hint="restore it, or submit again without --verify-hidden")
    out, total = [], 0
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for d in list(dirnames):
            if os.path.islink(os.path.join(dirpath, d)):
                raise HiddenError(f"{os.path.join(dirpath, d)} is a link; held-out checks are plain files",
                                  hint="copy what the link points to into the folder")
            if d in ("__pycache__", ".pytest_cache"):
                dirnames.remove(d)
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)   # ELOOP for a link
            except OSError as exc:
                raise HiddenError(f"{path} cannot be read as a plain file ({exc.strerror})",
                                  hint="keep only plain files in the held-out checks folder") from None
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise HiddenError(f"{path} is not a regular file", hint="keep only files in the folder")
                total += st.st_size
                if len(out) >= MAX_FILES or total > MAX_BYTES:
                    raise HiddenError(f"the held-out checks folder {folder} holds more than {MAX_FILES} files or "
                                      f"{MAX_BYTES // (1024 * 1024)} MiB", code="verify_limit",
                                      hint="keep only the held-out tests there")
                with os.fdopen(os.dup(fd), "rb") as f:
                    data = f.read(st.st_size + 1)
            finally:
                os.close(fd)
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            out.append((rel, data, st.st_mode & 0o777))
    return sorted(out)


def check_folder(folder: str, workspace: Path, shown: list[tuple[str, bool]]) -> str:
    """The held-out checks folder as stored with the work item (absolute, resolved).

    ``shown``: the doer's sandbox view as (path, hidden) pairs (``roles.workbench.sandbox.view``): a folder
    inside a shown path and not inside a hidden one is refused. Raises HiddenError."""
    path = Path(folder).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    path = path.resolve()
    if not path.is_dir():
        raise HiddenError(f"--verify-hidden {folder} is not a folder", hint="give the folder holding the held-out tests")
    if path.is_relative_to(workspace) or workspace.is_relative_to(path):
        raise HiddenError(f"the held-out checks folder {path} and the workspace {workspace} overlap: the doer would "
                          "see them", code="hidden_visible", hint="keep held-out tests outside the workspace")
    for top, hidden in sorted(shown, key=lambda p: -len(p[0])):
        if path.is_relative_to(top) or Path(top).is_relative_to(path):
            if hidden and path.is_relative_to(top):
                break
            if not hidden:
                raise HiddenError(f"the held-out checks folder {path} is inside {top}, which the doer's sandbox "
                                  "shows", code="hidden_visible",
                                  hint="move them where the sandbox shows nothing (e.g. a folder in your home "
                                       "that is not on PATH)")
    _files(path)
    return str(path)


def copy_into(snapshot: Path, folder: str) -> list[str]:
    """Write the held-out files into ``snapshot`` at their paths, replacing what is there (a
    link or a folder in the way is removed first). Returns their paths. Raises HiddenError."""
    written = []
    root = snapshot.resolve()
    for rel, data, mode in _files(Path(folder)):
        dest = snapshot / rel
        parent = dest.parent
        # every folder on the way is a real folder inside the snapshot (the doer's links replaced)
        for up in reversed([p for p in [parent, *parent.parents] if p.is_relative_to(snapshot) and p != snapshot]):
            if up.is_symlink() or (up.exists() and not up.is_dir()):
                up.unlink()
            up.mkdir(exist_ok=True)
        if not parent.resolve().is_relative_to(root):
            raise HiddenError(f"{rel} would be written outside the snapshot", code="verify_limit")
        if dest.is_symlink() or dest.is_file():
            dest.unlink()
        elif dest.is_dir():
            import shutil
            shutil.rmtree(dest)
        dest.write_bytes(data)
        os.chmod(dest, mode | 0o600)
        written.append(rel)
    return written


def names(folder: str) -> frozenset[str]:
    """What names a held-out check in a runner's output: its files' paths and base names (with
    and without ``.py``) and its tests' function and class names."""
    out = set()
    for rel, data, _ in _files(Path(folder)):
        out.add(rel)
        base = rel.rsplit("/", 1)[-1]
        out.add(base)
        if base.endswith(".py"):
            out.add(base[:-3])
            out.update((a or b).decode("ascii", "replace") for a, b in _TEST_NAMES.findall(data))
    return frozenset(n for n in out if n)
