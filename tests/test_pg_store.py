"""The PostgreSQL store: the state_db suite's own tests run against it, its connection (sqlite3's surface),
the write lock, migrations and the vocabulary's CHECK constraints, and ``org migrate-store``.

A throwaway server on a Unix socket (tests/support/pg.py) serves every test here; each test gets
a fresh schema as its store. The state_db test files' tests that reach the store through the
``org_home`` / ``writer_for`` / ``conn`` / ``raw`` fixtures are collected here a second time, with
those fixtures giving a PostgreSQL store (``RERUN``); the few that open state.db as a SQLite file
themselves stay SQLite-only (``SQLITE_ONLY`` says why), and their PostgreSQL counterparts are
written below.
"""
from __future__ import annotations

import functools
import inspect
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import tests.test_read_model as read_model_tests
import tests.test_state_db_infra as infra_tests
import tests.test_state_writer as writer_tests
import tests.test_vocab_guard as vocab_tests
from state_db.kernel import config as config_mod
from state_db import pg_migrations, pg_schema, store
from state_db.connection import connect
from state_db.kernel.errors import MigrationFailed, SchemaTooNew, StoreBusy
from state_db.kernel.home import OrgHome
from state_db.migrations import migrate
from state_db.schema import MIGRATIONS
from state_db.vocab import Actor, WorkStatus
from state_db.writer import StateWriter
from tests.support.pg import pg_server, pg_url  # noqa: F401 - fixtures
from tests.support.state import assign_and_run, commit_iteration, submit, verdict
from tests.test_read_model import conn  # noqa: F401 - the fixture, on this module's org_home

ROOT = Path(__file__).resolve().parents[1]
STORE_FIXTURES = {"org_home", "writer_for", "conn", "raw"}

SQLITE_ONLY = {
    "test_the_latest_eval_verdict_is_the_only_one_that_counts": "writes a verdict with sqlite3.connect(state.db)",
    "test_every_text_column_is_guarded_or_listed_as_free_text_with_open_vocabularies_explained":
        "reads sqlite_master and PRAGMA table_info (see test_every_guarded_column_has_its_check_constraint)",
    "test_every_column_named_like_a_vocabulary_is_guarded_unless_it_says_why_it_is_open":
        "reads sqlite_master and PRAGMA table_info (see test_every_guarded_column_has_its_check_constraint)",
    "test_triggers_are_generated_from_the_enums": "reads SQLite triggers (see test_the_checks_are_generated_from_the_enums)",
    "test_fake_api_key_never_reaches_state_db_logs_or_snapshots":
        "greps every file of the org home, where state.db is (PostgreSQL keeps no file there)",
}


# what does not run on PostgreSQL yet, and why: code outside state_db's store seam (strict: a fix
# makes these fail until they are moved out of this list)
PG_GAPS: dict[str, str] = {}     # tests known to fail on PostgreSQL, with why (none left)


def _known_gap(fn, reason: str):
    @functools.wraps(fn)
    def test(*args, **kwargs):
        return fn(*args, **kwargs)
    test.pytestmark = [*getattr(fn, "pytestmark", []), pytest.mark.xfail(strict=True, reason=reason)]
    return test


def _rerun(module) -> dict:
    found = {}
    for name, fn in vars(module).items():
        if not name.startswith("test_") or not inspect.isfunction(fn) or fn.__module__ != module.__name__:
            continue
        if name in SQLITE_ONLY or not STORE_FIXTURES & set(inspect.signature(fn).parameters):
            continue
        if name in PG_GAPS:
            fn = _known_gap(fn, PG_GAPS[name])
        found[f"test_pg_{module.__name__.rsplit('.', 1)[1].removeprefix('test_')}__{name[5:]}"] = fn
    return found


RERUN = {**_rerun(writer_tests), **_rerun(read_model_tests), **_rerun(infra_tests), **_rerun(vocab_tests)}
globals().update(RERUN)


@dataclass(frozen=True)
class PgOrgHome(OrgHome):
    """An org home whose truth is a PostgreSQL store (``db_path`` is its URL)."""

    url: str = ""

    @property
    def db_path(self) -> str:  # type: ignore[override]
        return self.url

    def exists(self) -> bool:
        return True


