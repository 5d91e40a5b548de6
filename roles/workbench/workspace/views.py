"""Showing what a shadow history recorded: diffs and patches between commits, the paths that
changed, the files of a commit, and the eval-agent's snapshots of a checkpoint (with protected
files restored).

``HistoryViews`` is one half of ``WorkspaceHistory`` (``history``): it reads what the other half
records, through the same libgit2 repository.
"""
from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path
from typing import Sequence

import pygit2
from pygit2.enums import DiffOption

from roles.workbench.workspace import shadow, snapshot
from roles.workbench.workspace.errors import HistoryError
from roles.workbench.workspace.protect import DEFAULT_PROTECTED_PATTERNS, match_paths

BASELINE_REF = "refs/loop-org/baseline"
HEAD_REF = "refs/heads/checkpoints"

_MATCHES: dict[tuple, list[str]] = {}
_IDS: dict[pygit2.Oid, dict[str, str]] = {}
_CACHE_LOCK = threading.Lock()


def inside(path: Path, root: Path) -> bool:
    """True if ``path`` is ``root`` or below it (symlinks resolved)."""
    p, r = os.path.realpath(path), os.path.realpath(root)
    return p == r or p.startswith(r.rstrip(os.sep) + os.sep)


def _full_index(patch: pygit2.Patch) -> bytes:
    """A file's patch with whole object ids on its ``index`` line, as ``git diff --full-index``
    writes it (libgit2 abbreviates them)."""
    data = patch.data
    head, sep, rest = data.partition(b"\nindex ")
    if not sep:
        return data  # a mode change alone
    line, nl, tail = rest.partition(b"\n")
    _, space, mode = line.partition(b" ")
    delta = patch.delta
    ids = f"{delta.old_file.id}..{delta.new_file.id}".encode()
    return head + sep + ids + space + mode + nl + tail


def _remember(cache: dict, key, value):
    with _CACHE_LOCK:
        if len(cache) > 64:
            cache.clear()
        cache[key] = value
    return value


