"""Eval-agent process: runs the preflight of every new work item (its verify commands on the
baseline, before the first act) and verifies every committed, unverified iteration of a live run.

Requests from loop-agents are only wake-ups; the work list is read from state.db, so a lost
request or a crash of the eval-agent delays a verdict and never loses it. Verification runs in
a worker thread so heartbeats continue while verify commands run.

A verification that raises (its snapshot cannot be written, the sandbox fails to start) is
retried ``RETRIES`` times with exponential backoff from ``BACKOFF_S``; then an ``error`` verdict
with the code ``verifier_error`` (or the sandbox's code) is written and the run ends
``verify_unrunnable``: a verdict that can never be written must not keep a run waiting. On a
joined host a coordinator host that cannot be reached (``git_remote_failed``) goes the same way.

What is owed is one query (``state_db.queries.verdicts.due``): the preflights of live runs
without one, then committed iterations of live runs without a verdict. Of several eval-agents,
each takes its share (``roles.instances.OrgEvalAgents``). One on a joined host (``org join --role
eval-agent``) verifies iterations only, from the checkpoints the store names, fetched from the
coordinator host's histories; the preflights, which read the real workspace, stay there.
"""
from __future__ import annotations

import fcntl
import os
import threading
import time
import zlib
from pathlib import Path

from roles.eval_agent.codes import MACHINE_CODES
from roles.instances import OrgEvalAgents
from roles.runtime import RoleProcess
from state_db.errors import OrgError
from state_db.queries.verdicts import Due, due
from transport.kinds import Kind

RETRIES = 3
BACKOFF_S = 0.5
GIT_TIMEOUT_S = 60.0     # one git exchange with the coordinator host (a joined eval-agent)


class EvalAgentProcess(RoleProcess):
    tick_s = 0.5

    def __init__(self, home, instance, **seams):
        super().__init__(home, instance, **seams)
        self.worker: threading.Thread | None = None
        self.more = threading.Event()
        # on a joined host (org join --role eval-agent) the work items' histories are the
        # coordinator host's, fetched through git; preflights stay on the coordinator host
        self.joined = bool(self.cfg.hosts.coordinator)

    def _verifying(self, writer, work_id: str | None) -> None:
        """Record the run being verified (None: done) so every view shows this eval-agent busy with
        it. Bookkeeping only: a failed write is logged and the verification goes on."""
        try:
            with writer.transaction(render=False) as tx:
                tx.update("role_instances", self.instance, current_work=work_id, updated_at=time.time())
        except Exception as exc:  # noqa: BLE001 - status is best effort; the verdict matters
            self.log.warning("current_work_not_recorded", error=str(exc), next="the next verification tries again")

    def _owns(self, agents: OrgEvalAgents, row: Due) -> bool:
        """Whether ``row`` is this eval-agent's to verify: of several, its share (the same list
        every process reads: ``roles.instances``); never a preflight on a joined host."""
        if self.joined and row.n == 0:
            return False
        current = agents.current()
        if not agents.stored and self.instance not in current.everyone:
            return True          # over ipc, an instance [org] eval_agents does not name verifies everything
        return current.owner(row.work_id, row.n) == self.instance

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
        # the verifier's code is imported by the worker, after the role is ready (the role template
        # has it imported for any eval-agent forked once it is warm)
        from roles.eval_agent.review import Reviewer, ReviewSettings
        from roles.eval_agent.verifier import Verifier
        from state_db.writer import StateWriter
        writer = StateWriter(self.home.db_path, self.role, self.instance)
        sender = self.transport.thread_sender()
        from roles.sandbox import runner_from_config
        agents = OrgEvalAgents(self.cfg, writer.conn)
        locks = WorkLocks(self.home.run_dir / "verify.lock")
        verifier = Verifier(self.home, writer, timeout_s=float(self.cfg.sandbox.cpu_seconds),
                            history_factory=remote_histories(self.home, writer.conn) if self.joined else None,
                            runner_factory=lambda snapshot, workspace: runner_from_config(self.cfg, self.home, snapshot,
                                                                               present_at=workspace),
                            reviewer=Reviewer(ReviewSettings.from_config(self.cfg), writer))
        failures: dict[tuple[str, int], tuple[int, float]] = {}   # (work, n) -> (failed tries, next try at)
        try:
            while not self.stopping:
                soonest = min((at for _, at in failures.values()), default=None)
                self.more.wait(1.0 if soonest is None else min(1.0, max(0.05, soonest - time.monotonic())))
                self.more.clear()
                for row in [r for r in due(writer.conn) if self._owns(agents, r)]:
                    if self.stopping:
                        break
                    key = (row.work_id, row.n)
                    tries, next_at = failures.get(key, (0, 0.0))
                    if time.monotonic() < next_at:
                        continue
                    if not locks.take(row.work_id):
                        # another eval-agent of this home verifies it (a share changing hands): its
                        # verdict counts, and this one must not rewrite the snapshot under its checks
                        self.log.info("verify_busy", work_id=row.work_id, iteration=row.n,
                                      next="another eval-agent of this host verifies it")
                        continue
                    try:
                        self._verifying(writer, row.work_id)
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
                        # an error verdict keeps the machine's codes (never the doer's); any other is verifier_error
                        code = code if code in MACHINE_CODES else "verifier_error"
                        self.log.error("verify_gave_up", work_id=row.work_id, iteration=row.n, error=str(exc),
                                       code=code, attempts=tries, next="error verdict; the run ends verify_unrunnable")
                        try:
                            result = verifier.record_error(row.work_id, row.n, code, str(exc))
                        except Exception as again:  # noqa: BLE001 - e.g. the run ended meanwhile
                            self.log.error("error_verdict_failed", work_id=row.work_id, error=str(again))
                            continue
                    finally:
                        self._verifying(writer, None)
                        locks.release(row.work_id)
                    failures.pop(key, None)
                    self._announce(sender, row, result)
        finally:
            locks.close()
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


