"""Objects a running loop has recorded but not yet written out as loose objects.

The loop-agent's checkpoints append their new objects (each exactly the bytes of its loose
file) to one file, ``<git_dir>/loop-org-pending-objects``, instead of creating a file per
object: on this machine's ext4 disk a new file costs 60–800 µs depending on load, an append
4–50 µs, and a checkpoint makes at least three objects. ``publish`` writes them out as git's
loose objects later (before git runs on the repository, when the run stops, and every few
dozen checkpoints with the refs; see ``refs``), and the writer then drops the file.

The file starts with a random generation; then each record is ``magic | payload length |
sha1 | payload | crc32``. Readers in any process find
an object here when it is not (yet) loose; a record torn by a killed writer fails its length
or checksum and ends the readable part. The writer (one per history: the loop-agent holding the
run) cuts such a tail off before its first append, so nothing is ever appended behind garbage.
"""
from __future__ import annotations

import os
import struct
import threading
import zlib

PENDING_OBJECTS = "loop-org-pending-objects"
_HEAD = struct.Struct(">4sI20s")
_MAGIC = b"LOOB"
_CRC = struct.Struct(">I")
# The file starts with a generation: a new file (after a write-out) is told from the old one by
# it, not by its inode number, which the file system hands out again at once.
_GEN = struct.Struct(">4s16s")
_GEN_MAGIC = b"LOOG"


def _generation(fd: int) -> bytes | None:
    head = os.pread(fd, _GEN.size, 0)
    if len(head) < _GEN.size:
        return None
    magic, gen = _GEN.unpack(head)
    return gen if magic == _GEN_MAGIC else None


def _records(fd: int, start: int) -> tuple[list[tuple[bytes, int, int]], int]:
    """(sha, payload offset, payload length) of each whole record from ``start``, and the
    offset where the readable part ends."""
    out, offset = [], start
    size = os.fstat(fd).st_size
    while offset + _HEAD.size + _CRC.size <= size:
        head = os.pread(fd, _HEAD.size, offset)
        magic, length, sha = _HEAD.unpack(head)
        end = offset + _HEAD.size + length + _CRC.size
        if magic != _MAGIC or end > size:
            break
        payload = os.pread(fd, length, offset + _HEAD.size)
        (crc,) = _CRC.unpack(os.pread(fd, _CRC.size, offset + _HEAD.size + length))
        if crc != zlib.crc32(payload, zlib.crc32(head)):
            break
        out.append((sha, offset + _HEAD.size, length))
        offset = end
    return out, offset


class PendingObjects:
    """The pending-objects file of one repository, as one process sees it."""

    def __init__(self, git_dir: bytes) -> None:
        self.path = git_dir + b"/" + PENDING_OBJECTS.encode()
        self._index: dict[bytes, tuple[int, int]] = {}
        self._gen: bytes | None = None    # the file the index describes
        self._scanned = 0
        self._tail_checked = False
        self._lock = threading.Lock()

    def _reset(self, gen: bytes | None) -> None:
        self._index, self._gen, self._scanned = {}, gen, _GEN.size

    def _scan(self, fd: int, gen: bytes | None) -> None:
        if gen != self._gen:
            self._reset(gen)
        if gen is None:
            return
        found, self._scanned = _records(fd, self._scanned)
        for sha, offset, length in found:
            self._index[sha] = (offset, length)

    def has(self, sha: bytes) -> bool:
        """Whether this process has seen ``sha`` in the file (no disk access)."""
        return sha in self._index

    def get(self, sha: bytes) -> bytes | None:
        """The loose-object bytes of ``sha`` if the file holds it, else None."""
        with self._lock:
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                self._reset(None)
                return None
            try:
                gen = _generation(fd)
                if sha not in self._index or gen != self._gen:
                    self._scan(fd, gen)
                loc = self._index.get(sha)
                return None if loc is None else os.pread(fd, loc[1], loc[0])
            finally:
                os.close(fd)

    def append(self, sha: bytes, data: bytes) -> None:
        """Add one object (its loose-file bytes). The caller is the history's one writer."""
        with self._lock:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                gen = _generation(fd)
                if gen is None:                   # a new file (or one torn before its first record)
                    os.ftruncate(fd, 0)
                    gen = os.urandom(16)
                    os.write(fd, _GEN.pack(_GEN_MAGIC, gen))
                    self._reset(gen)
                    self._tail_checked = True
                elif not self._tail_checked or gen != self._gen:
                    self._scan(fd, gen)   # index what is there, and cut a killed writer's torn tail
                    if os.fstat(fd).st_size > self._scanned:
                        os.ftruncate(fd, self._scanned)
                    self._tail_checked = True
                head = _HEAD.pack(_MAGIC, len(data), sha)
                record = head + data + _CRC.pack(zlib.crc32(data, zlib.crc32(head)))
                view = memoryview(record)
                while view:
                    view = view[os.write(fd, view):]
                self._index[sha] = (self._scanned + _HEAD.size, len(data))
                self._scanned += len(record)
            finally:
                os.close(fd)

    def publish(self, write_loose, *, drop: bool) -> int:
        """Write every pending object out with ``write_loose(sha, data)`` (which skips those
        already there) and return how many there were; ``drop`` (the writer only) then removes
        the file."""
        with self._lock:
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return 0
            try:
                found = _records(fd, _GEN.size)[0] if _generation(fd) is not None else []
                for sha, offset, length in found:
                    write_loose(sha, os.pread(fd, length, offset))
            finally:
                os.close(fd)
            if drop:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
                self._reset(None)
                self._tail_checked = False
            return len(found)
