"""Loop-agent process: runs the loop of the work item dispatched to it, in a worker thread.

The main thread keeps heartbeating and handling messages. On stop or suspend the loop is asked
to pause at its next safe boundary (after an iteration is verified); if that takes too long the
current act is cut and discarded, exactly as after a crash.
"""
from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

from roles.base.instances import OrgEvalAgents
from roles.loop_agent.remote_verify import RemoteVerify
from roles.base.runtime import RoleProcess
from state_db.connection import connect
from state_db.queries import work as work_q
from state_db.queries.iterations import open_attempt
from state_db.kernel.errors import OrgError, RunTaken
from state_db.queries.work import assigned_to
from state_db.vocab import WorkStatus
from transport.kinds import Kind

# every run assigned here in a non-terminal state (a paused one is parked by its engine)
MINE = (WorkStatus.DISPATCHED, WorkStatus.RUNNING, WorkStatus.PAUSED)


# POSIX sh: the approved command ($2) runs with its output copied to the file $1 as it comes (what
# an action cut by a crash leaves: ``partial_output``), and its own exit code kept.
_TEE = ('( /bin/sh -c "$2" 2>&1; echo $? > "$1.code" ) | tee "$1"; '
        'code=$(cat "$1.code" 2>/dev/null); rm -f "$1.code"; exit "${code:-1}"')
PARTIAL_CHARS = 1500


class ActionRunner:
    """Runs an action a human approved, once, in the workspace, with only the block it asked to
    lift: ``network`` gets a sandbox with network; anything else runs as the human approved it.
    Its output is copied to a file of the org's as it comes (bound writable for that command
    alone), and removed once the action ends: a file left behind is what an action cut by a crash
    printed before it died (``partial_output``)."""

    def __init__(self, cfg, home) -> None:
        self.cfg, self.home = cfg, home

    def log_dir(self, workspace: str) -> Path:
        import hashlib
        return self.home.run_dir / "actions" / hashlib.sha256(workspace.encode()).hexdigest()[:16]

    def __call__(self, command: str, kind: str, workspace: str):
        from roles.workbench.sandbox import BwrapRunner, runner_from_config
        cfg = self.cfg
        runner = runner_from_config(cfg, self.home, Path(workspace))
        if kind == "network" and isinstance(runner, BwrapRunner):
            runner.network = True
        elif kind != "network":
            from roles.workbench.sandbox import UnsandboxedRunner
            runner = UnsandboxedRunner(Path(workspace))
        logs = self.log_dir(workspace)
        try:
            logs.mkdir(parents=True, exist_ok=True)
            out = logs / "output"
            result = runner.execute(["/bin/sh", "-c", _TEE, "sh", str(out), command], cwd=Path(workspace),
                                    timeout_s=float(cfg.sandbox.cpu_seconds), max_output=cfg.sandbox.output_bytes,
                                    writable=[logs])
        except Exception as exc:  # noqa: BLE001 - a refused sandbox is the action's result
            return None, f"error[{exc.code if isinstance(exc, OrgError) else 'sandbox_error'}]: {exc}"
        (logs / "output").unlink(missing_ok=True)          # it ended: its result holds the output
        return (None if result.timed_out else result.exit_code), result.output

    def partial_output(self, workspace: str) -> str | None:
        """The end of what an action cut while it ran had printed (None: nothing was kept); the
        file is removed. Written by the action: read as hostile input."""
        from roles.loop_agent.backends.exits import read_bounded
        from state_db.text import clean
        path = self.log_dir(workspace) / "output"
        raw = read_bounded(path, PARTIAL_CHARS * 4, tail=True)
        path.unlink(missing_ok=True)
        text = clean(raw.decode("utf-8", "replace")).strip()
        return text[-PARTIAL_CHARS:] if text else None


def gate_runner(cfg, home) -> ActionRunner:
    """The runner of actions a human approved (``ActionRunner``)."""
    return ActionRunner(cfg, home)


def current_tool_recorder(writer, work_id: str, log=None):
    """An observer for ``tools.observed`` that keeps ``attempts.current_tool`` of the run's open
    attempt up to date (set as a tool starts, cleared as it ends): what ``org status`` and
    ``org watch`` show while a run acts. Bookkeeping only (not journaled); a failed write is
    logged and the tool goes on."""
    def record(description: str | None) -> None:
        try:
            with writer.transaction(render=False) as tx:
                row = open_attempt(tx.conn, work_id)
                if row is not None:
                    tx.update("attempts", (work_id, row.attempt), current_tool=description,
                              current_tool_at=tx.now if description else None)
        except Exception as exc:  # noqa: BLE001 - status is best effort; the act must go on
            if log is not None:
                log.warning("current_tool_not_recorded", error=str(exc), next="the next tool call tries again")
    return record