@pytest.fixture
def org_home(tmp_path, monkeypatch, pg_url):
    """A fresh org home on a migrated PostgreSQL store (overrides conftest's SQLite one here)."""
    home = PgOrgHome(tmp_path / "org", pg_url).ensure()
    config_mod.write_default(home.config_path)
    migrate(pg_url)
    monkeypatch.setenv("ORG_HOME", str(home.root))
    return home


@pytest.fixture
def raw(pg_url):
    """Raw SQL on a migrated PostgreSQL store: no StateWriter; references unchecked, as a plain
    sqlite3.connect has foreign_keys off, while every CHECK constraint still applies."""
    migrate(pg_url)
    c = store.connect(pg_url)
    c.run("SET session_replication_role = replica")
    yield c
    c.close()


def writer(url, actor, instance=None):
    return StateWriter(url, actor, instance)


# ------------------------------------------------------------------------------------ the connection

def test_rows_read_by_name_and_index_and_sqlite_functions_answer_alike(raw):
    raw.execute("INSERT INTO work_items (id, goal, workspace, backend, status, created_by, created_at, updated_at, "
                "cancel_requested) VALUES (?,?,?,?,?,?,?,?,?)", ("w1", "g", "/ws", "scripted", "queued", "h", 1, 2, True))
    raw.execute("INSERT INTO iterations (work_id, n, attempt, act_status, committed_at, prompt, input_tokens) "
                "VALUES ('w1', 1, 1, 'ok', 5, '{\"skills\": [\"a\", \"b\"]}', 7), "
                "('w1', 2, 1, 'ok', 6, '{\"skills\": [\"b\"]}', 8)")
    row = raw.execute("SELECT id, status, created_at, cancel_requested FROM work_items WHERE id = ?", ("w1",)).fetchone()
    assert (row[0], row["STATUS"], row["created_at"], row["cancel_requested"]) == ("w1", "queued", 1.0, 1)
    assert dict(row) == {"id": "w1", "status": "queued", "created_at": 1.0, "cancel_requested": 1}
    assert raw.execute("SELECT SUM(input_tokens) FROM iterations").fetchone()[0] == 15      # numeric -> int
    assert sorted(raw.execute("SELECT j.value, COUNT(*) FROM iterations i, json_each(i.prompt, '$.skills') j "
                              "GROUP BY j.value").fetchall()) == [("a", 1), ("b", 2)]
    assert raw.execute("SELECT json_extract(prompt, '$.skills') FROM iterations WHERE n = 2").fetchone()[0] == '["b"]'
    # a JSON number compared with a count, and cast (state_db/queries/knowledge.py, events.py)
    assert raw.execute("""SELECT COUNT(*) FROM iterations i WHERE json_extract('{"n": 2}', '$.n') =
                            (SELECT COUNT(*) FROM iterations)""").fetchone()[0] == 2
    assert raw.execute("SELECT MAX(CAST(json_extract('{\"upto\": 41}', '$.upto') AS INTEGER)) + 1").fetchone()[0] == 42
    assert raw.execute("SELECT id FROM work_items WHERE stop_reason IS NOT DISTINCT FROM ?", (None,)).fetchall() == [("w1",)]
    assert raw.execute("SELECT 1 FROM work_items WHERE id = 'nope'").fetchone() is None
    assert raw.execute("UPDATE work_items SET goal = 'h' WHERE id = 'nope'").rowcount == 0


def test_constraints_raise_the_sqlite_errors_callers_catch(raw):
    raw.execute("INSERT INTO org_session (id, status, updated_at) VALUES (1, 'running', 0)")
    with pytest.raises(sqlite3.IntegrityError):
        raw.execute("INSERT INTO org_session (id, status, updated_at) VALUES (2, 'running', 0)")   # CHECK (id = 1)
    with pytest.raises(sqlite3.IntegrityError):
        raw.execute("INSERT INTO org_session (id, status, updated_at) VALUES (1, 'running', 0)")   # primary key
    with pytest.raises(sqlite3.OperationalError):
        raw.execute("SELECT * FROM no_such_table")
    raw.execute("INSERT INTO org_session (id, status, updated_at) VALUES (1, 'stopped', 0) ON CONFLICT DO NOTHING")
    upsert = ("INSERT INTO transport_counters (instance, name, value) VALUES ('a', 'n', ?) "
              "ON CONFLICT (instance, name) DO UPDATE SET value = excluded.value")
    raw.execute(upsert, (1,))
    raw.execute(upsert, (5,))
    assert raw.execute("SELECT status FROM org_session").fetchone()[0] == "running"
    assert raw.execute("SELECT value FROM transport_counters").fetchall() == [(5,)]


