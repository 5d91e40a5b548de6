"""The writers of one SQLite store take its write lock in the order they asked for it.

SQLite's own wait for its write lock (``busy_timeout``) is a poll: a writer that finds the lock
taken sleeps 1, 2, 5, 10 … then 100 ms between tries, while the writer that has just committed
and begins again takes the lock back at once. On a host busier than it has cores (an org of 128
loop-agents on two), where the holder of the lock is itself descheduled in the middle of its
transaction, the lock is taken nearly all the time and an old waiter keeps losing to whoever
comes next: a user's ``submit``, the supervisor's own rows, waited past the store's ten seconds
while transactions that came later went through. A wait decided by luck is no wait at all; a
kernel lock that wakes its waiters (``flock``) would not do either, since the writer that lets go
is still running and takes it again before the woken one is scheduled.

A ``WriteGate`` is a ticket queue on a file beside the store, made of the kernel's open-file-
description record locks (``fcntl(F_OFD_SETLKW)``, Linux 3.15+): under a short lock on its first
byte, a writer draws the next ticket from the counter kept there and locks the byte of its own
ticket; then it waits until the byte of the ticket before it is free, and holds its own until its
``COMMIT`` or ``ROLLBACK`` is done. Each byte has one waiter, its successor, so the gate is
handed from one writer to the next in the order of their tickets, and one that comes later waits
behind, however fast it is. The locks are the kernel's, tied to an open file: they go with their
process however it dies, so a crash never leaves the line waiting for a ticket nobody holds; and
one per writer (its own open file), so two threads of one process queue as two processes do.

The gate orders writers; it never guards the data. SQLite's lock still does, and a writer that
does not take the gate (the ``sqlite3`` shell, a migration, a process whose gate file could not be
opened) is waited for through ``busy_timeout`` as before: the gate can only make waits fair, never
let two writers in. A PostgreSQL store needs none: waiters for its advisory lock queue in order
in its lock manager.

How long to wait is judged by what the line does, not by how long it is. Each writer that passes
the gate on records its ticket (bytes 8..15); a waiter given a stall limit (the store's busy
timeout, for every write that does not ask for less) waits as long as that record moves, and
gives up only once it has stood still for the limit: a hundred writers ahead of one on a host
that is busier than it has cores is load, and every one of them is let through; a writer that
holds the lock and does not let go is a fault, and is reported as ``store_busy`` as before. A
write that asks for a deadline (a heartbeat row, skipped unless the store is free within 0.1 s)
never takes a place in the line: it gets in only when the line is empty. Had it queued and given
up, its place would still have to come round and be passed on — by a thread of a process that
may be busy, a handoff that holds up everyone behind it — fifty times a second at N = 128.

A writer killed while it waits (not while it holds the gate) frees its byte early and lets the
one behind it in while the one before may still be in: SQLite's lock keeps those two apart, and
the line is in order again from the next writer on. A writer stopped while it waits (a command
suspended with Ctrl-Z, SIGSTOP) would hold up everyone behind it once its turn came: each writer
records its ticket as it goes in (bytes 16..23), and the one after a writer whose turn has come
(the one before it went out) and who has not gone in for ``SKIP_S`` goes in ahead of it; should
the stopped one wake and come in too, SQLite's lock keeps them apart.

``F_OFD_SETLKW`` has no time limit, so a wait that may end is made in a thread of its own: the
caller waits on an event (looking at the line every ``LOOK_S``, beating between slices); if it
gives up, the thread keeps its place in the line (its file, with the byte of its ticket locked)
and, when its turn comes, passes it on at once by closing that file. That thread starts only when
the writer before is still in: an open gate costs ten system calls."""
from __future__ import annotations

import errno
import fcntl
import os
import struct
import threading
import time
from pathlib import Path
from typing import Callable

