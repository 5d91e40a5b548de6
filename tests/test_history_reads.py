"""What the org reads per iteration and per dispatch pass does not grow with the work it has
ended: every statement those paths run finds its rows through an index (no full scan of the
history's tables), and the org's usage is a running total equal to the sums it replaces."""
from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path

import pytest

from state_db.connection import connect
from state_db.retention import DAY, prune
from state_db.writer import StateWriter

ROOT = Path(__file__).resolve().parents[1]
HISTORY_TABLES = ("work_items", "iterations", "verdicts", "attempts", "model_calls", "preflights")

pytestmark = pytest.mark.timeout(120)


def _with_history(home, items: int = 300) -> None:
    sys.path.insert(0, str(ROOT))
    from bench.workload import add_history
    add_history(home, items)
    h = StateWriter(home.db_path, "human")
    now = time.time()
    with h.transaction() as tx:
        for wid in ("live-1", "live-2"):
            tx.insert("work_items", {"id": wid, "goal": "g", "workspace": f"/ws/{wid}", "backend": "anthropic",
                                     "status": "queued", "created_by": "t", "created_at": now, "updated_at": now})
    h.close()


def _statements(conn: sqlite3.Connection, call) -> list[str]:
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    try:
        call()
    finally:
        conn.set_trace_callback(None)
    return [s for s in seen if s.lstrip().upper().startswith(("SELECT", "WITH"))]


def _scans(conn: sqlite3.Connection, sql: str) -> list[str]:
    """The history tables ``sql`` reads whole (SQLite's ``SCAN <table>`` without an index)."""
    plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql)]
    return [step for step in plan if step.startswith("SCAN ") and "USING" not in step
            and step.split()[1] in HISTORY_TABLES]


def test_the_reads_of_every_iteration_and_dispatch_pass_use_an_index(org_home):
    import importlib

    from roles.coordinator import dispatch
    # the modules, not the package's functions of the same names
    iterations, replays, usage, verdicts, work = (importlib.import_module(f"state_db.queries.{m}") for m in
                                                  ("iterations", "replays", "usage", "verdicts", "work"))

    _with_history(org_home)
    conn = connect(org_home.db_path, readonly=True)
    co = StateWriter(org_home.db_path, "coordinator")
    paths = {
        "what the eval-agent must verify": lambda: verdicts.due(conn),
        "the org's spend (before every model call)": lambda: usage.org_spend(conn),
        "a workspace's toolchain (every sandboxed command)": lambda: work.toolchain_of_workspace(conn, "/ws/live-1"),
        "the least recently used loop-agents": lambda: iterations.last_started_by_instance(conn, ["loop-agent-1"]),
        "replays still running": lambda: replays.active_count(conn),
    }
    found = {}
    for name, call in paths.items():
        for sql in _statements(conn, call):
            if _scans(conn, sql):
                found[name] = (sql, _scans(conn, sql))
    # the coordinator's whole pass, on its own connection
    found.update({f"dispatch pass: {sql[:80]}": (sql, _scans(co.conn, sql))
                  for sql in _statements(co.conn, lambda: dispatch.reconcile(co, heartbeat_timeout_s=30,
                                                                              spend_cap_usd=50.0))
                  if _scans(co.conn, sql)})
    co.close()
    conn.close()
    assert not found, "reads that scan the ended history:\n" + "\n".join(f"{k}: {v}" for k, v in found.items())


