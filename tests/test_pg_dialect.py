"""Every statement of ``state_db/`` runs on PostgreSQL as it is written, and answers there as on SQLite.

No statement is rewritten for PostgreSQL (``state_db/store.py`` says why): one that PostgreSQL
cannot run fails here, not in production. The census test drives a whole org's worth of rows
through both stores — the writer, the ending, every public query of ``state_db/queries`` (a new
one without arguments below fails the test), the views, the snapshot, retention, migrations and
the copy of a SQLite store into PostgreSQL — compares each answer and every table between the two
stores, and then reads ``state_db/``'s source: every SQL text written there (a string or f-string
that is a statement or a clause of one) must be among the statements PostgreSQL ran, unless the
module is SQLite's own (``SQLITE_ONLY`` says why). The few statements written outside ``state_db/``
(the transport's delivery ledger and counters) get the same treatment in a test of their own.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import state_db.queries as queries
from state_db import pg_migrations, pg_schema, retention, snapshot, store, views
from state_db.connection import connect
from state_db.ending import StopDecision, end_run
from state_db.migrations import _split, migrate
from state_db.queries import peers as peer_queries
from state_db.queries.base import plain
from state_db.schema import MIGRATIONS
from state_db.vocab import Actor, StopReason, WorkStatus
from state_db.vocab_guard import GUARDED
from state_db.writer import StateWriter
from tests.support.pg import pg_server, pg_url  # noqa: F401 - fixtures
from tests.support.state import assign_and_run, commit_iteration, submit, verdict

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[1]
NOW = 1000.0

# modules whose SQL is SQLite's own, with PostgreSQL's counterpart
SQLITE_ONLY = {
    "state_db/schema.py": "SQLite's migrations; PostgreSQL runs pg_migrations.py's "
                          "(test_every_migration_has_its_postgresql_form)",
    "state_db/vocab_guard.py": "SQLite's vocabulary triggers; PostgreSQL's CHECKs are pg_schema.py's",
    "state_db/connection.py": "opens a SQLite file with its PRAGMAs; a PostgreSQL URL goes to store.connect",
    "state_db/pg_migrations.py": "each form runs whole in every migrate of a fresh store (migrate fails on any "
                                 "statement PostgreSQL refuses); test_both_stores_have_the_same_schema",
}
# texts of modules checked here that are not statements PostgreSQL runs: (module, opening words) -> why
NOT_ON_POSTGRES = {
    ("state_db/pg_schema.py", "SELECT name FROM sqlite_master"): "copy_from_sqlite reads its SQLite source",
    ("state_db/pg_schema.py", "PRAGMA foreign_key_list("): "copy_from_sqlite reads its SQLite source",
    ("state_db/pg_schema.py", "PRAGMA table_info("): "copy_from_sqlite reads its SQLite source",
    ("state_db/pg_schema.py", "SELECT status FROM org_session"): "copy_from_sqlite asks its SQLite source",
    ("state_db/pg_schema.py", "SELECT calls, input_tokens"): "copy_from_sqlite reads its SQLite source's totals "
                                                             "(the UPDATE that sets them runs on PostgreSQL)",
    ("state_db/store.py", "COPY"): "sent through psycopg's COPY protocol (copy_rows), not execute; "
                                   "copy_from_sqlite is driven below and verifies every row it copied",
    ("state_db/store.py", "PRAGMA"): "the message refusing a PRAGMA the store does not answer",
    ("state_db/writer.py", "PRAGMA busy_timeout"): "SQLite's lock wait (_set_busy_ms); on PostgreSQL "
                                                   "SET lock_timeout (tests/test_pg_store.py)",
}
# functions of state_db.queries that run their caller's statement (it is counted where it is written)
EXECUTORS = {"state_db.queries.base.scalar", "state_db.queries.base.exists", "state_db.queries.rows"}

SQL = re.compile(r"^\s*(?:SELECT|INSERT INTO|UPDATE \S+ SET|DELETE FROM|WITH \w+ AS|CREATE|ALTER TABLE|DROP|PRAGMA|"
                 r"BEGIN|COMMIT|ROLLBACK|COPY)\b|^\s*(?:AND|OR|WHERE|ORDER BY|GROUP BY|LIMIT|LEFT JOIN|JOIN|"
                 r"ON CONFLICT)\s")
HOLE = "\x00"

# ------------------------------------------------------------------------------------ the rows

WORK_ROWS = [
    ("attempts", {"work_id": "w1", "attempt": 1, "iteration": 1, "instance": "loop-agent-1", "started_at": 5.0,
                  "ended_at": 6.0, "outcome": "committed"}),
    ("attempts", {"work_id": "w1", "attempt": 2, "iteration": 2, "instance": "loop-agent-1", "started_at": 7.0,
                  "alive_at": 8.0, "current_tool": "bash", "current_tool_at": 8.0}),
    ("decisions", {"id": "d1", "work_id": "w1", "iteration": 1, "kind": "network", "action": '{"command": "curl x"}',
                   "question": "may it?", "status": "pending", "created_at": 3.0}),
    ("decisions", {"id": "d2", "work_id": "w1", "iteration": 1, "kind": "scope", "action": '{"globs": ["a/*"]}',
                   "status": "rejected", "stop_run": 0, "decided_by": "human", "decided_at": 4.0,
                   "checkpoint": "abc", "created_at": 3.5}),
    ("model_calls", {"request_id": "r1", "work_id": "w1", "iteration": 1, "attempt": 1, "instance": "loop-agent-1",
                     "model": "scripted", "input_tokens": 10, "output_tokens": 5, "cost_usd": 0.25, "at": 3.0}),
    ("model_calls", {"request_id": "r2", "work_id": "w1", "iteration": 1, "attempt": 1, "instance": "Eval-Agent-1",
                     "model": "scripted", "input_tokens": 7, "output_tokens": 2, "cost_usd": 0.5, "at": 4.0}),
    ("model_calls", {"request_id": "r3", "work_id": "w3", "iteration": 1, "attempt": 1, "instance": "loop-agent-2",
                     "model": "scripted", "input_tokens": 3, "output_tokens": 1, "cost_usd": 0.125, "at": 2.0}),
    ("transcript", {"work_id": "w1", "attempt": 1, "seq": 1, "iteration": 1, "kind": "prompt", "at": 5.0,
                    "data": '{"text": "go"}'}),
    ("transcript", {"work_id": "w3", "attempt": 1, "seq": 1, "iteration": 1, "kind": "text", "at": 2.0,
                    "data": '{"text": "old"}'}),
    ("preflights", {"work_id": "w2", "outcome": "ready", "checks": "[]", "written_by": "eval-agent-1", "at": 2.5}),
    ("handoffs", {"work_id": "w1", "ending": 0, "done": "half", "remains": "the rest", "learned": "x",
                  "source": "wrapup", "attempt": 1, "written_by": "loop-agent-1", "at": 6.0}),
    ("workspace_locks", {"workspace": "/tmp/ws", "work_id": "w1", "acquired_at": 5.0}),
    ("stop_history", {"work_id": "w3", "seq": 1, "stop_reason": "timeout", "ended_at": 2.0, "iterations": 1,
                      "continued_by": "human", "continued_at": 2.5}),
    ("replays", {"work_id": "w2", "subject": "c1", "subject_kind": "candidate", "source_id": "w3",
                 "relation": "source", "arm": "with", "skill_name": "s1", "skill_text": "do", "created_at": 2.0}),
    ("proposals", {"id": "p1", "fingerprint": "f1", "workspace": "/tmp/ws", "kind": "bug", "source": "tests/x.py",
                   "title": "t", "goal": "fix x", "verify": '["pytest"]', "rank": 1, "status": "proposed",
                   "created_by": "coordinator", "created_at": 1.0, "seen_at": 1.0, "expires_at": 5000.0}),
    ("proposals", {"id": "p2", "fingerprint": "f2", "workspace": "/tmp/ws", "kind": "todo", "source": "a.py",
                   "title": "u", "goal": "do y", "rank": 2, "status": "accepted", "created_by": "coordinator",
                   "created_at": 1.5, "seen_at": 1.5, "expires_at": 900.0, "work_id": "w2"}),
]
ORG_ROWS = [
    ("org_session", {"id": 1, "status": "running", "started_at": 0.5, "updated_at": 999.0, "supervisor_pid": 1}),
    ("role_instances", {"instance": "loop-agent-1", "role": "loop-agent", "status": "ready", "pid": 10,
                        "heartbeat_at": 999.0, "updated_at": 999.0, "restarts": 1}),
    ("role_instances", {"instance": "eval-agent-1", "role": "eval-agent", "status": "ready", "pid": 11,
                        "heartbeat_at": 999.5, "updated_at": 999.5}),
    ("role_instances", {"instance": "curator", "role": "curator", "status": "failed", "updated_at": 9.0,
                        "last_exit": "crashed"}),
    ("attention", {"key": "a1", "kind": "decision_waiting", "subject": "w1", "text": "d1 waits", "created_at": 3.0}),
    ("candidate_batches", {"id": "b1", "status": "open", "created_at": 1.0}),
    ("skill_candidates", {"id": "c1", "name": "s1", "description": "d", "body": "b", "score": 3,
                          "source_notes": '["rn1"]', "status": "pending", "batch_id": "b1", "created_at": 1.0}),
    ("skill_candidates", {"id": "c2", "name": "s2", "status": "approved", "decided_by": "human", "decided_at": 2.0,
                          "created_at": 1.5}),
    ("skills", {"name": "s1", "path": "skills/s1", "candidate_id": "c1", "status": "active", "use_count": 2,
                "created_at": 1.0}),
    ("skills", {"name": "s2", "path": "skills/s2", "status": "retired", "created_at": 1.0}),
    ("raw_notes", {"id": "rn1", "run_id": "w1", "fact": "f", "judgment": "j", "rationale": "r",
                   "applicability": "a", "evidence": '{"kind": "fix", "subject": "a"}', "status": "pending",
                   "created_at": 2.0}),
    ("raw_notes", {"id": "rn2", "run_id": "w3", "fact": "g", "judgment": "k", "rationale": "s",
                   "applicability": "b", "evidence": '{"kind": "outcome"}', "status": "archived",
                   "curated_id": "cn1", "created_at": 2.5}),
    ("curated_notes", {"id": "cn1", "topic": "t", "body": "b", "source_notes": '["rn2"]', "created_at": 2.0,
                       "updated_at": 2.0, "kind": "fix", "tier": "curated", "score": 2}),
    ("replay_plans", {"subject": "c1", "subject_kind": "candidate", "status": "planned", "name": "s1",
                      "skill_text": "do", "items": '["w3"]', "planned_by": "curator", "created_at": 2.0}),
    ("schedules", {"id": "sch1", "name": "nightly", "kind": "every", "rule": '{"seconds": 60}',
                   "request": '{"goal": "g"}', "status": "active", "created_by": "human", "created_at": 1.0,
                   "updated_at": 1.0, "fired": 1, "last_work_id": "w3"}),
    ("peers", {"instance": "eval-agent-9", "host": "h1", "role": "eval-agent", "endpoint": "tcp://127.0.0.1:1",
               "curve_public": "k" * 40, "hmac_key": "m" * 64, "registered_at": 1.0, "updated_at": 1.0}),
    ("role_instances", {"instance": "eval-agent-9", "role": "eval-agent", "status": "ready", "heartbeat_at": 999.0,
                        "updated_at": 999.0}),
    ("events", {"at": 500.0, "actor": "coordinator", "kind": "announce", "data": '{"upto": 3}'}),
    ("events", {"at": 600.0, "actor": "curator", "kind": "retro.skipped", "subject": "w3", "data": '{"ending": 1}'}),
    ("delivery_ledger", {"msg_id": "m1", "recipient": "coordinator", "sender": "human", "kind": "wake",
                         "created_at": 1.0, "recorded_at": 1.0}),
    ("transport_counters", {"instance": "coordinator", "name": "pushed", "value": 3}),
]


def populate(target) -> None:
    """The same rows, written the same way, into the store at ``target`` (migrated here)."""
    migrate(target)

    def wf(actor, instance=None):
        return StateWriter(target, actor, instance, clock=lambda: NOW)

    submit(wf, created_at=1.0, updated_at=1.0, caps={"max_iterations": 5, "max_cost_usd": 2.0})
    assign_and_run(wf)
    with wf(Actor.LOOP_AGENT, "loop-agent-1").transaction() as tx:     # the writer's own iteration numbering
        tx.insert("iterations", {"work_id": "w1", "n": 1, "attempt": 1, "act_status": "ok", "committed_at": 5.0,
                                 "prompt": {"skills": ["s1", "s2"]}, "input_tokens": 10, "checkpoint": "c0ffee",
                                 "tool_calls": [{"name": "bash"}]})
    verdict(wf)
    commit_iteration(wf, n=2)
    verdict(wf, n=2, outcome="fail")
    submit(wf, work_id="w2", workspace="/tmp/ws2", created_at=2.0, updated_at=2.0)
    submit(wf, work_id="w3", created_at=0.5, updated_at=0.5)
    assign_and_run(wf, "w3", "loop-agent-2")
    commit_iteration(wf, "w3", instance="loop-agent-2")
    with wf(Actor.LOOP_AGENT, "loop-agent-2").transaction() as tx:
        end_run(tx, "w3", StopDecision(StopReason.MAX_ITERATIONS, "one iteration, the cap"), ended_at=1.5)
    with wf(Actor.COORDINATOR).transaction() as tx:
        tx.update("work_items", "w2", next_step="replay")
    with wf(Actor.HUMAN).transaction() as tx:
        tx.set_status("work_items", "w2", WorkStatus.WAITING)
    wf(Actor.HUMAN).run_once("key-1", "dismiss", lambda tx: {"ok": True}, args={"id": "w3"})
    wf(Actor.HUMAN).run_once("key-1", "dismiss", lambda tx: {"ok": False}, args={"id": "w3"})   # replayed
    c = connect(target)
    try:
        for table, row in WORK_ROWS + ORG_ROWS:
            cols = ", ".join(row)
            c.execute(f"INSERT INTO {table} ({cols}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))
        c.execute("UPDATE work_items SET origin = 'schedule', origin_id = 'sch1' WHERE id = 'w3'")
        c.execute("UPDATE work_items SET origin = 'replay' WHERE id = 'w2'")
    finally:
        c.close()
    with wf(Actor.SUPERVISOR).transaction() as tx:
        peer_queries.register(tx, instance="eval-agent-9", host="h1", role="eval-agent", endpoint="tcp://127.0.0.1:2",
                              curve_public="k" * 40, hmac_key="m" * 64)
    with wf(Actor.COORDINATOR).transaction() as tx:
        tx.delete("workspace_locks", "/tmp/ws")


# ------------------------------------------------------------------------------------ the queries

ARGS = {"work_id": "w1", "run_id": "w1", "instance": "loop-agent-1", "n": 1, "iteration": 1, "attempt": 1,
        "kind": "network", "name": "s1", "subjects": ["a"], "workspace": "/tmp/ws", "after": 0, "after_id": 0,
        "now": NOW, "since": 0.0, "until": 5000.0, "status": "open", "key": "key-1", "decision_id": "d1",
        "command": "curl x", "limit": 10, "ids": ["w1", "w2"], "id": "w1", "candidate_id": "c1",
        "curated_id": "cn1", "curated_ids": ["cn1"], "note": "rn1", "note_ids": ["rn2", "rn1"],
        "fingerprints": ["f1", "f2"], "sources": ["tests/x.py"], "host": "h1", "instances": ["loop-agent-1"],
        "role": "eval-agent", "request_id": "r1", "retries": 3, "schedule_id": "sch1", "name_or_id": "nightly",
        "subject": "c1", "verdict_id": "v-w1-1-pass", "proposal_id": "p1", "heartbeat_timeout_s": 30.0,
        "cap_usd": 5.0, "budget_usd": 1.0, "before": NOW, "after_iteration": 0, "upto": 10, "all_": True,
        "removed": True, "include_retired": True, "prompts": False, "names": ["s1", "s2"],
        "kinds": ("every", "cron"), "statuses": ("running", "queued"), "stopping_kinds": ("scope",),
        "tables": ("work_items", "events")}
# the same parameter name meaning other things in some functions
ARGS_OF = {
    "state_db.queries.knowledge.raw_notes": {"ids": ["rn1", "rn2"]},
    "state_db.queries.knowledge.curated_notes": {"ids": ["cn1"]},
    "state_db.queries.skills.candidates": {"statuses": ["pending", "approved"]},
    "state_db.queries.decisions.of_work": {"statuses": ("pending", "rejected")},
    "state_db.queries.events.after": {"kinds": ("announce", "retro.skipped")},
    "state_db.queries.work.command_result": {"command": "dismiss"},
}
VARIANTS = {"state_db.queries.cost.rollup": [{"by": by} for by in ("item", "goal", "model", "day")],
            "state_db.queries.schedules.find": [{"name_or_id": "sch1"}]}


def query_functions() -> list:
    modules = [importlib.import_module(f"state_db.queries.{m.name}") for m in pkgutil.iter_modules(queries.__path__)]
    found = []
    for module in [*modules, queries]:
        for name, fn in vars(module).items():
            if name.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != module.__name__:
                continue
            params = list(inspect.signature(fn).parameters.values())
            if params and params[0].name == "conn" and f"{module.__name__}.{name}" not in EXECUTORS:
                found.append((f"{module.__name__}.{name}", fn, params[1:]))
    return found


def calls(qualified: str, params: list) -> tuple[list[tuple[tuple, dict]], list[str]]:
    """The calls to make: with what each function needs, then with every optional argument too;
    and the required parameters no argument is known for."""
    args = {**ARGS, **ARGS_OF.get(qualified, {})}
    missing = [p.name for p in params if p.default is p.empty and p.kind is not p.VAR_POSITIONAL
               and p.kind is not p.VAR_KEYWORD and p.name not in args]
    if missing:
        return [], missing
    made = []
    for full in (False, True):
        pos, kw = [], {}
        for p in params:
            if p.kind is p.VAR_POSITIONAL:
                pos += list(args.get(p.name, ())) if full else []
            elif p.default is not p.empty:
                if full and p.name in args:
                    kw[p.name] = args[p.name]
            elif p.kind is p.KEYWORD_ONLY:
                kw[p.name] = args[p.name]
            else:
                pos.append(args[p.name])
        made.append((tuple(pos), kw))
    for extra in VARIANTS.get(qualified, []):
        made.append(((), {**{p.name: args[p.name] for p in params if p.default is p.empty}, **extra}))
    return made, []


def answer(fn, conn, pos, kw):
    try:
        return plain(fn(conn, *pos, **kw))
    except Exception as exc:  # noqa: BLE001 - an error is an answer to compare
        return f"{type(exc).__name__}: {exc}"


# ------------------------------------------------------------------------------------ the census

def sql_texts(path: Path) -> list[tuple[int, list[str]]]:
    """(line, the text's pieces between its holes) of each SQL text written in ``path``."""
    tree = ast.parse(path.read_text())
    inner = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else HOLE for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inner:
            text = re.sub(r"\{\w*\}", HOLE, node.value)          # a str.format template's fields
        else:
            continue
        if text in store._TX or not SQL.match(text.replace(HOLE, "x")):
            continue                # the transaction words the store answers itself are not statements
        found.append((node.lineno, [" ".join(p.split()) for p in text.split(HOLE) if p.strip()]))
    return found


def ran(pieces: list[str], statements: list[str]) -> bool:
    for sql in statements:
        at = 0
        for piece in pieces:
            at = sql.find(piece, at)
            if at < 0:
                break
            at += len(piece)
        else:
            return True
    return False


@pytest.fixture
def recorded(monkeypatch):
    """Every statement a PostgreSQL connection is given (as written, and as sent), whitespace folded."""
    seen: set[str] = set()
    execute, run = store.PgConnection.execute, store.PgConnection.run

    def recording_execute(self, sql, params=()):
        seen.add(" ".join(sql.split()))
        return execute(self, sql, params)

    def recording_run(self, text, params=None):
        seen.add(" ".join(text.split()))
        return run(self, text, params)

    monkeypatch.setattr(store.PgConnection, "execute", recording_execute)
    monkeypatch.setattr(store.PgConnection, "run", recording_run)
    return seen


def digests(target) -> dict:
    c = connect(target, readonly=True)
    try:
        tables = [t for t, in connect_tables(c)]
        return {t: pg_schema.table_digest(c, t, columns_of(c, t))[:2] for t in tables}
    finally:
        c.close()


def connect_tables(c):
    if store.is_postgres(c):
        return c.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
                         "AND table_name NOT IN ('_store', '_migrations') ORDER BY 1").fetchall()
    return c.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
                     "AND name != '_migrations' ORDER BY 1").fetchall()


