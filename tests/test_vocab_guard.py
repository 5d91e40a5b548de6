"""The database refuses what the vocabulary forbids, through raw SQL (no StateWriter), and its
triggers follow vocab.py: generated from it, installed by 0006_vocabulary on a database the
previous schema made, and recreated at the next migrate when a vocabulary grows."""
from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path

import pytest

from state_db import vocab_guard
from state_db.migrations import migrate
from state_db.schema import MIGRATIONS
from state_db.vocab import DecisionStatus, StopReason, WorkStatus

_ids = itertools.count()

# the smallest row each guarded table accepts, apart from the guarded column
BASE = {
    "work_items": lambda i: {"id": f"w{i}", "goal": "g", "workspace": f"/ws{i}", "backend": "anthropic",
                             "status": "queued", "created_by": "h", "created_at": 1, "updated_at": 1},
    "stop_history": lambda i: {"work_id": "w", "seq": i, "stop_reason": "timeout", "iterations": 1,
                               "continued_by": "h", "continued_at": 1},
    "decisions": lambda i: {"id": f"d{i}", "work_id": "w", "kind": "network", "action": f'{{"command": "c{i}"}}',
                            "status": "pending", "created_at": 1},
    "role_instances": lambda i: {"instance": f"r{i}", "role": "curator", "status": "ready", "updated_at": 1},
    "org_session": lambda i: {"id": 1, "status": "running", "updated_at": 1},
    "peers": lambda i: {"instance": f"p{i}", "host": "h", "role": "loop-agent", "endpoint": "tcp://h:1",
                        "curve_public": f"{i:040d}", "hmac_key": "0" * 64, "registered_at": 1, "updated_at": 1},
    "skill_candidates": lambda i: {"id": f"c{i}", "name": "n", "status": "pending", "created_at": 1},
    "candidate_batches": lambda i: {"id": f"b{i}", "status": "open", "created_at": 1},
    "raw_notes": lambda i: {"id": f"n{i}", "run_id": "w", "fact": "f", "judgment": "j", "rationale": "r",
                            "applicability": "a", "status": "pending", "created_at": 1},
    "skills": lambda i: {"name": f"s{i}", "path": "p", "status": "active", "created_at": 1},
    "verdicts": lambda i: {"id": f"v{i}", "work_id": "w", "iteration": 1, "outcome": "pass", "written_by": "e",
                           "at": 1},
    "preflights": lambda i: {"work_id": f"w{i}", "outcome": "ready", "written_by": "e", "at": 1},
    "events": lambda i: {"at": 1, "actor": "human", "kind": "k"},
    "idempotency": lambda i: {"key": f"k{i}", "actor": "human", "command": "c", "at": 1},
    "proposals": lambda i: {"id": f"p{i}", "fingerprint": f"f{i}", "workspace": "/ws", "kind": "todo",
                            "source": "markers", "title": "t", "goal": "g", "rank": 1, "status": "proposed",
                            "created_by": "h", "created_at": 1, "seen_at": 1, "expires_at": 2},
    "schedules": lambda i: {"id": f"s{i}", "name": f"s{i}", "kind": "every", "status": "active",
                            "created_by": "h", "created_at": 1, "updated_at": 1},
    "replays": lambda i: {"work_id": f"w{i}", "subject": "c", "subject_kind": "candidate", "source_id": "w",
                          "relation": "source", "arm": "with", "skill_name": "n", "skill_text": "t", "created_at": 1},
    "replay_plans": lambda i: {"subject": f"c{i}", "subject_kind": "candidate", "status": "planned", "name": "n",
                               "skill_text": "t", "planned_by": "coordinator", "created_at": 1},
    "iterations": lambda i: {"work_id": "w", "n": i, "attempt": 1, "act_status": "ok", "committed_at": 1},
    "attempts": lambda i: {"work_id": "w", "attempt": i, "iteration": 1, "started_at": 1},
    "curated_notes": lambda i: {"id": f"c{i}", "topic": "t", "body": "b", "kind": "fix", "created_at": 1,
                                "updated_at": 1},
    "attention": lambda i: {"key": f"a{i}", "kind": "batch_open", "text": "t", "created_at": 1},
    "handoffs": lambda i: {"work_id": "w", "ending": i, "done": "d", "remains": "r", "learned": "l",
                           "source": "record", "written_by": "l", "at": 1},
    "transcript": lambda i: {"work_id": "w", "attempt": 1, "seq": i, "iteration": 1, "at": 1},
}

