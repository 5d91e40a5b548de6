"""The life of a role process: start, heartbeat, reconcile on a tick, answer ping, stop cleanly.

A role subclasses ``RoleProcess`` and overrides ``reconcile`` (read state.db, act on what it finds)
and ``handle`` (a wake-up message arrived). Messages are only wake-ups: every fact is read from
state.db, so a lost message delays and never loses work.

What a test needs to control is injected: the transport (any ``RoleTransport``; tests give a
``transport.stub.StubTransport``), the wall clock (state.db timestamps, heartbeats), the monotonic
clock (ticks) and the configuration. ``start()``, ``step()`` and ``close()`` run the role's
loop one turn at a time, in-process.
"""
from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from roles.base import readiness
from roles.base.beat import Beat
from roles.base.transport_link import TransportLink
from state_db.kernel import config as config_mod
from state_db.kernel.errors import OrgError, StoreBusy
from state_db.kernel.home import OrgHome
from state_db.kernel.logsetup import configure
from state_db.vocab import RoleStatus
from state_db import writer as writer_mod
from state_db.writer import StateWriter
from transport.envelope import Envelope
from transport.kinds import Kind, role_of
from transport.role import RoleTransport


STOP_LATENCY_MS = 100     # the longest a turn waits where nothing else wakes it on a stop
BEAT_ROW_WAIT_S = 0.1     # the longest a heartbeat row waits for the store (the beat file never waits)
ROWS_PER_TIMEOUT = 4      # a plain heartbeat row at least this many times per [supervisor] heartbeat_timeout_s


