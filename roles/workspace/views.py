"""Showing what a shadow history recorded: diffs and patches between commits, the paths that
changed, and the eval-agent's snapshots of a checkpoint (with protected files restored).

``HistoryViews`` is one half of ``WorkspaceHistory`` (``history``): it reads what the other
half records and restores, through the same object store, refs and git fallback.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Sequence

from roles.workspace import snapshot, statcache
from roles.workspace.errors import FastPathUnavailable, HistoryError
from roles.workspace.protect import DEFAULT_PROTECTED_PATTERNS, match_paths

BASELINE_REF = "refs/loop-org/baseline"
HEAD_REF = "refs/heads/checkpoints"


def inside(path: Path, root: Path) -> bool:
    """True if ``path`` is ``root`` or below it (symlinks resolved)."""
    p, r = os.path.realpath(path), os.path.realpath(root)
    return p == r or p.startswith(r.rstrip(os.sep) + os.sep)


class HistoryViews:
    """Diffs, patches and snapshots of recorded commits (mixed into ``WorkspaceHistory``, which
    provides ``_commit_of``, ``_tree_of``, ``_store``, ``_git``, ``_gitpath``, ``_fallback``,
    ``_step``, ``git_dir`` and ``workspace``)."""

    def _range(self, from_commit: str | None, to_commit: str | None) -> tuple[str, str]:
        start = self._commit_of(from_commit or BASELINE_REF)
        return start, self._commit_of(to_commit or HEAD_REF)

    def diff_bytes(self, from_commit: str | None = None, to_commit: str | None = None) -> bytes:
        """Unified, binary-safe patch (``git apply`` reads it) between two commits.

        Defaults: from the baseline to the latest checkpoint. Raises: UnknownCommit.
        """
        a, b = self._range(from_commit, to_commit)
        return self._git.run(
            ["diff", "--binary", "--full-index", "--no-renames", "--no-color",
             "--no-ext-diff", "--no-textconv", a, b]
        ).stdout

    def diff(self, from_commit: str | None = None, to_commit: str | None = None) -> str:
        """``diff_bytes`` as text; undecodable bytes survive via ``surrogateescape``."""
        return self.diff_bytes(from_commit, to_commit).decode("utf-8", "surrogateescape")

    def export_patch(
        self, dest: Path, from_commit: str | None = None, to_commit: str | None = None
    ) -> Path:
        """Write the patch to ``dest`` atomically and return ``dest``."""
        dest = Path(dest)
        data = self.diff_bytes(from_commit, to_commit)
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, dest)
        return dest

    def changed_paths(self, a: str, b: str) -> list[str]:
        """Paths added, modified, deleted or changed in mode between commits ``a`` and ``b``."""
        ca, cb = self._commit_of(a), self._commit_of(b)
        try:
            raw = self._store().changed(self._tree_of(ca), self._tree_of(cb))
        except FastPathUnavailable:
            raw = self._gitpath.changed(ca, cb)
        return sorted(p.decode("utf-8", "surrogateescape") for p in raw)

    # -- files of a commit ----------------------------------------------------------------------

    def file_ids(self, commit: str | None = None) -> dict[str, str]:
        """Every file of ``commit`` (default: the baseline): path -> object id (hex) and mode,
        as ``"<mode> <oid>"``; equal values mean equal files."""
        commit = self._commit_of(commit or BASELINE_REF)
        try:
            return {p.decode("utf-8", "surrogateescape"): f"{mode:o} {sha.hex()}"
                    for p, (mode, sha) in self._store().files(self._tree_of(commit)).items()}
        except FastPathUnavailable:
            out = {}
            for path, entry in self._gitpath.ls_tree(commit).items():
                mode, _kind, oid = entry.split(b"\t", 1)[0].split(b" ")
                out[path] = f"{int(mode, 8):o} {oid.decode()}"
            return out

    def read_path(self, commit: str | None, path: str) -> bytes | None:
        """The content of ``path`` in ``commit`` (default: the baseline), or None if absent."""
        oid = self.file_ids(commit).get(path)
        if oid is None:
            return None
        sha = oid.split(" ", 1)[1]
        try:
            return self._store().blob(bytes.fromhex(sha))
        except FastPathUnavailable:
            return self._git.run(["cat-file", "blob", sha]).stdout

    # -- protected paths and snapshots ---------------------------------------------------------

    def protected_paths(
        self, baseline: str | None = None,
        patterns: Sequence[str] = DEFAULT_PROTECTED_PATTERNS,
    ) -> list[str]:
        """Files present at ``baseline`` (default: the recorded one) matching ``patterns``."""
        commit = self._commit_of(baseline or BASELINE_REF)
        try:
            return snapshot.protected(self._store(), self._tree_of(commit), tuple(patterns))
        except FastPathUnavailable:
            return match_paths(self._gitpath.ls_tree(commit), patterns)

    def _snapshot_index(self, dest: Path) -> Path:
        key = snapshot.key_of(dest)
        return self.git_dir / "snapshots" / f"{key}.index"

    def materialize(
        self,
        commit: str,
        dest_dir: Path,
        *,
        restore_from: str | None = None,
        paths: Sequence[str] | None = None,
    ) -> list[str]:
        """Write ``commit`` into ``dest_dir`` with ``paths`` restored from ``restore_from``.

        ``dest_dir`` must be absent, empty, or a snapshot this history wrote before (one
        writer per snapshot directory; a torn one is rewritten whole): then only
        what differs is rewritten and anything else found there (build output, files the
        verify commands wrote) is removed, so re-verifying the next checkpoint costs what
        changed, not the workspace size. Tampering is caught by a stat check (ctime
        included), never trusted to mtimes alone.

        Args:
            commit: what to write (typically a checkpoint).
            dest_dir: the snapshot directory.
            restore_from: where protected content comes from (default: the baseline).
            paths: protected paths (default: ``protected_paths(restore_from)``); those absent
                from ``restore_from`` are ignored.
        Returns: the protected paths that differ between ``restore_from`` and ``commit``
            (modified, deleted or mode-changed), sorted; the snapshot has them restored.
        Raises: UnknownCommit, GitFailed, HistoryError with code ``dest_not_empty``,
            ``dest_inside_workspace`` or ``snapshot_busy``.
        """
        target = self._commit_of(commit)
        source = self._commit_of(restore_from or BASELINE_REF)
        dest = Path(dest_dir).absolute()
        if inside(dest, self.workspace):
            raise HistoryError(f"snapshot directory {dest} is inside the workspace; "
                               "write snapshots elsewhere", code="dest_inside_workspace")
        sidecar = self._snapshot_index(dest)
        gitindex = sidecar.with_suffix(".gitindex")
        snapshot.check_ours(dest, sidecar, gitindex)
        try:
            t_tree, s_tree = self._tree_of(target), self._tree_of(source)
            differing = snapshot.materialize(self._store(), t_tree, s_tree, dest, sidecar,
                                             paths=paths, on_step=self._step)
            gitindex.unlink(missing_ok=True)
            return differing
        except (FastPathUnavailable, OSError) as exc:
            self._fallback("materialize", exc)
            statcache.discard(sidecar)
            return self._gitpath.materialize(target, source, dest, gitindex, paths,
                                             fresh=snapshot.is_empty(dest))

    def discard_snapshot(self, dest_dir: Path) -> None:
        """Remove a snapshot directory written by ``materialize`` and its private index."""
        dest = Path(dest_dir).absolute()
        snapshot.discard(dest, self._snapshot_index(dest))
