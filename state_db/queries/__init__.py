"""The read model of state.db: every query the org asks, one module per subject.

The subject modules return frozen dataclasses, their JSON columns decoded once:

- ``work``: ``WorkItem`` with its ``Caps`` (the one parser of the caps JSON), workspace locks,
  stop history, idempotent results;
- ``iterations``: ``Iteration``, ``Attempt``;
- ``verdicts``: ``Verdict``, ``Preflight``, ``latest_eval_verdict`` (the one place that says which
  verdict counts) and what the eval-agent still owes (``due``);
- ``usage``: ``Usage``, ``ModelCall``, ``org_spend`` (summarised usage included);
- ``decisions``: ``Decision``;
- ``processes``: ``Session``, ``RoleInstance``, transport counters;
- ``events``: the journal (``Event``) and ``Attention`` rows;
- ``knowledge``, ``skills``, ``loop``, ``review``, ``schedules``, ``proposals``: the learning
  pipeline, the loop's waits and hand-offs, the eval-agent's review, standing orders.

``base`` holds what they share: ``loads`` (a JSON column as data), ``columns`` (a row's values
for a dataclass) and ``plain`` (typed results as JSON data, for ``--json``, the dashboard, MCP).

Roles, knowledge, skills, the CLI and transport ask these functions; no ``SELECT`` is written
outside state_db/ (tests and benchmarks may read raw SQL to check what was stored):
tests/test_read_model.py fails when one is.

This module keeps the plain-data views ``org status --json`` and the dashboard print
(``status``, ``work_items``, ``usage``, ``iterations``, ``events`` …, nested dicts ready for JSON)
and named predicates: SQL fragments over ``work_items`` so callers say *which* items they mean
(``ACTIVE``, ``TERMINAL``, ``USER_VISIBLE``, ``AWAITING_HUMAN``) instead of repeating status
lists. Three of those functions share their name with a subject module (``usage``,
``iterations``, ``events``): the name here is the function; import the typed functions from the
module itself (``from state_db.queries.usage import org_spend``). The subject modules are
imported first, below, so a later import of one never replaces the function of the same name.
"""
from __future__ import annotations

import sqlite3
from typing import Any

import orjson

# the subject modules, loaded before the functions below take three of their names
from state_db.queries import decisions, events as _events, iterations as _iterations, processes  # noqa: F401
from state_db.queries import usage as _usage, verdicts, work  # noqa: F401
from state_db.queries.base import loads, plain  # noqa: F401
from state_db.queries.usage import org_spend  # noqa: F401
from state_db.vocab import DecisionStatus, WorkStatus

ACTIVE = f"status != '{WorkStatus.ENDED}'"
TERMINAL = f"status = '{WorkStatus.ENDED}'"
RUNNING = f"status IN ('{WorkStatus.DISPATCHED}', '{WorkStatus.RUNNING}')"
WAITING = f"status IN ('{WorkStatus.QUEUED}', '{WorkStatus.WAITING}')"
AWAITING_HUMAN = (f"(status = '{WorkStatus.PAUSED}' OR id IN (SELECT work_id FROM decisions "
                  f"WHERE status = '{DecisionStatus.PENDING}'))")
USER_VISIBLE = "1 = 1"

PREDICATES = {"active": ACTIVE, "terminal": TERMINAL, "running": RUNNING, "waiting": WAITING,
              "awaiting-human": AWAITING_HUMAN, "all": USER_VISIBLE}


def rows(conn: sqlite3.Connection, sql: str, params: Any = ()) -> list[dict]:
    return [dict(r) for r in conn.execute(sql, params).fetchall()]


def session(conn: sqlite3.Connection) -> dict | None:
    row = conn.execute("SELECT * FROM org_session WHERE id = 1").fetchone()
    return dict(row) if row else None


def work_items(conn: sqlite3.Connection, predicate: str = USER_VISIBLE, params: tuple = (),
               limit: int = 200) -> list[dict]:
    items = rows(conn, f"SELECT * FROM work_items WHERE {predicate} ORDER BY created_at DESC LIMIT ?",
                 (*params, limit))
    for item in items:
        for col in ("verify", "protect", "caps"):
            item[col] = orjson.loads(item[col])
        item.update(usage(conn, item["id"]))
        item["iterations"] = _iterations.count(conn, item["id"])
    return items


def work_item(conn: sqlite3.Connection, work_id: str) -> dict | None:
    found = work_items(conn, "id = ?", (work_id,), limit=1)
    return found[0] if found else None


def usage(conn: sqlite3.Connection, work_id: str | None = None) -> dict:
    """Tokens and cost as plain data (``usage.Usage.as_dict``): model calls, each counted once,
    plus the summaries retention folded old calls into."""
    return _usage.of_work(conn, work_id).as_dict()


def iterations(conn: sqlite3.Connection, work_id: str) -> list[dict]:
    """The iterations of ``work_id`` as plain data (``iterations.of_work``)."""
    return plain(_iterations.of_work(conn, work_id))


def roles(conn: sqlite3.Connection) -> list[dict]:
    """Role instances as plain data (``processes.role_instances``)."""
    return plain(processes.role_instances(conn))


def pending_decisions(conn: sqlite3.Connection) -> list[dict]:
    """Decisions waiting for a human as plain data (``decisions.pending``)."""
    return plain(decisions.pending(conn))


def transport_counters(conn: sqlite3.Connection) -> dict[str, dict[str, int]]:
    return processes.transport_counters(conn)


def events(conn: sqlite3.Connection, *, after: int = 0, limit: int = 100, kind: str | None = None) -> list[dict]:
    """Journal entries after ``after`` (of ``kind``) as plain data (``events.after``)."""
    return plain(_events.after(conn, after, *((kind,) if kind else ()), limit=limit))


def table_counts(conn: sqlite3.Connection, tables: tuple[str, ...]) -> dict[str, int]:
    """Rows in each of ``tables`` (names from the schema, never from input)."""
    return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables}


def last_event_id(conn: sqlite3.Connection) -> int:
    return _events.last_id(conn)


def open_batches(conn: sqlite3.Connection) -> list[dict]:
    return rows(conn, "SELECT * FROM candidate_batches WHERE status = 'open' ORDER BY created_at")


def status(conn: sqlite3.Connection) -> dict:
    """Everything ``org status`` shows, as plain data."""
    counts = work.status_counts(conn)
    return {
        "session": session(conn),
        "roles": roles(conn),
        "work": {"counts": counts, "active": work_items(conn, ACTIVE, limit=50),
                 "recent_ended": work_items(conn, TERMINAL, limit=10)},
        "usage": usage(conn),
        "pending_decisions": pending_decisions(conn),
        "open_batches": open_batches(conn),
        "transport": transport_counters(conn),
        "last_event_id": last_event_id(conn),
    }

