"""Read-only queries over state.db, with named predicates.

Predicates are SQL fragments over ``work_items`` so callers say *which* items they mean by name
(``ACTIVE``, ``TERMINAL``, ``USER_VISIBLE``, ``AWAITING_HUMAN``) instead of repeating status lists.
"""
from __future__ import annotations

import sqlite3
from typing import Any

import orjson

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

_USAGE = """SELECT COUNT(*) AS calls, COALESCE(SUM(input_tokens),0) AS input_tokens,
                   COALESCE(SUM(output_tokens),0) AS output_tokens,
                   COALESCE(SUM(cache_write_tokens),0) AS cache_write_tokens,
                   COALESCE(SUM(cache_read_tokens),0) AS cache_read_tokens,
                   COALESCE(SUM(cost_usd),0) AS cost_usd FROM model_calls"""


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
        item["iterations"] = conn.execute("SELECT COUNT(*) FROM iterations WHERE work_id = ?",
                                          (item["id"],)).fetchone()[0]
    return items


def work_item(conn: sqlite3.Connection, work_id: str) -> dict | None:
    found = work_items(conn, "id = ?", (work_id,), limit=1)
    return found[0] if found else None


_SUMMARY = _USAGE.replace("COUNT(*) AS calls", "COALESCE(SUM(calls),0) AS calls").replace("model_calls", "usage_summaries")


def org_spend(conn: sqlite3.Connection) -> float:
    """Everything the org has spent, in USD: per-call usage plus what retention folded into
    summaries (the org-wide spend cap must not forget old spend)."""
    return conn.execute("""SELECT (SELECT COALESCE(SUM(cost_usd), 0) FROM model_calls)
                                + (SELECT COALESCE(SUM(cost_usd), 0) FROM usage_summaries)""").fetchone()[0]


def usage(conn: sqlite3.Connection, work_id: str | None = None) -> dict:
    """Tokens and cost, summed from model calls (each counted once, keyed by request id) plus the
    summaries retention folded old calls into."""
    if work_id is None:
        row, old = conn.execute(_USAGE).fetchone(), conn.execute(_SUMMARY).fetchone()
    else:
        row = conn.execute(_USAGE + " WHERE work_id = ?", (work_id,)).fetchone()
        old = conn.execute(_SUMMARY + " WHERE work_id = ?", (work_id,)).fetchone()
    out = {k: row[k] + old[k] for k in row.keys()}
    out["tokens"] = (out["input_tokens"] + out["output_tokens"] + out["cache_write_tokens"]
                     + out["cache_read_tokens"])
    # what the token budget counts: cache reads are left out (roles/loop_agent/backends/base.py)
    out["budget_tokens"] = out["input_tokens"] + out["cache_write_tokens"] + out["output_tokens"]
    return out


def iterations(conn: sqlite3.Connection, work_id: str) -> list[dict]:
    return rows(conn, "SELECT * FROM iterations WHERE work_id = ? ORDER BY n", (work_id,))


def roles(conn: sqlite3.Connection) -> list[dict]:
    return rows(conn, "SELECT * FROM role_instances ORDER BY role, instance")


def pending_decisions(conn: sqlite3.Connection) -> list[dict]:
    return rows(conn, "SELECT * FROM decisions WHERE status = ? ORDER BY created_at",
                (DecisionStatus.PENDING,))


def transport_counters(conn: sqlite3.Connection) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in conn.execute("SELECT instance, name, value FROM transport_counters ORDER BY instance, name"):
        out.setdefault(r["instance"], {})[r["name"]] = r["value"]
    return out


def events(conn: sqlite3.Connection, *, after: int = 0, limit: int = 100, kind: str | None = None) -> list[dict]:
    sql = "SELECT * FROM events WHERE id > ?"
    params: list[Any] = [after]
    if kind:
        sql += " AND kind = ?"
        params.append(kind)
    return rows(conn, sql + " ORDER BY id LIMIT ?", (*params, limit))


def last_event_id(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]


def open_batches(conn: sqlite3.Connection) -> list[dict]:
    return rows(conn, "SELECT * FROM candidate_batches WHERE status = 'open' ORDER BY created_at")


def status(conn: sqlite3.Connection) -> dict:
    """Everything ``org status`` shows, as plain data."""
    counts = {r["status"]: r["n"] for r in conn.execute(
        "SELECT status, COUNT(*) AS n FROM work_items GROUP BY status")}
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

