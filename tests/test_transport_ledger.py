"""The delivery ledger in state.db: one transaction per batch, duplicates, counters, journal,
pruning, no snapshot rendering."""
from __future__ import annotations

import os
import sqlite3

import orjson
import pytest

from state_db.migrations import migrate
from state_db.writer import StateWriter
from transport.envelope import Envelope, Limits
from transport.ledger import Counters, Ledger, Rejection, read_counters

KEY = os.urandom(32)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "state.db"
    migrate(path)
    return path


def env(n: int = 0, now: float = 1_000.0) -> Envelope:
    return Envelope.create("wake", "coordinator", "loop-agent-1", {"n": n}, key=KEY, now=now)


def rows(db, sql):
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_new_ids_are_returned_and_duplicates_dropped_even_within_a_batch(db):
    ledger = Ledger(db, "loop-agent-1")
    a, b = env(1), env(2)
    assert ledger.record([a, b, a]) == [a, b]
    assert ledger.record([b, env(3)])[0].payload == {"n": 3}
    ledger.flush()
    assert read_counters(db)["loop-agent-1"] == {"delivered": 3, "duplicates": 2}
    assert rows(db, "SELECT COUNT(*) FROM delivery_ledger")[0][0] == 3


def test_a_batch_costs_one_transaction(db):
    statements: list[str] = []
    ledger = Ledger(db, "loop-agent-1")
    ledger.writer.conn.set_trace_callback(statements.append)
    ledger.counters.add("pushed", 5)
    ledger.record([env(i) for i in range(50)], [Rejection("expired", "file", "human")])
    begins = [s for s in statements if s.startswith("BEGIN")]
    assert begins == ["BEGIN IMMEDIATE"]
    assert read_counters(db)["loop-agent-1"] == {"delivered": 50, "pushed": 5,
                                                 "rejected:expired": 1}


def test_rejections_are_journaled_with_code_sender_and_source(db):
    ledger = Ledger(db, "loop-agent-1")
    ledger.record([], [Rejection("not_authenticated", "socket", "coordinator", "ab" * 16,
                                 "dispatch", "tag does not match")])
    (kind, subject, data, actor, instance), = rows(
        db, "SELECT kind, subject, data, actor, instance FROM events")
    assert (kind, subject, actor, instance) == ("message_rejected", "ab" * 16, "loop-agent",
                                                "loop-agent-1")
    assert orjson.loads(data) == {"recipient": "loop-agent-1", "code": "not_authenticated",
                                  "source": "socket", "sender": "coordinator",
                                  "kind": "dispatch", "detail": "tag does not match"}


def test_a_flood_of_rejections_is_capped_in_the_journal_but_fully_counted(db):
    clock = Clock(10_000.0)
    ledger = Ledger(db, "loop-agent-1", clock=clock, journal_per_minute=5)
    ledger.record([], [Rejection("bad_envelope", "socket")] * 20)
    clock.now += 61
    ledger.record([], [Rejection("bad_envelope", "socket")])
    ledger.flush()
    kinds = [k for (k,) in rows(db, "SELECT kind FROM events ORDER BY id")]
    assert kinds == ["message_rejected"] * 5 + ["message_rejected_suppressed",
                                                "message_rejected"]
    assert read_counters(db)["loop-agent-1"] == {"rejected:bad_envelope": 21}


def test_failed_transaction_records_nothing_and_keeps_counter_deltas(db):
    ledger = Ledger(db, "loop-agent-1")
    ledger.counters.add("pushed", 2)
    blocker = sqlite3.connect(db, timeout=0, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    ledger.writer.conn.execute("PRAGMA busy_timeout=50")
    with pytest.raises(sqlite3.OperationalError):
        ledger.record([env(1)])
    blocker.execute("ROLLBACK")
    blocker.close()
    assert ledger.counters.peek() == {"pushed": 2}
    assert ledger.record([env(1)])  # still new: the failed batch left no trace
    assert read_counters(db)["loop-agent-1"] == {"pushed": 2, "delivered": 1}


def test_ledger_writes_never_render_snapshots(db):
    rendered = []
    writer = StateWriter(db, "loop-agent", "loop-agent-1",
                         hooks=[lambda w, changes: rendered.append(changes)])
    ledger = Ledger(db, "loop-agent-1", writer=writer)
    ledger.record([env(1)], [Rejection("expired", "file")])
    ledger.prune()
    assert rendered == []


def test_prune_keeps_ids_for_at_least_max_age_plus_skew(db):
    clock = Clock(100_000.0)
    limits = Limits(max_age_s=600, skew_s=30)
    ledger = Ledger(db, "loop-agent-1", limits=limits, clock=clock)
    ledger.record([env(1)])
    clock.now += limits.max_age_s + limits.skew_s  # a copy could still be accepted
    assert ledger.prune(keep_s=1) == 0  # asking for less is raised to the safe minimum
    clock.now += limits.skew_s + 1
    assert ledger.prune() == 1
    assert rows(db, "SELECT COUNT(*) FROM delivery_ledger")[0][0] == 0


def test_counters_shared_with_a_sender_are_flushed_on_close(db):
    counters = Counters("loop-agent-1")
    ledger = Ledger(db, "loop-agent-1", counters=counters)
    counters.add("pushed", 3)
    counters.add("fell_back")
    ledger.close()
    assert read_counters(db, "loop-agent-1") == {"loop-agent-1": {"fell_back": 1, "pushed": 3}}


@pytest.mark.timeout(30)
def test_a_quiet_ledger_never_checkpoints_and_a_busy_one_does_every_so_many_commits(db):
    """Every role has a ledger: one that checkpointed on a timer made an org of N roles checkpoint
    state.db N times a second (each followed by a WAL restart synced inside a writer's lock)."""
    import time
    ledger = Ledger(db, "loop-agent-1")
    try:
        cp = ledger._checkpointer
        time.sleep(1.5)                                 # the old timer's period, and then some
        assert cp.checkpoints == 0
        for n in range(Ledger.checkpoint_every):
            ledger.record([env(n)])
        deadline = time.monotonic() + 10
        while cp.checkpoints == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert cp.checkpoints == 1
    finally:
        ledger.close()