def test_the_partial_unique_index_on_a_json_expression_holds(org_home, writer_for):
    submit(writer_for)
    row = {"work_id": "w1", "kind": "network", "action": {"command": "curl x"}, "status": "pending", "created_at": 1}
    with writer_for(Actor.LOOP_AGENT, "loop-agent-1").transaction() as tx:
        tx.insert("decisions", {"id": "d1", **row})
    with pytest.raises(Exception) as err:
        with writer_for(Actor.LOOP_AGENT, "loop-agent-1").transaction() as tx:
            tx.insert("decisions", {"id": "d2", **row})
    assert err.value.code == "conflict"


# ------------------------------------------------------------------------------------ the write lock

COUNTER = r"""
import os, sys, time
sys.path.insert(0, sys.argv[3])
from state_db.writer import StateWriter
w = StateWriter(sys.argv[1], "loop-agent", "loop-agent-" + sys.argv[2])
w.conn
open(os.path.join(sys.argv[5], "ready-" + sys.argv[2]), "w").close()
while not os.path.exists(os.path.join(sys.argv[5], "go")):     # all four start together
    time.sleep(0.005)
for i in range(int(sys.argv[4])):
    with w.transaction(render=False) as tx:     # read, then write what was read plus one
        row = tx.one("SELECT value FROM transport_counters WHERE instance='shared' AND name='n'")
        tx.execute("INSERT INTO transport_counters(instance, name, value) VALUES ('shared','n',?) "
                   "ON CONFLICT(instance, name) DO UPDATE SET value = excluded.value", ((row[0] if row else 0) + 1,))
print("done")
"""


def test_read_then_write_from_four_processes_loses_no_increment(org_home, tmp_path):
    """Without the lock, READ COMMITTED loses increments here (about half of them, measured)."""
    per_proc = 150
    procs = [subprocess.Popen([sys.executable, "-c", COUNTER, org_home.db_path, str(i), str(ROOT), str(per_proc),
                               str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(4)]
    try:
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("ready-*"))) < 4 and time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                break
            time.sleep(0.01)
        (tmp_path / "go").touch()
        outs = [p.communicate(timeout=50) for p in procs]
    finally:
        for p in procs:
            p.kill() if p.poll() is None else None
    for (out, err), p in zip(outs, procs):
        assert p.returncode == 0 and "done" in out, err
    c = connect(org_home.db_path, readonly=True)
    assert c.execute("SELECT value FROM transport_counters WHERE instance='shared'").fetchone()[0] == 4 * per_proc
    c.close()


def test_a_second_writer_waits_for_the_first_and_then_sees_its_commit(pg_url):
    migrate(pg_url)
    first, second = store.connect(pg_url), store.connect(pg_url)
    first.execute("BEGIN IMMEDIATE")
    first.execute("INSERT INTO transport_counters (instance, name, value) VALUES ('a', 'n', 1)")
    waiter = second.run("SELECT pid FROM pg_stat_activity WHERE pid = pg_backend_pid()").fetchone()[0]
    import threading
    seen = []

    def write_after():
        second.execute("BEGIN IMMEDIATE")
        seen.append(second.execute("SELECT value FROM transport_counters").fetchall())
        second.execute("COMMIT")

    t = threading.Thread(target=write_after)
    t.start()
    probe = store.connect(pg_url)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:      # the second is blocked on the advisory lock
        if probe.run("SELECT wait_event FROM pg_stat_activity WHERE pid = $1", (waiter,)).fetchone()[0] == "advisory":
            break
        time.sleep(0.02)
    else:
        pytest.fail("the second writer never waited for the lock")
    assert not seen
    first.execute("COMMIT")
    t.join(10)
    assert seen == [[(1,)]]
    for c in (first, second, probe):
        c.close()


