"""The store stayed busy past its wait: one coded error (``StoreBusy``, ``store_busy``) from the
write path, and a thread that beats keeps beating while it waits (SQLite; the PostgreSQL side is
in tests/test_pg_store.py)."""
from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from roles.loop_agent import triage
from state_db import writer as writer_mod
from state_db.kernel.errors import OrgError, StoreBusy
from state_db.vocab import Actor

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def held(org_home):
    """The store's write lock, held by another connection until the test ends."""
    other = sqlite3.connect(org_home.db_path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    yield other
    other.execute("ROLLBACK")
    other.close()


def test_a_write_lock_held_past_the_wait_is_the_coded_store_busy_and_nothing_is_written(org_home, writer_for, held):
    w = writer_for(Actor.HUMAN)
    t0 = time.monotonic()
    with pytest.raises(StoreBusy) as err:
        with w.transaction(wait_s=0.2) as tx:
            tx.journal("never", "w9")
    waited = time.monotonic() - t0
    assert err.value.code == "store_busy" and isinstance(err.value, OrgError)
    assert isinstance(err.value, sqlite3.OperationalError)       # what callers written for SQLite catch
    assert err.value.line().startswith("error[store_busy]: the store stayed busy past its wait")
    assert 0.15 <= waited < 5
    held.execute("ROLLBACK")
    held.execute("BEGIN IMMEDIATE")
    assert held.execute("SELECT COUNT(*) FROM events WHERE kind='never'").fetchone()[0] == 0
    assert not w.conn.in_transaction


def test_the_default_wait_is_the_busy_timeout_and_ends_in_store_busy(org_home, writer_for, held, monkeypatch):
    """A short busy timeout (the store's setting) is what a plain transaction waits."""
    monkeypatch.setattr(writer_mod, "BUSY_TIMEOUT_MS", 300)
    w = writer_for(Actor.HUMAN)
    w.conn.execute("PRAGMA busy_timeout=300")
    w._busy_ms = 300
    t0 = time.monotonic()
    with pytest.raises(StoreBusy):
        with w.transaction():
            pass
    assert time.monotonic() - t0 >= 0.25


def test_a_thread_that_beats_keeps_beating_while_it_waits_and_only_that_thread(org_home, writer_for, held, monkeypatch):
    monkeypatch.setattr(writer_mod, "WAIT_SLICE_S", 0.1)
    monkeypatch.setattr(writer_mod, "BUSY_TIMEOUT_MS", 800)
    beats: list[float] = []
    writer_mod.beat_while_waiting(lambda: beats.append(time.monotonic()))
    try:
        w = writer_for(Actor.HUMAN)
        with pytest.raises(StoreBusy):
            with w.transaction():
                pass
        assert len(beats) >= 4, beats            # a beat every slice of the 0.8 s wait
        assert max(b - a for a, b in zip(beats, beats[1:])) < 0.6
        # another thread's wait does not beat for this one
        before, other = len(beats), writer_for(Actor.HUMAN)
        errors = []

        def write():
            try:
                with other.transaction(wait_s=0.3):
                    pass
            except StoreBusy as exc:
                errors.append(exc)
        t = threading.Thread(target=write)
        t.start()
        t.join(10)
        assert len(errors) == 1 and len(beats) == before
    finally:
        writer_mod.beat_while_waiting(None)


def test_a_wait_that_ends_in_the_lock_writes(org_home, writer_for, held, monkeypatch):
    """The sliced wait is as long as the whole one: a lock let go within it is taken."""
    monkeypatch.setattr(writer_mod, "WAIT_SLICE_S", 0.05)
    writer_mod.beat_while_waiting(lambda: None)
    try:
        threading.Timer(0.4, lambda: held.execute("ROLLBACK")).start()
        w = writer_for(Actor.HUMAN)
        with w.transaction() as tx:
            tx.journal("written", "x")
        held.execute("BEGIN IMMEDIATE")
    finally:
        writer_mod.beat_while_waiting(None)
    assert held.execute("SELECT COUNT(*) FROM events WHERE kind='written'").fetchone()[0] == 1


def test_triage_knows_the_store_busy_by_its_code_not_its_words(org_home, writer_for, held):
    w = writer_for(Actor.HUMAN)
    with pytest.raises(StoreBusy) as err:
        with w.transaction(wait_s=0.05):
            pass
    assert triage.machine_busy(err.value)
    assert triage.machine_busy(err.value.__cause__)     # SQLite's own error, by its result code
    assert not triage.machine_busy(sqlite3.OperationalError("no such table: locked_items"))
    assert not triage.machine_busy(RuntimeError("database is locked"))
