"""Git objects in-process: loose blobs, trees and commits in exactly git's format.

An object is ``<type> <size>\\0<body>``, named by its sha1 and stored zlib-compressed at
``objects/<2 hex>/<38 hex>``; written to a temp file in the same directory and renamed into
place (read-only, like git), so a killed writer never leaves a torn object and git reads ours
as its own. Only loose (and pending, below) objects are read here: one missing (or packed by a
manual ``git gc``) raises FastPathUnavailable and the caller asks git instead. Objects never change, so parsed
trees and commits are cached for the life of the process.

A store with ``defer_writes`` set (the running loop's) appends new objects to the pending file
instead (``pending``); every store reads an object there when it is not loose, and
``publish_pending`` writes them out as loose objects.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
import zlib
from binascii import hexlify
from pathlib import Path

from roles.workspace.errors import FastPathUnavailable
from roles.workspace.pending import PendingObjects

TREE = 0o40000
FILE = 0o100644
EXEC = 0o100755
LINK = 0o120000
EMPTY_TREE = bytes.fromhex("4b825dc642cb6eb9a060e54bf8d69288fbee4904")
_PLAIN_MODES = frozenset((TREE, FILE, EXEC, LINK))
_CACHE_LIMIT = 50_000  # parsed objects kept per repository before the caches start over

Entries = dict  # name (bytes) -> (mode, sha (20 bytes))


def read_file(path: bytes | str, size: int = 0, *, nofollow: bool = False) -> bytes:
    """Whole content of a file (plain ``os`` calls: a third of the syscalls of ``open()``).

    ``size``: the expected size (one read); ``nofollow``: refuse a symlink (ELOOP).
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (os.O_NOFOLLOW if nofollow else 0))
    try:
        chunks = []
        while True:
            chunk = os.read(fd, max(size + 1, 65536))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def object_id(kind: bytes, body: bytes) -> bytes:
    """The 20-byte id git gives an object of this kind and body."""
    h = hashlib.sha1(b"%s %d\0" % (kind, len(body)))
    h.update(body)
    return h.digest()


def _loose_bytes(kind: bytes, body: bytes) -> bytes:
    """What a loose object's file holds: the zlib-compressed ``<kind> <size>\\0<body>``."""
    return zlib.compress(b"%s %d\0" % (kind, len(body)) + body, 1)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def encode_tree(entries: Entries) -> bytes:
    """Serialize tree entries in git's order (a tree sorts as if its name ended with ``/``)."""
    items = sorted(entries.items(), key=lambda kv: kv[0] + b"/" if kv[1][0] == TREE else kv[0])
    return b"".join(b"%o %s\0%s" % (mode, name, sha) for name, (mode, sha) in items)


def decode_tree(body: bytes) -> Entries:
    out, i, end = {}, 0, len(body)
    while i < end:
        sp = body.index(b" ", i)
        nul = body.index(b"\0", sp)
        out[body[sp + 1 : nul]] = (int(body[i:sp], 8), body[nul + 1 : nul + 21])
        i = nul + 21
    return out


def ident(name: str, email: str, when: float | None = None) -> str:
    """``Name <email> <epoch> <±hhmm>`` in the local timezone, as git writes it."""
    secs = int(time.time() if when is None else when)
    off = time.localtime(secs).tm_gmtoff // 60
    sign = "-" if off < 0 else "+"
    return f"{name} <{email}> {secs} {sign}{abs(off) // 60:02d}{abs(off) % 60:02d}"


def encode_commit(tree: str, parents: list[str], author: str, committer: str, message: str) -> bytes:
    """A commit body exactly as ``git commit-tree -m message`` writes it."""
    head = [f"tree {tree}"] + [f"parent {p}" for p in parents]
    text = "\n".join(head + [f"author {author}", f"committer {committer}", "", message])
    return (text if text.endswith("\n") else text + "\n").encode("utf-8", "surrogateescape")


def write_commit(store: "ObjectStore", tree: str, parents: list[str], message: str,
                 env: dict[str, str]) -> str:
    """Write a commit as ``git commit-tree`` would with ``env``'s author and committer, now."""
    now = time.time()
    body = encode_commit(tree, parents,
                         ident(env["GIT_AUTHOR_NAME"], env["GIT_AUTHOR_EMAIL"], now),
                         ident(env["GIT_COMMITTER_NAME"], env["GIT_COMMITTER_EMAIL"], now), message)
    sha = store.write(b"commit", body)
    store.remember_commit(sha, bytes.fromhex(tree), tuple(bytes.fromhex(p) for p in parents))
    return sha.hex()