class LoopAgentProcess(RoleProcess):
    # work reaches a loop-agent by a wake (dispatch, a verdict, its own worker ending): the tick
    # only recovers a lost one, so it keeps the heartbeat's pace (one wake-up a second, not two:
    # an idle org of 128 loop-agents spent a seventh of a core on its ticks)
    tick_s = 1.0

    def __init__(self, home, instance, **seams):
        super().__init__(home, instance, **seams)
        self.worker: threading.Thread | None = None
        self.pause = threading.Event()
        self.interrupt = threading.Event()
        self.verifier: RemoteVerify | None = None
        self.current: str | None = None
        self.worker_done = False        # the worker has let go of its run and is only returning
        # the runs' own store connections and sender, kept from one run to the next (one worker
        # at a time uses them: a run starts only once the previous worker has ended)
        self._run_links: tuple | None = None

    def busy(self) -> bool:
        return self.worker is not None and self.worker.is_alive()

    def warm_up(self) -> None:
        """Import the model SDK in the background once ready, so the first act does not pay ~2 s.
        Not in a role forked from the supervisor's template (``ORG_FORKED``): the template imports
        the SDK once for every role, and an idle loop-agent forked before it had is replaced by
        one forked after (roles/supervisor/forkserver.py)."""
        if os.environ.get("ORG_FORKED"):
            return

        def load():
            try:
                import anthropic  # noqa: F401
                import roles.loop_agent.backends.factory  # noqa: F401
                import roles.loop_agent.backends.anthropic_backend  # noqa: F401
                import roles.workbench.scripted.server  # noqa: F401
                import roles.workbench.workspace.history  # noqa: F401
            except Exception:  # noqa: BLE001 - the act reports a missing SDK properly
                pass
        threading.Thread(target=load, name="warm-up", daemon=True).start()

    def reconcile(self) -> None:
        if self.stopping:
            return
        if self.worker is not None and self.worker.is_alive():
            if not self.worker_done:
                return
            self.worker.join(1.0)           # past its last step: only the return is left
            if self.worker.is_alive():
                return
        mine = assigned_to(self.writer.conn, self.instance, *MINE)
        if mine is None:
            if self.current is not None:
                self._set_current(None)
            return
        self._set_current(mine.id)
        self.worker_done = False
        self.worker = threading.Thread(target=self._run_loop, args=(mine.id, mine.backend),
                                       name=f"loop-{mine.id}", daemon=True)
        self.worker.start()

    def handle(self, env) -> None:
        if env.kind == Kind.VERDICT_READY and self.verifier is not None:
            self.verifier.arrived.set()
        elif env.kind in (Kind.DISPATCH, Kind.WAKE):
            self.reconcile()

    def _set_current(self, work_id: str | None) -> None:
        self.current = work_id
        with self.writer.transaction(render=False) as tx:
            tx.update("role_instances", self.instance, current_work=work_id, updated_at=time.time())

    def _run_loop(self, work_id: str, backend_spec: str) -> None:
        """Worker thread: one engine run with its own connections (sqlite objects are per thread).
        The engine's code is imported here, by the first run: a loop-agent is ready before it
        (one forked from the warm role template has it imported already)."""
        from roles.loop_agent.backends.factory import build
        from roles.loop_agent.engine import LoopEngine, LoopSettings
        from roles.loop_agent.tools import observed
        from state_db.writer import StateWriter

        log = self.log.bind(work_id=work_id)
        lock = self._run_lock(work_id)
        if lock is None:
            return                      # stopping before the previous holder let go; a later tick retries
        writer, reads, sender = self._links()
        built = None
        kept = True
        try:
            # which eval-agent verifies what: [org] eval_agents over ipc, the store's list over tcp
            verifier_of = OrgEvalAgents(self.cfg, reads)
            sender.prepare(verifier_of.target(work_id))     # connected before the first verify request
            item = work_q.item(writer.conn, work_id)
            workspace = Path(item.workspace)
            built = build(backend_spec, self.cfg, self.home, self.instance)
            log.info("loop_starting", backend=built.label)
            self.verifier = RemoteVerify(reads, sender.send, (self.interrupt, self.pause),
                                         eval_agent=verifier_of.target)
            history = self._history(writer, work_id, workspace)
            settings = LoopSettings.from_config(self.cfg)
            settings.gate_runner = gate_runner(self.cfg, self.home)
            from skills import select
            settings.skills, settings.knowledge = select.for_run(
                writer.conn, {"id": item.id, "goal": item.goal, "verify": list(item.verify)})
            engine = LoopEngine(writer, work_id, built.backend, self.verifier, history, settings,
                                interrupt=self.interrupt, pause=self.pause)
            with observed(current_tool_recorder(writer, work_id, log)):
                decision = engine.run()
            try:
                select.record_use(writer, work_id)
            except Exception as exc:  # noqa: BLE001 - the curator's slow pass recounts use
                log.warning("skill_use_not_recorded", error=str(exc), next="the curator recounts")
            if decision is not None:
                log.info("loop_finished", reason=str(decision.reason), next="tell the coordinator")
                sender.send("coordinator", Kind.RUN_ENDED, {"work_id": work_id, "reason": str(decision.reason)})
            else:
                log.info("loop_paused", next="continues from its last committed iteration on resume")
        except RunTaken as exc:
            # handed to another loop-agent while this one acted (it was taken for gone): this act
            # is discarded — its commit was refused, its usage stays counted once — and the run is
            # the holder's, which waits for this thread's run lock and resets the workspace first
            log.warning("run_taken", holder=exc.holder, next="this act is discarded; the holder goes on")
        except Exception as exc:  # noqa: BLE001 - the run stays in state.db; a later tick retries it
            log.error("loop_failed", error=str(exc), code=exc.code if isinstance(exc, OrgError) else None, exc_info=True,
                      next="retry on a later tick")
            kept = False                    # the next run opens its connections anew
            self._end_if_unbuildable(writer, work_id, exc)
            time.sleep(1.0)
        finally:
            if built is not None:
                built.close()
            if kept:
                try:
                    sender.flush(writer)    # this run's transport counters, into the store now
                except Exception:  # noqa: BLE001 - counted again at the next flush or the close
                    kept = False
            if not kept:
                self._close_links()
            os.close(lock)                  # releases the flock
            # work dispatched while this thread was closing found it alive and waited: look now,
            # not at the next tick (a run ending here is what lets the coordinator dispatch)
            self.worker_done = True
            self.reconcile_soon()

    def _history(self, writer, work_id: str, workspace: Path):
        """The run's shadow history. On a joined host (org join) the workspace is a local copy
        under the host's own home, fetched from and pushed to the coordinator host's history of
        the work item through git (``roles.workbench.workspace.remote``); else the workspace itself."""
        from roles.workbench.workspace.history import WorkspaceHistory
        if not self.cfg.hosts.coordinator:
            return WorkspaceHistory(self.home.history_dir / f"{work_id}.git", workspace, defer=True)
        from roles.workbench.workspace.remote import RemoteHistory
        from state_db.queries.peers import peer
        coordinator = peer(writer.conn, "coordinator")
        if coordinator is None or not coordinator.git_url:
            raise OrgError("the coordinator host serves no histories to joined hosts",
                           code="no_git_server",
                           hint="set [hosts] git_listen = \"HOST:PORT\" (or git_url = \"ssh://...\") in the coordinator "
                                "host's org.toml and start it again")
        return RemoteHistory(self.home.history_dir / f"{work_id}.git", self.home.root / "workspaces" / work_id,
                             remote=f"{coordinator.git_url}/{work_id}.git", defer=True)

    def _run_lock(self, work_id: str) -> int | None:
        """Hold an exclusive lock on the run while working it. If the run moved here from a
        loop-agent that is still finishing an act (stopping, or thought dead), wait until that
        process lets go (or dies) so two acts never touch one workspace; the first attempt here
        then resets the workspace to the last checkpoint."""
        path = self.home.run_dir / "locks" / f"{work_id}.lock"
        path.parent.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if self.stopping or self.pause.is_set():
                    os.close(fd)
                    return None
                time.sleep(0.05)

    def _end_if_unbuildable(self, writer, work_id: str, exc: Exception) -> None:
        """A backend that cannot be built (no key, unknown model) will not fix itself: the stop
        policy's ModelError ends the run."""
        from roles.loop_agent.backends.base import BackendConfigError
        from roles.loop_agent.engine import LoopSettings, end_unbuildable
        if isinstance(exc, BackendConfigError):
            end_unbuildable(writer, work_id, LoopSettings.from_config(self.cfg), exc)

    def _links(self) -> tuple:
        """The runs' writer, read connection and sender: opened by the first run, kept for the
        next ones (each opening cost a run ~1.5 ms of CPU three times: a connection's first look
        at the WAL, its pragmas, the sender's counters flushed through a connection of their own)."""
        if self._run_links is None:
            from state_db.writer import StateWriter
            writer = StateWriter(self.home.db_path, self.role, self.instance)
            try:
                reads = connect(self.home.db_path, readonly=True)
            except Exception:
                writer.close()
                raise
            self._run_links = (writer, reads, self.transport.thread_sender())
        return self._run_links

    def _close_links(self) -> None:
        links, self._run_links = self._run_links, None
        if links is None:
            return
        writer, reads, sender = links
        for close in (sender.close, reads.close, writer.close):
            try:
                close()
            except Exception as exc:  # noqa: BLE001 - closing what may already be broken
                self.log.warning("close_failed", error=str(exc))

    def on_stop(self) -> None:
        try:
            self._stop_worker()
        finally:
            if self.worker is None or not self.worker.is_alive():
                self._close_links()          # before the transport closes: the sender is its socket

    def _stop_worker(self) -> None:
        if self.worker is None or not self.worker.is_alive():
            return
        self.pause.set()
        grace = max(0.5, self.cfg.supervisor.stop_timeout_s - 2.0)
        self.worker.join(grace)
        if self.worker.is_alive():
            self.log.warning("cutting_act", why="no safe boundary within the stop timeout")
            self.interrupt.set()
            self.worker.join(2.0)
