"""Process identity on Linux, as state.db records it: a pid plus its start time (``pid_start``
of role instances, the executor of an approved action), so a reused pid is never taken for the
process that was recorded."""
from __future__ import annotations

import os
from pathlib import Path


def identity(pid: int | None = None) -> str:
    """``"<pid>:<start time>"`` of ``pid`` (default: this process)."""
    pid = pid or os.getpid()
    return f"{pid}:{start_time(pid) or ''}"


def identity_alive(recorded: str | None) -> bool:
    """True if the process ``identity`` recorded still runs (the same one, not a reused pid)."""
    if not recorded or ":" not in recorded:
        return False
    pid, _, started = recorded.partition(":")
    return pid.isdigit() and is_alive(int(pid), started or None)


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # the command name (field 2) may contain spaces and parentheses: split after the last ')'
    fields = raw[raw.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def state(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()[0]


def is_alive(pid: int | None, started: str | None) -> bool:
    """True if ``pid`` runs and is the same process that started at ``started`` (not a zombie)."""
    if not pid:
        return False
    current = start_time(pid)
    if current is None or (started is not None and current != started):
        return False
    return state(pid) not in ("Z", "X")


