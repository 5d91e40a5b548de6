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

File format: a 36-byte header (magic, body length, sha1 of the body) then ``marshal`` data.
The file is rewritten in place (no new inode, no rename: both are costly on journaling
filesystems and the cache is rewritten at every checkpoint); a writer killed midway leaves a
body that fails its checksum, and such a cache is simply not used. Callers write a cache after
the refs it describes and record in ``meta`` what it must match. The last cache written or read
is kept in memory and reused while the file's header is unchanged.
"""
from __future__ import annotations

import hashlib
import marshal
import os
import struct
from dataclasses import dataclass
from pathlib import Path

VERSION = 2
MAGIC = b"LOSTAT02"
HEADER = len(MAGIC) + 8 + 20
COARSE_SLACK_NS = 2_000_000_000

Node = tuple  # (tree, entries) for a directory, 6-tuple for a file (see module docstring)


@dataclass(frozen=True)
class StatCache:
    """A loaded cache: ``root`` node, ``meta`` (what it must match) and its ``racy_ns``."""

    root: Node
    meta: dict
    racy_ns: int


def racy(ctime_ns: int, racy_ns: int) -> bool:
    """True if an entry with this ctime cannot be trusted by stat alone."""
    if ctime_ns % 1_000_000 == 0:
        return ctime_ns >= racy_ns - COARSE_SLACK_NS
    return ctime_ns >= racy_ns


_MEMORY: dict[str, tuple[bytes, StatCache]] = {}
_MEMORY_KEPT = 8  # caches of large workspaces weigh megabytes: keep the few in use


def _remember(key: str, head: bytes, cache: StatCache) -> None:
    _MEMORY.pop(key, None)
    if len(_MEMORY) >= _MEMORY_KEPT:
        del _MEMORY[next(iter(_MEMORY))]
    _MEMORY[key] = (head, cache)


def read_fd(fd: int, key: str) -> StatCache | None:
    """The cache in open file ``fd`` (``key``: its path), or None if empty or invalid."""
    head = os.pread(fd, HEADER, 0)
    kept = _MEMORY.get(key)
    if kept is not None and kept[0] == head:
        return kept[1]
    if len(head) != HEADER or not head.startswith(MAGIC):
        return None
    (length,) = struct.unpack_from(">Q", head, len(MAGIC))
    chunks, offset = [], HEADER
    while offset < HEADER + length:
        chunk = os.pread(fd, HEADER + length - offset, offset)
        if not chunk:
            return None
        chunks.append(chunk)
        offset += len(chunk)
    body = b"".join(chunks)
    if hashlib.sha1(body).digest() != head[len(MAGIC) + 8 :]:
        return None  # torn by a killed writer
    try:
        version, meta, root = marshal.loads(body)
    except (ValueError, EOFError, TypeError):
        return None
    if version != VERSION or not isinstance(meta, dict) or not isinstance(root, tuple) or len(root) != 2:
        return None
    cache = StatCache(root, meta, os.fstat(fd).st_mtime_ns)
    _remember(key, head, cache)
    return cache


def write_fd(fd: int, key: str, root: Node, meta: dict) -> StatCache:
    """Rewrite the cache in open file ``fd`` in place; return it as a later read sees it."""
    body = marshal.dumps((VERSION, meta, root))
    head = MAGIC + struct.pack(">Q", len(body)) + hashlib.sha1(body).digest()
    view, offset = memoryview(head + body), 0
    while offset < len(view):
        offset += os.pwrite(fd, view[offset:], offset)
    # Shrink without ever truncating to zero: ext4 flushes a file truncated to 0 on close.
    os.ftruncate(fd, len(view))
    cache = StatCache(root, meta, os.fstat(fd).st_mtime_ns)
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
    _MEMORY.pop(os.fspath(path), None)
    Path(path).unlink(missing_ok=True)


def forget_under(directory: Path) -> None:
    """Drop in-memory caches of files below ``directory`` (it was deleted)."""
    prefix = os.fspath(directory).rstrip(os.sep) + os.sep
    for key in [k for k in _MEMORY if k.startswith(prefix)]:
        del _MEMORY[key]
