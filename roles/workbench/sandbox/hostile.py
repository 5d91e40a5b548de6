"""Reading what a sandboxed process could write: every such file is hostile input on the host.

A sandboxed command can leave, at any path it can write, a symbolic link to a host file it
cannot see, a hard link, a FIFO (an ``open`` for reading blocks until a writer comes), a socket,
a device node, a sparse file of any apparent size, a folder nested thousands deep. The host's
readers run as the org's user (root, often) with the host's view: following the link reads what
the sandbox hid; opening the FIFO stops the reader.

``read_regular`` is the one way a host-side reader takes a file from a sandbox's reach, built
from what it accepts rather than from what it refuses:

- the path is walked one component at a time from a folder the caller trusts (``beneath``),
  each component opened with ``O_NOFOLLOW`` (a link anywhere on the way is refused, ``..`` and
  absolute components too), so nothing the sandbox wrote can lead the walk out of that folder;
- the file itself is opened with ``O_NOFOLLOW | O_NONBLOCK | O_NOCTTY`` (a FIFO opens at once,
  never waiting for a writer; a terminal never becomes the reader's), then ``fstat`` on the
  descriptor — not on the path, which may have changed — must say "regular file" with a single
  link (a hard link names a file some other path names too);
- it is read up to ``limit`` bytes: one more byte than that means "too large", and the size the
  file claims is never trusted (a sparse file claims anything, a growing one changes).

Each refusal is a ``HostileFile`` with its code (``file_link``, ``file_not_regular``,
``file_linked``, ``file_too_large``, ``file_missing``), never a traceback and never a block.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from roles.workbench.sandbox.errors import SandboxError

_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
_CHUNK = 1 << 16


class HostileFile(SandboxError):
    """A file from a sandbox's reach was refused (``code`` says why). The reader fails the one
    run it serves; nothing else is read in its place."""

    code = "file_refused"


def read_regular(path: str | os.PathLike, *, limit: int, beneath: str | os.PathLike | None = None,
                 single_link: bool = True) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them.

    Params: ``beneath`` the folder the walk starts from, which the caller trusts (its own
    scratch folder, a snapshot it made); ``path`` is then relative to it, or absolute inside it.
    Without ``beneath`` only the last component is checked (the caller made every folder above).
    ``single_link=False`` accepts a file with several hard links (a workspace's own files: uv
    and pnpm link their caches' files into a project; a sandbox can only link what it can see).
    Errors: ``HostileFile`` with ``file_link`` (a link on the way or at the end),
    ``file_not_regular`` (a FIFO, socket, device or folder), ``file_linked`` (more than one hard
    link), ``file_too_large`` (over ``limit``), ``file_missing`` (nothing there).
    """
    fd = open_regular(path, beneath=beneath, single_link=single_link)
    try:
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise HostileFile(f"{os.fspath(path)} is larger than the {limit} bytes a reader takes; it was not read",
                          code="file_too_large")
    return b"".join(chunks)


def open_regular(path: str | os.PathLike, *, beneath: str | os.PathLike | None = None,
                 single_link: bool = True) -> int:
    """A descriptor of the regular, singly linked file at ``path`` (see ``read_regular``); the
    caller closes it. The descriptor is blocking again: a regular file never blocks a read."""
    parent_fd, name = _walk(Path(path), beneath)
    try:
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=parent_fd)
        except OSError as exc:
            raise _refusal(path, exc) from None
    finally:
        os.close(parent_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise HostileFile(f"{os.fspath(path)} is not a regular file ({_kind(st.st_mode)}); it was not read",
                              code="file_not_regular")
        if single_link and st.st_nlink != 1:
            raise HostileFile(f"{os.fspath(path)} has {st.st_nlink} hard links; it was not read",
                              code="file_linked")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _walk(path: Path, beneath: str | os.PathLike | None) -> tuple[int, str]:
    """(descriptor of the folder holding ``path``'s last component, that component), every
    folder below ``beneath`` opened without following a link."""
    if beneath is None:
        top, parts = path.parent, []
    else:
        top = Path(beneath)
        try:
            rel = path.relative_to(top) if path.is_absolute() else path
        except ValueError:
            raise HostileFile(f"{os.fspath(path)} is not below {os.fspath(top)}", code="file_link") from None
        parts = list(rel.parent.parts)
    name = path.name
    if not name or name in (".", "..") or any(p in ("..", ".", "/") or "/" in p for p in parts):
        raise HostileFile(f"{os.fspath(path)} does not name a file below {os.fspath(top)}", code="file_link")
    try:
        fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _refusal(top, exc) from None
    for part in parts:
        try:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            os.close(fd)
            raise _refusal(path, exc) from None
        os.close(fd)
        fd = nxt
    return fd, name


def _refusal(path, exc: OSError) -> HostileFile:
    where = os.fspath(path)
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return HostileFile(f"{where} is, or passes through, a link or a non-folder; it was not read", code="file_link")
    if exc.errno == errno.ENOENT:
        return HostileFile(f"{where} does not exist", code="file_missing")
    if exc.errno in (errno.ENXIO, errno.EOPNOTSUPP, errno.ENODEV):
        return HostileFile(f"{where} is not a regular file; it was not read", code="file_not_regular")
    return HostileFile(f"{where} cannot be opened ({exc.strerror or exc}); it was not read", code="file_refused")


def _kind(mode: int) -> str:
    for test, word in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a link")):
        if test(mode):
            return word
    return "not a file"
