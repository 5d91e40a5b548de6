"""The eval-agent's snapshot of a checkpoint, written in-process and reused from one to the next.

A snapshot directory has a sidecar in the git dir (``snapshots/<key>.index``, a stat cache
whose ``meta`` names the directory) describing the tree the directory holds and the stat of
every file written there. The next ``materialize`` compares the tree it wants with that, walks
the directory once, and rewrites only files that differ or were touched (any stat change,
ctime included, so tampering by a verify command is caught), removing everything else found
there. A writer killed midway needs no repair: whatever it rewrote has a new stat and is
checked again, and a sidecar torn mid-write fails its checksum, so every file is then read and
compared. ``flock`` on the sidecar keeps a second writer out.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
from pathlib import Path
from typing import Callable, Sequence

import structlog

from roles.workspace import statcache
from roles.workspace.checkout import Syncer
from roles.workspace.errors import FastPathUnavailable, HistoryError
from roles.workspace.objects import ObjectStore
from roles.workspace.protect import DEFAULT_PROTECTED_PATTERNS, match_paths

log = structlog.get_logger("loop_agent.history")

_MATCHES: dict[tuple, list[str]] = {}


@functools.lru_cache(maxsize=256)
def key_of(dest: Path) -> str:
    """The sidecar name of a snapshot directory (stable for its real path; remembered per path,
    as the eval-agent writes the same few snapshot directories again and again)."""
    return hashlib.sha1(os.path.realpath(dest).encode("utf-8", "surrogateescape")).hexdigest()[:20]


def is_empty(dest: Path) -> bool:
    """True if ``dest`` does not exist or holds nothing."""
    try:
        with os.scandir(dest) as it:
            return next(it, None) is None
    except FileNotFoundError:
        return True


def check_ours(dest: Path, sidecar: Path, gitindex: Path) -> None:
    """Make sure ``dest`` may be written: absent, empty or written by this history before.

    A lock left beside the sidecar or git's index means its writer was killed midway: the
    snapshot is discarded and written whole. Raises: HistoryError(code="dest_not_empty").
    """
    if any(p.with_name(p.name + ".lock").exists() for p in (sidecar, gitindex)):
        log.warning("snapshot_torn", snapshot=str(dest), next="written whole")
        discard(dest, sidecar)
    if not sidecar.exists() and not gitindex.exists() and not is_empty(dest):
        raise HistoryError(f"snapshot directory {dest} is not empty and was not written "
                           "by this history; pass a fresh one", code="dest_not_empty")


def discard(dest: Path, sidecar: Path) -> None:
    """Remove a snapshot directory, its sidecar and git's private index for it."""
    shutil.rmtree(dest, ignore_errors=True)
    statcache.discard(sidecar)
    for p in (sidecar, sidecar.with_suffix(".gitindex")):
        p.unlink(missing_ok=True)
        p.with_name(p.name + ".lock").unlink(missing_ok=True)


def _paths_of(store: ObjectStore, tree: bytes) -> dict[str, bytes]:
    """Every file of ``tree`` as text path -> path bytes."""
    return {p.decode("utf-8", "surrogateescape"): p for p in store.files(tree)}


def protected(store: ObjectStore, tree: bytes, patterns: tuple[str, ...]) -> list[str]:
    """Files of ``tree`` matching ``patterns``, sorted (remembered per tree and patterns)."""
    key = (store.root, tree, patterns)
    found = _MATCHES.get(key)
    if found is None:
        if len(_MATCHES) > 64:
            _MATCHES.clear()
        found = _MATCHES[key] = match_paths(_paths_of(store, tree), patterns)
    return list(found)


def materialize(store: ObjectStore, target: bytes, source: bytes, dest: Path, sidecar: Path, *,
                paths: Sequence[str] | None, on_step: Callable[[str], None]) -> list[str]:
    """Make ``dest`` hold tree ``target`` with protected paths restored from tree ``source``.

    ``dest`` must be absent, empty or written by this history (the caller checks). Without a
    usable sidecar every file found there is read and compared, so the result is exact.
    Returns the protected paths that differ between ``source`` and ``target``, sorted.
    Raises: FastPathUnavailable (a tree needs git's checkout), HistoryError with code
    ``snapshot_busy`` (another process is writing this snapshot), OSError.
    """
    if store.special(target) or store.special(source):
        raise FastPathUnavailable("the snapshot needs git's checkout (attributes or gitlinks)")
    names = _paths_of(store, source)
    if paths is None:
        wanted = set(protected(store, source, DEFAULT_PROTECTED_PATTERNS))
    else:
        wanted = set(paths) & names.keys()
    changed = {p.decode("utf-8", "surrogateescape") for p in store.changed(source, target)}
    differing = sorted(wanted & changed)
    tree = target
    if differing:
        files = store.files(source)
        tree = store.edit_tree(target, {names[p]: files[names[p]] for p in differing})
    meta = {"dest": os.fspath(dest)}
    try:
        fd = os.open(sidecar, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:
        sidecar.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(sidecar, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise HistoryError(f"snapshot {dest} is being written by another process; "
                               "one eval-agent per snapshot directory", code="snapshot_busy") from None
        empty = is_empty(dest)
        old = None if empty else statcache.read_fd(fd, os.fspath(sidecar))
        if old is not None and old.meta != meta:
            old = None
        if empty:
            dest.mkdir(parents=True, exist_ok=True)
        on_step("snapshot_writing")
        syncer = Syncer(store, old.racy_ns if old else 0, snapshot=True)
        node = syncer.sync(os.fsencode(dest), tree, old.root if old else None)
        if syncer.changes or old is None or old.root[0] != tree:
            statcache.write_fd(fd, os.fspath(sidecar), node, meta)
    finally:
        os.close(fd)
    return differing
