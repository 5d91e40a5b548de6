"""``file-change``: the git blob ids of the files matching a glob (content, not timestamps).
Polled on the watcher's tick rather than watchdog-driven: the same input gives the same events,
and a burst of changes is one event once the files are quiet for ``debounce_s``. A state is the
org's when the matching files are as one of its checkpoints has them."""
from __future__ import annotations

from pathlib import Path

from roles.coordinator.triggers.seen import Seen
from roles.operations.watch import Observer, fingerprint, matching
from state_db.queries import schedules as q


def look(observer: Observer, order: q.Schedule, ws: Path) -> Seen:
    pattern = order.rule["glob"]
    files = observer.files(ws, pattern)
    return Seen(fingerprint(files), detail=f"files matching {pattern} changed ({len(files)} now match)")


def org_made(observer: Observer, order: q.Schedule, seen: Seen, states: list[dict[str, str]]) -> bool:
    return any(fingerprint({p: s[p] for p in matching(sorted(s), order.rule["glob"])}) == seen.fingerprint
               for s in states)