# values outside every vocabulary, near misses of real ones, and the issue's examples
FORBIDDEN = ["bogus", "", "QUEUED", "queued ", "maybe", "zombie", "Human", 1]


def row_with(table: str, column: str, value) -> dict:
    row = {**BASE[table](next(_ids)), column: value}
    if table == "work_items":          # the table's own CHECK ties ended to a stop reason
        if column == "stop_reason":
            row["status"] = "ended"
        elif value == WorkStatus.ENDED:
            row["stop_reason"] = StopReason.GOAL_MET
    return row


def insert(conn, table: str, row: dict) -> None:
    conn.execute(f"DELETE FROM {table}")          # org_session is a singleton; the rest stay small
    conn.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                 list(row.values()))


@pytest.fixture
def raw(tmp_path):
    db = tmp_path / "state.db"
    migrate(db)
    conn = sqlite3.connect(db, isolation_level=None)     # raw SQL: no StateWriter, no checks of ours
    yield conn
    conn.close()


GUARDED = sorted(vocab_guard.GUARDED)


@pytest.mark.parametrize("table, column", GUARDED, ids=[f"{t}.{c}" for t, c in GUARDED])
def test_every_allowed_value_is_accepted_and_every_forbidden_one_refused_on_insert_and_update(raw, table, column):
    values = vocab_guard.allowed(table, column)
    for value in values:
        insert(raw, table, row_with(table, column, value))
    for bad in FORBIDDEN:
        if bad in values:
            continue
        with pytest.raises(sqlite3.IntegrityError, match=rf"{table}\.{column}: value is not one of|CHECK|check constraint"):
            insert(raw, table, row_with(table, column, bad))
    insert(raw, table, row_with(table, column, values[0]))
    for value in values:
        if (table, column, value) == ("work_items", "status", WorkStatus.ENDED):
            continue                    # ended needs a stop reason: the table's own CHECK
        raw.execute(f"UPDATE {table} SET {column} = ?", (value,))
    for bad in FORBIDDEN:
        with pytest.raises(sqlite3.IntegrityError, match=rf"{table}\.{column}|CHECK|check constraint"):
            raw.execute(f"UPDATE {table} SET {column} = ?", (bad,))
    assert raw.execute(f"SELECT {column} FROM {table}").fetchone()[0] in values


def test_the_issues_examples_are_refused_through_raw_sql(raw):
    insert(raw, "work_items", row_with("work_items", "status", "queued"))
    insert(raw, "decisions", row_with("decisions", "status", "pending"))
    insert(raw, "role_instances", row_with("role_instances", "role", "curator"))
    for sql in ("UPDATE work_items SET status = 'bogus'",
                "UPDATE work_items SET status = 'ended', stop_reason = 'gave_up'",
                "UPDATE decisions SET status = 'maybe'",
                "UPDATE role_instances SET role = 'zombie'"):
        with pytest.raises(sqlite3.IntegrityError):
            raw.execute(sql)


def text_columns(conn) -> set[tuple[str, str]]:
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                         "AND name NOT LIKE 'sqlite_%'")]
    return {(t, c[1]) for t in tables for c in conn.execute(f"PRAGMA table_info({t})")
            if c[2].upper().startswith("TEXT") or not c[2]}


