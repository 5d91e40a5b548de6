"""Stat caches: what a directory held when it was last read or written, kept in the git dir.

A cache mirrors the directory as nested nodes:

- a directory is ``(tree, entries)``: the 20-byte id of the tree it held (None if unknown) and
  ``{name (bytes): node}``;
- a file or symlink is ``(st_mode, blob, mtime_ns, ctime_ns, size, ino)``: while ``lstat``
  still returns exactly these, the content is still ``blob``.

Racily clean entries are handled as git does: a file changed in the same timestamp tick as its
recorded stat keeps an identical stat, so an entry whose ctime is not strictly older than the
cache file itself (the moment the cache was written, on the filesystem's own clock) is read
again before it is trusted. ctime cannot be set by a process, unlike mtime. Timestamps that look
coarse (whole milliseconds or seconds, as on FAT or ext3) get two seconds of slack.

File format: a 28-byte header (magic, body length, crc32 of the body, a nonce naming this
write) then ``marshal`` data: one chunk per directory (its tree, files and subdirectory names).
The file is rewritten in place (no new inode, no rename: both are costly on journaling
filesystems, and the cache is rewritten at every checkpoint); a writer killed midway leaves a
body that fails its checksum, and such a cache is simply not used. Callers write a cache after
the refs it describes and record in ``meta`` what it must match. The last cache written or read
is kept in memory and reused while the file's header is unchanged, and the chunk of every
directory whose node did not change is reused as it is, so a write costs what changed.
"""
from __future__ import annotations

import marshal
import os
import struct
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path

VERSION = 3
MAGIC = b"LOSTAT03"
HEADER = struct.Struct(">8sQI8s")  # magic, body length, crc32 of the body, nonce
COARSE_SLACK_NS = 2_000_000_000

Node = tuple  # (tree, entries) for a directory, 6-tuple for a file (see module docstring)


@dataclass(frozen=True)
class StatCache:
    """A loaded cache: ``root`` node, ``meta`` (what it must match) and its ``racy_ns``."""

    root: Node
    meta: dict
    racy_ns: int
    # id(directory node) -> (node, its encoded chunk, its subdirectory names)
    chunks: dict = field(default_factory=dict, compare=False, repr=False)


def racy(ctime_ns: int, racy_ns: int) -> bool:
    """True if an entry with this ctime cannot be trusted by stat alone."""
    if ctime_ns % 1_000_000 == 0:
        return ctime_ns >= racy_ns - COARSE_SLACK_NS
    return ctime_ns >= racy_ns


_MEMORY: dict[str, tuple[bytes, StatCache]] = {}
_MEMORY_KEPT = 8  # caches of large workspaces weigh megabytes: keep the few in use


_MEMORY_LOCK = threading.Lock()


def _remember(key: str, head: bytes, cache: StatCache) -> None:
    with _MEMORY_LOCK:
        _MEMORY.pop(key, None)
        if len(_MEMORY) >= _MEMORY_KEPT:
            del _MEMORY[next(iter(_MEMORY))]
        _MEMORY[key] = (head, cache)


def _encode(root: Node, known: dict) -> tuple[list, dict]:
    """Chunks of every directory (pre-order: a parent before what it holds), reusing known ones."""
    chunks, by_node, stack = [], {}, [(b"", root)]
    while stack:
        path, node = stack.pop()
        kept = known.get(id(node))
        if kept is None or kept[0] is not node:
            files = {n: e for n, e in node[1].items() if len(e) != 2}
            subdirs = [n for n, e in node[1].items() if len(e) == 2]
            kept = (node, marshal.dumps((node[0], files, subdirs)), subdirs)
        by_node[id(node)] = kept
        chunks.append((path, kept[1]))
        stack.extend((path + b"/" + n, node[1][n]) for n in kept[2])
    return chunks, by_node


def _decode(chunks: list) -> tuple[Node, dict]:
    nodes, by_node = {}, {}
    for path, chunk in reversed(chunks):  # what a directory holds comes before it
        tree, entries, subdirs = marshal.loads(chunk)
        for name in subdirs:
            entries[name] = nodes.pop(path + b"/" + name)
        node = nodes[path] = (tree, entries)
        by_node[id(node)] = (node, chunk, subdirs)
    return nodes[b""], by_node


def read_fd(fd: int, key: str) -> StatCache | None:
    """The cache in open file ``fd`` (``key``: its path), or None if empty or invalid."""
    head = os.pread(fd, HEADER.size, 0)
    kept = _MEMORY.get(key)
    if kept is not None and kept[0] == head:
        return kept[1]
    if len(head) != HEADER.size or not head.startswith(MAGIC):
        return None
    _, length, crc, _ = HEADER.unpack(head)
    parts, offset = [], HEADER.size
    while offset < HEADER.size + length:
        part = os.pread(fd, HEADER.size + length - offset, offset)
        if not part:
            return None
        parts.append(part)
        offset += len(part)
    body = b"".join(parts)
    if zlib.crc32(body) != crc:
        return None  # torn by a killed writer
    try:
        version, meta, chunks = marshal.loads(body)
        if version != VERSION or not isinstance(meta, dict):
            return None
        root, by_node = _decode(chunks)
    except (ValueError, EOFError, TypeError, KeyError):
        return None
    cache = StatCache(root, meta, os.fstat(fd).st_mtime_ns, by_node)
    _remember(key, head, cache)
    return cache


def write_fd(fd: int, key: str, root: Node, meta: dict) -> StatCache:
    """Rewrite the cache in open file ``fd`` in place; return it as a later read sees it."""
    kept = _MEMORY.get(key)
    chunks, by_node = _encode(root, kept[1].chunks if kept is not None else {})
    body = marshal.dumps((VERSION, meta, chunks))
    head = HEADER.pack(MAGIC, len(body), zlib.crc32(body), os.urandom(8))
    for data, start in ((head, 0), (body, HEADER.size)):
        view, offset = memoryview(data), 0
        while offset < len(view):
            offset += os.pwrite(fd, view[offset:], start + offset)
    # Shrink without ever truncating to zero: ext4 flushes a file truncated to 0 on close.
    os.ftruncate(fd, HEADER.size + len(body))
    cache = StatCache(root, meta, os.fstat(fd).st_mtime_ns, by_node)
    _remember(key, head, cache)
    return cache


def load(path: Path) -> StatCache | None:
    """The cache at ``path``, or None if there is none or it is not a valid cache."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return read_fd(fd, os.fspath(path))
    finally:
        os.close(fd)


def save(path: Path, root: Node, meta: dict) -> StatCache:
    """Write the cache at ``path`` (in place; created if absent)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        return write_fd(fd, os.fspath(path), root, meta)
    finally:
        os.close(fd)


def discard(path: Path) -> None:
    with _MEMORY_LOCK:
        _MEMORY.pop(os.fspath(path), None)
    Path(path).unlink(missing_ok=True)


def forget_under(directory: Path) -> None:
    """Drop in-memory caches of files below ``directory`` (it was deleted)."""
    prefix = os.fspath(directory).rstrip(os.sep) + os.sep
    with _MEMORY_LOCK:
        for key in [k for k in _MEMORY if k.startswith(prefix)]:
            del _MEMORY[key]
