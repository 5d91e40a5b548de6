"""A role's turn waits until its next tick, and a stop ends that wait at once.

An idle role no longer wakes ten times a second to look at a flag: its transport polls a pipe
beside its socket, written by the signal handler (``signal.set_wakeup_fd``) and by
``request_stop``. These tests make the tick a minute long, so a stop that did not interrupt
the wait would run into the test's own timeout."""
from __future__ import annotations

import os
import shutil
import signal
import threading
import time

import pytest

from roles.base.runtime import RoleProcess
from state_db.bootstrap import init_home
from state_db.kernel.config import load_config
from state_db.kernel.home import OrgHome
from state_db.vocab import Actor
from state_db.writer import StateWriter
from tests.support.org import short_home_dir
from transport.keys import Keyring, keyring_path


@pytest.fixture
def role():
    root = short_home_dir()
    home = OrgHome(root / "org")
    init_home(home)
    sup = StateWriter(home.db_path, Actor.SUPERVISOR)
    with sup.transaction() as tx:
        tx.insert("role_instances", {"instance": "loop-agent-1", "role": "loop-agent", "status": "starting",
                                     "updated_at": tx.now})
    sup.close()
    ring = Keyring.create(keyring_path(home.run_dir))          # as the supervisor issues them
    for instance in ("loop-agent-1", "coordinator"):
        ring.issue(instance)
    proc = RoleProcess(home, "loop-agent-1", cfg=load_config(home))
    proc.start()
    proc._wake_on_stop()
    proc.step(max_wait_ms=0)                     # the first turn: reconcile and heartbeat
    proc.tick_s = proc.heartbeat_s = 60.0        # the next ones are a minute away
    proc._next_tick = proc._next_beat = time.monotonic() + 60.0
    old = signal.signal(signal.SIGTERM, lambda *_: proc.request_stop("SIGTERM"))
    yield proc
    signal.signal(signal.SIGTERM, old)
    proc.close()
    shutil.rmtree(root, ignore_errors=True)


def _after(delay_s: float, action) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(delay_s), action()), daemon=True)
    t.start()
    return t


@pytest.mark.timeout(20)
def test_an_idle_turn_waits_for_its_tick_and_a_signal_ends_it(role):
    assert role._interrupt is not None
    _after(0.3, lambda: os.kill(os.getpid(), signal.SIGTERM))
    role.step()                                  # would wait the minute until the next tick
    assert role.stopping and role.stop_reason == "SIGTERM"


@pytest.mark.timeout(20)
def test_a_stop_requested_from_another_thread_ends_the_wait(role):
    _after(0.3, lambda: role.request_stop("worker says stop"))
    role.step()
    assert role.stopping and role.stop_reason == "worker says stop"


@pytest.mark.timeout(20)
def test_a_message_still_ends_the_wait_and_is_handled(role):
    got = []
    role.handle = got.append
    from roles.base.transport_link import TransportLink
    other = TransportLink(role.home, "coordinator", role.cfg)
    try:
        _after(0.3, lambda: other.send("loop-agent-1", "wake", {"work_id": "w1"}))
        role.step()
    finally:
        other.close()
    assert [e.kind for e in got] == ["wake"] and not role.stopping


@pytest.mark.timeout(20)
def test_a_worker_thread_asking_for_a_reconcile_is_served_at_once_not_at_the_next_tick(role):
    """A loop-agent's worker that ended its run asks for a reconcile (work may have been dispatched
    while it closed): the minute-long wait ends, and the next turn reconciles."""
    seen = []
    role.reconcile = lambda: (seen.append(time.monotonic()), role.request_stop("reconciled"))
    t0 = time.monotonic()
    _after(0.3, role.reconcile_soon)
    while not role.stopping:
        role.step()
    assert seen and seen[0] - t0 < 5