def columns_of(c, table: str) -> list[str]:
    if store.is_postgres(c):
        return [r[0] for r in c.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = "
                                        "current_schema() AND table_name = ? ORDER BY column_name", (table,))]
    return sorted(r[1] for r in c.execute(f"PRAGMA table_info({table})"))


def test_every_statement_in_state_db_runs_on_postgresql_and_answers_as_on_sqlite(tmp_path, pg_server, recorded,
                                                                                  monkeypatch):
    monkeypatch.setattr(time, "time", lambda: NOW)
    pg = pg_server.fresh_url()
    stores = [tmp_path / "state.db", pg]
    for target in stores:
        populate(target)
    # the vocabulary's CHECKs re-created when a value is added, and again when it goes
    with pytest.MonkeyPatch.context() as vocabulary:
        vocabulary.setitem(GUARDED, ("work_items", "status"), [*WorkStatus, "archived"])
        assert migrate(pg)["vocabulary"] == ["vocab_work_items_status"]
    assert migrate(pg)["vocabulary"] == ["vocab_work_items_status"]

    # every public query, with what it needs and then with every optional argument, on both stores
    conns = [connect(t, readonly=True) for t in stores]
    unknown, differ, compared = [], [], 0
    for qualified, fn, params in query_functions():
        made, missing = calls(qualified, params)
        if missing:
            unknown.append(f"{qualified}: {missing}")
        for pos, kw in made:
            answers = [answer(fn, c, pos, kw) for c in conns]
            compared += 1
            if answers[0] != answers[1]:
                differ.append((qualified, pos, kw, answers))
    # the views and the snapshot, on both
    for label, view in [("org_view", lambda c: views.org_view(c, now=NOW)),
                        ("run_view", lambda c: views.run_view(c, "w1", now=NOW)),
                        ("snapshot", snapshot.render_markdown)]:
        answers = [view(c) for c in conns]
        if answers[0] != answers[1]:
            differ.append((label, (), {}, answers))
    pg_conn = conns[1]
    pg_conn.execute("BEGIN")                 # a read snapshot (SQLite's deferred BEGIN)
    pg_conn.execute("COMMIT")
    for c in conns:
        c.close()
    assert not unknown, f"queries with no known arguments (add them to ARGS): {unknown}"
    assert not differ, differ
    assert compared > 200

    # retention on both: the same counts, then the same rows in every table
    pruned = [retention.prune(StateWriter(t, Actor.SUPERVISOR, clock=lambda: NOW), events_days=0.001,
                              model_calls_days=0.001, ledger_keep_s=1, now=NOW, dry_run=dry, transcript_days=0.001)
              for dry in (True, False) for t in stores]
    assert pruned[0] == pruned[1] and pruned[2] == pruned[3] and pruned[2]["model_calls"] > 0, pruned
    sqlite_tables, pg_tables = digests(stores[0]), digests(pg)
    assert sqlite_tables == pg_tables

    # a SQLite org, stopped, copied into another PostgreSQL store
    c = connect(stores[0])
    c.execute("UPDATE org_session SET status = 'stopped'")
    c.close()
    copied = pg_schema.copy_from_sqlite(stores[0], pg_server.fresh_url())
    assert copied["verified"] and copied["rows"] > 50

    # the census: every SQL text of state_db/ is among what PostgreSQL ran
    statements = sorted(recorded)
    unrun = []
    for path in sorted((ROOT / "state_db").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in SQLITE_ONLY:
            continue
        for line, pieces in sql_texts(path):
            if any(rel == module and pieces[0].startswith(words) for module, words in NOT_ON_POSTGRES):
                continue
            if not ran(pieces, statements):
                unrun.append(f"{rel}:{line}: {' … '.join(pieces)[:140]}")
    assert not unrun, "SQL in state_db/ that no test ran on PostgreSQL:\n" + "\n".join(unrun)


# the SQL outside state_db/ (the transport's ledger, the coordinator's counters, SQLite's PRAGMAs):
# by opening words -> why PostgreSQL does not run it
OUTSIDE_NOT_ON_POSTGRES = {
    "PRAGMA wal_": "SQLite's WAL checkpoints; the ledger starts its checkpointer only on SQLite",
    "PRAGMA integrity_check": "'org doctor' runs it on state.db only; PostgreSQL's constraints hold its store",
}
OUTSIDE = ("roles", "transport", "knowledge", "skills", "scripts")


def test_the_statements_outside_state_db_run_on_postgresql_too(tmp_path, pg_url, recorded):
    """The delivery ledger and the transport counters write from outside state_db/; each such text
    in the tree runs on both stores here, with the same rows after."""
    from roles.coordinator.attention import _ADD
    from skills.select import _db
    from transport.envelope import Envelope
    from transport.ledger import Ledger

    envelopes = [Envelope(1, f"m{i}", "wake", "human", "coordinator", NOW - i) for i in range(3)]
    stores, answers = [tmp_path / "state.db", pg_url], []
    for target in stores:
        migrate(target)
        ledger = Ledger(target, "coordinator", clock=lambda: NOW, background_checkpoint=False)
        first = [e.id for e in ledger.record(envelopes[:2], flush_counters=True)]
        again = [e.id for e in ledger.record(envelopes, flush_counters=True)]     # two of three seen before
        ledger.counters.add("pushed", 2)
        ledger.flush()
        answers.append((first, again, ledger.prune(keep_s=0)))
        ledger.close()
        with StateWriter(target, Actor.COORDINATOR, clock=lambda: NOW).transaction() as tx:
            for _ in range(2):
                tx.execute(_ADD, ("coordinator", "notify_failed"))
        c = connect(target, readonly=True)
        assert _db(c)
        c.close()
    assert answers[0] == answers[1] == (["m0", "m1"], ["m2"], 0)
    assert digests(stores[0]) == digests(pg_url)
    statements, unrun = sorted(recorded), []
    for root in OUTSIDE:
        for path in sorted((ROOT / root).rglob("*.py")):
            for line, pieces in sql_texts(path):
                if not any(pieces[0].startswith(words) for words in OUTSIDE_NOT_ON_POSTGRES) \
                        and not ran(pieces, statements):
                    unrun.append(f"{path.relative_to(ROOT)}:{line}: {' … '.join(pieces)[:140]}")
    assert not unrun, "SQL outside state_db/ that no test ran on PostgreSQL:\n" + "\n".join(unrun)


# ------------------------------------------------------------------------------------ schema and parameters

def test_every_migration_has_its_postgresql_form():
    """A migration appended without its PostgreSQL form fails here (and is refused by migrate)."""
    text = [name for name, sql in MIGRATIONS if not callable(sql)]
    steps = [name for name, sql in MIGRATIONS if callable(sql)]
    assert list(pg_migrations.FORMS) == text
    assert sorted(pg_schema.STEPS) == sorted(steps)
    for name, form in pg_migrations.FORMS.items():
        assert _split(form), name


def test_a_migration_without_a_postgresql_form_is_refused_and_changes_nothing(pg_url):
    from state_db.kernel.errors import MigrationFailed
    migrate(pg_url)
    with pytest.raises(MigrationFailed, match="no PostgreSQL form"):
        migrate(pg_url, migrations=MIGRATIONS + [("9001_new", "ALTER TABLE events ADD COLUMN at2 REAL;")])
    c = connect(pg_url, readonly=True)
    assert c.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    c.close()


PG_TYPE = {"INTEGER": "bigint", "REAL": "double precision", "FLOAT": "double precision", "TEXT": "text",
           "BLOB": "bytea"}


def test_both_stores_have_the_same_schema(tmp_path, pg_url):
    """Tables, columns (SQLite's declared type as PostgreSQL's 8-byte one), nullability and indexes."""
    migrate(tmp_path / "state.db")
    migrate(pg_url)
    lite, pg = connect(tmp_path / "state.db", readonly=True), connect(pg_url, readonly=True)
    tables = [t for t, in connect_tables(lite)]
    assert tables == [t for t, in connect_tables(pg)]
    for table in tables:
        want = {(r[1], PG_TYPE[r[2].upper()], bool(r[3] or r[5])) for r in lite.execute(f"PRAGMA table_info({table})")}
        have = {(r[0], r[1], r[2] == "NO") for r in pg.execute(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = ?", (table,))}
        assert have == want, table
    lite_indexes = {r[0] for r in lite.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")}
    pg_indexes = {r[0] for r in pg.execute(     # those CREATE INDEX made, not a key constraint's own
        """SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
             JOIN pg_namespace n ON n.oid = i.relnamespace WHERE n.nspname = current_schema()
              AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)""")}
    assert lite_indexes == pg_indexes
    lite.close(), pg.close()


@pytest.mark.parametrize("sql, sent", [
    ("SELECT * FROM t WHERE a = ? AND b = '?' AND c = ?", "SELECT * FROM t WHERE a = $1 AND b = '?' AND c = $2"),
    ("SELECT 'it''s ?', \"odd?col\" FROM t WHERE x = ?", "SELECT 'it''s ?', \"odd?col\" FROM t WHERE x = $1"),
    ("SELECT 1 -- why?\nWHERE a = ? /* and ? */ AND b = ?", "SELECT 1 -- why?\nWHERE a = $1 /* and ? */ AND b = $2"),
    ("SELECT json_extract(action, '$.command') FROM d WHERE x IS NOT DISTINCT FROM ?",
     "SELECT json_extract(action, '$.command') FROM d WHERE x IS NOT DISTINCT FROM $1"),
])
def test_only_the_parameter_markers_change_on_the_way_to_postgresql(sql, sent):
    assert store.numbered(sql) == sent


_TEXT = st.text(alphabet="ab ?'\"-*/\n", max_size=8)
_PIECE = st.one_of(st.just(("?", None)), st.builds(lambda t: ("'" + t.replace("'", "''") + "'", None), _TEXT),
                   st.builds(lambda t: ('"' + t.replace('"', '""') + '"', None), _TEXT),
                   st.builds(lambda t: ("/*" + t.replace("*/", "") + "*/", None), _TEXT),
                   st.builds(lambda t: ("--" + t.replace("\n", "") + "\n", None), _TEXT),
                   st.builds(lambda t: (t, None), st.text(alphabet="ab =,()", max_size=6)))


@given(st.lists(_PIECE, max_size=12))
def test_every_marker_outside_literals_and_comments_is_numbered_and_nothing_else_changes(pieces):
    sql = "".join(p for p, _ in pieces)
    count, want = 0, []
    for piece, _ in pieces:
        if piece == "?":
            count += 1
            want.append(f"${count}")
        else:
            want.append(piece)
    assert store.numbered(sql) == "".join(want)


def test_a_statement_only_sqlite_runs_fails_on_postgresql(pg_url):
    """Nothing translates SQLite's own spellings: PostgreSQL refuses them, as an error callers catch."""
    import sqlite3
    migrate(pg_url)
    c = connect(pg_url)
    for sql in ("INSERT OR IGNORE INTO transport_counters (instance, name, value) VALUES ('a', 'n', 1)",
                "SELECT group_concat(id, ',') FROM work_items",
                "SELECT rowid FROM work_items",
                "SELECT 1 FROM work_items WHERE stop_reason IS ?"):
        with pytest.raises(sqlite3.OperationalError):
            c.execute(sql, (None,) if "?" in sql else ())
    c.close()