#: The gate's file, beside the store: ``state.db`` → ``state.db-writers``.
SUFFIX = "-writers"
_COUNTER = 0                # byte 0..7: the last ticket drawn; byte 0's lock guards the draw
_SERVED = 8                 # byte 8..15: the last ticket that passed the gate on (progress)
_ENTERED = 16               # byte 16..23: the last ticket that took its turn
_FIRST = 24                 # ticket t's byte is _FIRST + t
#: How often a waiter with a stall limit looks whether the line has moved.
LOOK_S = 0.25
#: How long a writer whose turn has come may take to take it before the one after it goes
#: ahead (a process stopped while it waits: Ctrl-Z on a command, SIGSTOP).
SKIP_S = 2.0
#: How often a writer tries the counter again while another draws its ticket.
DRAW_RETRY_S = 0.0002
#: How often a write that may be skipped looks for an empty line until its deadline.
TRY_S = 0.02
_BUSY = (errno.EAGAIN, errno.EACCES)


def gate_path(db_path: str | Path) -> Path:
    return Path(f"{db_path}{SUFFIX}")


def _lock(fd: int, cmd: int, kind: int, at: int) -> None:
    """An open-file-description lock of one byte (``struct flock``; ``l_pid`` must be 0)."""
    fcntl.fcntl(fd, cmd, struct.pack("hhqqi4x", kind, os.SEEK_SET, at, 1, 0))


def _free(fd: int, at: int) -> bool:
    """Whether byte ``at`` is free now (nobody holds it); never waits."""
    try:
        _lock(fd, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, at)
    except OSError as exc:
        if exc.errno in _BUSY:
            return False
        raise
    _lock(fd, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, at)
    return True


def _record(fd: int, at: int, ticket: int) -> None:
    """Record ``ticket`` at ``at``: the last one through (``_SERVED``, what a waiter reads as the
    line moving) or the last one in (``_ENTERED``)."""
    try:
        os.pwrite(fd, ticket.to_bytes(8, "little"), at)
    except OSError:
        pass


def _read(fd: int, at: int) -> int:
    try:
        return int.from_bytes(os.pread(fd, 8, at), "little")
    except OSError:
        return -1


class _Waiter(threading.Thread):
    """Waits until byte ``before`` is free; then tells the caller, or, once the caller has given
    up (``abandon``), passes the turn on at once by closing ``fd`` (which holds the caller's
    ticket)."""

    def __init__(self, fd: int, before: int):
        super().__init__(name="store-gate-wait", daemon=True)
        self.fd, self.before = fd, before
        self.done = threading.Event()
        self.error: OSError | None = None
        self._mu = threading.Lock()
        self._abandoned = False
        self._detached = False

    def run(self) -> None:
        try:
            _lock(self.fd, fcntl.F_OFD_SETLKW, fcntl.F_WRLCK, self.before)
            _lock(self.fd, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, self.before)
        except OSError as exc:
            self.error = exc
        with self._mu:
            if self._detached:
                return
            if self._abandoned:
                _record(self.fd, _SERVED, self.before - _FIRST + 1)
                os.close(self.fd)
                return
            self.done.set()

    def detach(self) -> bool:
        """Stop waiting without giving up the place (the caller goes in); False when the turn
        came first."""
        with self._mu:
            if self.done.is_set():
                return False
            self._detached = True
            return True

    def abandon(self) -> bool:
        """Give up the wait; False when the turn came first (the caller holds the gate)."""
        with self._mu:
            if self.done.is_set():
                return False
            self._abandoned = True
            return True


