"""A role's beat: the proof that its main loop turns, which no lock of the store can delay.

Each role process sets the modification time of ``run/beats/<instance>`` at every heartbeat
(``RoleProcess.heartbeat``) and, while its main thread waits for the store's write lock, between
slices of that wait (``state_db.writer.beat_while_waiting``). The heartbeat row in state.db is
written too, but only when the store is free within a short wait: when writers queue (an org of
128 loop-agents on two cores), a row written behind them is late, and a role judged by it alone
was killed as hung by the supervisor, and its run handed to another loop-agent by the coordinator,
while it worked. So whoever judges a role of this host alive — the supervisor's check, the
coordinator's dispatch, ``org status`` — takes the later of the two (``latest``): the file says "alive, and the
store is busy", the row says it for a role of another host, which has no file here.

A file's time rather than a pipe or a socket: it costs one ``futimens`` a second, needs no reader
to be running (a supervisor or coordinator restarted later reads it as it is), a dead process's
beat only ages (and the supervisor judges a new process by the time since it spawned it), and
readers on this host only ``stat`` it. The time written is the role's own clock, the one its
heartbeat rows use.
"""
from __future__ import annotations

import os
from pathlib import Path

DIR = "beats"


def path(run_dir: Path, instance: str) -> Path:
    return run_dir / DIR / instance


class Beat:
    """The beat file of one instance, kept open; ``touch`` never raises (a beat that cannot be
    written is seen as a missed one)."""

    def __init__(self, run_dir: Path, instance: str):
        self._fd: int | None = None
        try:
            where = path(run_dir, instance)
            where.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            self._fd = None

    def touch(self, now: float) -> bool:
        """Set the beat to ``now``; whether it was written (False: the file could not be made or
        set, and the heartbeat row is the only proof of life)."""
        if self._fd is not None:
            try:
                os.utime(self._fd, (now, now))
                return True
            except OSError:
                pass
        return False

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def last(run_dir: Path, instance: str) -> float | None:
    """When ``instance`` last beat on this host (None: never, or not here)."""
    try:
        return os.stat(path(run_dir, instance)).st_mtime
    except OSError:
        return None


def latest(row_heartbeat_at: float | None, run_dir: Path | None, instance: str) -> float | None:
    """The later of the heartbeat row's time and the beat file's (``run_dir`` None: the row's)."""
    file_at = last(run_dir, instance) if run_dir is not None else None
    if file_at is None or (row_heartbeat_at is not None and row_heartbeat_at >= file_at):
        return row_heartbeat_at
    return file_at