def test_every_text_column_is_guarded_or_listed_as_free_text_with_open_vocabularies_explained(raw):
    """A new TEXT column fails here until it is guarded (GUARDED) or said to be free (FREE)."""
    columns = text_columns(raw)
    guarded, open_ = set(vocab_guard.GUARDED), set(vocab_guard.OPEN)
    free = {(t, c) for t, cs in vocab_guard.FREE.items() for c in cs}
    assert not guarded & free and not guarded & open_ and not free & open_
    unclassified = columns - guarded - free - open_
    assert not unclassified, f"TEXT columns neither guarded nor free: {sorted(unclassified)}"
    stale = (guarded | free | open_) - columns
    assert not stale, f"classified columns the schema does not have: {sorted(stale)}"


VOCABULARY_NAME = ("kind", "status", "outcome", "reason", "source", "role", "actor", "tier", "origin", "backend",
                   "model", "state", "type", "level", "mode")


def test_every_column_named_like_a_vocabulary_is_guarded_unless_it_says_why_it_is_open(raw):
    """Listing a status or kind column as free text is not enough: it needs a guard or a reason."""
    named = {(t, c) for t, c in text_columns(raw) if c.split("_")[-1] in VOCABULARY_NAME}
    assert named - set(vocab_guard.OPEN) <= set(vocab_guard.GUARDED), sorted(named - set(vocab_guard.GUARDED)
                                                                             - set(vocab_guard.OPEN))
    assert all(len(why) > 20 for why in vocab_guard.OPEN.values())


def test_the_contract_issues_columns_refuse_bogus_through_raw_sql(raw):
    """iterations.act_status, attempts.outcome, decisions.kind, proposals.kind, curated_notes.kind and
    attention.kind took any value before."""
    for table, column in (("iterations", "act_status"), ("attempts", "outcome"), ("decisions", "kind"),
                          ("proposals", "kind"), ("curated_notes", "kind"), ("attention", "kind")):
        with pytest.raises(sqlite3.IntegrityError, match=rf"{table}\.{column}"):
            insert(raw, table, row_with(table, column, "bogus"))


def test_triggers_are_generated_from_the_enums(raw):
    sql = vocab_guard.installed(raw)
    assert set(sql) == set(vocab_guard.generated())
    for status in DecisionStatus:
        assert f"'{status}'" in sql["vocab_decisions_status_insert"]
    assert vocab_guard.stale(raw) == ({}, [])


def test_migration_on_a_database_of_the_previous_schema_installs_the_guard_and_keeps_a_backup(tmp_path):
    db = tmp_path / "state.db"
    migrate(db, migrations=MIGRATIONS[:5])
    old = sqlite3.connect(db, isolation_level=None)
    insert(old, "work_items", {**BASE["work_items"](0), "id": "w-old"})
    old.execute("INSERT INTO decisions(id, work_id, kind, status, created_at) VALUES ('d1', 'w-old', 'network', "
                "'pending', 1)")
    old.execute("UPDATE work_items SET status = 'bogus'")            # the previous schema let it through
    old.execute("UPDATE work_items SET status = 'queued'")
    old.close()
    result = migrate(db, backups_dir=tmp_path / "backups")
    assert result["applied"][0] == "0006_vocabulary" and result["from"] == 5    # later migrations follow it
    backup = Path(result["backup"])
    assert backup.exists()
    saved = sqlite3.connect(backup)
    assert saved.execute("PRAGMA user_version").fetchone()[0] == 5
    assert saved.execute("SELECT COUNT(*) FROM sqlite_master WHERE name LIKE 'vocab_%'").fetchone()[0] == 0
    saved.close()
    conn = sqlite3.connect(db, isolation_level=None)
    assert conn.execute("SELECT id, status FROM work_items").fetchall() == [("w-old", "queued")]
    assert conn.execute("SELECT status FROM decisions").fetchall() == [("pending",)]
    assert conn.execute("SELECT COUNT(*) FROM stop_history").fetchone()[0] == 0
    with pytest.raises(sqlite3.IntegrityError, match="work_items.status"):
        conn.execute("UPDATE work_items SET status = 'bogus'")
    conn.close()


