"""The outbox: the file fallback when a push cannot complete.

Layout under the org home's ``outbox/`` folder::

    outbox/<recipient>/<id>.msg          messages waiting for <recipient>
    outbox/.tmp/<recipient>/...          temp files being written
    outbox/.quarantine/<recipient>/...   copies of files that were rejected
    outbox/.wake/<recipient>             a FIFO the receiver keeps open: the writer's wake

Writers write a temp file, fsync it and rename it into place, so a reader never sees a partial
message; the reader *deletes* processed files and *copies* bad ones to quarantine before deleting
them, never moves them.

The writer wakes the reader itself, with one byte into the recipient's FIFO (``WakeFifo``), rather
than the reader watching its folder. A watch costs every receiver an inotify instance, and the
kernel allows 128 per user (``fs.inotify.max_user_instances``) for every process of that user
together: an org of 128 loop-agents could not start (each role beyond the limit crashed at start,
again and again). A FIFO is one file descriptor of the receiver's own, counted against nothing
shared, and needs no thread. Every file lands through ``write_message``, so every file is woken
for; a file put there by other means is found by the start-up drain and the slow sweep.
"""
from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path

from transport.kinds import role_of

SUFFIX = ".msg"
TMP_DIR = ".tmp"
QUARANTINE_DIR = ".quarantine"
WAKE_DIR = ".wake"


def _private_dirs(*paths: Path) -> None:
    for path in paths:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)


def write_message(outbox_root: Path | str, recipient: str, msg_id: str, data: bytes) -> Path:
    """Atomically place one encoded message in ``outbox/<recipient>/``.

    Args:
        outbox_root: the org home's ``outbox/`` folder.
        recipient: the receiving instance (validated: it becomes a folder name).
        msg_id: the envelope id (hex; it becomes the file name).
        data: the encoded envelope.

    Returns:
        The final path.

    Raises:
        BadInstance: ``recipient`` is not an instance name.
        OSError: the file system refused (disk full, permissions).
    """
    role_of(recipient)
    root = Path(outbox_root)
    final_dir, tmp_dir = root / recipient, root / TMP_DIR / recipient
    if not tmp_dir.is_dir() or not final_dir.is_dir():
        _private_dirs(final_dir, tmp_dir)
    tmp = tmp_dir / f"{msg_id}.{os.getpid()}.{os.urandom(4).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    final = final_dir / f"{msg_id}{SUFFIX}"
    os.rename(tmp, final)
    wake(root, recipient)
    return final


def wake(outbox_root: Path | str, recipient: str) -> bool:
    """Tell ``recipient``'s receiver that a file waits, if it is listening (its FIFO is open).
    Never blocks and never fails: a receiver that is down drains its folder when it starts.

    Returns:
        True when the byte was written (or a wake was already pending).
    """
    path = Path(outbox_root) / WAKE_DIR / recipient
    try:
        # O_NONBLOCK: ENXIO at once when no receiver holds it open; O_NOFOLLOW: only the FIFO
        # the receiver made is ever written to
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        os.write(fd, b"\0")
        return True
    except BlockingIOError:                 # the pipe is full: a wake is pending anyway
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