class WriteGate:
    """One writer's (one ``StateWriter``'s) side of its store's gate: its own open file."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._fd: int | None = None
        self._ticket: int | None = None         # held: the ticket whose byte this writer locks

    def _file(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._fd

    def _draw(self, fd: int, give_up_at: float, *, only_first: bool = False) -> int | None:
        """The next ticket, its byte locked before the counter is let go (so whoever draws the
        one after finds this one's byte taken); None when the counter stayed taken until
        ``give_up_at``, or, ``only_first``, when the last ticket drawn is still in the line (its
        byte taken: this one would have to wait). The counter is held for a read, a write and a
        lock, so it is tried every ``DRAW_RETRY_S`` rather than waited for in the kernel without
        a limit: a process stopped (SIGSTOP) in those few instructions must not stop every
        writer for good."""
        while True:
            try:
                _lock(fd, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, _COUNTER)
                break
            except OSError as exc:
                if exc.errno not in _BUSY:
                    raise
                if time.monotonic() >= give_up_at:
                    return None
                time.sleep(DRAW_RETRY_S)
        try:
            last = int.from_bytes(os.pread(fd, 8, _COUNTER), "little")     # a new file: b"", 0
            if only_first and not _free(fd, _FIRST + last):
                return None
            ticket = last % (1 << 62) + 1
            os.pwrite(fd, ticket.to_bytes(8, "little"), _COUNTER)
            _lock(fd, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, _FIRST + ticket)
        finally:
            _lock(fd, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, _COUNTER)
        return ticket

    def enter(self, deadline: float | None = None, *, stall_s: float | None = None,
              slice_s: float | None = None, between: Callable[[], None] | None = None) -> bool:
        """Take the gate; False when it did not come. Given ``stall_s``, take a ticket and wait
        for its turn until the line has not moved for that long: a long line that moves is load,
        and is waited through; one that stands still is a writer that holds the lock and does
        not let go (the place is passed on when the turn comes). Given ``deadline``
        (``time.monotonic()``) instead, never take a place in the line: get in when it is empty,
        trying every ``TRY_S`` until the deadline — a write that may be skipped (a heartbeat
        row) must not hold up the ones that wait, which it would if it gave up a place in the
        line that still has to come round and be passed on. ``between`` is called every
        ``slice_s`` of a wait (a role's beat). Raises OSError when the gate's file cannot be
        opened or locked (the caller goes on without it)."""
        if (deadline is None) == (stall_s is None):
            raise ValueError("give a deadline or a stall limit")
        fd = self._file()
        if deadline is not None:
            next_call = time.monotonic() + slice_s if slice_s else None
            while (ticket := self._draw(fd, deadline, only_first=True)) is None:
                now = time.monotonic()
                if now + TRY_S > deadline:
                    return False
                if next_call is not None and now >= next_call:
                    if between is not None:
                        between()
                    next_call = time.monotonic() + slice_s
                time.sleep(TRY_S)
            self._in(fd, ticket)
            return True
        ticket = self._draw(fd, time.monotonic() + stall_s)
        if ticket is None:
            return False
        before = _FIRST + ticket - 1
        if not _free(fd, before) and not self._wait(fd, before, stall_s, slice_s, between):
            self._fd = None                     # the waiter's now: closed when the turn comes
            return False
        self._in(fd, ticket)
        return True

    def _in(self, fd: int, ticket: int) -> None:
        self._ticket = ticket
        _record(fd, _ENTERED, ticket)

    def _wait(self, fd: int, before: int, stall_s: float, slice_s: float | None,
              between: Callable[[], None] | None) -> bool:
        waiter = _Waiter(fd, before)
        waiter.start()
        now = time.monotonic()
        moved_at, seen = now, _read(fd, _SERVED)
        handed_at = None                        # when the turn came to the one before, not taken
        mine = before - _FIRST + 1
        next_call = now + slice_s if slice_s else None
        while True:
            wake = min(t for t in (moved_at + stall_s, next_call, now + LOOK_S) if t is not None)
            if waiter.done.wait(max(0.0, wake - now)):
                break
            now = time.monotonic()
            if (served := _read(fd, _SERVED)) != seen:
                moved_at, seen = now, served
            # the one before has had its turn (the one before it went out) and not taken it: a
            # process stopped while it waits (Ctrl-Z). Past SKIP_S this one goes in ahead of it;
            # should it wake and come in too, SQLite's lock keeps the two apart.
            if served >= mine - 2 and _read(fd, _ENTERED) < mine - 1:
                handed_at = handed_at or now
                if now - handed_at >= SKIP_S and waiter.detach():
                    break
            else:
                handed_at = None
            if now >= moved_at + stall_s:
                if waiter.abandon():
                    return False
                break
            if next_call is not None and now >= next_call:
                if between is not None:
                    between()
                now = time.monotonic()
                next_call = now + slice_s
        if waiter.error is not None:
            _lock(fd, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, mine + _FIRST)       # the place, given up
            raise waiter.error
        return True

    def leave(self) -> None:
        """Pass the turn to the next ticket."""
        if self._ticket is not None:
            ticket, self._ticket = self._ticket, None
            _record(self._fd, _SERVED, ticket)
            _lock(self._fd, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, _FIRST + ticket)

    def close(self) -> None:
        self._ticket = None
        if self._fd is not None:
            os.close(self._fd)           # lets its locks go with it
            self._fd = None
