"""Retention keeps totals and live runs intact while pruning old bookkeeping."""
from __future__ import annotations

import time

import pytest

from scripts.cli import main as cli
from state_db import queries
from state_db.connection import connect
from state_db.kernel.errors import NotAllowed
from state_db.retention import DAY, prune
from state_db.writer import StateWriter


def _seed(home, old: float):
    h = StateWriter(home.db_path, "human", clock=lambda: old)
    for wid, status in (("old", "queued"), ("live", "queued")):
        with h.transaction() as tx:
            tx.insert("work_items", {"id": wid, "goal": "g", "workspace": f"/ws/{wid}", "backend": "anthropic",
                                     "status": status, "created_by": "t", "created_at": old, "updated_at": old})
    with h.transaction() as tx:
        tx.set_status("work_items", "old", "ended", stop_reason="cancelled")
    la = StateWriter(home.db_path, "loop-agent", "loop-agent-1")
    with la.transaction() as tx:
        for i, wid in enumerate(["old", "old", "live"]):
            tx.insert("model_calls", {"request_id": f"r{i}", "work_id": wid, "model": "m", "input_tokens": 100,
                                      "output_tokens": 10, "cost_usd": 0.5, "at": old})
        tx.execute("INSERT INTO delivery_ledger(msg_id, recipient, recorded_at) VALUES ('m1', 'x', ?)", (old,))
    h.close()
    la.close()


def test_prune_folds_usage_into_summaries_and_keeps_live_runs(org_home):
    old = time.time() - 40 * DAY
    _seed(org_home, old)
    conn = connect(org_home.db_path, readonly=True)
    before_total, before_old = queries.usage(conn), queries.usage(conn, "old")
    w = StateWriter(org_home.db_path, "supervisor")
    result = prune(w, events_days=30, model_calls_days=30, ledger_keep_s=600)
    assert result["model_calls"] == 2 and result["runs_summarized"] == 1 and result["ledger_ids"] == 1
    assert queries.usage(conn) == before_total and queries.usage(conn, "old") == before_old
    assert conn.execute("SELECT COUNT(*) FROM model_calls WHERE work_id='live'").fetchone()[0] == 1
    live_events = conn.execute("SELECT COUNT(*) FROM events WHERE subject='live'").fetchone()[0]
    assert live_events >= 1, "events of a live run were pruned"
    assert conn.execute("SELECT COUNT(*) FROM events WHERE kind='journal_pruned'").fetchone()[0] == 1
    assert conn.execute("SELECT COUNT(*) FROM work_items").fetchone()[0] == 2
    conn.close()


def test_the_org_spend_cap_remembers_spend_that_retention_folded_into_summaries(org_home):
    """$1.00 of the old run's calls are pruned into a summary; the org has still spent $1.50, so a
    $1.20 cap ends the queued run (org_limit) after pruning exactly as before it."""
    from roles.coordinator.dispatch import reconcile
    _seed(org_home, time.time() - 40 * DAY)
    prune(StateWriter(org_home.db_path, "supervisor"), events_days=30, model_calls_days=30, ledger_keep_s=600)
    conn = connect(org_home.db_path, readonly=True)
    assert conn.execute("SELECT COALESCE(SUM(cost_usd), 0) FROM model_calls").fetchone()[0] == 0.5
    assert queries.org_spend(conn) == 1.5
    co = StateWriter(org_home.db_path, "coordinator")
    assert reconcile(co, heartbeat_timeout_s=10, spend_cap_usd=1.2)["capped"] == ["live"]
    co.close()
    assert conn.execute("SELECT stop_reason FROM work_items WHERE id='live'").fetchone()[0] == "org_limit"
    conn.close()


def test_only_supervisor_or_human_prunes(org_home):
    with pytest.raises(NotAllowed):
        prune(StateWriter(org_home.db_path, "loop-agent", "loop-agent-1"), events_days=1, model_calls_days=1,
              ledger_keep_s=1)


def test_org_gc_dry_run_changes_nothing(org_home, capsys):
    _seed(org_home, time.time() - 40 * DAY)
    conn = connect(org_home.db_path, readonly=True)
    n = conn.execute("SELECT COUNT(*) FROM model_calls").fetchone()[0]
    assert cli.main(["gc", "--dry-run"]) == 0
    assert "would prune" in capsys.readouterr().out
    assert conn.execute("SELECT COUNT(*) FROM model_calls").fetchone()[0] == n
    assert cli.main(["gc", "--json"]) == 0
    assert conn.execute("SELECT COUNT(*) FROM model_calls").fetchone()[0] == 1
    conn.close()


def test_org_gc_removes_the_cli_homes_of_ended_runs_only(org_home, capsys):
    _seed(org_home, time.time() - 40 * DAY)
    homes = {wid: org_home.run_dir / "cli" / "loop-agent-1" / wid for wid in ("old", "live")}
    for d in homes.values():
        (d / "home" / ".claude" / "projects").mkdir(parents=True)
        (d / "home" / ".claude" / "projects" / "session.jsonl").write_text('{"prompt": "..."}\n')
    assert cli.main(["gc", "--dry-run", "--json"]) == 0
    assert '"cli_homes": 1' in capsys.readouterr().out
    assert all(d.exists() for d in homes.values())
    assert cli.main(["gc", "--json"]) == 0
    assert not homes["old"].exists() and homes["live"].exists()


def test_a_joined_host_removes_its_own_copies_of_ended_runs_and_prunes_no_shared_rows(org_home):
    """On a joined host the rows are the shared store's (the coordinator host prunes them); its
    own files are not anyone else's to remove: the eval-agent's history copies and snapshots of
    runs that ended long enough ago go, those of live runs stay."""
    from roles.operations.retention import collect
    from state_db.kernel.config import load_config

    _seed(org_home, time.time() - 40 * DAY)
    made = {}
    for wid in ("old", "live"):
        made[wid] = (org_home.root / "eval-history" / f"{wid}.git", org_home.root / "eval" / wid)
        for d in made[wid]:
            (d / "objects").mkdir(parents=True)
            (d / "objects" / "pack").write_text("x")
    conn = connect(org_home.db_path, readonly=True)
    counts = lambda: [conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]   # noqa: E731
                      for t in ("model_calls", "delivery_ledger", "events")]
    before = counts()
    result = collect(org_home, load_config(org_home), dry_run=True, history=False, older_than_days=0,
                     actor="supervisor", rows=False)
    assert (result["eval_histories"], result["eval_snapshots"]) == (1, 1) and "events" not in result
    assert all(d.exists() for pair in made.values() for d in pair)
    collect(org_home, load_config(org_home), dry_run=False, history=False, older_than_days=0, actor="supervisor",
            rows=False)
    assert not any(d.exists() for d in made["old"]) and all(d.exists() for d in made["live"])
    assert counts() == before
    conn.close()


def test_org_gc_on_a_joined_host_says_it_prunes_no_rows(org_home, capsys):
    _seed(org_home, time.time() - 40 * DAY)
    org_home.config_path.write_text('[hosts]\ncoordinator = "tcp://127.0.0.1:7200"\n'
                                    f'coordinator_key = "{"A" * 40}"\n')
    conn = connect(org_home.db_path, readonly=True)
    n = conn.execute("SELECT COUNT(*) FROM model_calls").fetchone()[0]
    assert cli.main(["gc"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pruned: no rows (a joined host") and "eval history copies" in out, out
    assert conn.execute("SELECT COUNT(*) FROM model_calls").fetchone()[0] == n
    conn.close()