class OutboxReader:
    """Reads, deletes and quarantines the files waiting for one recipient.

    Args:
        outbox_root: the org home's ``outbox/`` folder.
        recipient: the instance whose folder this reads.
        max_bytes: files are read up to ``max_bytes + 1`` bytes, so an oversized one is seen as
            such without loading it whole.
    """

    def __init__(self, outbox_root: Path | str, recipient: str, *, max_bytes: int) -> None:
        role_of(recipient)
        root = Path(outbox_root)
        self.recipient = recipient
        self.dir = root / recipient
        self.tmp_dir = root / TMP_DIR / recipient
        self.quarantine_dir = root / QUARANTINE_DIR / recipient
        self.max_bytes = max_bytes
        _private_dirs(self.dir, self.tmp_dir)

    def pending(self, limit: int) -> list[Path]:
        """Up to ``limit`` waiting files, oldest id first. Dot-files and folders are ignored;
        anything else that is not a regular file (e.g. a symlink) is removed unread."""
        names = []
        try:
            entries = list(os.scandir(self.dir))
        except FileNotFoundError:
            _private_dirs(self.dir)
            return []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_file(follow_symlinks=False):
                names.append(entry.name)
            elif not entry.is_dir(follow_symlinks=False):
                self.done(Path(entry.path))
        names.sort()
        return [self.dir / name for name in names[:limit]]

    def read(self, path: Path) -> bytes | None:
        """The file's bytes (at most ``max_bytes + 1``), or None if it vanished meanwhile."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except (FileNotFoundError, OSError):
            return None
        try:
            chunks, left = [], self.max_bytes + 1
            while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
                chunks.append(chunk)
                left -= len(chunk)
        finally:
            os.close(fd)
        return b"".join(chunks)

    def done(self, path: Path) -> None:
        """Delete a processed file (missing is fine: another drain got it first)."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def quarantine(self, path: Path, code: str) -> Path | None:
        """Copy a rejected file to ``outbox/.quarantine/<recipient>/<name>.<code>``, then delete it.

        Returns the copy's path, or None if the file had vanished.
        """
        _private_dirs(self.quarantine_dir)
        dest = self.quarantine_dir / f"{path.name}.{code}"
        try:
            shutil.copyfile(path, dest, follow_symlinks=False)
        except FileNotFoundError:
            return None
        self.done(path)
        return dest

    def clean_orphans(self, max_age_s: float, *, now: float | None = None) -> int:
        """Delete temp files older than ``max_age_s`` (a writer died between write and rename).

        Returns how many were deleted.
        """
        limit = (time.time() if now is None else now) - max_age_s
        removed = 0
        try:
            entries = list(os.scandir(self.tmp_dir))
        except FileNotFoundError:
            return 0
        for entry in entries:
            try:
                if entry.is_file(follow_symlinks=False) and entry.stat(
                        follow_symlinks=False).st_mtime < limit:
                    os.unlink(entry.path)
                    removed += 1
            except FileNotFoundError:
                continue
        return removed


class WakeFifo:
    """The receiving end of ``wake``: a FIFO at ``outbox/.wake/<recipient>``, held open for reading
    and writing (so it never reports a hang-up when a writer closes, and a writer's open never
    waits). ``fd`` becomes readable when a writer placed a file; ``drain()`` empties it.

    Raises:
        OSError: the FIFO could not be made or opened (the caller falls back to its sweep).
    """

    def __init__(self, outbox_root: Path | str, recipient: str) -> None:
        role_of(recipient)
        folder = Path(outbox_root) / WAKE_DIR
        _private_dirs(folder)
        self.path = folder / recipient
        try:
            os.mkfifo(self.path, 0o600)
        except FileExistsError:
            st = os.lstat(self.path)
            if not stat.S_ISFIFO(st.st_mode):       # never anything else in its place
                os.unlink(self.path)
                os.mkfifo(self.path, 0o600)
        self.fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)

    def drain(self) -> None:
        try:
            while os.read(self.fd, 4096):
                pass
        except OSError:
            pass

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# A wake a CLI left in the outbox (the coordinator was down) that nobody took within this long is
# only noise: the coordinator reconciles from state.db at every start and every few seconds, so
# the write it announced was seen long ago; and the receiver refuses it as expired anyway.
CLI_OUTBOX_STALE_S = 600.0


def stale_cli_outbox(root: Path, *, now: float | None = None, older_than_s: float = CLI_OUTBOX_STALE_S) -> list[Path]:
    """Outbox files (``<root>/<recipient>/*.msg``) sent by a CLI (human) instance, older than
    ``older_than_s``. The sender is read from the file, unauthenticated: only to explain and
    clean up, never to act on. Returns their paths, oldest first."""
    import orjson

    from state_db.vocab import Actor
    from transport.errors import BadInstance

    now = time.time() if now is None else now
    found = []
    for f in root.glob(f"[!.]*/*{SUFFIX}") if root.is_dir() else []:
        try:
            age = now - f.stat().st_mtime
            if age <= older_than_s:
                continue
            sender = orjson.loads(f.read_bytes()).get("sender")
            if role_of(sender) == Actor.HUMAN:
                found.append((f.stat().st_mtime, f))
        except (OSError, orjson.JSONDecodeError, AttributeError, BadInstance):
            continue                # gone meanwhile, or not a message a CLI wrote
    return [f for _, f in sorted(found)]
