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

The file is ``marshal`` data written to a temp file and renamed into place; the caller writes it
after the refs it describes, and records in ``meta`` what it must match to be used. The cache of
the last file written or read is kept in memory, keyed by the file's identity, so the next
operation in the same process does not read it back.
"""
from __future__ import annotations

import marshal
import os
from dataclasses import dataclass
from pathlib import Path

VERSION = 1
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


_MEMORY: dict[str, tuple[tuple, StatCache]] = {}


def _identity(st: os.stat_result) -> tuple:
    return (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size)


def load(path: Path) -> StatCache | None:
    """The cache at ``path``, or None if there is none or it is not a valid cache."""
    key = os.fspath(path)
    try:
        with open(path, "rb") as f:
            ident = _identity(os.fstat(f.fileno()))
            kept = _MEMORY.get(key)
            if kept is not None and kept[0] == ident:
                return kept[1]
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        version, meta, root = marshal.loads(data)
        valid = version == VERSION and isinstance(meta, dict) and isinstance(root, tuple) and len(root) == 2
    except (ValueError, EOFError, TypeError):
        valid = False
    if not valid:
        return None
    cache = StatCache(root, meta, ident[2])
    _MEMORY[key] = (ident, cache)
    return cache


def save(path: Path, root: Node, meta: dict, *, tmp: Path | None = None) -> StatCache:
    """Write a cache atomically (to ``tmp``, default a fresh temp name, then rename).

    Returns the cache as a later ``load`` would see it (its ``racy_ns`` is the file's mtime).
    """
    tmp = tmp or path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    data = marshal.dumps((VERSION, meta, root))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            ident = _identity(os.fstat(fd))
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    cache = StatCache(root, meta, ident[2])
    _MEMORY[os.fspath(path)] = (ident, cache)
    return cache


def discard(path: Path) -> None:
    _MEMORY.pop(os.fspath(path), None)
    Path(path).unlink(missing_ok=True)


def forget_under(directory: Path) -> None:
    """Drop in-memory caches of files below ``directory`` (it was deleted)."""
    prefix = os.fspath(directory).rstrip(os.sep) + os.sep
    for key in [k for k in _MEMORY if k.startswith(prefix)]:
        del _MEMORY[key]