class RoleProcess:
    """Base of every role process.

    Args:
        home: the org home.
        instance: this process's instance name (``loop-agent-2``).
        transport: its transport; default the real one (``TransportLink``), opened on first use.
        clock: wall clock (epoch seconds) for state.db and heartbeats.
        monotonic: clock of the tick and heartbeat schedule.
        cfg: the configuration; default ``load_config(home)``.
        tick_s: seconds between reconcile ticks.

    Raises:
        ConfigError: org.toml is invalid.
    """

    tick_s = 1.0

    def __init__(self, home: OrgHome, instance: str, *, transport: RoleTransport | None = None,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 cfg: config_mod.Config | None = None):
        self.home = home
        self.instance = instance
        self.role = str(role_of(instance))
        self.clock, self.monotonic = clock, monotonic
        self.cfg = cfg if cfg is not None else config_mod.load_config(home)
        self.log = configure(home.logs_dir, self.role, instance, max_bytes=self.cfg.logs.max_bytes,
                             backups=self.cfg.logs.backups)
        self.writer = StateWriter(home.db_path, self.role, instance, clock=clock)
        from roles.base import telemetry
        telemetry.configure(self.cfg, self.role, instance)     # OFF unless org.toml asks: nothing imported
        self.heartbeat_s = self.cfg.supervisor.heartbeat_s
        # while the beat file is written, a plain heartbeat row every heartbeat_s would only repeat
        # it on this host; it is written often enough for the readers that have only the row (a
        # role of another host, the tcp eval-agent list): ROWS_PER_TIMEOUT times per timeout
        self.row_beat_s = max(self.heartbeat_s, self.cfg.supervisor.heartbeat_timeout_s / ROWS_PER_TIMEOUT)
        self._next_row = 0.0
        self.beat = Beat(home.run_dir, instance)     # roles/base/beat.py: read by the supervisor and the coordinator
        self.stopping = False
        self.stop_reason = ""
        self._transport: RoleTransport | None = transport
        self._next_tick = self._next_beat = 0.0
        self._interrupt: tuple[int, int] | None = None     # (read, write): wakes the poll on a stop
        self._active_at = 0.0                  # when the role last worked or handled a message
        self._released = True                  # memory given back since then (nothing to give at start)

    # -- hooks for roles ----------------------------------------------------------------
    def reconcile(self) -> None:
        """Look at state.db and act on it. Called at start and on every tick."""

    def handle(self, env: Envelope) -> None:
        """A message other than ping/stop arrived; by default it just triggers a reconcile."""
        self.reconcile()

    def on_stop(self) -> None:
        """Called once when the role is asked to stop, before its transport closes."""

    def busy(self) -> bool:
        """Whether the role is working now. An idle role gives freed memory back to the system
        after ``[org] idle_release_s`` (``release_memory``); a role that works in a thread says so."""
        return False

    def warm_up(self) -> None:
        """Called once after the role is ready (slow imports it will need go here)."""

    # -- machinery ----------------------------------------------------------------------
    @property
    def transport(self) -> RoleTransport:
        if self._transport is None:
            self._transport = TransportLink(self.home, self.instance, self.cfg)
        return self._transport

    def _on_message(self, env: Envelope) -> None:
        if env.kind == Kind.PING:
            reply_to = (env.payload or {}).get("reply_to") or env.sender
            self.transport.send(reply_to, Kind.PONG, {"ping": env.id, "instance": self.instance,
                                                      "pid": os.getpid()})
        elif env.kind in (Kind.STOP, Kind.SUSPEND):
            self.request_stop(f"{env.kind} from {env.sender}")
        else:
            self._active_at, self._released = self.monotonic(), False     # a ping is not work
            self.handle(env)

    def request_stop(self, why: str) -> None:
        self.stopping = True
        self.stop_reason = why
        if self._interrupt is not None:          # from a signal handler or another thread: wake the poll
            try:
                os.write(self._interrupt[1], b"\0")
            except OSError:
                pass

    def reconcile_soon(self) -> None:
        """Have the main loop reconcile now rather than at its next tick; safe from any thread
        (a worker that ended, so the work dispatched meanwhile starts without waiting a tick)."""
        self._next_tick = 0.0
        if self._interrupt is not None:          # ends the poll the main thread waits in
            try:
                os.write(self._interrupt[1], b"\0")
            except OSError:                      # full: a wake is pending anyway
                pass

    def heartbeat(self, status: str | None = None) -> None:
        """Beat (the file, at once), then record it in the role's row: with ``status`` (ready,
        stopped) as long as the store makes it wait; a plain heartbeat row only if the store is
        free within ``BEAT_ROW_WAIT_S`` — when it is not, the file's beat stands for this one and
        the main loop goes on (``roles/base/beat.py``).

        A plain row is written every ``row_beat_s`` (a quarter of ``heartbeat_timeout_s``, at
        least every ``heartbeat_s``) while the beat file is written, and at every beat when it is
        not. Every reader on this host takes the later of row and file (``beat.latest``); the row
        alone serves a reader of another host, and a quarter of the timeout keeps three rows in
        hand before it would judge the role gone. At a hundred roles, a row a second each was
        a hundred write transactions a second queueing for the store's one write lock."""
        now = self.monotonic()
        filed = self.beat.touch(self.clock())
        if status is not None:
            with self.writer.transaction() as tx:
                tx.set_status("role_instances", self.instance, status, heartbeat_at=tx.now, updated_at=tx.now,
                              pid=os.getpid())
            self._next_row = now + self.row_beat_s
            readiness.poke(self.home.run_dir)       # committed: whoever waits for it looks now
            return
        if filed and now < self._next_row:
            return
        try:
            with self.writer.transaction(render=False, wait_s=BEAT_ROW_WAIT_S) as tx:
                tx.update("role_instances", self.instance, heartbeat_at=tx.now, updated_at=tx.now)
            self._next_row = now + self.row_beat_s
        except StoreBusy:
            pass

    def start(self) -> None:
        """Open the transport and record the role ready (its row must exist: the supervisor's)."""
        link = self.transport
        link.start(self._on_message)
        self.heartbeat(RoleStatus.READY)
        readiness.tell_template()
        self.log.info("role_ready", pid=os.getpid(), endpoint=link.endpoint, next="reconcile, then serve")
        self._next_tick = self._next_beat = self.monotonic()

    def step(self, max_wait_ms: int = STOP_LATENCY_MS) -> None:
        """One turn of the loop: reconcile and heartbeat when due, then handle the messages that
        arrive within ``max_wait_ms`` (at most until the next tick)."""
        now = self.monotonic()
        if now >= self._next_tick:
            self.reconcile()
            self._next_tick = now + self.tick_s
        if now >= self._next_beat:
            self.heartbeat()
            self._next_beat = now + self.heartbeat_s
        self._give_back_when_idle(now)
        wait = max(0.0, min(self._next_tick, self._next_beat) - self.monotonic())
        if self._interrupt is not None:
            # a stop (signal or request_stop) writes to the interrupt pipe and ends the poll: the
            # turn waits until the next tick, not waking up ten times a second for nothing
            self.transport.poll(int(wait * 1000) + 1)
        else:
            # bounded so a stop signal (which cannot interrupt the poll) is seen quickly
            self.transport.poll(min(int(wait * 1000) + 1, max_wait_ms))
        if self._asked and not self.stopping:
            # the messages of this turn asked for a reconcile: one, now, for all of them
            self._asked = False
            self.reconcile()
            self._next_tick = self.monotonic() + self.tick_s

    _asked = False

    def ask_reconcile(self) -> None:
        """From a message handler (the main thread): reconcile once the batch of messages being
        handled is done, in this turn of the loop — however many of them asked."""
        self._asked = True

    def _give_back_when_idle(self, now: float) -> None:
        """Once per idle spell, past ``[org] idle_release_s``: what the last run allocated and freed
        goes back to the system (an idle loop-agent of a large org holds only what it needs)."""
        if self.busy():
            self._active_at, self._released = now, False
            return
        after = self.cfg.org.idle_release_s
        if self._released or after <= 0 or now - self._active_at < after:
            return
        self._released = True
        freed = release_memory()
        self.log.info("memory_released", rss_mb_before=freed[0], rss_mb_after=freed[1])

    def _wake_on_stop(self) -> None:
        """Let a stop end the transport's wait at once: a signal's number is written to a pipe
        (``signal.set_wakeup_fd``), and so is ``request_stop`` from another thread; the transport
        polls that pipe beside its socket. Only a transport that can poll it (``interrupt_on``)
        and the main thread take part; otherwise each turn's wait stays within STOP_LATENCY_MS."""
        interrupt_on = getattr(self.transport, "interrupt_on", None)
        if interrupt_on is None or threading.current_thread() is not threading.main_thread():
            return
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        interrupt_on(r)
        self._interrupt = (r, w)

    def close(self) -> None:
        """Stop: the role's own clean-up, the transport, the STOPPED row, the database."""
        self.log.info("role_stopping", why=self.stop_reason or "loop ended")
        try:
            self.on_stop()
        finally:
            if self._transport is not None:
                self._transport.close()
        try:
            self.heartbeat(RoleStatus.STOPPED)
        except Exception as exc:  # the supervisor records the exit either way
            self.log.warning("stop_not_recorded", error=str(exc))
        self.writer.close()
        self.beat.close()
        if self._interrupt is not None:
            try:
                signal.set_wakeup_fd(-1)
            except ValueError:                  # not the main thread: the process is ending anyway
                pass
            for fd in self._interrupt:
                os.close(fd)
            self._interrupt = None
        from roles.base import telemetry
        telemetry.current().shutdown()          # the spans still in the batch are exported

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop("SIGTERM"))
        signal.signal(signal.SIGINT, lambda *_: self.request_stop("SIGINT"))
        # this thread beats while it waits for the store's write lock: waiting is not hanging
        writer_mod.beat_while_waiting(lambda: self.beat.touch(self.clock()))
        self.start()
        self._wake_on_stop()
        self.warm_up()
        # what start-up made (imports, configuration, connections) lives as long as the process:
        # out of the collector's way, so a full collection walks only what the role makes while
        # it works (bench/loop.py: an iteration's overhead halves on a heap this size)
        gc.freeze()
        try:
            while not self.stopping:
                self.step()
        finally:
            self.close()
        return 0


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)
    except (OSError, ValueError, IndexError):
        return 0.0


def release_memory() -> tuple[float, float]:
    """Give the memory this process has freed back to the system: a collection of what is not
    frozen, then glibc's ``malloc_trim(0)``, which returns the free pages inside the heap, not
    only its top (a heap with a few survivors of a large run keeps the rest otherwise: freed is
    not returned). Elsewhere than glibc only the collection runs. Returns RSS in MB before, after."""
    before = _rss_mb()
    gc.collect()
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        trim = getattr(libc, "malloc_trim", None)
        if trim is not None:
            trim(0)
    except OSError:
        pass
    return before, _rss_mb()


def main(role_cls: type[RoleProcess], argv: list[str] | None = None) -> int:
    """Entry point of ``python -m roles.<role> --home H --instance I``."""
    parser = argparse.ArgumentParser(prog=f"python -m {role_cls.__module__}")
    parser.add_argument("--home", required=True, help="org home")
    parser.add_argument("--instance", required=True, help="instance name")
    args = parser.parse_args(argv)
    try:
        proc = role_cls(OrgHome(Path(args.home)), args.instance)
        return proc.run()
    except OrgError as exc:  # an expected failure: one line; the supervisor restarts us with backoff
        print(exc.line(), file=sys.stderr)
        return 1
