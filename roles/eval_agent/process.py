"""Eval-agent process: runs the preflight of every new work item (its verify commands on the
baseline, before the first act) and verifies every committed, unverified iteration of a live run.

Requests from loop-agents are only wake-ups; the work list is read from state.db, so a lost
request or a crash of the eval-agent delays a verdict and never loses it. Verification runs in
a worker thread so heartbeats continue while verify commands run.

A verification that raises (its snapshot cannot be written, the sandbox fails to start) is
retried ``RETRIES`` times with exponential backoff from ``BACKOFF_S``; then an ``error`` verdict
with the code ``verifier_error`` (or the sandbox's code) is written and the run ends
``verify_unrunnable``: a verdict that can never be written must not keep a run waiting.

What is owed is one query (``state_db.queries.verdicts.due``): the preflights of live runs
without one, then committed iterations of live runs without a verdict.
"""
from __future__ import annotations

import threading
import time

from roles.eval_agent.review import Reviewer, ReviewSettings
from roles.eval_agent.verifier import Verifier
from roles.instances import eval_agent_shard, shard_of
from roles.runtime import RoleProcess
from state_db.errors import OrgError
from state_db.queries.verdicts import Due, due
from transport.kinds import Kind

RETRIES = 3
BACKOFF_S = 0.5


class EvalAgentProcess(RoleProcess):
    tick_s = 0.5

    def __init__(self, home, instance, **seams):
        super().__init__(home, instance, **seams)
        self.worker: threading.Thread | None = None
        self.more = threading.Event()
        shard = eval_agent_shard(self.instance, self.cfg.org.eval_agents)
        # of several eval-agents, this one verifies only the work items of its share
        self._owns = None if shard is None else (lambda work_id: shard_of(work_id, shard[1]) == shard[0])

    def reconcile(self) -> None:
        if self.stopping:
            return
        if self.worker is None or not self.worker.is_alive():
            self.worker = threading.Thread(target=self._work, name="verify", daemon=True)
            self.worker.start()
        self.more.set()

    def handle(self, env) -> None:
        if env.kind in (Kind.VERIFY_REQUEST, Kind.WAKE):
            self.more.set()

    def _work(self) -> None:
        from state_db.writer import StateWriter
        writer = StateWriter(self.home.db_path, self.role, self.instance)
        sender = self.transport.thread_sender()
        from roles.sandbox import runner_from_config
        verifier = Verifier(self.home, writer, timeout_s=float(self.cfg.sandbox.cpu_seconds),
                            runner_factory=lambda snapshot, workspace: runner_from_config(self.cfg, self.home, snapshot,
                                                                               present_at=workspace),
                            reviewer=Reviewer(ReviewSettings.from_config(self.cfg), writer))
        failures: dict[tuple[str, int], tuple[int, float]] = {}   # (work, n) -> (failed tries, next try at)
        try:
            while not self.stopping:
                soonest = min((at for _, at in failures.values()), default=None)
                self.more.wait(1.0 if soonest is None else min(1.0, max(0.05, soonest - time.monotonic())))
                self.more.clear()
                for row in due(writer.conn, self._owns):
                    if self.stopping:
                        break
                    key = (row.work_id, row.n)
                    tries, next_at = failures.get(key, (0, 0.0))
                    if time.monotonic() < next_at:
                        continue
                    try:
                        result = verifier.verify(row.work_id, row.n)
                    except Exception as exc:  # noqa: BLE001 - one bad item must not stop the others
                        code = exc.code if isinstance(exc, OrgError) else None
                        if code == "run_ended":      # cancelled or ended while its check ran
                            self.log.info("verify_abandoned", work_id=row.work_id, iteration=row.n,
                                          next="nothing: the run is over")
                            failures.pop(key, None)
                            continue
                        tries += 1
                        if tries < RETRIES:
                            delay = BACKOFF_S * 2 ** (tries - 1)
                            failures[key] = (tries, time.monotonic() + delay)
                            self.log.error("verify_failed", work_id=row.work_id, iteration=row.n, error=str(exc),
                                           code=code, attempt=tries, of=RETRIES, next=f"retry in {delay:.1f} s")
                            continue
                        failures.pop(key, None)
                        code = code if code in ("sandbox_failed", "sandbox_error") else "verifier_error"
                        self.log.error("verify_gave_up", work_id=row.work_id, iteration=row.n, error=str(exc),
                                       code=code, attempts=tries, next="error verdict; the run ends verify_unrunnable")
                        try:
                            result = verifier.record_error(row.work_id, row.n, code, str(exc))
                        except Exception as again:  # noqa: BLE001 - e.g. the run ended meanwhile
                            self.log.error("error_verdict_failed", work_id=row.work_id, error=str(again))
                            continue
                    failures.pop(key, None)
                    self._announce(sender, row, result)
        finally:
            sender.close()
            writer.close()

    def _announce(self, sender, row: Due, result) -> None:
        """Log the verdict (or preflight) and wake whoever waits for it."""
        if row.n == 0:
            self.log.info("preflight", work_id=row.work_id, outcome=result.outcome, detail=result.detail[:300],
                          ended=result.ended)
        else:
            self.log.info("verdict", work_id=row.work_id, iteration=row.n, outcome=result.outcome,
                          goal_met=result.goal_met, held_back=len(result.held_back), ended=result.ended)
        if row.assigned_to:
            sender.send(row.assigned_to, Kind.VERDICT_READY,
                        {"work_id": row.work_id, "iteration": row.n, "verdict": getattr(result, "id", "preflight")})
        if result.ended:
            sender.send("coordinator", Kind.WAKE, {"work_id": row.work_id, "ended": str(result.ended)})

    def on_stop(self) -> None:
        self.more.set()
        if self.worker is not None:
            self.worker.join(max(0.5, self.cfg.supervisor.stop_timeout_s - 2.0))