def remote_histories(home, conn):
    """(git_dir, workspace) -> a work item's history for an eval-agent on a joined host: a copy
    in this home that fetches the checkpoint to verify and the baseline from the coordinator
    host's ``git daemon`` (``roles.workspace.remote``). It is ``eval-history/<id>.git``, not the
    ``history/<id>.git`` a loop-agent of the same home keeps for its own workspace (whose baseline
    ref it writes only once the baseline is checked out there). No workspace is made or written:
    only snapshots (``eval/<id>``).

    Raises (when a history is made): OrgError ``no_git_server`` — the coordinator host serves no
    histories; retried, then an ``error`` verdict.
    """
    from roles.workspace.remote import RemoteHistory
    from state_db.queries.peers import peer

    def make(git_dir, workspace):
        coordinator = peer(conn, "coordinator")
        if coordinator is None or not coordinator.git_url:
            raise OrgError("the coordinator host serves no histories to joined hosts", code="no_git_server",
                           hint="set [hosts] git_listen = \"HOST:PORT\" (or git_url = \"ssh://...\") in the coordinator "
                                "host's org.toml and start it again")
        work_id = git_dir.name.removesuffix(".git")
        return RemoteHistory(home.root / "eval-history" / git_dir.name, home.root / "workspaces" / work_id,
                             remote=f"{coordinator.git_url}/{work_id}.git", timeout_s=GIT_TIMEOUT_S)
    return make


class WorkLocks:
    """One verification at a time per work item among the eval-agents of one home, which share
    its snapshot directories (``eval/<id>``): while the org's eval-agent list changes, two of them
    may both take an iteration, and one must not rewrite the snapshot under the other's checks.
    A byte of ``path`` per work item (by crc32: two items on one byte only wait for each other),
    POSIX record locks, so a killed holder lets go at once."""

    SPAN = 1 << 20

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    def _at(self, work_id: str) -> int:
        return zlib.crc32(work_id.encode("utf-8")) % self.SPAN

    def take(self, work_id: str) -> bool:
        """Lock ``work_id`` for this process; False when another process holds it."""
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, self._at(work_id))
        except OSError:
            return False
        return True

    def release(self, work_id: str) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, self._at(work_id))

    def close(self) -> None:
        os.close(self.fd)
