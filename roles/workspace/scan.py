"""Record a directory as git trees in-process, reading only files whose stat changed.

``record`` walks the workspace with ``os.scandir`` (one ``lstat`` per entry), reuses the blob of
every file whose stat matches its cache entry and is not racily clean, hashes and stores the
others, and rebuilds only the trees of directories whose content changed. The result is the
tree ``git add --all --force && git write-tree`` would write from a private index: every
regular file (mode 100644, or 100755 if the owner may execute it) and symlink (120000, the
target as content); ``.git`` at the top left out; empty directories not recorded; build caches
(``CACHE_DIRS``: ``__pycache__``, ``.pytest_cache``, …) left out at any depth, as git's own path
leaves them out with exclude pathspecs (``gitpath.CACHE_EXCLUDES``): they are not the doer's work,
change on every run, and would make every checkpoint — and the no-progress fingerprint — differ.

Whatever git would treat differently is refused with FastPathUnavailable so the caller asks
git: a nested repository (a ``.git`` below the top), a ``.gitattributes`` (conversions and
filters), sockets and fifos, and names git refuses (``.git`` spelled otherwise, NTFS aliases).
"""
from __future__ import annotations

import os

from roles.workspace.errors import FastPathUnavailable
from roles.workspace.objects import EXEC, FILE, LINK, TREE, ObjectStore, object_id, read_file
from roles.workspace.statcache import COARSE_SLACK_NS, Node

S_IFMT, S_IFDIR, S_IFREG, S_IFLNK = 0o170000, 0o040000, 0o100000, 0o120000
_EMPTY: dict = {}
LARGE_FILE = 128 * 1024 * 1024
CACHE_DIRS = frozenset({b"__pycache__", b".pytest_cache", b".mypy_cache", b".ruff_cache"})


def git_mode(st_mode: int) -> int:
    if st_mode & S_IFMT == S_IFLNK:
        return LINK
    return EXEC if st_mode & 0o100 else FILE


def refused_name(name: bytes, is_link: bool) -> str | None:
    """Why git would not record ``name`` the usual way, or None (only names starting with
    ``.``/``g`` or holding a backslash can be concerned; callers filter on that first)."""
    if name == b".gitattributes":
        return "a .gitattributes file (git applies its conversions)"
    for part in name.split(b"\\"):
        low = part.lower()
        rest = low[4:] if low.startswith(b".git") else low[5:] if low.startswith(b"git~1") else None
        if rest is not None and not rest.strip(b". "):
            return f"a name git refuses ({name!r})"
        if is_link and (b"gitmod" in low or b"gi7eba" in low):
            return f"a symlink git refuses ({name!r})"
    return None


def file_record(store: ObjectStore, path: bytes, st: os.stat_result, *, keep: bool = True) -> tuple:
    """Hash a file or symlink (and store the blob if ``keep``); return its cache entry.

    Raises: FastPathUnavailable for a file too large to hold in memory (git streams it).
    """
    if st.st_size > LARGE_FILE:
        raise FastPathUnavailable(f"{path!r} is larger than {LARGE_FILE} bytes")
    if st.st_mode & S_IFMT == S_IFLNK:
        data = os.readlink(path)
    else:
        data = read_file(path, st.st_size, nofollow=True)
    size = st.st_size
    if len(data) != size:
        size = -1  # it changed while being read: never trust this entry, read it again next time
    sha = store.write(b"blob", data) if keep else object_id(b"blob", data)
    return (st.st_mode, sha, st.st_mtime_ns, st.st_ctime_ns, size, st.st_ino)


class Recorder:
    """One walk of a directory against its previous cache.

    After ``record``: ``hashed`` files were read; ``dirty`` says the cache changed (save it).
    A directory where nothing changed keeps its cache node (the same object), so the cache
    writer can reuse that directory's encoded chunk.
    """

    def __init__(self, store: ObjectStore, racy_ns: int) -> None:
        self.store = store
        self.racy_ns = racy_ns
        self.hashed = 0
        self.dirty = False

    def record(self, top: bytes, old: Node | None) -> tuple[bytes, Node]:
        """Tree id and new cache node of directory ``top`` (the empty tree if it has no file)."""
        sha, node = self._dir(top, old, True)
        return sha, node

    def _dir(self, path: bytes, old: Node | None, top: bool) -> tuple[bytes | None, Node | None]:
        old_entries = old[1] if old is not None else _EMPTY
        changed = old is None or old[0] is None  # the tree differs from the cached one
        same = not changed  # every cache entry is the cached object: the old node is reused
        entries = {}
        racy_ns = self.racy_ns
        coarse_floor = racy_ns - COARSE_SLACK_NS
        with os.scandir(path) as it:
            for de in it:
                name = de.name
                st = de.stat(follow_symlinks=False)
                mode = st.st_mode
                fmt = mode & S_IFMT
                prev = old_entries.get(name)
                c = name[0]
                # names already recorded passed this check; '.', 'g', 'G' and '\\' may concern git
                if (prev is None or fmt == S_IFLNK) and (c == 46 or c == 103 or c == 71 or 92 in name):
                    if name == b".git":
                        if top:
                            continue
                        raise FastPathUnavailable(f"a nested repository at {de.path!r}")
                    why = refused_name(name, fmt == S_IFLNK)
                    if why:
                        raise FastPathUnavailable(f"{why} at {de.path!r}")
                if fmt == S_IFDIR:
                    if name in CACHE_DIRS:
                        changed = changed or prev is not None
                        continue
                    sub_old = prev if prev is not None and len(prev) == 2 else None
                    sha, node = self._dir(de.path, sub_old, False)
                    if node is None:
                        changed = changed or prev is not None
                        continue
                    entries[name] = node
                    if node is not sub_old:
                        same = False
                        changed = changed or sub_old is None or sub_old[0] != sha
                elif fmt == S_IFREG or fmt == S_IFLNK:
                    ctime = st.st_ctime_ns
                    if (prev is not None and len(prev) == 6 and prev[2] == st.st_mtime_ns
                            and prev[3] == ctime and prev[0] == mode and prev[4] == st.st_size
                            and prev[5] == st.st_ino
                            and (ctime < coarse_floor or (ctime < racy_ns and ctime % 1_000_000))):
                        entries[name] = prev  # clean, and not racily so (see statcache.racy)
                        continue
                    rec = file_record(self.store, de.path, st)
                    self.hashed += 1
                    same = False
                    entries[name] = rec
                    if (prev is None or len(prev) != 6 or prev[1] != rec[1]
                            or git_mode(prev[0]) != git_mode(mode)):
                        changed = True
                else:
                    raise FastPathUnavailable(f"a special file (socket, fifo) at {de.path!r}")
        if len(entries) != len(old_entries):
            changed = True
        if not entries and not top:
            return None, None
        if not changed:
            if same:
                return old[0], old
            self.dirty = True
            return old[0], (old[0], entries)
        self.dirty = True
        tree = {name: (TREE, node[0]) if len(node) == 2 else (git_mode(node[0]), node[1])
                for name, node in entries.items()}
        sha = self.store.write_tree(tree)
        return sha, (sha, entries)