def test_a_lock_held_past_the_timeout_is_the_coded_store_busy(pg_url, monkeypatch):
    migrate(pg_url)
    first, second = store.connect(pg_url), store.connect(pg_url)
    second.run("SET lock_timeout = 200")
    first.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreBusy, match="database is locked") as err:
        second.execute("BEGIN IMMEDIATE")
    assert err.value.code == "store_busy" and isinstance(err.value, sqlite3.OperationalError)
    assert err.value.sqlstate == "55P03"              # lock_not_available
    second.execute("ROLLBACK")
    first.execute("ROLLBACK")
    first.close(), second.close()


def test_a_writer_past_the_lock_timeout_raises_store_busy_and_writes_nothing(pg_url):
    """Through ``StateWriter``, as on SQLite (tests/test_store_busy.py): one coded error."""
    migrate(pg_url)
    holder = store.connect(pg_url)
    holder.execute("BEGIN IMMEDIATE")
    w = StateWriter(pg_url, Actor.HUMAN)
    w.conn.run("SET lock_timeout = 200")
    with pytest.raises(StoreBusy) as err:
        with w.transaction() as tx:
            tx.journal("never", "x")
    assert err.value.code == "store_busy"
    holder.execute("ROLLBACK")
    assert w.conn.execute("SELECT COUNT(*) FROM events WHERE kind = 'never'").fetchone()[0] == 0
    w.close(), holder.close()


def test_a_thread_that_beats_keeps_beating_while_it_waits_for_the_pg_lock(pg_url, monkeypatch):
    """The wait is taken in slices of lock_timeout with a beat between them, as on SQLite; a
    heartbeat's short wait (``wait_s``) ends in StoreBusy; the next plain write waits as before."""
    from state_db import writer as writer_mod
    migrate(pg_url)
    monkeypatch.setattr(writer_mod, "WAIT_SLICE_S", 0.1)
    monkeypatch.setattr(writer_mod, "BUSY_TIMEOUT_MS", 700)
    holder = store.connect(pg_url)
    holder.execute("BEGIN IMMEDIATE")
    beats: list[float] = []
    writer_mod.beat_while_waiting(lambda: beats.append(time.monotonic()))
    w = StateWriter(pg_url, Actor.HUMAN)
    try:
        with pytest.raises(StoreBusy):
            with w.transaction():
                pass
        assert len(beats) >= 3, beats
        with pytest.raises(StoreBusy):
            with w.transaction(wait_s=0.05):
                pass
    finally:
        writer_mod.beat_while_waiting(None)
        holder.execute("ROLLBACK")
    with w.transaction() as tx:
        tx.journal("written", "x")
    assert w.conn.execute("SELECT COUNT(*) FROM events WHERE kind = 'written'").fetchone()[0] == 1
    w.close(), holder.close()


def test_a_serialization_failure_is_store_busy(pg_url):
    """PostgreSQL gives up a snapshot transaction whose row another committed meanwhile
    (``serialization_failure``): the store stayed busy for it, the same coded error."""
    migrate(pg_url)
    setup = store.connect(pg_url)
    setup.execute("INSERT INTO events(at, actor, kind) VALUES (1, 'human', 'row')")
    first, second = store.connect(pg_url), store.connect(pg_url)
    first.execute("BEGIN")                          # REPEATABLE READ: SQLite's deferred snapshot
    first.execute("SELECT COUNT(*) FROM events").fetchone()
    second.execute("UPDATE events SET kind = 'changed' WHERE kind = 'row'")
    with pytest.raises(StoreBusy) as err:
        first.execute("UPDATE events SET kind = 'mine' WHERE kind = 'row'")
    assert err.value.code == "store_busy" and err.value.sqlstate == "40001"
    first.execute("ROLLBACK")
    for c in (setup, first, second):
        c.close()


# ------------------------------------------------------------------------------------ migrations