def test_a_value_added_to_a_vocabulary_is_accepted_after_the_next_migrate_with_no_new_migration(tmp_path,
                                                                                                 monkeypatch):
    db = tmp_path / "state.db"
    migrate(db)
    assert migrate(db)["vocabulary"] == []                    # nothing differs: nothing rewritten
    conn = sqlite3.connect(db, isolation_level=None)
    row = row_with("work_items", "status", "archived")
    with pytest.raises(sqlite3.IntegrityError):
        insert(conn, "work_items", row)
    monkeypatch.setitem(vocab_guard.GUARDED, ("work_items", "status"), [*WorkStatus, "archived"])
    result = migrate(db)
    assert result["applied"] == [] and result["vocabulary"] == ["vocab_work_items_status_insert",
                                                                "vocab_work_items_status_update"]
    insert(conn, "work_items", row)
    conn.execute("UPDATE work_items SET status = 'queued'")
    conn.execute("UPDATE work_items SET status = 'archived'")
    monkeypatch.undo()                                         # the value is dropped again
    assert len(migrate(db)["vocabulary"]) == 2
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("UPDATE work_items SET status = 'archived'")
    conn.close()


def test_a_trigger_dropped_or_edited_by_hand_is_restored_at_the_next_migrate(tmp_path):
    db = tmp_path / "state.db"
    migrate(db)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("DROP TRIGGER vocab_decisions_status_update")
    conn.execute("DROP TRIGGER vocab_events_actor_insert")
    conn.execute("CREATE TRIGGER vocab_events_actor_insert BEFORE INSERT ON events BEGIN SELECT 1; END")
    assert migrate(db)["vocabulary"] == ["vocab_decisions_status_update", "vocab_events_actor_insert"]
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("INSERT INTO events(at, actor, kind) VALUES (1, 'zombie', 'k')")
    conn.close()


def test_0018_splits_attempt_outcomes_written_as_kind_and_code_and_gives_kindless_notes_a_kind(tmp_path):
    db = tmp_path / "state.db"
    before = [name for name, _ in MIGRATIONS].index("0018_contract")
    migrate(db, migrations=MIGRATIONS[:before])
    old = sqlite3.connect(db, isolation_level=None)
    for vocab in ("vocab_attempts_outcome_insert", "vocab_attempts_outcome_update",
                  "vocab_curated_notes_kind_insert"):    # as a database of the previous code held them
        old.execute(f"DROP TRIGGER IF EXISTS {vocab}")
    for n, outcome in enumerate(["committed", "discarded", "interrupted", "cancelled", "model_error:overloaded",
                                 "wrapup:ok", "wrapup:budget_exhausted", "wrapup:error"]):
        old.execute("INSERT INTO attempts(work_id, attempt, iteration, started_at, outcome) VALUES ('w', ?, 1, 1, ?)",
                    (n, outcome))
    old.execute("INSERT INTO curated_notes(id, topic, body, kind, created_at, updated_at) VALUES ('c', 't', 'b', '', 1, 1)")
    old.close()
    migrate(db, backups_dir=tmp_path / "backups")
    conn = sqlite3.connect(db, isolation_level=None)
    rows = conn.execute("SELECT outcome, detail FROM attempts ORDER BY attempt").fetchall()
    assert rows == [("committed", None), ("discarded", None), ("interrupted", "interrupted"),
                    ("interrupted", "cancelled"), ("model_error", "overloaded"), ("wrapped_up", None),
                    ("wrapup_failed", "budget_exhausted"), ("wrapup_failed", "error")]
    assert conn.execute("SELECT kind FROM curated_notes").fetchall() == [("context",)]
    with pytest.raises(sqlite3.IntegrityError, match="attempts.outcome"):
        conn.execute("UPDATE attempts SET outcome = 'model_error:x'")
    conn.close()
