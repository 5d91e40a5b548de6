"""Eval-agent process: verifies every committed, unverified iteration of a live run.

Requests from loop-agents are only wake-ups; the work list is read from state.db, so a lost
request or a crash of the eval-agent delays a verdict and never loses it. Verification runs in
a worker thread so heartbeats continue while verify commands run.
"""
from __future__ import annotations

import threading

from roles.eval_agent.verifier import Verifier
from roles.runtime import RoleProcess
from state_db.vocab import WorkStatus
from transport.kinds import Kind

PENDING = f"""SELECT i.work_id, i.n, w.assigned_to FROM iterations i JOIN work_items w ON w.id = i.work_id
               WHERE w.status != '{WorkStatus.ENDED}'
                 AND NOT EXISTS (SELECT 1 FROM verdicts v WHERE v.work_id = i.work_id AND v.iteration = i.n)
               ORDER BY i.committed_at"""


class EvalAgentProcess(RoleProcess):
    tick_s = 0.5

    def __init__(self, home, instance):
        super().__init__(home, instance)
        self.worker: threading.Thread | None = None
        self.more = threading.Event()

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
        verifier = Verifier(self.home, writer, timeout_s=float(self.cfg["sandbox.cpu_seconds"]),
                            runner_factory=lambda snapshot, workspace: runner_from_config(self.cfg, self.home, snapshot))
        try:
            while not self.stopping:
                self.more.wait(1.0)
                self.more.clear()
                for row in writer.conn.execute(PENDING).fetchall():
                    if self.stopping:
                        break
                    try:
                        verdict = verifier.verify(row["work_id"], row["n"])
                    except Exception as exc:  # noqa: BLE001 - one bad item must not stop the others
                        self.log.error("verify_failed", work_id=row["work_id"], iteration=row["n"], error=str(exc),
                                       code=getattr(exc, "code", None), next="retry on the next tick")
                        continue
                    self.log.info("verdict", work_id=row["work_id"], iteration=row["n"], outcome=verdict.outcome,
                                  goal_met=verdict.goal_met)
                    if row["assigned_to"]:
                        sender.send(row["assigned_to"], Kind.VERDICT_READY,
                                    {"work_id": row["work_id"], "iteration": row["n"], "verdict": verdict.id})
        finally:
            sender.close()
            writer.close()

    def on_stop(self) -> None:
        self.more.set()
        if self.worker is not None:
            self.worker.join(max(0.5, self.cfg["supervisor.stop_timeout_s"] - 2.0))
