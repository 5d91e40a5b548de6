"""Waking whoever waits for the org's roles to change status, instead of having it poll state.db;
and telling the role template a role it forked is ready (``tell_template``).

``org start`` (``scripts.control.wait_ready``) waits until every role has written its ready row.
Each waiter holds a FIFO of its own in ``run/ready/``; a role that has committed a new status
(``RoleProcess.heartbeat``), and the supervisor when it records a role failed, write one byte
into every FIFO there. The byte only says "look again": the row in state.db is the fact, so a
waiter reads state.db after each wake, and a wake that is lost (a role of an older version, a
full pipe) delays the waiter to its next look on a slow timeout, never misleads it.

FIFOs rather than an inotify watch on state.db, for the reason ``transport.outbox`` gives: a
watch costs an inotify instance, of which the kernel allows 128 per user for all its processes
together. A FIFO per waiter also wakes every waiter, where one shared FIFO wakes one reader.
"""
from __future__ import annotations

import os
import select
import stat
from pathlib import Path

WAKE_DIR = "ready"
# in a role forked by the role template: the write end of the pipe it closes once it is ready
# (set by roles/supervisor/forkserver.py in the forked process; never inherited through exec)
template_pipe: int | None = None


def poke(run_dir: Path | str) -> int:
    """Write one byte into every waiter's FIFO under ``run_dir``. Never blocks and never fails:
    a FIFO whose waiter is gone refuses the open (ENXIO) and is skipped.

    Returns:
        How many waiters were woken.
    """
    woken = 0
    try:
        entries = list(os.scandir(Path(run_dir) / WAKE_DIR))
    except OSError:                          # nobody ever waited here
        return 0
    for entry in entries:
        if entry.name.startswith("."):       # a FIFO being made, not yet open
            continue
        try:
            # O_NONBLOCK: ENXIO at once when its waiter is gone; O_NOFOLLOW: only a FIFO made here
            fd = os.open(entry.path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, b"\0")
                woken += 1
        except BlockingIOError:              # full: a wake is pending anyway
            woken += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return woken


def tell_template() -> bool:
    """Close the pipe the role template gave this role (``template_pipe``): it begins its heavy
    stage once every role it forked is ready. Returns whether there was one to close."""
    global template_pipe
    fd, template_pipe = template_pipe, None
    if fd is None:
        return False
    try:
        os.close(fd)
    except OSError:
        pass
    return True


class Waiter:
    """One waiter's FIFO, ``run/ready/<pid>``, open for reading and writing (a writer's open never
    waits, and a writer that closes is no hang-up). Made under a hidden name and renamed into
    place once open, so a FIFO ``poke`` finds without a reader is one whose waiter is gone.

    Raises:
        OSError: the FIFO could not be made (the caller looks at state.db on its timeout alone).
    """

    def __init__(self, run_dir: Path | str) -> None:
        folder = Path(run_dir) / WAKE_DIR
        folder.mkdir(mode=0o700, exist_ok=True)
        self.path = folder / str(os.getpid())
        tmp = folder / f".{os.getpid()}"
        tmp.unlink(missing_ok=True)
        os.mkfifo(tmp, 0o600)
        try:
            self.fd = os.open(tmp, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def wait(self, timeout: float, *also: int) -> bool:
        """Wait up to ``timeout`` seconds for a poke (or for any of the file descriptors ``also``
        to become readable); returns whether something woke it."""
        ready, _, _ = select.select([self.fd, *also], [], [], max(0.0, timeout))
        if self.fd in ready:
            try:
                while os.read(self.fd, 4096):
                    pass
            except OSError:
                pass
        return bool(ready)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            self.path.unlink(missing_ok=True)
