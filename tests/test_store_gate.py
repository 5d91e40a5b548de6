"""The writers of a SQLite store take its write lock in the order they asked for it
(``state_db/gate.py``): a writer that waits is let in behind those that came before it, never
after one that came later, and a writer that gives up, dies or never takes the gate leaves the
line moving and the data guarded by SQLite's own lock."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from state_db import writer as writer_mod
from state_db.gate import WriteGate, gate_path
from state_db.kernel.errors import StoreBusy
from state_db.vocab import Actor

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]

#: A writer that begins again the moment it commits, holding the lock ``hold`` seconds each time,
#: until the stop file appears: what a hundred agents' writes look like to one more writer.
HAMMER = """
import sys, time
from pathlib import Path
from state_db.writer import StateWriter
db, hold, stop, ready = sys.argv[1], float(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
w = StateWriter(db, "human", "hammer")
ready.touch()
n = 0
while not stop.exists() and n < 5000:
    with w.transaction() as tx:
        tx.journal("hammer", "w-hammer")
        time.sleep(hold)
    n += 1
w.close()
"""


def _hammers(db, k: int, hold: float, tmp: Path) -> tuple[list[subprocess.Popen], Path]:
    stop = tmp / "stop"
    procs = []
    for i in range(k):
        ready = tmp / f"ready-{i}"
        procs.append(subprocess.Popen([sys.executable, "-c", HAMMER, str(db), str(hold), str(stop), str(ready)],
                                      cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}))
    deadline = time.monotonic() + 30
    while not all((tmp / f"ready-{i}").exists() for i in range(k)):
        assert time.monotonic() < deadline, "the writers did not start"
        time.sleep(0.02)
    time.sleep(0.3)                             # every one of them in its loop
    return procs, stop


def _holding(writer, release: threading.Event) -> threading.Thread:
    """A thread in a transaction of ``writer`` (an event 'held' written) until ``release`` is set;
    started, and in the line's first place once this returns."""
    def hold():
        with writer.transaction() as tx:
            tx.journal("held", "w-1")
            release.wait(20)
    t = threading.Thread(target=hold)
    t.start()
    time.sleep(0.2)
    return t


def test_a_writer_among_writers_that_begin_again_at_once_gets_in_behind_them_not_starved(
        org_home, writer_for, tmp_path, monkeypatch):
    """Three processes write back to back, each holding the lock 30 ms and beginning again the
    moment it commits. Through SQLite's busy wait alone (a poll, 100 ms apart once it has
    waited a while) one more writer keeps losing to whichever of them commits and begins again:
    it waited out a busy timeout of four seconds. In the gate's line it waits for those before
    it (about three holds)."""
    monkeypatch.setattr(writer_mod, "BUSY_TIMEOUT_MS", 4000)
    procs, stop = _hammers(org_home.db_path, 3, 0.03, tmp_path)
    w = writer_for(Actor.HUMAN)
    waits = []
    try:
        for i in range(8):
            t0 = time.monotonic()
            with w.transaction() as tx:
                tx.journal("late", f"w-late-{i}")
            waits.append(time.monotonic() - t0)
    finally:
        stop.touch()
        for p in procs:
            p.wait(timeout=30)
    assert len(waits) == 8 and max(waits) < 2.0, waits
    assert w.conn.execute("SELECT COUNT(*) FROM events WHERE kind='late'").fetchone()[0] == 8
    assert w.conn.execute("SELECT COUNT(*) FROM events WHERE kind='hammer'").fetchone()[0] > 8


def test_writers_waiting_at_the_gate_come_in_the_order_they_came(tmp_path):
    path = tmp_path / "state.db-writers"
    first = WriteGate(path)
    assert first.enter(stall_s=1)
    order: list[int] = []
    gates = [WriteGate(path) for _ in range(6)]

    def one(i: int) -> None:
        assert gates[i].enter(stall_s=20)
        order.append(i)
        gates[i].leave()

    threads = []
    for i in range(6):
        threads.append(threading.Thread(target=one, args=(i,)))
        threads[-1].start()
        time.sleep(0.05)                        # each has drawn its ticket before the next
    first.leave()
    for t in threads:
        t.join(timeout=20)
    assert order == list(range(6))
    for g in [first, *gates]:
        g.close()


def test_a_writer_that_gives_up_passes_its_turn_on_when_it_comes(org_home, writer_for, monkeypatch):
    """One holds the gate and does not let go; the next gives up once the line has stood still
    for the busy timeout (store_busy, nothing written); one that came after it is let in as
    soon as the holder is done, not kept waiting for the one that left."""
    monkeypatch.setattr(writer_mod, "BUSY_TIMEOUT_MS", 600)
    holder, quitter, patient = (writer_for(Actor.HUMAN) for _ in range(3))
    release = threading.Event()
    came: dict = {}

    def wait_long():
        with patient.transaction() as tx:
            came["in"] = time.monotonic()
            tx.journal("patient", "w-3")

    t_hold = _holding(holder, release)
    t0 = time.monotonic()
    with pytest.raises(StoreBusy) as err:
        with quitter.transaction() as tx:
            tx.journal("never", "w-2")
    assert time.monotonic() - t0 >= 0.5 and "for the whole wait" in err.value.message
    t_patient = threading.Thread(target=wait_long)     # its ticket after the one given up
    t_patient.start()
    time.sleep(0.2)
    released = time.monotonic()
    release.set()
    t_hold.join(5)
    t_patient.join(10)
    assert came["in"] - released < 1.0            # not left to wait out its own stall limit
    kinds = [r[0] for r in holder.conn.execute(
        "SELECT kind FROM events WHERE kind IN ('held','never','patient') ORDER BY rowid")]
    assert kinds == ["held", "patient"]


def test_a_write_with_a_deadline_never_takes_a_place_before_one_that_waits(org_home, writer_for):
    """A write that may be skipped (a heartbeat row: wait_s) gets in only when the line is
    empty: while one holds and another waits, it gives up at its deadline and leaves nothing in
    the line; once the line is empty it gets in at once."""
    holder, patient, skippable = (writer_for(Actor.HUMAN) for _ in range(3))
    release = threading.Event()
    order: list[str] = []

    def wait_long():
        with patient.transaction() as tx:
            order.append("patient")
            tx.journal("patient", "w-2")

    threads = [_holding(holder, release), threading.Thread(target=wait_long)]
    threads[1].start()
    time.sleep(0.2)
    t0 = time.monotonic()
    with pytest.raises(StoreBusy):
        with skippable.transaction(wait_s=0.3) as tx:
            tx.journal("never", "w-3")
    assert 0.25 <= time.monotonic() - t0 < 2.0
    release.set()
    for t in threads:
        t.join(10)
    with skippable.transaction(wait_s=0.3) as tx:      # the line empty: in within its deadline
        tx.journal("beat", "w-3")
    assert order == ["patient"]
    assert [r[0] for r in holder.conn.execute(
        "SELECT kind FROM events WHERE kind IN ('held','patient','never','beat') ORDER BY rowid")] == [
        "held", "patient", "beat"]


HOLD_AND_HANG = """
import sys, time
from state_db.writer import StateWriter
w = StateWriter(sys.argv[1], "human", "doomed")
with w.transaction() as tx:
    tx.journal("doomed", "w-doomed")
    print("in", flush=True)
    time.sleep(60)
"""


def test_a_writer_killed_inside_its_transaction_leaves_nobody_waiting_for_its_turn(org_home, writer_for):
    p = subprocess.Popen([sys.executable, "-c", HOLD_AND_HANG, str(org_home.db_path)], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "in"
        w = writer_for(Actor.HUMAN)
        killed = {}

        def kill_soon():
            time.sleep(0.5)
            killed["at"] = time.monotonic()
            os.kill(p.pid, signal.SIGKILL)
        threading.Thread(target=kill_soon).start()
        with w.transaction(wait_s=10) as tx:
            tx.journal("after", "w-after")
        assert time.monotonic() - killed["at"] < 2.0
        assert w.conn.execute("SELECT COUNT(*) FROM events WHERE kind='doomed'").fetchone()[0] == 0
    finally:
        p.kill()
        p.wait(timeout=10)


def test_a_writer_that_takes_no_gate_is_still_waited_for_by_sqlites_lock(org_home, writer_for):
    """The gate orders writers, it guards nothing: a connection that never takes it (the sqlite3
    shell, a migration) still keeps a gated writer out until it commits."""
    other = sqlite3.connect(org_home.db_path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO events(kind, subject, actor, at) VALUES ('raw', 'w-raw', 'human', 0)")
    w = writer_for(Actor.HUMAN)
    threading.Timer(0.4, lambda: other.execute("COMMIT")).start()
    t0 = time.monotonic()
    with w.transaction(wait_s=5) as tx:
        tx.journal("gated", "w-gated")
        seen = tx.conn.execute("SELECT COUNT(*) FROM events WHERE kind='raw'").fetchone()[0]
    assert time.monotonic() - t0 >= 0.3 and seen == 1
    other.close()


def test_a_thread_that_beats_beats_while_it_waits_in_the_gates_line(org_home, writer_for, monkeypatch):
    monkeypatch.setattr(writer_mod, "WAIT_SLICE_S", 0.1)
    monkeypatch.setattr(writer_mod, "BUSY_TIMEOUT_MS", 800)
    holder, waiter = writer_for(Actor.HUMAN), writer_for(Actor.HUMAN)
    release = threading.Event()
    t = _holding(holder, release)
    beats: list[float] = []
    writer_mod.beat_while_waiting(lambda: beats.append(time.monotonic()))
    try:
        with pytest.raises(StoreBusy):
            with waiter.transaction():
                pass
    finally:
        writer_mod.beat_while_waiting(None)
        release.set()
        t.join(5)
    assert len(beats) >= 4 and max(b - a for a, b in zip(beats, beats[1:])) < 0.6, beats
    assert gate_path(holder.db_path).is_file()


def test_a_long_line_that_moves_is_waited_through_and_a_holder_that_does_not_let_go_is_store_busy(
        org_home, writer_for, monkeypatch):
    """The default wait is judged by the line, not by its length: four writers ahead, each
    holding the lock 0.3 s, keep a fifth waiting 1.2 s, past a busy timeout of 0.5 s, and it gets
    in; one writer holding it 2 s makes the next give up after the busy timeout (store_busy)."""
    monkeypatch.setattr(writer_mod, "BUSY_TIMEOUT_MS", 500)
    ahead = [writer_for(Actor.HUMAN) for _ in range(4)]

    def hold(w, s):
        with w.transaction() as tx:
            tx.journal("ahead", "w-ahead")
            time.sleep(s)
    threads = [threading.Thread(target=hold, args=(w, 0.3)) for w in ahead]
    for t in threads:
        t.start()
        time.sleep(0.03)
    last = writer_for(Actor.HUMAN)
    t0 = time.monotonic()
    with last.transaction() as tx:
        tx.journal("last", "w-last")
    waited = time.monotonic() - t0
    for t in threads:
        t.join(10)
    assert waited > 0.8, waited              # past the busy timeout, behind the line that moved
    stuck = threading.Thread(target=hold, args=(ahead[0], 2.0))
    stuck.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    with pytest.raises(StoreBusy) as err:
        with last.transaction() as tx:
            tx.journal("never", "w-never")
    assert 0.4 < time.monotonic() - t0 < 1.5
    assert "held the store's write lock for the whole wait" in err.value.message
    stuck.join(10)
    assert last.conn.execute("SELECT COUNT(*) FROM events WHERE kind='never'").fetchone()[0] == 0


def test_a_writer_stopped_while_it_draws_its_ticket_stops_no_one_for_good(org_home, writer_for, monkeypatch):
    """The ticket counter is taken for a few instructions; a process stopped (SIGSTOP) inside them
    holds it. A write with a deadline gives up at it, a write with the default wait once the
    busy timeout has passed with the counter taken: store_busy, never a wait without end."""
    import fcntl

    from state_db import gate
    monkeypatch.setattr(writer_mod, "BUSY_TIMEOUT_MS", 400)
    w = writer_for(Actor.HUMAN)
    with w.transaction() as tx:                 # the gate's file exists
        tx.journal("first", "w-1")
    fd = os.open(gate_path(w.db_path), os.O_RDWR)
    gate._lock(fd, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, gate._COUNTER)
    try:
        for wait_s, at_least in ((0.3, 0.25), (None, 0.35)):
            t0 = time.monotonic()
            with pytest.raises(StoreBusy):
                with w.transaction(wait_s=wait_s) as tx:
                    tx.journal("never", "w-never")
            assert at_least <= time.monotonic() - t0 < 3.0
    finally:
        os.close(fd)
    with w.transaction(wait_s=1.0) as tx:       # the counter free again: the line goes on
        tx.journal("after", "w-2")
    assert w.conn.execute("SELECT COUNT(*) FROM events WHERE kind IN ('first','after')").fetchone()[0] == 2


def test_a_gate_file_that_cannot_be_opened_leaves_the_writer_writing_through_sqlites_lock(org_home, writer_for):
    """The gate orders writers and guards nothing: when its file cannot be opened (here a
    directory in its place) the writer says so in its log once and writes as before."""
    gate_path(org_home.db_path).mkdir()
    w = writer_for(Actor.HUMAN)
    for i in range(2):
        with w.transaction() as tx:
            tx.journal("written", f"w-{i}")
    assert w._gate is None
    assert w.conn.execute("SELECT COUNT(*) FROM events WHERE kind='written'").fetchone()[0] == 2


WAIT_IN_LINE = """
import sys
from state_db.writer import StateWriter
w = StateWriter(sys.argv[1], "human", "stopped")
print("ready", flush=True)
with w.transaction() as tx:
    tx.journal("stopped-then-resumed", "w-stopped")
print("written", flush=True)
"""


def test_a_writer_stopped_while_it_waits_in_line_holds_up_no_one_behind_it(org_home, writer_for, monkeypatch):
    """A command suspended (Ctrl-Z, SIGSTOP) while it waits its turn: once its turn has come and
    it has not taken it for SKIP_S, the writer after it goes ahead; resumed, it writes too
    (SQLite's lock keeps the two apart). Without that, every writer behind it waited until the
    line stood still for the busy timeout and failed."""
    from state_db import gate
    monkeypatch.setattr(writer_mod, "BUSY_TIMEOUT_MS", 8000)
    holder, after = writer_for(Actor.HUMAN), writer_for(Actor.HUMAN)
    release = threading.Event()
    came: dict = {}
    t_hold = _holding(holder, release)
    drawn = int.from_bytes(gate_path(holder.db_path).read_bytes()[:8], "little")
    p = subprocess.Popen([sys.executable, "-c", WAIT_IN_LINE, str(org_home.db_path)], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 20
        while int.from_bytes(gate_path(holder.db_path).read_bytes()[:8], "little") <= drawn:
            assert time.monotonic() < deadline, "the command never took a ticket"
            time.sleep(0.01)
        os.kill(p.pid, signal.SIGSTOP)

        def write_after():
            with after.transaction() as tx:
                came["in"] = time.monotonic()
                tx.journal("after", "w-2")
        t_after = threading.Thread(target=write_after)
        t_after.start()
        time.sleep(0.3)                             # its ticket after the stopped one's
        released = time.monotonic()
        release.set()
        t_hold.join(10)
        t_after.join(20)
        assert "in" in came and came["in"] - released < gate.SKIP_S + 3.0
        os.kill(p.pid, signal.SIGCONT)
        assert p.stdout.readline().strip() == "written"
        assert p.wait(timeout=20) == 0
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        p.wait(timeout=10)
    kinds = sorted(r[0] for r in holder.conn.execute(
        "SELECT kind FROM events WHERE kind IN ('held','after','stopped-then-resumed')"))
    assert kinds == ["after", "held", "stopped-then-resumed"]
