"""Make a directory hold exactly a tree, writing only what differs, in-process.

``Syncer.sync`` walks the directory once against the tree and the directory's stat cache:

- a file whose stat matches its cache entry (and is not racily clean) and whose recorded blob
  and mode are what the tree wants is left alone — no read, no write;
- a file without a usable cache entry is read and kept if its content and mode are right;
- any other file is removed and written from the tree (like git: unlink, then create with
  0666/0777 minus the umask), files and directories the tree does not have are removed, and
  missing ones are written. In a snapshot, a file the syncer wrote itself and that is still
  exactly as written (inode, mode, a single link) is rewritten in place instead.

Two flavours. ``snapshot=False`` (a workspace, for ``reset_to``): the top-level ``.git`` is
never touched, and a nested repository or a socket/fifo raises FastPathUnavailable so git does
the reset exactly as before. ``snapshot=True`` (the eval-agent's snapshot): everything that is
not part of the tree is removed, ``.git`` included. Trees needing more than plain files and
symlinks (see ``ObjectStore.special``) must be refused by the caller beforehand.
"""
from __future__ import annotations

import os
import shutil

from roles.workspace.errors import FastPathUnavailable
from roles.workspace.objects import EXEC, LINK, TREE, ObjectStore, write_all
from roles.workspace.scan import S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, file_record, git_mode
from roles.workspace.statcache import Node, racy

_EMPTY: dict = {}


class Syncer:
    """One synchronisation of a directory; ``changes`` counts files written, removed or read."""

    def __init__(self, store: ObjectStore, racy_ns: int, *, snapshot: bool) -> None:
        self.store = store
        self.racy_ns = racy_ns
        self.snapshot = snapshot
        self.changes = 0

    def sync(self, top: bytes, tree: bytes, old: Node | None) -> Node:
        """Make ``top`` hold ``tree``; return the new cache node describing it."""
        return self._dir(top, tree, old, True)

    def _dir(self, path: bytes, tree: bytes, old: Node | None, top: bool) -> Node:
        want = self.store.tree(tree)
        old_entries = old[1] if old is not None and len(old) == 2 else _EMPTY
        entries = {}
        with os.scandir(path) as it:
            found = list(it)
        for de in found:
            name = de.name
            if name == b".git" and not self.snapshot:
                if top:
                    continue
                raise FastPathUnavailable(f"a nested repository at {de.path!r}")
            if name == b".gitattributes" and not self.snapshot:
                raise FastPathUnavailable(f"a .gitattributes file at {de.path!r}")
            st = de.stat(follow_symlinks=False)
            fmt = st.st_mode & S_IFMT
            w = want.get(name)
            if fmt == S_IFDIR:
                if w is not None and w[0] == TREE:
                    entries[name] = self._dir(de.path, w[1], old_entries.get(name), False)
                    continue
                self.changes += 1
                shutil.rmtree(de.path)
            elif fmt == S_IFREG or fmt == S_IFLNK:
                if w is not None and w[0] != TREE:
                    prev = old_entries.get(name)
                    rec = self._kept(de.path, st, w, prev)
                    if rec is None and self.snapshot and fmt == S_IFREG:
                        rec = self._rewritten(de.path, st, w, prev)
                    if rec is not None:
                        entries[name] = rec
                        continue
                os.unlink(de.path)
                self.changes += 1
            elif self.snapshot:
                os.unlink(de.path)
                self.changes += 1
            else:
                raise FastPathUnavailable(f"a special file (socket, fifo) at {de.path!r}")
            if w is not None:
                entries[name] = self._create(de.path, w)
        for name, w in want.items():
            if name not in entries:
                entries[name] = self._create(path + b"/" + name, w)
        if (old is not None and old[0] == tree and len(entries) == len(old_entries)
                and all(old_entries.get(n, _EMPTY) is e for n, e in entries.items())):
            return old  # untouched: the same node, so its encoded cache chunk is reused
        return (tree, entries)

    def _kept(self, path: bytes, st: os.stat_result, want: tuple[int, bytes],
              prev: tuple | None) -> tuple | None:
        """The cache entry of a file that already holds ``want`` (mode, blob), else None."""
        if (prev is not None and len(prev) == 6 and prev[2] == st.st_mtime_ns
                and prev[3] == st.st_ctime_ns and prev[0] == st.st_mode and prev[4] == st.st_size
                and prev[5] == st.st_ino and not racy(st.st_ctime_ns, self.racy_ns)):
            return prev if prev[1] == want[1] and git_mode(prev[0]) == want[0] else None
        if git_mode(st.st_mode) != want[0]:
            return None
        rec = file_record(self.store, path, st, keep=False)  # unknown or racy: read it
        self.changes += 1
        return rec if rec[1] == want[1] else None

    def _rewritten(self, path: bytes, st: os.stat_result, want: tuple[int, bytes],
                   prev: tuple | None) -> tuple | None:
        """A snapshot file this syncer wrote before, rewritten in place with ``want``'s content;
        None if it must be replaced instead (then it is unlinked and created again).

        In place only when the file is still the one recorded (same inode, mode as written,
        one link, ours) and the wanted mode is the same: it then costs no new file, where a
        new file costs a directory entry and an inode (60–800 µs on this machine's ext4
        disk). A torn rewrite has a new stat, so the next sync reads it and writes it again.
        """
        if (prev is None or len(prev) != 6 or want[0] == LINK or prev[5] != st.st_ino
                or prev[0] != st.st_mode or git_mode(st.st_mode) != want[0] or st.st_nlink != 1
                or st.st_uid != os.geteuid()):
            return None
        try:
            out = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            now = os.fstat(out)
            if now.st_ino != st.st_ino or now.st_nlink != 1 or now.st_mode != st.st_mode:
                return None                     # swapped since the scan: replace it
            data = self.store.blob(want[1])
            write_all(out, data)
            if now.st_size > len(data):
                os.ftruncate(out, len(data))    # never to zero from a larger size: see statcache
            new = os.fstat(out)
        finally:
            os.close(out)
        self.changes += 1
        return (new.st_mode, want[1], new.st_mtime_ns, new.st_ctime_ns, new.st_size, new.st_ino)

    def _create(self, path: bytes, entry: tuple[int, bytes]) -> Node:
        mode, sha = entry
        if mode == TREE:
            os.mkdir(path)
            return self._dir(path, sha, None, False)
        self.changes += 1
        data = self.store.blob(sha)
        if mode == LINK:
            os.symlink(data, path)
            st = os.lstat(path)
        else:
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                          0o777 if mode == EXEC else 0o666)
            try:
                write_all(out, data)
                st = os.fstat(out)
            finally:
                os.close(out)
        return (st.st_mode, sha, st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)
