"""Coordinator process: reconciles (locks, dispatch, recovery, spend cap) and announces."""
from __future__ import annotations

from roles.base.runtime import RoleProcess
from transport.kinds import Kind


class CoordinatorProcess(RoleProcess):
    tick_s = 0.5
    _rendered_event = -1
    _rendered_at = 0.0
    _attention = None
    _watcher = None

    def reconcile(self) -> None:
        # imported once the role is ready (its ready row written), not before: the coordinator is
        # forked before the role template has them, and ~13 ms of CPU on the start-up's last step
        from roles.coordinator import announce, dispatch, schedules
        schedules.tick(self.writer, self.home, self.cfg)     # standing orders due now: dispatched below
        if self._watcher is None:                            # triggers: a thread (a check may take minutes)
            from roles.coordinator import triggers          # its checks' code: imported once the role is ready
            self._watcher = triggers.Watcher(self.home, self.cfg, self.instance, clock=self.clock)
            self._watcher.start()
        self.replays()                                       # skill replays due: dispatched below
        changed = dispatch.reconcile(self.writer, heartbeat_timeout_s=self.cfg.supervisor.heartbeat_timeout_s,
                                     spend_cap_usd=self.cfg.limits.total_spend_usd, run_dir=self.home.run_dir)
        for work_id, agent in changed["dispatched"]:
            self.log.info("dispatched", work_id=work_id, to=agent, next="the loop-agent starts its loop")
            self.transport.send(agent, Kind.DISPATCH, {"work_id": work_id})
        for work_id in changed["requeued"]:
            self.log.warning("requeued", work_id=work_id, why="its loop-agent is gone", next="dispatch to a live one")
        for work_id in changed["unparked"]:
            self.log.info("unparked", work_id=work_id, why="every decision of the paused run is made",
                          next="a free loop-agent runs what was approved and goes on")
        texts = announce.announce(self.writer, self.cfg.gate.reannounce_after_s,
                                  dashboard_url=self.cfg.attention.dashboard_url,
                                  spend_cap_usd=self.cfg.limits.total_spend_usd)
        for text in texts:
            self.log.info("announce", text=text)
        if texts or self._attention is None:
            self.attention.kick()          # the first pass delivers what a previous run left undelivered
        self.render_snapshot()

    def replays(self) -> None:
        """Plan new candidates' replays and submit the runs due (roles/operations/replays.py). A
        failure is logged and retried on the next pass: learning never stops the org's work."""
        try:
            from roles.operations import replays
            for work_id in replays.tick(self.writer, self.home, self.cfg):
                self.log.info("replay_submitted", work_id=work_id, next="dispatched like any work item")
        except Exception as exc:  # noqa: BLE001 - a replay that cannot start is not the org's failure
            self.log.warning("replays_failed", error=str(exc), next="retry on the next pass")

    @property
    def attention(self):
        if self._attention is None:
            from roles.coordinator.attention import Delivery, Settings
            self._attention = Delivery(self.home.db_path, self.instance, Settings.from_config(self.cfg))
        return self._attention

    def on_stop(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
        if self._attention is not None:
            self._attention.stop()

    def render_snapshot(self) -> None:
        """Keep snapshots/org-state.md in step with state.db (every role's changes), debounced."""
        import time

        from state_db import queries
        from state_db.snapshot import render_markdown, write_atomic
        last = queries.last_event_id(self.writer.conn)
        now = time.monotonic()
        if last == self._rendered_event or now - self._rendered_at < self.cfg.snapshots.debounce_s:
            return
        try:
            write_atomic(self.home.snapshots_dir / "org-state.md", render_markdown(self.writer.conn))
            self._rendered_event, self._rendered_at = last, now
        except Exception as exc:  # noqa: BLE001 - a snapshot never stops coordination
            self.log.warning("snapshot_render_failed", error=str(exc), next="retry on the next tick")

    def handle(self, env) -> None:
        """Every message asks for a reconcile (its content is in state.db): one, right after the
        batch it arrived in (``ask_reconcile``), not one per message — a hundred loop-agents' runs
        ending together are one dispatch pass, not a hundred."""
        self.ask_reconcile()

    def warm_up(self) -> None:
        """Connect to every loop-agent now, so the first dispatch does not wait for a handshake:
        this host's and those other hosts joined with (their rows, not the configured count)."""
        from state_db.kernel.errors import OrgError
        from state_db.queries.processes import role_instances
        for row in role_instances(self.writer.conn, "loop-agent"):
            try:
                self.transport.prepare(row.instance)
            except OrgError as exc:      # not reachable yet (no keys registered): the first send retries
                self.log.info("not_prepared", instance=row.instance, error=exc.code)
