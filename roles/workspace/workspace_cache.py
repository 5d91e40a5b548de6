"""The workspace side of the in-process path: its stat cache, recording and resetting.

The cache (``<git_dir>/loop-org-workspace.statcache``) says which blob every file of the
workspace held when last read or written, and which tree the workspace held. It is only used
while it matches the refs: its ``meta`` names the ``HEAD`` commit it was written with (after
the refs moved) and the workspace path; a cache that does not match is discarded and the
files are read again, once.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import structlog

from roles.workspace import statcache
from roles.workspace.checkout import Syncer
from roles.workspace.errors import FastPathUnavailable
from roles.workspace.objects import ObjectStore
from roles.workspace.scan import Recorder

log = structlog.get_logger("loop_agent.history")

CACHE_NAME = "loop-org-workspace.statcache"


class WorkspaceCache:
    """Stat cache, in-process recording and reset of one workspace.

    Args:
        git_dir: the history (the cache lives there).
        workspace: the workspace.
        on_step: called with ``cache_written`` after each cache write.
    """

    def __init__(self, git_dir: Path, workspace: Path, on_step: Callable[[str], None]) -> None:
        self.path = git_dir / CACHE_NAME
        self.attributes = git_dir / "info" / "attributes"
        self.workspace = workspace
        self._top = os.fsencode(workspace)
        self._meta_ws = os.fspath(workspace)
        self._step = on_step

    def load(self, head: str | None) -> statcache.StatCache | None:
        """The cache if it matches ``head`` and this workspace, else None (and it is dropped)."""
        cache = statcache.load(self.path)
        if cache is not None and (cache.meta.get("head") != head
                                  or cache.meta.get("workspace") != self._meta_ws):
            log.info("history_stat_cache_discarded", workspace=self._meta_ws,
                     next="files are read again once")
            statcache.discard(self.path)
            cache = None
        return cache

    def save(self, node: statcache.Node, head: str | None) -> None:
        """Write the cache; call it after the refs moved, with the ``HEAD`` they now hold."""
        statcache.save(self.path, node, {"head": head, "workspace": self._meta_ws})
        self._step("cache_written")

    def handed_to_git(self) -> str | None:
        """Forget the cache (git is about to record or change the workspace on its own) and
        return the tree it described, which git's private index is given first."""
        cache = statcache.load(self.path)
        statcache.discard(self.path)
        return cache.root[0].hex() if cache is not None and cache.root[0] else None

    def _refuse_attributes(self) -> None:
        if os.path.exists(self.attributes):
            raise FastPathUnavailable("the history has info/attributes")

    def record(self, store: ObjectStore, head: str | None) -> tuple[str, statcache.Node, bool]:
        """Record the workspace: (tree id, new cache node, whether the cache must be saved).

        Raises: FastPathUnavailable (git must do it), OSError.
        """
        self._refuse_attributes()
        cache = self.load(head)
        rec = Recorder(store, cache.racy_ns if cache else 0)
        tree, node = rec.record(self._top, cache.root if cache else None)
        return tree.hex(), node, rec.dirty or cache is None

    def sync(self, store: ObjectStore, tree: bytes, head: str | None) -> tuple[statcache.Node, bool]:
        """Make the workspace hold ``tree``, rewriting only what differs; return the new cache
        node and whether it must be saved (move the refs first, then ``save``).

        Raises: FastPathUnavailable (git must do it), OSError.
        """
        if store.special(tree):
            raise FastPathUnavailable("the target needs git's checkout (attributes or gitlinks)")
        self._refuse_attributes()
        cache = self.load(head)
        syncer = Syncer(store, cache.racy_ns if cache else 0, snapshot=False)
        node = syncer.sync(self._top, tree, cache.root if cache else None)
        return node, bool(syncer.changes) or cache is None or cache.root[0] != tree
