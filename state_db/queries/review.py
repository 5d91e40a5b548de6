"""What the eval-agent's review reads: its own usage per work item, a doer's claim that the goal
is impossible, and the review settings a work item was submitted with.

Review calls are ``model_calls`` rows written by an eval-agent instance (``eval-agent-<n>``), with
the work id and the iteration they judged and no attempt: they count toward the work item's and
the org's spend, and never toward the doer's budgets (``DOER_CALLS``).
"""
from __future__ import annotations

import sqlite3

import orjson

from state_db.vocab import Actor

# model_calls rows that are the eval-agent's (its reviews), and those that are not (lower(): as
# SQLite's LIKE, on PostgreSQL too)
REVIEW_CALLS = f"lower(COALESCE(instance, '')) LIKE '{Actor.EVAL_AGENT}%'"
DOER_CALLS = f"lower(COALESCE(instance, '')) NOT LIKE '{Actor.EVAL_AGENT}%'"
CLAIM_TOOL = "declare_impossible"      # the doer's tool (roles/loop_agent/tools.py)


def review_usage(conn: sqlite3.Connection, work_id: str) -> dict:
    """The eval-agent's review calls for ``work_id``: {calls, input_tokens, output_tokens,
    cache_write_tokens, cache_read_tokens, cost_usd, budget_tokens} (budget tokens: input, cache
    write and output, as the doer's token budget counts them)."""
    row = conn.execute(f"""SELECT COUNT(*) AS calls, COALESCE(SUM(input_tokens), 0) AS input_tokens,
                                  COALESCE(SUM(output_tokens), 0) AS output_tokens,
                                  COALESCE(SUM(cache_write_tokens), 0) AS cache_write_tokens,
                                  COALESCE(SUM(cache_read_tokens), 0) AS cache_read_tokens,
                                  COALESCE(SUM(cost_usd), 0) AS cost_usd
                             FROM model_calls WHERE work_id = ? AND {REVIEW_CALLS}""", (work_id,)).fetchone()
    out = dict(row)
    out["budget_tokens"] = out["input_tokens"] + out["cache_write_tokens"] + out["output_tokens"]
    return out


def claim_of(tool_calls) -> str | None:
    """The reason of the doer's last successful ``declare_impossible`` call among an iteration's
    recorded tool calls (the column's JSON text or its list), or None."""
    calls = orjson.loads(tool_calls) if isinstance(tool_calls, (str, bytes)) else (tool_calls or [])
    reason = None
    for call in calls:
        if isinstance(call, dict) and call.get("name") == CLAIM_TOOL and call.get("ok"):
            given = call.get("input")
            reason = str(given.get("reason", "")) if isinstance(given, dict) else ""
    return reason


def work_review(conn: sqlite3.Connection, work_id: str) -> dict:
    """The review settings ``work_id`` was submitted with ({} when none: no review of passes)."""
    row = conn.execute("SELECT review FROM work_items WHERE id = ?", (work_id,)).fetchone()
    return orjson.loads(row["review"]) if row is not None and row["review"] else {}


def reviews(conn: sqlite3.Connection, work_id: str) -> list[dict]:
    """Every review of ``work_id``'s verdicts, oldest first: the review's fields plus
    ``iteration`` and ``outcome`` (the verdict's)."""
    out = []
    for r in conn.execute("""SELECT iteration, outcome, review FROM verdicts
                              WHERE work_id = ? AND review IS NOT NULL ORDER BY iteration, at""", (work_id,)):
        out.append({**orjson.loads(r["review"]), "iteration": r["iteration"], "outcome": r["outcome"]})
    return out


def pending_decision(conn: sqlite3.Connection, work_id: str, kind: str) -> str | None:
    """The id of ``work_id``'s pending decision of ``kind``, or None."""
    row = conn.execute("SELECT id FROM decisions WHERE work_id = ? AND kind = ? AND status = 'pending'",
                       (work_id, kind)).fetchone()
    return row["id"] if row else None