def test_migration_from_an_older_schema_keeps_data_and_records_each_step(pg_url, monkeypatch):
    monkeypatch.setitem(pg_migrations.FORMS, "9001_add_column", "ALTER TABLE events ADD COLUMN extra TEXT;")
    monkeypatch.setitem(pg_migrations.FORMS, "9002_index", "CREATE INDEX events_extra ON events(extra);")
    migrate(pg_url, migrations=MIGRATIONS[:1])
    c = connect(pg_url)
    c.execute("INSERT INTO events(at, actor, kind) VALUES (1, 'human', 'kept')")
    newer = MIGRATIONS + [("9001_add_column", "ALTER TABLE events ADD COLUMN extra TEXT;"),
                          ("9002_index", "CREATE INDEX events_extra ON events(extra);")]
    result = migrate(pg_url, migrations=newer)
    assert result["applied"] == [n for n, _ in newer[1:]] and result["backup"] is None
    assert c.execute("SELECT kind FROM events").fetchone()[0] == "kept"
    assert c.execute("PRAGMA user_version").fetchone()[0] == len(newer)
    assert [r[0] for r in c.execute("SELECT name FROM _migrations ORDER BY applied_at")] == [n for n, _ in newer]
    c.close()


def test_a_failing_migration_rolls_back_its_step_ddl_included(pg_url, monkeypatch):
    monkeypatch.setitem(pg_migrations.FORMS, "9001_bad", "CREATE TABLE t(x BIGINT); INSERT INTO nope VALUES (1);")
    migrate(pg_url)
    bad = MIGRATIONS + [("9001_bad", "CREATE TABLE t(x INTEGER); INSERT INTO nope VALUES (1);")]
    with pytest.raises(MigrationFailed):
        migrate(pg_url, migrations=bad)
    c = connect(pg_url, readonly=True)
    assert c.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert c.run("SELECT to_regclass('t')").fetchone()[0] is None
    c.close()


def test_a_newer_store_is_refused_by_migrate_and_by_the_writer(pg_url):
    migrate(pg_url)
    c = connect(pg_url)
    c.execute(f"PRAGMA user_version={len(MIGRATIONS) + 5}")
    c.close()
    with pytest.raises(SchemaTooNew):
        migrate(pg_url)
    with pytest.raises(SchemaTooNew):
        with StateWriter(pg_url, "human").transaction():
            pass


# ------------------------------------------------------------------------------------ the vocabulary

def test_every_guarded_column_has_its_check_constraint(raw):
    have = pg_schema.installed(raw)
    assert set(have) == set(pg_schema.generated())
    assert pg_schema.stale(raw) == ({}, {})
    names = {"status", "stop_reason", "outcome", "role", "actor"}
    found = {k for k in pg_schema.columns(raw) if k[1] in names}
    assert found == {k for k in vocab_tests.vocab_guard.GUARDED if k[1] in names}


