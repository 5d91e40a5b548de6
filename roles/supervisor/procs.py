"""Process identity on Linux: a pid plus its start time, so a reused pid is never signalled."""
from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path

from state_db.connection import connect
from state_db.kernel.errors import StateError
from state_db.queries.processes import role_instances
from state_db.kernel.processes import is_alive, start_time, state  # noqa: F401 - re-exported: callers use procs.*


def signal_if_same(pid: int | None, started: str | None, sig: int = signal.SIGTERM) -> bool:
    """Send ``sig`` only if ``pid`` is still the process identified by ``started``."""
    if started is None or not is_alive(pid, started):
        return False
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def write_pidfile(path: Path, pid: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{pid} {start_time(pid) or ''}\n")
    os.replace(tmp, path)


def read_pidfile(path: Path) -> tuple[int, str | None] | None:
    try:
        parts = path.read_text().split()
        return int(parts[0]), (parts[1] if len(parts) > 1 else None)
    except (OSError, ValueError, IndexError):
        return None


def kill_org(home) -> None:
    """SIGKILL the supervisor and every role process recorded for ``home`` (each checked by pid
    and start time, so a reused pid is never hit): a hard stop that runs no code of theirs."""
    if not home.exists():
        return
    sup = read_pidfile(home.run_dir / "supervisor.pid")
    if sup:
        signal_if_same(sup[0], sup[1], signal.SIGKILL)
    try:
        conn = connect(home.db_path, readonly=True)
        try:
            rows = role_instances(conn)
        finally:
            conn.close()
    except (sqlite3.Error, StateError):
        rows = []
    for r in rows:
        signal_if_same(r.pid, r.pid_start, signal.SIGKILL)
    for pidfile in home.run_dir.glob("*.pid"):
        info = read_pidfile(pidfile)
        if info:
            signal_if_same(info[0], info[1], signal.SIGKILL)
