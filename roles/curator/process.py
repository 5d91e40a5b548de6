"""Curator process: writes retros, curates knowledge, proposes skill candidates, opens batches.

Triggers: a new ``work_items.ended`` event in the journal (checked every tick, a cheap query),
a ``wake`` message, and a slow periodic pass (``slow_s``) so curation never starves. Passes are
single-flight (see roles/curator/pipeline.py). The retro author is derived (no model) unless a
model-written one is injected (``knowledge.retro_model.model_author``).
"""
from __future__ import annotations

import time

from knowledge.thresholds import Thresholds
from roles.base.runtime import RoleProcess
from state_db.queries.events import last_id
from transport.kinds import Kind


class CuratorProcess(RoleProcess):
    tick_s = 2.0
    slow_s = 60.0

    def __init__(self, home, instance, *, author=None, **seams):
        super().__init__(home, instance, **seams)
        self._author = author
        self._pipeline = None
        self.seen_ended = -1
        self.next_slow = 0.0
        self.woken = False

    @property
    def pipeline(self):
        """The curation pipeline, made at its first pass: its imports (the knowledge and skills
        code, ~80 ms) come after the role is ready, not before (the role template has them
        imported for any curator forked once it is warm)."""
        if self._pipeline is None:
            from roles.curator.pipeline import Pipeline
            from skills.replay import enabled
            kwargs = {"author": self._author} if self._author is not None else {}
            self._pipeline = Pipeline(self.writer, Thresholds.from_config(self.cfg), self.home.skills_dir,
                                      log=self.log, wait_for_replays=enabled(self.cfg)[0], **kwargs)
        return self._pipeline

    def reconcile(self) -> None:
        latest = last_id(self.writer.conn, "work_items.ended")
        slow = time.monotonic() >= self.next_slow
        if latest == self.seen_ended and not slow and not self.woken:
            return
        self.woken = False
        report = self.pipeline.run(slow=slow)
        if report.skipped:
            return
        self.seen_ended = latest
        if slow:
            self.next_slow = time.monotonic() + self.slow_s
        if report.batch:
            self._tell_coordinator(report.batch)

    def handle(self, env) -> None:
        if env.kind in (Kind.WAKE, Kind.RUN_ENDED):
            self.woken = True
            self.reconcile()

    def _tell_coordinator(self, batch_id: str) -> None:
        """Best effort: the coordinator announces from the journal either way."""
        if self._transport is None:
            return
        try:
            self.transport.send("coordinator", Kind.BATCH_OPENED, {"batch_id": batch_id})
        except Exception as exc:  # noqa: BLE001 - a lost wake delays, never loses
            self.log.warning("batch_wake_failed", batch=batch_id, error=str(exc), next="announced from the journal")