class HistoryViews:
    """Diffs, files and snapshots of recorded commits (mixed into ``WorkspaceHistory``, which
    provides ``_commit_of``, ``_tree_of``, ``_repo``, ``_step``, ``git_dir`` and ``workspace``)."""

    def _range(self, from_commit: str | None, to_commit: str | None) -> tuple[str, str]:
        start = self._commit_of(from_commit or BASELINE_REF)
        return start, self._commit_of(to_commit or HEAD_REF)

    def diff_bytes(self, from_commit: str | None = None, to_commit: str | None = None) -> bytes:
        """Unified, binary-safe patch (``git apply`` reads it) between two commits, with whole
        object ids and no rename detection, as ``git diff --binary --full-index`` writes it.

        Defaults: from the baseline to the latest checkpoint. Raises: UnknownCommit.
        """
        a, b = self._range(from_commit, to_commit)
        repo = self._repo
        diff = repo.diff(repo[self._tree_of(a)], repo[self._tree_of(b)], flags=DiffOption.SHOW_BINARY)
        return b"".join(_full_index(patch) for patch in diff if patch is not None)

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

    def _changed(self, a: pygit2.Oid, b: pygit2.Oid) -> set[str]:
        """Paths of files added, removed or changed (content or mode) from tree ``a`` to ``b``."""
        if a == b:
            return set()
        repo = self._repo
        out = set()
        for delta in repo.diff(repo[a], repo[b]).deltas:
            out.add(delta.old_file.raw_path.decode("utf-8", "surrogateescape"))
            out.add(delta.new_file.raw_path.decode("utf-8", "surrogateescape"))
        return out

    def changed_paths(self, a: str, b: str) -> list[str]:
        """Paths added, modified, deleted or changed in mode between commits ``a`` and ``b``."""
        return sorted(self._changed(self._tree_of(self._commit_of(a)), self._tree_of(self._commit_of(b))))

    # -- files of a commit ----------------------------------------------------------------------

    def file_ids(self, commit: str | None = None) -> dict[str, str]:
        """Every file of ``commit`` (default: the baseline): path -> object id (hex) and mode,
        as ``"<mode> <oid>"``; equal values mean equal files. The result is shared: never
        mutate it."""
        tree = self._tree_of(self._commit_of(commit or BASELINE_REF))
        found = _IDS.get(tree)
        if found is None:
            found = _remember(_IDS, tree, {p: f"{mode:o} {oid}"
                                           for p, (mode, oid) in shadow.files(self._repo, tree).items()})
        return found

    def read_path(self, commit: str | None, path: str) -> bytes | None:
        """The content of ``path`` in ``commit`` (default: the baseline), or None if absent."""
        tree = self._repo[self._tree_of(self._commit_of(commit or BASELINE_REF))]
        try:
            obj = tree[path]
        except (KeyError, ValueError, UnicodeError, pygit2.GitError):
            return None
        return obj.data if isinstance(obj, pygit2.Blob) else None

    # -- protected paths and snapshots ---------------------------------------------------------

    def _protected(self, tree: pygit2.Oid, patterns: tuple[str, ...]) -> list[str]:
        key = (tree, patterns)
        found = _MATCHES.get(key)
        if found is None:
            found = _remember(_MATCHES, key, match_paths(shadow.files(self._repo, tree), patterns))
        return list(found)

    def protected_paths(
        self, baseline: str | None = None,
        patterns: Sequence[str] = DEFAULT_PROTECTED_PATTERNS,
    ) -> list[str]:
        """Files present at ``baseline`` (default: the recorded one) matching ``patterns``."""
        return self._protected(self._tree_of(self._commit_of(baseline or BASELINE_REF)), tuple(patterns))

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
        writer per snapshot directory; a snapshot whose writer was killed is finished): then
        only what differs is rewritten and anything else found there (build output, files the
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
        Raises: UnknownCommit, HistoryError with code ``dest_not_empty``,
            ``dest_inside_workspace`` or ``snapshot_busy``.
        """
        target = self._tree_of(self._commit_of(commit))
        source = self._tree_of(self._commit_of(restore_from or BASELINE_REF))
        dest = Path(dest_dir).absolute()
        if inside(dest, self.workspace):
            raise HistoryError(f"snapshot directory {dest} is inside the workspace; "
                               "write snapshots elsewhere", code="dest_inside_workspace")
        snap_dir = snapshot.git_dir_of(self.git_dir, dest)
        snapshot.check_ours(dest, snap_dir)
        repo = self._repo
        names = shadow.files(repo, source)
        if paths is None:
            wanted = set(self._protected(source, DEFAULT_PROTECTED_PATTERNS))
        else:
            wanted = set(paths) & names.keys()
        differing = sorted(wanted & self._changed(source, target)) if wanted else []
        tree = target
        if differing:
            tree = shadow.edit_tree(repo, target, {p: (names[p][1], names[p][0]) for p in differing})
        with snapshot.writing(snap_dir, dest):
            self._step("snapshot_writing")
            snapshot.write(self.git_dir, snap_dir, dest, str(tree))
        return differing

    def derive(self, commit: str, edits: dict[str, bytes | tuple[int, str] | None], message: str) -> str:
        """A commit whose tree is ``commit``'s with ``edits`` applied: path -> new content
        (bytes, written as a regular file: executable if it was), (mode, object id) of an entry
        to put there, or None to leave the path out. Its parent is ``commit``; no ref names it
        (the caller keeps its id). The same edits of the same commit give the same tree.
        Raises: UnknownCommit."""
        commit = self._commit_of(commit)
        repo = self._repo
        tree = self._tree_of(commit)
        if not edits:
            return commit
        names = shadow.files(repo, tree)
        entries: dict[str, tuple[pygit2.Oid, int] | None] = {}
        for path, value in edits.items():
            if value is None:
                entries[path] = None
            elif isinstance(value, bytes):
                mode = names[path][0] if path in names and names[path][0] == 0o100755 else 0o100644
                entries[path] = (repo.create_blob(value), mode)
            else:
                entries[path] = (pygit2.Oid(hex=value[1]), value[0])
        new_tree = shadow.edit_tree(repo, tree, entries)
        if new_tree == tree:
            return commit
        sig = shadow.signature()
        return str(repo.create_commit(None, sig, sig, message + "\n", new_tree, [pygit2.Oid(hex=commit)]))

    def workspace_differences(self, commit: str, *, skip_caches: bool = False) -> list[str]:
        """Paths where the workspace differs from ``commit`` in content, mode or presence, read
        file by file (``delivered.differences``). Raises: UnknownCommit."""
        from roles.workbench.workspace.delivered import differences
        return differences(Path(self.workspace), self._repo, self._tree_of(self._commit_of(commit)),
                           skip_caches=skip_caches)

    def unrecorded(self, verified: str, held: str | None) -> list[str]:
        """What the workspace holds that neither commit records as a file (``delivered.unrecorded``).
        Raises: UnknownCommit."""
        from roles.workbench.workspace.delivered import unrecorded
        return unrecorded(Path(self.workspace), self._repo, self._commit_of(verified),
                          self._commit_of(held) if held else None)

    def nested_touched(self, commit: str) -> list[str]:
        """Files inside the repositories nested in the workspace at the baseline (and still in
        ``commit``) changed since the baseline was recorded (``delivered.touched_since``)."""
        from roles.workbench.workspace.delivered import touched_since
        base = self._commit_of(BASELINE_REF)
        kept = {p for p, (mode, _) in shadow.files(self._repo, self._tree_of(self._commit_of(commit))).items()
                if mode == 0o160000}
        nested = sorted(p for p, (mode, _) in shadow.files(self._repo, self._tree_of(base)).items()
                        if mode == 0o160000 and p in kept)
        if not nested:
            return []
        since = (self._repo[base].commit_time + 1) * 1_000_000_000
        return touched_since(Path(self.workspace), nested, since)

    def tree_or_none(self, commit: str) -> str | None:
        """The tree id of ``commit``, or None when this history does not hold it."""
        try:
            return str(self._tree_of(self._commit_of(commit)))
        except HistoryError:
            return None

    def parent_of(self, commit: str) -> str | None:
        """The first parent of ``commit`` (None for a root commit). Raises: UnknownCommit."""
        parents = self._repo[self._commit_of(commit)].parent_ids
        return str(parents[0]) if parents else None

    def entries(self, commit: str | None = None) -> dict[str, tuple[int, str]]:
        """Every non-tree entry of ``commit`` (default: the baseline): path -> (mode, object id)."""
        tree = self._tree_of(self._commit_of(commit or BASELINE_REF))
        return {p: (mode, str(oid)) for p, (mode, oid) in shadow.files(self._repo, tree).items()}

    def discard_snapshot(self, dest_dir: Path) -> None:
        """Remove a snapshot directory written by ``materialize`` and its private repository."""
        dest = Path(dest_dir).absolute()
        snapshot.discard(dest, snapshot.git_dir_of(self.git_dir, dest))
