"""The eval-agent's snapshot of a checkpoint, written in-process and reused from one to the next.

A snapshot directory has a sidecar in the git dir (``snapshots/<key>.index``, a stat cache
whose ``meta`` names the directory) describing the tree the directory holds and the stat of
every file written there. The next ``materialize`` compares the tree it wants with that, walks
the directory once, and rewrites only files that differ or were touched (any stat change,
ctime included, so tampering by a verify command is caught), removing everything else found
there. The sidecar is written through ``<key>.index.lock``, created before the first change:
a lock still there means the writer was killed midway and the snapshot is rewritten whole.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable, Sequence

from roles.workspace import statcache
from roles.workspace.checkout import Syncer
from roles.workspace.errors import HistoryError
from roles.workspace.objects import ObjectStore
from roles.workspace.protect import DEFAULT_PROTECTED_PATTERNS, match_paths

_MATCHES: dict[tuple, list[str]] = {}


def key_of(dest: Path) -> str:
    """The sidecar name of a snapshot directory (stable for its real path)."""
    return hashlib.sha1(os.path.realpath(dest).encode("utf-8", "surrogateescape")).hexdigest()[:20]


def is_empty(dest: Path) -> bool:
    """True if ``dest`` does not exist or holds nothing."""
    try:
        with os.scandir(dest) as it:
            return next(it, None) is None
    except FileNotFoundError:
        return True


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

    ``dest`` is absent, empty, or described by ``sidecar``; anything else there is removed.
    Returns the protected paths that differ between ``source`` and ``target``, sorted.
    Raises: FastPathUnavailable (a tree needs git's checkout), HistoryError with code
    ``snapshot_busy`` (another writer holds the lock), OSError.
    """
    from roles.workspace.errors import FastPathUnavailable

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
    old = None if is_empty(dest) else statcache.load(sidecar)
    if old is not None and old.meta != meta:
        old = None
    if old is None and not is_empty(dest):
        raise FastPathUnavailable(f"snapshot {dest} has no usable sidecar")
    lock = sidecar.with_name(sidecar.name + ".lock")
    sidecar.parent.mkdir(parents=True, exist_ok=True)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        raise HistoryError(f"snapshot {dest} is being written by another process ({lock}); "
                           "one eval-agent per snapshot directory", code="snapshot_busy") from None
    on_step("snapshot_locked")
    syncer = Syncer(store, old.racy_ns if old else 0, snapshot=True)
    node = syncer.sync(os.fsencode(dest), tree, old.root if old else None)
    if syncer.changes or old is None or old.root[0] != tree:
        statcache.save(sidecar, node, meta, tmp=lock)
    else:
        lock.unlink()
    return differing
