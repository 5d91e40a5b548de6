"""Human-readable snapshot of the org (``snapshots/org-state.md``), derived from state.db.

Rendering is a post-commit hook, debounced: at most one render per ``debounce_s``; a change that
arrives inside the window schedules one trailing render so the file never stays stale.
"""
from __future__ import annotations

import atexit
import os
import threading
import time
from pathlib import Path

from state_db import queries
from state_db.connection import connect
from state_db.kernel.errors import StateError
from state_db.store import is_postgres, location

HEADER = "<!-- generated from state.db; last event {event_id} -->"


def render_markdown(conn) -> str:
    st = queries.status(conn)
    session = st["session"] or {}
    lines = [HEADER.format(event_id=st["last_event_id"]), "# Org state", "",
             f"Session: **{session.get('status', 'none')}**", ""]
    lines += ["## Roles", "", "| instance | status | pid | restarts |", "|---|---|---|---|"]
    for r in st["roles"]:
        lines.append(f"| {r['instance']} | {r['status']} | {r['pid'] or ''} | {r['restarts']} |")
    lines += ["", "## Work", "", "| id | status | iterations | tokens | cost | stop reason | goal |",
              "|---|---|---|---|---|---|---|"]
    for w in st["work"]["active"] + st["work"]["recent_ended"]:
        goal = w["goal"].replace("|", "\\|").replace("\n", " ")[:60]
        lines.append(f"| {w['id']} | {w['status']} | {w['iterations']} | {w['tokens']} | "
                     f"${w['cost_usd']:.4f} | {w['stop_reason'] or ''} | {goal} |")
    lines += ["", f"## Pending decisions ({len(st['pending_decisions'])})", ""]
    for d in st["pending_decisions"]:
        lines.append(f"- {d['id']} ({d['work_id']}): {d['question']}")
    lines += ["", f"Total: {st['usage']['tokens']} tokens, ${st['usage']['cost_usd']:.4f}", ""]
    return "\n".join(lines)


def snapshot_event_id(path: Path) -> int | None:
    """The event id a snapshot was rendered at, or None if absent/unreadable."""
    try:
        first = path.read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    prefix = "<!-- generated from state.db; last event "
    if not first.startswith(prefix):
        return None
    try:
        return int(first[len(prefix):].split()[0])
    except ValueError:
        return None


def clean_orphans(path: Path) -> None:
    """Remove temp files of ``path`` left by writers that died mid-write (their pid is gone)."""
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        pid = tmp.name[len(path.name) + 2:-4]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            tmp.unlink(missing_ok=True)


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_orphans(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class SnapshotHook:
    """Post-commit hook that renders the snapshot, debounced.

    Args:
        db_path: the org's store: state.db, or a PostgreSQL store's URL (then ``out_path`` is
            required: a URL has no home folder beside it).
        out_path: where the markdown goes (default ``<home>/snapshots/org-state.md``).
        debounce_s: minimum seconds between renders.
        render: function(conn) -> text (injectable to test failures).
    """

    __name__ = "snapshot"

    def __init__(self, db_path: Path | str, out_path: Path | None = None, *, debounce_s: float = 0.5,
                 render=render_markdown, clock=time.monotonic):
        self.db_path = location(db_path)
        if out_path is None and is_postgres(self.db_path):
            raise StateError("a snapshot of a PostgreSQL store needs its out_path", code="bad_argument",
                             hint="pass <org home>/snapshots/org-state.md")
        self.out_path = out_path or self.db_path.parent / "snapshots" / "org-state.md"
        self.debounce_s = debounce_s
        self.render = render
        self.clock = clock
        self._last = float("-inf")
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        atexit.register(self.flush)

    def __call__(self, writer, changes) -> None:
        with self._lock:
            wait = self._last + self.debounce_s - self.clock()
            if wait <= 0:
                self._render_now()
            elif self._timer is None:
                self._timer = threading.Timer(wait, self._trailing)
                self._timer.daemon = True
                self._timer.start()

    def _trailing(self) -> None:
        with self._lock:
            self._timer = None
            try:
                self._render_now()
            except Exception as exc:
                import structlog
                structlog.get_logger().warning("snapshot_render_failed", error=str(exc))

    def _render_now(self) -> None:
        self._last = self.clock()
        conn = connect(self.db_path, readonly=True)
        try:
            text = self.render(conn)
        finally:
            conn.close()
        write_atomic(self.out_path, text)

    def flush(self) -> None:
        """Render a pending trailing snapshot now (at exit)."""
        timer = self._timer
        if timer is not None:
            timer.cancel()
            self._trailing()
