"""Controlling a running org from the CLI: start in the background, stop, suspend, wait for ready.

The intent (stop / suspend, forced or not) is written to state.db first as actor ``human``; the
signal to the supervisor only makes it act now. If the supervisor is gone, the role processes it
left are stopped directly, by pid and start time.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from roles.base import readiness
from roles.operations.lifecycle import record_intent
from roles.supervisor import procs
from state_db.connection import connect
from state_db.kernel.errors import StateError
from state_db.queries.processes import RoleInstance, role_instances, session as org_session
from state_db.kernel.home import OrgHome
from state_db.vocab import Actor, RoleStatus, SessionStatus
from state_db.writer import StateWriter


POLL_S = 0.02       # how often start and stop look at state.db while they wait
WAKE_FALLBACK_S = 0.25     # the longest start waits for a wake before it looks at state.db anyway


class ControlError(StateError):
    code = "control_failed"


def supervisor_alive(home: OrgHome) -> tuple[int, str] | None:
    info = procs.read_pidfile(home.run_dir / "supervisor.pid")
    if info and procs.is_alive(*info):
        return info
    return None


def start_background(home: OrgHome, *, timeout_s: float = 20.0, env: dict | None = None) -> dict:
    """Start a supervisor detached from this terminal; wait until every role is ready.

    Returns {"pid", "ready_ms", "roles"}. Raises ControlError on timeout (with what was seen).
    """
    t0 = time.monotonic()
    log = open(home.logs_dir / "supervisor.out", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "roles.supervisor.main", "--home", str(home.root)],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                            close_fds=True, env={**os.environ, **env} if env else None)
    log.close()
    roles = wait_ready(home, timeout_s=timeout_s, proc=proc, since=time.time() - 0.5)
    return {"pid": proc.pid, "ready_ms": round((time.monotonic() - t0) * 1000, 1), "roles": roles}


def wait_ready(home: OrgHome, *, timeout_s: float, proc: subprocess.Popen | None = None,
               since: float | None = None) -> list[dict]:
    """Wait until the session runs under ``proc`` and every configured role is ready (or failed).

    With ``proc``/``since``, only the new supervisor and roles started after ``since`` count:
    rows a killed supervisor left behind (its session, its dying roles' "ready") are not taken
    for the new org."""
    deadline = time.monotonic() + timeout_s
    seen: list[RoleInstance] = []
    conn = wanted = waiter = None   # opened once the home exists; what org.toml asks for, read once
    exited = _exit_fd(proc)         # readable once the supervisor has exited
    try:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                tail = (home.logs_dir / "supervisor.out").read_text(errors="replace").strip().splitlines()[-1:]
                raise ControlError(f"the supervisor exited with {proc.returncode}: {' '.join(tail)}",
                                   hint="see 'org logs --role supervisor' and logs/supervisor.out")
            if conn is None and home.exists():
                try:                # before the first look: no status written after it goes unwoken
                    waiter = readiness.Waiter(home.run_dir)
                except OSError:
                    waiter = None   # looked at every POLL_S instead
                conn = connect(home.db_path, readonly=True)
            if conn is not None:
                session = org_session(conn)
                seen = role_instances(conn)
                settled = {r.instance for r in seen if r.status in (RoleStatus.READY, RoleStatus.FAILED)
                           and (since is None or r.status == RoleStatus.FAILED or (r.started_at or 0) >= since)}
                wanted = wanted if wanted is not None else _wanted(home)
                if _joined(home):                    # the session is the coordinator host's
                    if wanted <= settled:
                        return [r.as_dict() for r in seen if r.instance in wanted]
                    _wait(waiter, exited, deadline)
                    continue
                ours = session is not None and (proc is None or session.supervisor_pid == proc.pid)
                if ours and session.status == SessionStatus.RUNNING and session.supervisor_pid \
                        and wanted <= settled:
                    return [r.as_dict() for r in seen]
            _wait(waiter, exited, deadline)
    finally:
        if conn is not None:
            conn.close()
        if waiter is not None:
            waiter.close()
        if exited is not None:
            os.close(exited)
    raise ControlError(f"the org did not become ready in {timeout_s:.0f}s; roles: "
                       + ", ".join(f"{r.instance}={r.status}" for r in seen),
                       hint="see 'org logs' and 'org doctor'")


def _wait(waiter: "readiness.Waiter | None", exited: int | None, deadline: float) -> None:
    """Until a role's status changes (``roles.base.readiness``), the supervisor exits, or
    ``WAKE_FALLBACK_S`` passes (a lost wake; a status written by the supervisor); without a
    waiter, ``POLL_S``."""
    left = deadline - time.monotonic()
    if waiter is None:
        time.sleep(max(0.0, min(POLL_S, left)))
    else:
        waiter.wait(min(WAKE_FALLBACK_S, left), *([exited] if exited is not None else []))


def _exit_fd(proc: subprocess.Popen | None) -> int | None:
    """A pidfd of ``proc``: readable once it has exited (None where the system has none)."""
    if proc is None:
        return None
    try:
        return os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return None


def _wanted(home: OrgHome) -> set[str]:
    """The instances the configuration asks for (a lowered loop_agents leaves old rows behind)."""
    from roles.base.instances import org_instances
    from state_db.kernel import config as config_mod
    cfg = config_mod.load_config(home)
    if cfg.hosts.coordinator:
        from roles.supervisor import hosts
        return set(hosts.joined_names(home))
    specs = org_instances(cfg.org.loop_agents, cfg.org.eval_agents)
    return {s.instance for s in specs if cfg.hosts.loop_agents_here or s.role != "loop-agent"}


def _joined(home: OrgHome) -> bool:
    from roles.supervisor import hosts
    return hosts.joined_path(home).exists()


def request(home: OrgHome, intent: str, *, force: bool = False, timeout_s: float = 30.0) -> dict:
    """Stop or suspend the org: record the intent durably, signal the supervisor, wait.

    Returns {"status", "stopped_ms", "supervisor": "signalled"|"absent"}. Raises LifecycleError
    (``org_stopped`` for a suspend of a stopped org; ``control_failed`` when never started) and
    ControlError (``control_failed`` on timeout).
    """
    t0 = time.monotonic()
    if _joined(home):
        return _leave(home, force=force, timeout_s=timeout_s, t0=t0)
    # the human's intent first, durably (the operation); the signal only makes the supervisor act now
    record_intent(home, intent, force=force, supervisor_running=supervisor_alive(home) is not None)
    writer = StateWriter(home.db_path, Actor.HUMAN)
    try:
        sup = supervisor_alive(home)
        if sup:
            procs.signal_if_same(sup[0], sup[1], signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while procs.is_alive(*sup) and time.monotonic() < deadline:
                time.sleep(POLL_S)
            if procs.is_alive(*sup):
                raise ControlError(f"the supervisor (pid {sup[0]}) did not stop within {timeout_s:.0f}s",
                                   hint="retry with --force")
        else:
            _stop_orphans(home, writer)
            target = SessionStatus.SUSPENDED if intent == "suspend" else SessionStatus.STOPPED
            with writer.transaction() as tx:
                status = org_session(tx.conn).status
                if status != target:
                    if status == SessionStatus.RUNNING and target == SessionStatus.SUSPENDED:
                        tx.set_status("org_session", 1, SessionStatus.SUSPENDING, updated_at=time.time())
                    tx.set_status("org_session", 1, target, updated_at=time.time(), supervisor_pid=None)
        return {"status": org_session(writer.conn).status, "stopped_ms": round((time.monotonic() - t0) * 1000, 1),
                "supervisor": "signalled" if sup else "absent"}
    finally:
        writer.close()


def _leave(home: OrgHome, *, force: bool, timeout_s: float, t0: float) -> dict:
    """A joined host stops its own instances only: the org (its session, the coordinator
    host's roles, other hosts) goes on, and the coordinator requeues what they were running."""
    sup = supervisor_alive(home)
    if sup:
        procs.signal_if_same(sup[0], sup[1], signal.SIGTERM)
        deadline = time.monotonic() + (min(timeout_s, 1.0) if force else timeout_s)
        while procs.is_alive(*sup) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if procs.is_alive(*sup):
            if not force:
                raise ControlError(f"this host's supervisor (pid {sup[0]}) did not stop within {timeout_s:.0f}s",
                                   hint="retry with --force")
            procs.signal_if_same(sup[0], sup[1], signal.SIGKILL)
    writer = StateWriter(home.db_path, Actor.HUMAN)
    try:
        _stop_orphans(home, writer)
    finally:
        writer.close()
    return {"status": SessionStatus.STOPPED, "stopped_ms": round((time.monotonic() - t0) * 1000, 1),
            "supervisor": "signalled" if sup else "absent"}


def _stop_orphans(home: OrgHome, writer: StateWriter) -> None:
    for r in role_instances(writer.conn):
        if (home.run_dir / f"{r.instance}.pid").exists():      # this home's: not another host's
            procs.signal_if_same(r.pid, r.pid_start, signal.SIGKILL)
    for pidfile in home.run_dir.glob("*.pid"):
        info = procs.read_pidfile(pidfile)
        if info is None or not procs.is_alive(*info):
            pidfile.unlink(missing_ok=True)