class ObjectStore:
    """Loose objects of one repository (``git_dir``), with per-process parse caches."""

    def __init__(self, git_dir: Path) -> None:
        self.root = os.fsencode(git_dir) + b"/objects/"
        self.pending = PendingObjects(os.fsencode(git_dir))
        self.defer_writes = False  # set by the history's one writer (the running loop)
        self._present: set[bytes] = set()
        self._trees: dict[bytes, Entries] = {}
        self._commits: dict[bytes, tuple[bytes, tuple[bytes, ...]]] = {}
        self._kinds: dict[bytes, bytes] = {}
        self._special: dict[bytes, bool] = {}
        self._files: dict[bytes, dict[bytes, tuple[int, bytes]]] = {}
        self._diffs: dict[tuple, list[bytes]] = {}

    # -- raw objects -------------------------------------------------------------------------

    def _path(self, sha: bytes) -> tuple[bytes, bytes]:
        hx = hexlify(sha)
        d = self.root + hx[:2]
        return d, d + b"/" + hx[2:]

    def write(self, kind: bytes, body: bytes) -> bytes:
        """Store an object (if absent) and return its 20-byte sha1."""
        sha = object_id(kind, body)
        if sha in self._present:
            return sha
        if not os.path.exists(self._path(sha)[1]):
            if not self.defer_writes:
                self._write_loose(sha, _loose_bytes(kind, body))
            elif not self.pending.has(sha):
                self.pending.append(sha, _loose_bytes(kind, body))
        self._present.add(sha)
        return sha

    def _write_loose(self, sha: bytes, data: bytes) -> None:
        """Write the loose file of ``sha`` (``data``: its compressed bytes)."""
        d, path = self._path(sha)
        tmp = b"%s/tmp_obj_%d_%s" % (d, os.getpid(), hexlify(os.urandom(6)))
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        except FileNotFoundError:
            os.makedirs(d, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        try:
            write_all(fd, data)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        os.rename(tmp, path)

    def publish_pending(self, *, drop: bool) -> int:
        """Write the pending objects out as loose objects (git reads only those); ``drop``
        (the writer only) removes the pending file afterwards. Returns how many there were."""
        def write_out(sha: bytes, data: bytes) -> None:
            if not os.path.exists(self._path(sha)[1]):
                self._write_loose(sha, data)

        return self.pending.publish(write_out, drop=drop)

    def read(self, sha: bytes) -> tuple[bytes, bytes]:
        """(kind, body) of a loose or pending object. Raises FastPathUnavailable if it is
        neither (packed by git, or missing)."""
        try:
            try:
                raw = read_file(self._path(sha)[1])
            except FileNotFoundError:
                raw = self.pending.get(sha)
                if raw is None:
                    raw = read_file(self._path(sha)[1])  # written out meanwhile, or missing
            data = zlib.decompress(raw)
        except (OSError, zlib.error) as exc:
            raise FastPathUnavailable(f"object {sha.hex()} is not a readable loose object") from exc
        nul = data.index(b"\0")
        kind, _, size = data[:nul].partition(b" ")
        if int(size) != len(data) - nul - 1:
            raise FastPathUnavailable(f"object {sha.hex()} has a bad size")
        self._present.add(sha)
        self._kinds[sha] = kind
        return kind, data[nul + 1 :]

    def kind(self, sha: bytes) -> bytes:
        """Object type (``commit``, ``tree``, ...) of a loose or pending object; checks it
        still exists."""
        kind = self._kinds.get(sha)
        if kind is None or not (self.pending.has(sha) or os.path.exists(self._path(sha)[1])):
            kind = self.read(sha)[0]
        return kind

    def blob(self, sha: bytes) -> bytes:
        kind, body = self.read(sha)
        if kind != b"blob":
            raise FastPathUnavailable(f"object {sha.hex()} is a {kind.decode()}, not a blob")
        return body

    def _bounded(self) -> None:
        if len(self._trees) + len(self._commits) > _CACHE_LIMIT:
            for cache in (self._trees, self._commits, self._special, self._files, self._diffs):
                cache.clear()

    # -- trees and commits -------------------------------------------------------------------

    def tree(self, sha: bytes) -> Entries:
        """Entries of a tree: name -> (mode, sha). The result is shared: never mutate it."""
        entries = self._trees.get(sha)
        if entries is None:
            if sha == EMPTY_TREE:
                return {}
            kind, body = self.read(sha)
            if kind != b"tree":
                raise FastPathUnavailable(f"object {sha.hex()} is a {kind.decode()}, not a tree")
            self._bounded()
            entries = self._trees[sha] = decode_tree(body)
        return entries

    def commit(self, sha: bytes) -> tuple[bytes, tuple[bytes, ...]]:
        """(tree, parents) of a commit."""
        parsed = self._commits.get(sha)
        if parsed is None:
            kind, body = self.read(sha)
            if kind != b"commit":
                raise FastPathUnavailable(f"object {sha.hex()} is a {kind.decode()}, not a commit")
            head = body.split(b"\n\n", 1)[0].split(b"\n")
            tree = bytes.fromhex(head[0][5:].decode())
            parents = tuple(bytes.fromhex(line[7:].decode()) for line in head[1:]
                            if line.startswith(b"parent "))
            self._bounded()
            parsed = self._commits[sha] = (tree, parents)
        return parsed

    def remember_commit(self, sha: bytes, tree: bytes, parents: tuple[bytes, ...]) -> None:
        """Cache what ``commit`` would parse from a commit this process just wrote."""
        self._bounded()
        self._commits.setdefault(sha, (tree, parents))
        self._kinds[sha] = b"commit"

    def write_tree(self, entries: Entries) -> bytes:
        sha = self.write(b"tree", encode_tree(entries))
        self._trees.setdefault(sha, entries)
        return sha

    def files(self, tree: bytes) -> dict[bytes, tuple[int, bytes]]:
        """Every non-tree entry below ``tree``: path (``/``-separated bytes) -> (mode, sha)."""
        flat = self._files.get(tree)
        if flat is None:
            flat = {}
            self._flatten(tree, b"", flat)
            if len(self._files) > 8:
                self._files.clear()
            self._files[tree] = flat
        return flat

    def _flatten(self, tree: bytes, prefix: bytes, out: dict) -> None:
        for name, (mode, sha) in self.tree(tree).items():
            if mode == TREE:
                self._flatten(sha, prefix + name + b"/", out)
            else:
                out[prefix + name] = (mode, sha)

    def changed(self, a: bytes, b: bytes) -> list[bytes]:
        """Paths of non-tree entries added, removed or changed (content or mode) from a to b."""
        key = (a, b)
        paths = self._diffs.get(key)
        if paths is None:
            paths = sorted(self._diff(a, b, b""))
            if len(self._diffs) > 64:
                self._diffs.clear()
            self._diffs[key] = paths
        return paths

    def _diff(self, a: bytes | None, b: bytes | None, prefix: bytes) -> list[bytes]:
        if a == b:
            return []
        ta = self.tree(a) if a is not None else {}
        tb = self.tree(b) if b is not None else {}
        out: list[bytes] = []
        for name in ta.keys() | tb.keys():
            x, y = ta.get(name), tb.get(name)
            if x == y:
                continue
            xt = x is not None and x[0] == TREE
            yt = y is not None and y[0] == TREE
            if xt or yt:
                out += self._diff(x[1] if xt else None, y[1] if yt else None, prefix + name + b"/")
            if (x is not None and not xt) or (y is not None and not yt):
                out.append(prefix + name)
        return out

    def special(self, tree: bytes) -> bool:
        """True if checking ``tree`` out could need more than plain files and symlinks:
        a ``.gitattributes`` (conversions, filters), a gitlink, or an unusual mode."""
        found = self._special.get(tree)
        if found is None:
            found = any(name == b".gitattributes" or mode not in _PLAIN_MODES
                        or (mode == TREE and self.special(sha))
                        for name, (mode, sha) in self.tree(tree).items())
            self._special[tree] = found
        return found

    def edit_tree(self, base: bytes | None, edits: dict[bytes, tuple[int, bytes]]) -> bytes:
        """Tree ``base`` with each path in ``edits`` set to (mode, sha); whatever is in the way
        (a file where a directory is needed, a directory where a file goes) is replaced."""
        entries = dict(self.tree(base)) if base is not None else {}
        nested: dict[bytes, dict] = {}
        for path, entry in edits.items():
            head, sep, rest = path.partition(b"/")
            if sep:
                nested.setdefault(head, {})[rest] = entry
            else:
                entries[head] = entry
        for head, sub in nested.items():
            cur = entries.get(head)
            entries[head] = (TREE, self.edit_tree(cur[1] if cur and cur[0] == TREE else None, sub))
        return self.write_tree(entries)


_STORES: dict[str, ObjectStore] = {}
_STORES_KEPT = 16
_STORES_LOCK = threading.Lock()


def store_for(git_dir: Path) -> ObjectStore:
    """The process-wide store of ``git_dir`` (caches are shared by every history object)."""
    key = os.fspath(git_dir)
    with _STORES_LOCK:  # a loop-agent runs several engines, one thread each
        store = _STORES.pop(key, None)
        if store is None:
            if len(_STORES) >= _STORES_KEPT:
                del _STORES[next(iter(_STORES))]  # the longest unused: work items come and go
            store = ObjectStore(git_dir)
        _STORES[key] = store
        return store


def forget(git_dir: Path) -> None:
    """Drop the caches of a repository that was deleted."""
    with _STORES_LOCK:
        _STORES.pop(os.fspath(git_dir), None)
