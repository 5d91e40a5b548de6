"""The eval-agent's snapshot of a checkpoint, checked out by libgit2 and reused from one to the next.

A snapshot directory has a private repository in the history (``snapshots/<key>.git``): its
objects are the history's (``objects/info/alternates``), its index describes what the directory
holds. The next ``materialize`` scans the directory against that index once (any stat change,
ctime included, so tampering by a verify command is caught; anything the index does not
describe, build output and files the verify commands wrote, is removed) and then checks out only
the paths where the index and the wanted tree differ (``shadow.Shadow.sync``).

libgit2 never looks at special files (fifos, sockets) or ``.git`` entries, which a verify command
could leave there too: ``sweep`` removes them, reading only the directories whose stat changed
since it last looked (a directory's mtime and ctime move whenever an entry is added, removed or
renamed in it).

A writer killed midway needs no repair: whatever it rewrote has a new stat and is checked
again, and a stale ``index.lock`` it left is removed under the snapshot's lock. ``flock`` on
``snapshots/<key>.lock`` keeps a second writer out. The snapshot's index is written the first
time and then every ``INDEX_EVERY`` changed entries; in between it is kept in memory by the
process (an older index on disk only means more files are read again).
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import stat
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import structlog

from roles.workbench.workspace import shadow
from roles.workbench.workspace.errors import HistoryError

log = structlog.get_logger("loop_agent.history")

INDEX_EVERY = 64


@functools.lru_cache(maxsize=256)
def key_of(dest: Path) -> str:
    """The name of a snapshot directory's repository (stable for its real path; remembered per
    path, as the eval-agent writes the same few snapshot directories again and again)."""
    return hashlib.sha1(os.path.realpath(dest).encode("utf-8", "surrogateescape")).hexdigest()[:20]


@functools.lru_cache(maxsize=256)
def git_dir_of(history: Path, dest: Path) -> Path:
    """The private repository of snapshot directory ``dest`` of history ``history``."""
    return history / "snapshots" / f"{key_of(dest)}.git"


def is_empty(dest: Path) -> bool:
    """True if ``dest`` does not exist or holds nothing."""
    try:
        with os.scandir(dest) as it:
            return next(it, None) is None
    except FileNotFoundError:
        return True


def check_ours(dest: Path, snap_dir: Path) -> None:
    """Make sure ``dest`` may be written: absent, empty or written by this history before.
    Raises: HistoryError(code="dest_not_empty")."""
    if not (snap_dir / "HEAD").exists() and not is_empty(dest):
        raise HistoryError(f"snapshot directory {dest} is not empty and was not written "
                           "by this history; pass a fresh one", code="dest_not_empty")


def discard(dest: Path, snap_dir: Path) -> None:
    """Remove a snapshot directory and its private repository."""
    with _DIRS_LOCK:
        _DIRS.pop(os.fspath(dest), None)
    shutil.rmtree(dest, ignore_errors=True)
    shadow.forget(snap_dir)
    shutil.rmtree(snap_dir, ignore_errors=True)


@contextlib.contextmanager
def writing(snap_dir: Path, dest: Path) -> Iterator[None]:
    """Hold the snapshot's lock. Raises: HistoryError(code="snapshot_busy")."""
    lock = snap_dir.with_suffix(".lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise HistoryError(f"snapshot {dest} is being written by another process; "
                               "one eval-agent per snapshot directory", code="snapshot_busy") from None
        yield
    finally:
        os.close(fd)


def _create(history: Path, snap_dir: Path) -> None:
    """The snapshot's repository: bare, borrowing the history's objects; atomic."""
    tmp = snap_dir.with_name(f".{snap_dir.name}.init-{uuid.uuid4().hex[:8]}")
    try:
        shadow.init_bare(tmp, "refs/heads/master", alternates=history.absolute() / "objects")
        os.rename(tmp, snap_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write(history: Path, snap_dir: Path, dest: Path, tree: str) -> None:
    """Make ``dest`` hold ``tree`` exactly, rewriting only what differs (the caller holds
    ``writing``). Raises: OSError, pygit2.GitError."""
    if not (snap_dir / "HEAD").exists():
        _create(history, snap_dir)
    stale = snap_dir / "index.lock"
    if stale.exists():                 # its writer was killed: we hold the snapshot's lock
        log.warning("snapshot_writer_was_killed", snapshot=str(dest), next="finished by stat")
        stale.unlink(missing_ok=True)
    dest.mkdir(parents=True, exist_ok=True)
    sweep(dest)
    work = shadow.shadow_for(snap_dir, dest)
    work.sync(tree)
    work.settle_index(INDEX_EVERY)


# snapshot directory -> relative directory -> ((inode, mtime, ctime), its subdirectories)
_DIRS: dict[str, dict[bytes, tuple[tuple[int, int, int], list[bytes]]]] = {}
_DIRS_LOCK = threading.Lock()
SETTLED_NS = 50_000_000  # a directory changed this recently may change again within its timestamp tick


def sweep(dest: Path) -> int:
    """Remove the special files and ``.git`` entries below ``dest``; return how many. Only
    directories whose stat changed since the last sweep (of this process) are read."""
    top = os.fsencode(dest)
    key = os.fspath(dest)
    with _DIRS_LOCK:
        known = _DIRS.get(key, {})
    seen: dict[bytes, tuple[tuple[int, int, int], list[bytes]]] = {}
    settled = time.time_ns() - SETTLED_NS
    removed = 0
    stack = [b""]
    while stack:
        rel = stack.pop()
        path = top + b"/" + rel if rel else top
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            continue                    # replaced by a file or a symlink: libgit2 sees to it
        sig = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        old = known.get(rel)
        if old is not None and old[0] == sig:
            seen[rel] = old
            stack.extend(old[1])
            continue
        subdirs, gone = [], 0
        with os.scandir(path) as it:
            entries = list(it)
        for entry in entries:
            if entry.name == b".git":
                shadow.remove(entry.path)
                gone += 1
            elif entry.is_dir(follow_symlinks=False):
                subdirs.append(rel + b"/" + entry.name if rel else entry.name)
            elif not (entry.is_file(follow_symlinks=False) or entry.is_symlink()):
                os.unlink(entry.path)   # a fifo, a socket, a device node
                gone += 1
        if gone:
            st = os.lstat(path)
            sig = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        if st.st_ctime_ns < settled:    # else read again next time
            seen[rel] = (sig, subdirs)
        removed += gone
        stack.extend(subdirs)
    with _DIRS_LOCK:
        _DIRS[key] = seen
    return removed
