"""The outbox: the file fallback when a push cannot complete.

Layout under the org home's ``outbox/`` folder::

    outbox/<recipient>/<id>.msg          messages waiting for <recipient> (watched)
    outbox/.tmp/<recipient>/...          temp files being written (never watched)
    outbox/.quarantine/<recipient>/...   copies of files that were rejected

Writers write a temp file, fsync it and rename it into place, so a reader never sees a partial
message. Temp files live in a sibling folder because a rename out of (or within) a watched
folder holds watchdog's later events back for 0.5 s. For the same reason the reader *deletes*
processed files and *copies* bad ones to quarantine before deleting them, never moves them.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Callable

from transport.kinds import role_of

SUFFIX = ".msg"
TMP_DIR = ".tmp"
QUARANTINE_DIR = ".quarantine"


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
    return final


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


class OutboxWatch:
    """Calls ``on_change()`` (from watchdog's thread) when a file appears in a recipient folder.

    Deletions and dot-files are ignored, so the reader's own deletes do not wake it.
    """

    def __init__(self, folder: Path, on_change: Callable[[], None]) -> None:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        self.folder = folder

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event) -> None:  # noqa: ANN001 - watchdog's signature
                if event.is_directory or event.event_type not in ("created", "moved", "closed"):
                    return
                path = getattr(event, "dest_path", "") or event.src_path
                if not os.path.basename(os.fsdecode(path)).startswith("."):
                    on_change()

        self._observer = Observer()
        self._observer.schedule(_Handler(), str(folder), recursive=False)
        self._observer.daemon = True

    def start(self) -> None:
        self._observer.start()

    def stop(self) -> None:
        self._observer.stop()
        if self._observer.is_alive():
            self._observer.join(timeout=2)


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