def test_the_checks_are_generated_from_the_enums(raw):
    defs = dict(raw.run("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                        "WHERE conname = 'vocab_work_items_status'").fetchall())
    for status in WorkStatus:
        assert f"'{status}'" in defs["vocab_work_items_status"]


def test_a_value_added_to_a_vocabulary_is_accepted_after_the_next_migrate(pg_url, monkeypatch):
    migrate(pg_url)
    assert migrate(pg_url)["vocabulary"] == []
    c = connect(pg_url)
    row = vocab_tests.row_with("work_items", "status", "archived")
    with pytest.raises(sqlite3.IntegrityError, match="work_items.status: value is not one of"):
        vocab_tests.insert(c, "work_items", row)
    monkeypatch.setitem(vocab_tests.vocab_guard.GUARDED, ("work_items", "status"), [*WorkStatus, "archived"])
    assert migrate(pg_url)["vocabulary"] == ["vocab_work_items_status"]
    vocab_tests.insert(c, "work_items", row)
    c.execute("UPDATE work_items SET status = 'queued'")
    monkeypatch.undo()
    assert migrate(pg_url)["vocabulary"] == ["vocab_work_items_status"]
    with pytest.raises(sqlite3.IntegrityError):
        c.execute("UPDATE work_items SET status = 'archived'")
    c.close()


def test_a_check_dropped_by_hand_is_restored_at_the_next_migrate(pg_url):
    migrate(pg_url)
    c = connect(pg_url)
    c.run("ALTER TABLE events DROP CONSTRAINT vocab_events_actor")
    c.execute("INSERT INTO events(at, actor, kind) VALUES (1, 'zombie', 'k')")
    with pytest.raises(MigrationFailed):         # unlike a trigger, a CHECK validates the rows already there
        migrate(pg_url)
    c.execute("DELETE FROM events WHERE actor = 'zombie'")
    assert migrate(pg_url)["vocabulary"] == ["vocab_events_actor"]
    with pytest.raises(sqlite3.IntegrityError, match="events.actor"):
        c.execute("INSERT INTO events(at, actor, kind) VALUES (1, 'zombie', 'k')")
    c.close()


# ------------------------------------------------------------------------------------ configuration

def _a_worked_org(tmp_path) -> OrgHome:
    from state_db.bootstrap import init_home
    home = OrgHome(tmp_path / "sqlite-org")
    init_home(home)

    def wf(actor, instance=None):
        return StateWriter(home.db_path, actor, instance)

    submit(wf, goal="quote's\ttab\nline ✓")
    assign_and_run(wf)
    commit_iteration(wf)
    verdict(wf)
    with wf(Actor.LOOP_AGENT, "loop-agent-1").transaction(render=False) as tx:
        tx.execute("INSERT INTO transport_counters(instance, name, value) VALUES ('x', 'pushed', 3)")
    return home


def _org(home, *argv, env_extra=None):
    import os
    env = {**os.environ, "ORG_HOME": str(home.root), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "scripts.cli.main", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_migrate_store_copies_an_org_and_verifies_every_table(tmp_path, pg_url):
    import orjson
    home = _a_worked_org(tmp_path)
    proc = _org(home, "migrate-store", "--to", pg_url, "--json")
    assert proc.returncode == 0, proc.stderr
    result = orjson.loads(proc.stdout)
    assert result["verified"] is True
    src = sqlite3.connect(home.db_path)
    for table in ("work_items", "iterations", "verdicts", "events", "transport_counters"):
        assert result["tables"][table]["rows"] == src.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] > 0
    src.close()
    c = connect(pg_url, readonly=True)
    assert c.execute("SELECT goal FROM work_items").fetchone()[0] == "quote's\ttab\nline ✓"
    c.close()
    # the copy is a working store: the same writer goes on where the SQLite org stopped
    with StateWriter(pg_url, Actor.COORDINATOR).transaction() as tx:
        tx.journal("after.copy")
    c = connect(pg_url, readonly=True)
    ids = [r[0] for r in c.execute("SELECT id FROM events ORDER BY id")]
    assert ids == list(range(1, len(ids) + 1))       # the identity goes on after the copied ids
    c.close()
    again = _org(home, "migrate-store", "--to", pg_url)
    assert again.returncode == 1 and again.stderr.startswith("error[store_not_empty]"), again.stderr
    assert "Traceback" not in again.stderr


def test_migrate_store_detects_a_row_that_differs(tmp_path, pg_url, monkeypatch):
    home = _a_worked_org(tmp_path)
    real = pg_schema.table_digest

    def tampered(conn, table, cols):                  # PostgreSQL's side of one table altered after the copy
        if store.is_postgres(conn) and table == "verdicts":
            conn.run("UPDATE verdicts SET feedback = 'changed'")
        return real(conn, table, cols)

    monkeypatch.setattr(pg_schema, "table_digest", tampered)
    with pytest.raises(Exception) as err:
        pg_schema.copy_from_sqlite(home.db_path, pg_url)
    assert err.value.code == "copy_mismatch" and "verdicts" in str(err.value)


def test_migrate_store_refuses_a_running_org_and_a_bad_url(tmp_path, pg_url):
    home = _a_worked_org(tmp_path)
    with StateWriter(home.db_path, Actor.SUPERVISOR).transaction() as tx:
        tx.insert("org_session", {"id": 1, "status": "running", "updated_at": time.time()})
    proc = _org(home, "migrate-store", "--to", pg_url)
    assert proc.returncode == 1 and proc.stderr.startswith("error[org_running]"), proc.stderr
    proc = _org(home, "migrate-store", "--to", "mysql://x")
    assert proc.returncode != 0 and proc.stderr.startswith("error[bad_arguments]"), proc.stderr
