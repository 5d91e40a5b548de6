"""Writing what a trigger saw onto its row."""
from __future__ import annotations

from state_db.queries import schedules as q
from state_db.writer import StateWriter


def mark(writer: StateWriter, order: q.Schedule, watch: dict, **fields) -> None:
    """Record ``watch`` (and ``fields``) on ``order``'s row, in one transaction."""
    with writer.transaction() as tx:
        tx.update("schedules", order.id, watch=watch, **fields)