def test_the_running_usage_total_equals_the_sums_it_replaces_through_writes_pruning_and_removal(org_home):
    conn = connect(org_home.db_path, readonly=True)

    def summed() -> float:
        return conn.execute("""SELECT (SELECT COALESCE(SUM(cost_usd), 0) FROM model_calls)
                                    + (SELECT COALESCE(SUM(cost_usd), 0) FROM usage_summaries)""").fetchone()[0]

    from state_db.queries.usage import _CALLS, _SUMMARIES, Usage, of_work, org_spend

    def totals_hold() -> bool:
        """The org's totals (one row) against the sums of both tables: counts exact, cost to 1e-12."""
        want = (Usage.from_row(conn.execute(_CALLS).fetchone()) + Usage.from_row(conn.execute(_SUMMARIES).fetchone()))
        got = of_work(conn)
        return (got.calls, got.tokens, got.budget_tokens) == (want.calls, want.tokens, want.budget_tokens) \
            and got.cost_usd == pytest.approx(want.cost_usd, abs=1e-12) == org_spend(conn)

    assert org_spend(conn) == 0.0 and totals_hold()
    old = time.time() - 40 * DAY
    h = StateWriter(org_home.db_path, "human", clock=lambda: old)
    with h.transaction() as tx:
        tx.insert("work_items", {"id": "w1", "goal": "g", "workspace": "/ws/w1", "backend": "anthropic",
                                 "status": "queued", "created_by": "t", "created_at": old, "updated_at": old})
    la = StateWriter(org_home.db_path, "loop-agent", "loop-agent-1")
    with la.transaction() as tx:
        for i in range(7):
            tx.insert("model_calls", {"request_id": f"r{i}", "work_id": "w1", "model": "m", "input_tokens": 10,
                                      "output_tokens": 1, "cost_usd": 0.1 * (i + 1), "at": old})
    assert org_spend(conn) == pytest.approx(summed(), abs=1e-12) and summed() == pytest.approx(2.8)
    assert totals_hold() and of_work(conn).calls == 7
    with pytest.raises(Exception):                      # a refused row leaves the total as it was
        with la.transaction() as tx:
            tx.insert("model_calls", {"request_id": "r0", "work_id": "w1", "model": "m", "input_tokens": 1,
                                      "output_tokens": 1, "cost_usd": 9.0, "at": old})
    assert org_spend(conn) == pytest.approx(2.8)
    with h.transaction() as tx:
        tx.set_status("work_items", "w1", "ended", stop_reason="cancelled")
    prune(StateWriter(org_home.db_path, "supervisor"), events_days=30, model_calls_days=30, ledger_keep_s=600)
    assert conn.execute("SELECT COUNT(*) FROM model_calls").fetchone()[0] == 0      # folded into a summary
    assert org_spend(conn) == pytest.approx(summed(), abs=1e-12) == pytest.approx(2.8)
    assert totals_hold() and of_work(conn).calls == 7
    raw = sqlite3.connect(org_home.db_path)
    raw.execute("UPDATE usage_summaries SET cost_usd = cost_usd + 1.0")
    raw.commit()
    assert org_spend(conn) == pytest.approx(summed(), abs=1e-12) == pytest.approx(3.8) and totals_hold()
    raw.execute("DELETE FROM usage_summaries")
    raw.commit()
    raw.close()
    assert org_spend(conn) == pytest.approx(0.0, abs=1e-12) and totals_hold() and of_work(conn).calls == 0
    for w in (h, la):
        w.close()
    conn.close()


def test_the_curator_looks_for_runs_without_a_retro_only_among_those_that_ended_since_its_last_pass(org_home):
    """Its first pass reads every ending once; each later one only the endings since (an index
    range), so a run that ends later, or is continued and ends again, is still found."""
    from roles.curator.pipeline import RETRO_MARGIN_S, Pipeline, Thresholds
    from state_db.queries.knowledge import runs_without_retro

    _with_history(org_home, items=40)
    conn = connect(org_home.db_path, readonly=True)
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    runs_without_retro(conn, 50, since=time.time() - 600)
    conn.set_trace_callback(None)
    assert not _scans(conn, seen[-1]), seen[-1]
    now = [time.time()]
    pipe = Pipeline(StateWriter(org_home.db_path, "curator", "curator"), Thresholds(),
                    org_home.root / "skills", clock=lambda: now[0])
    first = pipe.retros(limit=100)
    assert len(first) + len(runs_without_retro(conn, 100)) >= 40 and runs_without_retro(conn, 100) == []
    assert pipe._retros_since == now[0] - RETRO_MARGIN_S
    h = StateWriter(org_home.db_path, "human", clock=lambda: now[0] + 5)
    with h.transaction() as tx:
        tx.set_status("work_items", "live-1", "ended", stop_reason="cancelled")
    now[0] += 10
    pipe.retros(limit=100)                      # its retro, or its skip, is written
    assert runs_without_retro(conn, 100) == []
    h.close()
    conn.close()
