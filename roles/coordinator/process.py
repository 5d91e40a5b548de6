"""Coordinator process: reconciles from state.db on every tick."""
from __future__ import annotations

from roles.runtime import RoleProcess
from state_db import queries


class CoordinatorProcess(RoleProcess):
    tick_s = 0.5

    def reconcile(self) -> None:
        # Dispatch arrives with the org issue; today the coordinator only observes state.
        conn = self.writer.conn
        self.queued = len(queries.work_items(conn, queries.WAITING))
