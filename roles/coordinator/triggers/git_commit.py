"""``git-commit``: the commit a branch points at. A commit is the org's when every file it
records is as one of the org's checkpoints has it (e.g. an approved ``git commit`` of a run's work)."""
from __future__ import annotations

from pathlib import Path

from roles.coordinator.triggers.seen import Seen
from roles.operations.watch import Observer
from state_db.queries import schedules as q


def look(observer: Observer, order: q.Schedule, ws: Path) -> Seen:
    head = observer.head(ws, order.rule["branch"])
    return Seen(head.oid, detail=head.detail, why=head.why)


def org_made(observer: Observer, order: q.Schedule, seen: Seen, states: list[dict[str, str]]) -> bool:
    files = observer.commit_files(Path(order.request["workspace"]), seen.fingerprint)
    return any(all(s.get(p) == oid for p, oid in files.items()) for s in states)
