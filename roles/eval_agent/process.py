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
each takes its share (``roles.base.instances.OrgEvalAgents``). One on a joined host (``org join --role
eval-agent``) verifies iterations only, from the checkpoints the store names, fetched from the
coordinator host's histories; the preflights, which read the real workspace, stay there.
"""
from __future__ import annotations

import fcntl
import os
import threading
import time
import uuid
import zlib
from pathlib import Path

from roles.eval_agent.codes import MACHINE_CODES
from roles.base.instances import OrgEvalAgents
from roles.base.runtime import RoleProcess
from state_db.kernel.errors import OrgError
from state_db.queries.verdicts import Due, due, verified
from transport.kinds import Kind

RETRIES = 3
BACKOFF_S = 0.5
# Verifications run side by side, one work item each: one that hangs on the host (a read, a
# snapshot, a review) holds one worker, is cut at its bound, and the others go on meanwhile.
WORKERS = 2
STUCK_MARGIN_S = 120.0
GIT_TIMEOUT_S = 60.0     # one git exchange with the coordinator host (a joined eval-agent)


class EvalAgentProcess(RoleProcess):
    tick_s = 0.5

    def __init__(self, home, instance, *, make_verifier=None, **seams):
        super().__init__(home, instance, **seams)
        self.workers: list[threading.Thread] = []
        self.more = threading.Event()
        # on a joined host (org join --role eval-agent) the work items' histories are the
        # coordinator host's, fetched through git; preflights stay on the coordinator host
        self.joined = bool(self.cfg.hosts.coordinator)
        self.make_verifier = make_verifier or self._verifier
        # what each worker verifies now: work id -> (iteration, started at, worker's name)
        self.in_flight: dict[str, tuple[int, float, str]] = {}
        self.stuck: dict[str, str] = {}          # work id -> the worker left with it (cut at its bound)
        self.flight_lock = threading.Lock()
        # (work, n) -> (failed tries, next try at), shared by the workers: a retry is counted once
        # whichever worker makes it (the bound is per verification, not per worker)
        self.failures: dict[tuple[str, int], tuple[int, float]] = {}
        self.locks = WorkLocks(self.home.run_dir / "verify.lock")
        self._shown_busy: str | None = None
        self._cutter = None

    def busy(self) -> bool:
        return bool(self.in_flight)

    @property
    def worker(self) -> threading.Thread | None:
        """The first verification worker (None before the first reconcile)."""
        return self.workers[0] if self.workers else None


    def _owns(self, agents: OrgEvalAgents, row: Due) -> bool:
        """Whether ``row`` is this eval-agent's to verify: of several, its share (the same list
        every process reads: ``roles.base.instances``); never a preflight on a joined host."""
        if self.joined and row.n == 0:
            return False
        current = agents.current()
        if not agents.stored and self.instance not in current.everyone:
            return True          # over ipc, an instance [org] eval_agents does not name verifies everything
        return current.owner(row.work_id, row.n) == self.instance

    def _may_help(self, agents: OrgEvalAgents) -> bool:
        """Whether this eval-agent runs preflights at all (``_order``): one of the coordinator
        host's, never a joined host's."""
        if self.joined:
            return False
        current = agents.current()
        return self.instance in current.preflights or (not agents.stored and self.instance not in current.everyone)

    def _order(self, agents: OrgEvalAgents, rows: list[Due]) -> list[Due]:
        """What this eval-agent takes up, in order (``rows``: ``verdicts.due``'s): its own share
        of what a loop-agent waits for (preflights of dispatched items, then committed
        iterations); then the preflights of dispatched items that another eval-agent of this host
        owns and has not started; then its own queued items' preflights, which nobody waits for yet.

        A preflight is each item's one verification on its baseline, with nothing of the item
        kept by whoever runs it, so which eval-agent runs it changes nothing but when: items are
        shared out by a hash of their ids, and in a burst of a hundred submits one eval-agent
        was owed twice as many as another while a loop-agent waited on each, or one was busy
        with a long verification while the others idled. The host's per-item lock (``WorkLocks``)
        keeps a preflight to one eval-agent at a time, and the first one written is the one
        (``Verifier.preflight``: an owner coming to it later finds it done)."""
        own = [r for r in rows if self._owns(agents, r)]
        waited = [r for r in own if not (r.n == 0 and r.assigned_to is None)]
        queued = [r for r in own if r.n == 0 and r.assigned_to is None]
        mine = {(r.work_id, r.n) for r in own}
        helping = [r for r in rows if r.n == 0 and r.assigned_to is not None and (r.work_id, 0) not in mine]
        if helping and not self._may_help(agents):
            helping = []
        return [*waited, *helping, *queued]

    def reconcile(self) -> None:
        if self.stopping:
            return
        self._cut_stuck()
        with self.flight_lock:
            stuck = set(self.stuck.values())
        self.workers = [w for w in self.workers if w.is_alive()]
        working = [w for w in self.workers if w.name not in stuck]
        for _ in range(WORKERS - len(working)):
            worker = threading.Thread(target=self._work, name=f"verify-{uuid.uuid4().hex[:6]}", daemon=True)
            self.workers.append(worker)
            worker.start()
        self._show_busy()
        self.more.set()

    def handle(self, env) -> None:
        if env.kind in (Kind.VERIFY_REQUEST, Kind.WAKE):
            self.more.set()

    def _verifier(self, writer):
        from roles.eval_agent.review import Reviewer, ReviewSettings
        from roles.eval_agent.verifier import Verifier
        from roles.workbench.sandbox import runner_from_config
        from roles.base.instances import host_name
        return Verifier(self.home, writer, timeout_s=float(self.cfg.sandbox.cpu_seconds),
                        history_factory=remote_histories(self.home, writer.conn) if self.joined else None,
                        runner_factory=lambda snapshot, workspace: runner_from_config(self.cfg, self.home, snapshot,
                                                                                       present_at=workspace),
                        reviewer=Reviewer(ReviewSettings.from_config(self.cfg), writer),
                        scope=tuple(self.cfg.verify.scope), canaries=self.cfg.verify.canaries,
                        host=host_name(self.cfg))

    def bound_s(self, row: Due) -> float:
        """How long one verification may take before it is cut: each verify command's own
        timeout, the review's every try (``[review] retries`` + 1 model requests, each bounded by
        ``[model] request_timeout_s``), plus ``STUCK_MARGIN_S`` for what the host does around them
        (snapshot, reading reports)."""
        from state_db.queries import work as work_q
        item = work_q.item(self.writer.conn, row.work_id)
        commands = len(item.verify) if item is not None else 1
        review = (int(self.cfg.review.retries) + 1) * float(self.cfg.model.request_timeout_s)
        return float(self.cfg.sandbox.cpu_seconds) * max(1, commands) + review + STUCK_MARGIN_S

    def _cut_stuck(self) -> None:
        """Fail every verification past its bound with a ``verify_stuck`` error verdict (the
        machine's, never the doer's: the run ends ``verify_unrunnable``). Its worker is left to
        finish or hang on its own — a thread cannot be killed — and a new one takes its place,
        so the other work items go on being verified."""
        now = time.monotonic()
        with self.flight_lock:
            late = [(w, n, started, name) for w, (n, started, name) in self.in_flight.items()
                    if w not in self.stuck]
        for work_id, n, started, name in late:
            bound = self.bound_s(Due(work_id, n, None))
            if now - started < bound:
                continue
            with self.flight_lock:
                if self.in_flight.get(work_id, (None,))[0] != n:
                    continue                        # it finished meanwhile
                self.stuck[work_id] = name
            self.log.error("verify_stuck", work_id=work_id, iteration=n, seconds=round(now - started),
                           bound_s=bound, next="error verdict verify_stuck; other work items go on")
            try:
                if self._cutter is None:
                    self._cutter = self.make_verifier(self.writer)
                self._cutter.record_error(work_id, n, "verify_stuck",
                                          f"verifying iteration {n} took more than {bound:.0f} s on this host "
                                          "(a host-side step hung: reading, snapshot or review) and was cut")
            except Exception as exc:  # noqa: BLE001 - e.g. the run ended meanwhile
                self.log.error("error_verdict_failed", work_id=work_id, error=str(exc))
            self.transport.send("coordinator", Kind.WAKE, {"work_id": work_id, "ended": "verify_unrunnable"})

    def _show_busy(self, writer=None) -> None:
        """``current_work``: the work items being verified now (a stuck one included, until its
        worker lets go), so ``org status`` shows the eval-agent busy, and with what. ``writer``:
        the calling worker's own connection (default: the role's, the main thread's)."""
        with self.flight_lock:
            shown = ",".join(sorted(self.in_flight)) or None
        if shown == self._shown_busy:
            return
        try:
            with (writer or self.writer).transaction(render=False) as tx:
                tx.update("role_instances", self.instance, current_work=shown, updated_at=tx.now)
            self._shown_busy = shown
        except Exception as exc:  # noqa: BLE001 - a display only: the next tick writes it again
            self.log.warning("busy_not_shown", error=str(exc))

    def _claim(self, row: Due) -> bool:
        with self.flight_lock:
            if row.work_id in self.in_flight:
                return False                        # another worker of this process has it
            if not self.locks.take(row.work_id):
                # another eval-agent of this home verifies it (a share changing hands): its
                # verdict counts, and this one must not rewrite the snapshot under its checks
                self.log.info("verify_busy", work_id=row.work_id, iteration=row.n,
                              next="another eval-agent of this host verifies it")
                return False
            self.in_flight[row.work_id] = (row.n, time.monotonic(), threading.current_thread().name)
            return True

    def _let_go(self, row: Due) -> bool:
        """Release ``row``'s work item; False when it was cut as stuck meanwhile (its verdict is
        written already, and this worker's end is its own)."""
        with self.flight_lock:
            self.in_flight.pop(row.work_id, None)
            was_cut = self.stuck.pop(row.work_id, None) is not None
            try:
                self.locks.release(row.work_id)
            except OSError:
                pass                                # a worker cut as stuck may outlive the role's stop
        return not was_cut

    def _work(self) -> None:
        # the verifier's code is imported by the worker, after the role is ready (the role template
        # has it imported for any eval-agent forked once it is warm)
        from state_db.writer import StateWriter
        writer = StateWriter(self.home.db_path, self.role, self.instance)
        sender = self.transport.thread_sender()
        agents = OrgEvalAgents(self.cfg, writer.conn)
        verifier = self.make_verifier(writer)
        from roles.workbench.sandbox.mode import unsandboxed_allowed, warm
        if not unsandboxed_allowed(self.cfg):
            warm()      # before the first preflight waits on it (the workers share what it makes)
        failures = self.failures
        me = threading.current_thread().name
        try:
            while not self.stopping:
                with self.flight_lock:
                    if me in self.stuck.values():
                        break                       # cut while it hung: a new worker took its place
                with self.flight_lock:
                    soonest = min((at for _, at in failures.values()), default=None)
                self.more.wait(1.0 if soonest is None else min(1.0, max(0.05, soonest - time.monotonic())))
                self.more.clear()
                for row in self._order(agents, due(writer.conn)):
                    if self.stopping:
                        break
                    key = (row.work_id, row.n)
                    with self.flight_lock:
                        _, next_at = failures.get(key, (0, 0.0))
                    if time.monotonic() < next_at or not self._claim(row):
                        continue
                    with self.flight_lock:          # again once claimed: another worker may have just tried
                        tries, next_at = failures.get(key, (0, 0.0))
                    if time.monotonic() < next_at:
                        self._let_go(row)
                        continue
                    if verified(writer.conn, row.work_id, row.n):
                        # written since ``due`` was read, by another eval-agent of this host (a
                        # preflight it ran for this one, ``_order``): its writer told whoever waits
                        self._let_go(row)
                        continue
                    self.more.set()                 # the other workers look for work of their own
                    self._show_busy(writer)
                    try:
                        result = self._verify_once(verifier, row, tries, failures)
                    finally:
                        kept = self._let_go(row)
                        self._show_busy(writer)
                    if result is not None and kept:
                        self._announce(sender, row, result, writer.conn)
                    self.more.set()                 # what is due has changed: read it again
                    break
        finally:
            sender.close()
            writer.close()

    def _verify_once(self, verifier, row: Due, tries: int, failures: dict):
        """Verify ``row`` once: its verdict (or preflight); None when it is to be tried again or
        there is nothing to tell."""
        key = (row.work_id, row.n)
        try:
            result = verifier.verify(row.work_id, row.n)
        except Exception as exc:  # noqa: BLE001 - one bad item must not stop the others
            code = exc.code if isinstance(exc, OrgError) else None
            if code == "run_ended":      # cancelled or ended while its check ran
                self.log.info("verify_abandoned", work_id=row.work_id, iteration=row.n,
                              next="nothing: the run is over")
                with self.flight_lock:
                    failures.pop(key, None)
                return None
            tries += 1
            if tries < RETRIES:
                delay = BACKOFF_S * 2 ** (tries - 1)
                with self.flight_lock:
                    failures[key] = (tries, time.monotonic() + delay)
                self.log.error("verify_failed", work_id=row.work_id, iteration=row.n, error=str(exc),
                               code=code, attempt=tries, of=RETRIES, next=f"retry in {delay:.1f} s")
                return None
            with self.flight_lock:
                failures.pop(key, None)
            # an error verdict keeps the machine's codes (never the doer's); any other is verifier_error
            code = code if code in MACHINE_CODES else "verifier_error"
            self.log.error("verify_gave_up", work_id=row.work_id, iteration=row.n, error=str(exc),
                           code=code, attempts=tries, next="error verdict; the run ends verify_unrunnable")
            try:
                result = verifier.record_error(row.work_id, row.n, code, str(exc))
            except Exception as again:  # noqa: BLE001 - e.g. the run ended meanwhile
                self.log.error("error_verdict_failed", work_id=row.work_id, error=str(again))
                return None
        with self.flight_lock:
            failures.pop(key, None)
        return result

    def _announce(self, sender, row: Due, result, conn) -> None:
        """Log the verdict (or preflight) and wake whoever waits for it: the loop-agent the run is
        assigned to *now* (read through ``conn``), not when it fell due — a preflight starts as
        soon as its item is queued, and the loop-agent dispatched meanwhile waits for this wake
        (without it, for its next look at the store, up to half a second later)."""
        if row.n == 0:
            self.log.info("preflight", work_id=row.work_id, outcome=result.outcome, detail=result.detail[:300],
                          ended=result.ended)
        else:
            self.log.info("verdict", work_id=row.work_id, iteration=row.n, outcome=result.outcome,
                          goal_met=result.goal_met, held_back=len(result.held_back), ended=result.ended)
        from state_db.queries import work as work_q
        try:
            item = work_q.item(conn, row.work_id)
            to = item.assigned_to if item is not None else None
        except Exception:  # noqa: BLE001 - a wake only: the loop-agent also looks at the store
            to = row.assigned_to
        if to:
            sender.send(to, Kind.VERDICT_READY,
                        {"work_id": row.work_id, "iteration": row.n, "verdict": getattr(result, "id", "preflight")})
        if result.ended:
            sender.send("coordinator", Kind.WAKE, {"work_id": row.work_id, "ended": str(result.ended)})

    def on_stop(self) -> None:
        self.more.set()
        with self.flight_lock:
            stuck = set(self.stuck.values())
        deadline = time.monotonic() + max(0.5, self.cfg.supervisor.stop_timeout_s - 2.0)
        for worker in self.workers:
            if worker.name not in stuck:
                worker.join(max(0.0, deadline - time.monotonic()))
        self.locks.close()


def remote_histories(home, conn):
    """(git_dir, workspace) -> a work item's history for an eval-agent on a joined host: a copy
    in this home that fetches the checkpoint to verify and the baseline from the coordinator
    host's ``git daemon`` (``roles.workbench.workspace.remote``). It is ``eval-history/<id>.git``, not the
    ``history/<id>.git`` a loop-agent of the same home keeps for its own workspace (whose baseline
    ref it writes only once the baseline is checked out there). No workspace is made or written:
    only snapshots (``eval/<id>``).

    Raises (when a history is made): OrgError ``no_git_server`` — the coordinator host serves no
    histories; retried, then an ``error`` verdict.
    """
    from roles.workbench.workspace.remote import RemoteHistory
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
