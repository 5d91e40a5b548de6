"""The supervisor: spawns every role instance, restarts crashed ones, stops them all.

It decides nothing about work. It records pids (with start times, so a reused pid is never
signalled), notices crashes and stale heartbeats, restarts with backoff and marks a role
``failed`` after too many crashes in a short window. Children get PR_SET_PDEATHSIG so they
never outlive it; a new supervisor first clears what an earlier one left behind.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import structlog

from roles.base import beat, readiness
from roles.base.instances import InstanceSpec, org_instances
from roles.supervisor import procs
from roles.supervisor.forkserver import ForkedRole, ForkServer, ForkServerError
from state_db.kernel.config import Config
from state_db.kernel.errors import StateError, StoreBusy
from state_db.kernel.home import OrgHome
from state_db.queries.processes import role_instance, role_instances, session as org_session
from state_db.queries import processes, work
from state_db.vocab import Actor, RoleStatus, SessionStatus, WorkStatus
from state_db.writer import StateWriter

_PR_SET_PDEATHSIG = 1
RETENTION_EVERY_S = 3600.0


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class AlreadyRunning(StateError):
    code = "already_running"


class Spawner(Protocol):
    """Starts one role process: ``spawner(spec, argv, env, out_path)`` runs ``python -m spec.module
    *argv`` (or anything a test wants in its place) with ``env``, its output appended to ``out_path``,
    and returns a ``Popen``-like handle (``pid``, ``poll``, ``wait``, ``returncode``) that the
    supervisor owns from then on."""

    def __call__(self, spec: InstanceSpec, argv: list[str], env: dict[str, str],
                 out_path: Path) -> subprocess.Popen: ...


@dataclass
class Child:
    spec: InstanceSpec
    proc: subprocess.Popen | None = None
    started: str | None = None
    spawned_at: float = 0.0
    crashes: deque = field(default_factory=deque)
    restart_at: float | None = None
    failed: bool = False
    stopping: bool = False
    replacing: bool = False       # stopped on purpose, to be forked again from the warm template


class Supervisor:
    """Runs one org.

    Args:
        home: the (initialised) org home.
        cfg: validated configuration.
        python: interpreter for role processes.
        clock: monotonic clock (injectable).
        spawner: starts a role process (a ``Spawner``); default the fork server, else ``python -m``.
    """

    def __init__(self, home: OrgHome, cfg: Config, *, python: str = sys.executable,
                 clock=time.monotonic, spawner: Spawner | None = None, forks: ForkServer | None = None,
                 instances: list[InstanceSpec] | None = None):
        self.home = home
        self.cfg = cfg
        self.python = python
        self.clock = clock
        self.log = structlog.get_logger()
        self.writer = StateWriter(home.db_path, Actor.SUPERVISOR)
        # a joined host (org join: [hosts] coordinator) runs only the instances it was given and
        # leaves the org session to the coordinator host (roles/supervisor/hosts.py)
        self.joined = bool(cfg.hosts.coordinator)
        specs = instances if instances is not None else org_instances(cfg.org.loop_agents, cfg.org.eval_agents)
        if instances is None and not cfg.hosts.loop_agents_here:
            specs = [s for s in specs if s.role != Actor.LOOP_AGENT]
        self.children = {s.instance: Child(s) for s in specs}
        self.git = None                  # the histories served to joined hosts ([hosts] git_listen)
        self.held = False                # a joined host whose org is suspended or stopped: children stopped
        self._stop_requested: str | None = None
        self._lock_fd: int | None = None
        # rows decided but not yet written because the store stayed busy past its wait, in the
        # order they were decided (``_write``)
        self._unwritten: deque[Callable[[], None]] = deque()
        self.spawner = spawner
        # roles are forked from a pre-imported template (roles/supervisor/forkserver.py) unless
        # [supervisor] spawn = "exec" (or ORG_SPAWN=exec) asks for one interpreter per role
        # (``forks``: a template the process started first thing, importing while this one does)
        self.forks: ForkServer | None = None
        if spawner is None and cfg.supervisor.spawn == "fork":
            self.forks = forks or ForkServer(python)
        elif forks is not None:
            forks.close()

    # -- start ----------------------------------------------------------------------------
    def acquire_lock(self) -> None:
        """One supervisor per org home (flock held for the process lifetime)."""
        fd = os.open(self.home.run_dir / "supervisor.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyRunning(f"an org is already running in {self.home.root}",
                                 hint="see 'org status'; stop it with 'org stop'") from None
        self._lock_fd = fd

    def issue_keys(self) -> None:
        """One key per instance (and for the human CLI and the supervisor); kept across restarts
        so messages waiting in outboxes stay verifiable."""
        from transport.keys import Keyring, keyring_path

        ring = Keyring.create(keyring_path(self.home.run_dir))
        for name in [*self.children, "supervisor", "human"]:
            if ring.key_for(name) is None:
                ring.issue(name)
            if self.cfg.transport.endpoint != "ipc" and ring.curve_keypair(name) is None:
                ring.issue_curve(name)

    def clear_leftovers(self) -> None:
        """Stop role processes an earlier (killed) supervisor left behind, by pid and start time."""
        victims = [(r.instance, r.pid, r.pid_start) for r in role_instances(self.writer.conn)
                   if r.instance in self.children and procs.is_alive(r.pid, r.pid_start)]
        for _, pid, started in victims:
            procs.signal_if_same(pid, started, signal.SIGTERM)
        deadline = time.monotonic() + 3
        while victims and time.monotonic() < deadline:
            victims = [v for v in victims if procs.is_alive(v[1], v[2])]
            time.sleep(0.05)
        for instance, pid, started in victims:
            procs.signal_if_same(pid, started, signal.SIGKILL)
            self.log.warning("leftover_killed", instance=instance, pid=pid)

    def open_session(self) -> None:
        me = os.getpid()
        now = time.time()
        if self.joined:                   # the org session is the coordinator host's
            with self.writer.transaction() as tx:
                self._role_rows(tx, now)
            procs.write_pidfile(self.home.run_dir / "supervisor.pid", me)
            return
        with self.writer.transaction() as tx:
            row = org_session(tx.conn)
            fields = {"supervisor_pid": me, "supervisor_start": procs.start_time(me), "updated_at": now,
                      "started_at": now}
            if row is None:
                tx.insert("org_session", {"id": 1, "status": SessionStatus.RUNNING, "detail": "{}", **fields})
            elif row.status == SessionStatus.RUNNING:
                tx.update("org_session", 1, **fields)
            else:
                tx.set_status("org_session", 1, SessionStatus.RUNNING, detail="{}", **fields)
            self._role_rows(tx, now)
            # instances beyond the configured count (loop_agents lowered) are simply left stopped
        procs.write_pidfile(self.home.run_dir / "supervisor.pid", me)

    def _role_rows(self, tx, now: float) -> None:
        for name, child in self.children.items():
            if role_instance(tx.conn, name) is None:
                tx.insert("role_instances", {"instance": name, "role": child.spec.role,
                                             "status": RoleStatus.STOPPED, "updated_at": now})

    def register_peers(self) -> None:
        """Over tcp: this host's instances go into the store's peers table, so roles on other
        hosts reach and authenticate them (roles/supervisor/hosts.py)."""
        from roles.supervisor import hosts
        if hosts.is_tcp(self.cfg):
            hosts.register(self.writer, self.home, self.cfg, list(self.children))

    def serve_histories(self) -> None:
        """[hosts] git_listen: the work items' histories, served to joined hosts by git daemon."""
        if self.joined or not self.cfg.hosts.git_listen:
            return
        from roles.workbench.serve.gitserve import GitServeError, GitServer
        if not self.cfg.hosts.git_unauthenticated:
            raise GitServeError(f"[hosts] git_listen = {self.cfg.hosts.git_listen!r} would serve every work item's "
                                "history to anyone who reaches the port (git:// has no authentication)",
                                code="git_unauthenticated",
                                hint="serve over ssh:// ('org hosts ssh-line KEYFILE --host NAME', [hosts] git_url), "
                                     "or on a private network say [hosts] git_unauthenticated = true")
        host, _, port = self.cfg.hosts.git_listen.rpartition(":")
        self.home.history_dir.mkdir(parents=True, exist_ok=True)
        self.git = GitServer(self.home.history_dir, host, int(port))
        self.git.start()
        self.log.info("histories_served", listen=self.cfg.hosts.git_listen)

    # -- children -------------------------------------------------------------------------
    def spawn(self, child: Child) -> None:
        self.spawn_all([child])

    def spawn_all(self, children: list[Child]) -> None:
        """Start ``children``: one transaction marks them starting, the template forks them all
        from requests sent together (``ForkServer.spawn_many``), one transaction records their
        pids. At the org's start that is every role, not a round trip and two commits each."""
        now = time.time()
        with self.writer.transaction() as tx:
            for child in children:
                name = child.spec.instance
                current = role_instance(tx.conn, name).status
                if current in (RoleStatus.READY, RoleStatus.STOPPING):
                    tx.set_status("role_instances", name, RoleStatus.CRASHED, updated_at=now,
                                  last_exit="lost with an earlier supervisor")
                if current != RoleStatus.STARTING:
                    tx.set_status("role_instances", name, RoleStatus.STARTING, updated_at=now)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORG_KEY")}
        asks = []
        for child in children:
            name = child.spec.instance
            out_path = self.home.logs_dir / f"{name}.out"
            if out_path.exists() and out_path.stat().st_size > self.cfg.logs.max_bytes:
                out_path.replace(out_path.with_name(out_path.name + ".1"))     # stdout/stderr of a role: rotated
            child.proc = None
            asks.append((child, ["--home", str(self.home.root), "--instance", name], out_path))
        if self.spawner is not None:
            for child, argv, out_path in asks:
                child.proc = self.spawner(child.spec, argv, env, out_path)
        elif self.forks is not None:
            try:
                forked = self.forks.spawn_many([(c.spec.module, argv, {**env, "ORG_FORKED": "1"}, out_path)
                                                for c, argv, out_path in asks])
            except ForkServerError as exc:
                forked = [exc] * len(asks)
            for (child, _, _), got in zip(asks, forked):
                if isinstance(got, ForkServerError):  # start it as its own interpreter instead
                    if self.forks is not None:
                        self.log.warning("fork_server_failed", error=str(got), next="exec")
                        self.forks.close()
                        self.forks = None
                else:
                    child.proc = got
        for child, argv, out_path in asks:
            if child.proc is None:
                with open(out_path, "ab") as out:
                    child.proc = subprocess.Popen(
                        [self.python, "-m", child.spec.module, *argv],
                        stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, close_fds=True,
                        preexec_fn=_die_with_parent)
            child.started = procs.start_time(child.proc.pid)
            child.spawned_at = self.clock()
            child.restart_at = None
            child.stopping = False
        started = [(c.spec.instance, c.proc.pid, c.started) for c in children]

        def record_pids() -> None:
            with self.writer.transaction(render=False) as tx:
                for name, pid, pid_start in started:
                    tx.update("role_instances", name, pid=pid, pid_start=pid_start,
                              started_at=now, heartbeat_at=None, updated_at=now)
            # a role quicker than this commit wrote its ready row before its pid and start: who
            # waits for it looks again now (``roles.base.readiness``), not on a timeout
            readiness.poke(self.home.run_dir)
        self._write(record_pids)
        for child in children:
            procs.write_pidfile(self.home.run_dir / f"{child.spec.instance}.pid", child.proc.pid)
            self.log.info("role_spawned", instance=child.spec.instance, pid=child.proc.pid)

    def _on_exit(self, child: Child, code: int) -> None:
        name = child.spec.instance
        now_m = self.clock()
        (self.home.run_dir / f"{name}.pid").unlink(missing_ok=True)
        replaced, child.replacing = child.replacing, False
        # a role asked to make way for a warm fork stops cleanly (exit 0); one that died of
        # anything else meanwhile (a kill -9) crashed, and is counted so
        if replaced and code == 0 and not self._stop_requested:
            child.restart_at = now_m                 # at once, and not a crash

            def replaced_row() -> None:
                self._record_exit_now(name, RoleStatus.STOPPED, "replaced by a fork of the warm template")
                with self.writer.transaction(render=False) as tx:     # the role wrote its own stop
                    tx.update("role_instances", name, last_exit="replaced by a fork of the warm template",
                              updated_at=time.time())
            self._write(replaced_row)
            return
        if child.stopping or self._stop_requested:
            self._record_exit(name, RoleStatus.STOPPED, f"exit {code}")
            return
        child.crashes.append(now_m)
        window = self.cfg.supervisor.restart_window_s
        while child.crashes and now_m - child.crashes[0] > window:
            child.crashes.popleft()
        if len(child.crashes) >= self.cfg.supervisor.restart_max:
            child.failed = True
            detail = f"exit {code}; {len(child.crashes)} crashes in {window:.0f}s"

            def failed_row() -> None:
                self._record_exit_now(name, RoleStatus.FAILED, detail)
                self._notify_failed(name)
            self.log.error("role_failed", instance=name, crashes=len(child.crashes), next="not restarted")
            self._write(failed_row)
            return
        backoff = min(5.0, 0.2 * 2 ** (len(child.crashes) - 1))
        child.restart_at = now_m + backoff
        self._record_exit(name, RoleStatus.CRASHED, f"exit {code}", restarts=True)
        self.log.warning("role_crashed", instance=name, exit=code, restart_in_s=backoff)

    def replace_cold_agents(self) -> None:
        """Once the template has imported the model SDK, stop each idle loop-agent forked before
        that (SIGTERM; it holds no work) so that it is forked again with the SDK's pages shared.
        A loop-agent that took work in the meantime imports the SDK itself and is left alone."""
        if self.forks is None or not self.forks.warm:
            return
        cold = [c for c in self.children.values()
                if c.spec.role == Actor.LOOP_AGENT and isinstance(c.proc, ForkedRole) and not c.proc.warm
                and not c.replacing and not c.stopping and self._exit_code(c.proc) is None]
        if not cold:
            return
        rows = {r.instance: r for r in processes.role_instances(self.writer.conn, Actor.LOOP_AGENT)}
        busy = work.busy_agents(self.writer.conn, WorkStatus.DISPATCHED, WorkStatus.RUNNING, WorkStatus.PAUSED)
        for c in cold:
            row = rows.get(c.spec.instance)
            if row is None or row.status != RoleStatus.READY or row.current_work or c.spec.instance in busy:
                if row is not None and (row.current_work or c.spec.instance in busy):
                    c.proc.warm = True               # working: keep it, it has its own SDK now
                continue
            c.replacing = True
            self.log.info("role_replaced", instance=c.spec.instance, why="forked before the template was warm")
            procs.signal_if_same(c.proc.pid, c.started, signal.SIGTERM)

    def _record_exit(self, name: str, status: str, detail: str, restarts: bool = False) -> None:
        self._write(lambda: self._record_exit_now(name, status, detail, restarts))

    def _write(self, write: Callable[[], None]) -> None:
        """Make ``write`` (a role row's transaction) now or, when the store stays busy past its
        wait, at the next round of the main loop, after the ones decided before it. A write that
        could not be made is kept, never dropped (an exit not recorded is a role never
        restarted), and the supervisor goes on reaping and watching heartbeats meanwhile: it is
        the org's one process that must not end because a writer held the store (a role dies of
        ``store_busy`` and is restarted; the supervisor's end would take the org down). Each write
        is one transaction, or ends in the state it sets whatever the row holds (safe to redo)."""
        self._unwritten.append(write)
        self.write_unwritten()

    def write_unwritten(self) -> bool:
        """Write what is waiting, in order; False when the store is still busy."""
        while self._unwritten:
            try:
                self._unwritten[0]()
            except StoreBusy as exc:
                self.log.warning("store_busy", error=exc.message, unwritten=len(self._unwritten),
                                 next="written at the next round")
                return False
            self._unwritten.popleft()
        return True

    def _record_exit_now(self, name: str, status: str, detail: str, restarts: bool = False) -> None:
        now = time.time()
        with self.writer.transaction() as tx:
            row = role_instance(tx.conn, name)
            extra = {"restarts": row.restarts + 1} if restarts else {}
            current = row.status
            if current == status or current == RoleStatus.FAILED:
                return
            if status == RoleStatus.FAILED and current != RoleStatus.CRASHED and _can(current, RoleStatus.CRASHED):
                tx.set_status("role_instances", name, RoleStatus.CRASHED, updated_at=now)
                current = RoleStatus.CRASHED
            if _can(current, status):
                tx.set_status("role_instances", name, status, last_exit=detail, updated_at=now, **extra)
        readiness.poke(self.home.run_dir)          # 'org start' waits for a failed role too

    def _notify_failed(self, name: str) -> None:
        try:
            from roles.base.transport_link import send_once
            send_once(self.home, "supervisor", "coordinator", "role_failed", {"instance": name}, self.cfg)
        except Exception as exc:  # the failure is in state.db; the message is only a wake-up
            self.log.warning("role_failed_not_sent", error=str(exc))

    def check_heartbeats(self) -> None:
        """Kill (then restart) a role whose heartbeat is stale: hung, not just slow to start. Its
        heartbeat is the later of its row's and its beat file's (``roles/base/beat.py``): a role
        that waits for a busy store beats on, its row behind the writers queued before it."""
        limit = self.cfg.supervisor.heartbeat_timeout_s
        now = time.time()
        rows = {r.instance: r for r in role_instances(self.writer.conn)}
        for name, child in self.children.items():
            row = rows.get(name)
            if child.proc is None or self._exit_code(child.proc) is not None or row is None:
                continue
            last = beat.latest(row.heartbeat_at, self.home.run_dir, name)
            started_long_ago = self.clock() - child.spawned_at > limit
            if started_long_ago and (last is None or now - last > limit):
                if not procs.is_alive(child.proc.pid, child.started):
                    continue                 # it has ended: its exit is on its way (reap_and_restart)
                # what it was doing says why it was silent: R (runnable: starved of CPU), S (waiting
                # on something other than the store), D (in I/O the kernel does not interrupt), T
                self.log.warning("heartbeat_stale", instance=name, pid=child.proc.pid,
                                 state=procs.state(child.proc.pid), silent_s=None if last is None else round(now - last, 1),
                                 row_silent_s=None if row.heartbeat_at is None else round(now - row.heartbeat_at, 1),
                                 next="kill and restart")
                procs.signal_if_same(child.proc.pid, child.started, signal.SIGKILL)

    def apply_retention(self) -> None:
        """Automatic retention (org.toml [retention]); failures are logged and retried later. A
        joined host removes only its own files (eval snapshots, history copies): the rows are the
        shared store's, pruned by the coordinator host."""
        try:
            from state_db.retention import collect
            from transport.envelope import Limits
            from transport.outbox import stale_cli_outbox
            result = collect(self.home, self.cfg, dry_run=False, history=False, older_than_days=0, actor="supervisor",
                             rows=not self.joined,
                             ledger_keep_s=Limits.from_config(self.cfg.data["transport"]).ledger_keep_s,
                             stale_outbox=stale_cli_outbox(self.home.outbox_dir, now=time.time()))
            self.log.info("retention_applied", **{k: v for k, v in result.items() if isinstance(v, int)})
        except Exception as exc:  # noqa: BLE001 - retention must never take the org down
            self.log.warning("retention_failed", error=str(exc), next=f"retry in {RETENTION_EVERY_S:.0f}s")

    # -- main loop ------------------------------------------------------------------------
    def _exit_code(self, proc) -> int | None:
        """``proc.poll()``, except for a role forked by the template: its exit is what the
        template reported, read once per round for every role (``reap_and_restart``), not with a
        system call per role per round (an org of 128 loop-agents: 2,600 a second)."""
        if isinstance(proc, ForkedRole) and proc.server is self.forks and self.forks.sock is not None:
            return proc.returncode
        return proc.poll()

    def reap_and_restart(self) -> None:
        """Record every child that exited (stopped, crashed or failed) and start again each
        crashed one whose backoff has passed."""
        if self.forks is not None:
            self.forks.pump(0)               # every exit the template reported so far
        self.write_unwritten()
        due = []
        for child in self.children.values():
            if child.proc is not None and (code := self._exit_code(child.proc)) is not None:
                child.proc = None
                self._on_exit(child, code)
            if (child.proc is None and not child.failed and child.restart_at is not None
                    and self.clock() >= child.restart_at):
                due.append(child)
        if due and not self._unwritten:      # a row's exit is written before its next start
            self.spawn_all(due)

    def request_stop(self, why: str) -> None:
        self._stop_requested = why

    def run(self, *, on_ready=None) -> int:
        from roles.supervisor.template import open_files_limit
        self.log.info("open_files_limit", soft=open_files_limit())    # a foreground start raises it here
        self.acquire_lock()
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop("SIGTERM"))
        signal.signal(signal.SIGINT, lambda *_: self.request_stop("SIGINT"))
        self.issue_keys()
        if self.forks is not None:
            if not self.forks.started():
                self.forks.start()                  # imports while the session opens
            self.forks.record_pid(self.home.run_dir / "forkserver.pid")
        self.clear_leftovers()
        self.open_session()
        self.register_peers()
        self.serve_histories()
        self.spawn_all(list(self.children.values()))
        if on_ready:
            on_ready()
        last_hb_check = next_git = self.clock()
        next_retention = self.clock() + RETENTION_EVERY_S
        while not self._stop_requested:
            try:
                self.reap_and_restart()
            except StoreBusy as exc:         # a start not marked: the children stay due, tried next round
                self.log.warning("store_busy", error=exc.message, next="tried again at the next round")
            self.replace_cold_agents()
            if self.clock() - last_hb_check > 1.0:
                self.check_heartbeats()
                if self.joined:
                    self.follow_session()
                last_hb_check = self.clock()
            if self.git is not None and not self.git.alive() and self.clock() >= next_git:
                next_git = self.clock() + 5.0
                self._restart_git()
            if self.clock() >= next_retention:
                self.apply_retention()
                next_retention = self.clock() + RETENTION_EVERY_S
            if self.forks is not None and self.forks.sock is not None:
                self.forks.pump(0.05)            # a role's exit ends the wait: restarted sooner
            else:
                time.sleep(0.05)
        return self.shutdown()

    def _restart_git(self) -> None:
        """The histories' server exited: start it again (a failure is logged and retried; the
        org goes on, and joined hosts' pushes fail until it is back, which their runs retry)."""
        from state_db.kernel.errors import OrgError
        self.log.warning("histories_server_exited", next="start it again")
        try:
            self.git.start()
        except OrgError as exc:
            self.log.error("histories_server_failed", error=exc.line(), next="retry in 5 s")

    def follow_session(self) -> None:
        """A joined host follows the org: while the coordinator host suspends or stops it, this
        host's roles are stopped the way a suspend stops them there (they finish their step);
        once the org runs again they are started again."""
        row = org_session(self.writer.conn)
        running = row is not None and row.status == SessionStatus.RUNNING
        if not running and not self.held:
            self.held = True
            self.log.info("org_held", status=row.status if row else None, next="stop this host's roles until it runs")
            self._stop_children(bool(row.intent.get("force")) if row else False)
        elif running and self.held:
            self.held = False
            self.log.info("org_runs_again", next="start this host's roles")
            for child in self.children.values():
                child.failed, child.crashes = False, deque()
            self.spawn_all(list(self.children.values()))

    def _stop_children(self, force: bool) -> None:
        """SIGTERM every live child, wait stop_timeout_s, then SIGKILL (at once with force)."""
        live = [c for c in self.children.values() if c.proc is not None and c.proc.poll() is None]
        for c in live:
            c.stopping = True
            procs.signal_if_same(c.proc.pid, c.started, signal.SIGKILL if force else signal.SIGTERM)
        deadline = self.clock() + (0 if force else self.cfg.supervisor.stop_timeout_s)
        while any(c.proc.poll() is None for c in live) and self.clock() < deadline:
            time.sleep(0.02)
        for c in live:
            if c.proc.poll() is None:
                self.log.warning("role_killed_after_timeout", instance=c.spec.instance)
                procs.signal_if_same(c.proc.pid, c.started, signal.SIGKILL)
            c.proc.wait(timeout=10)
            self._on_exit(c, c.proc.returncode)
            c.proc = None

    def shutdown(self) -> int:
        """Stop every child: SIGTERM, wait stop_timeout_s, then SIGKILL (at once with force)."""
        intent = _session_intent(self.writer)
        force = bool(intent.get("force"))
        target = SessionStatus.SUSPENDED if intent.get("intent") == "suspend" else SessionStatus.STOPPED
        self.log.info("org_stopping", why=self._stop_requested, force=force, next=str(target))
        self._stop_children(force)
        self.write_unwritten()              # the exits first; what still cannot be written, the next start's rows tell
        if self.forks is not None:
            self.forks.close()
        if self.git is not None:
            self.git.stop()
        if self.joined:
            (self.home.run_dir / "supervisor.pid").unlink(missing_ok=True)
            self.writer.close()
            return 0
        with self.writer.transaction() as tx:
            row = org_session(tx.conn)
            if row.status != target:
                if row.status == SessionStatus.RUNNING and target == SessionStatus.SUSPENDED:
                    tx.set_status("org_session", 1, SessionStatus.SUSPENDING, updated_at=time.time())
                tx.set_status("org_session", 1, target, updated_at=time.time(), supervisor_pid=None)
        (self.home.run_dir / "supervisor.pid").unlink(missing_ok=True)
        self.writer.close()
        return 0


def _session_intent(writer: StateWriter) -> dict:
    current = org_session(writer.conn)
    return current.intent if current is not None else {}


def _can(old: str, new: str) -> bool:
    from state_db.rules import allowed_transition
    return allowed_transition("role_instances", old, new)
