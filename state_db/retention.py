"""Retention: keep a long-running org's disk footprint bounded without losing what matters.

Only bookkeeping of *ended* runs is pruned: journal events older than the retention (a
``journal_pruned`` event keeps their counts by kind), per-call usage rows (folded into one
``usage_summaries`` row per run first, in the same transaction, so totals never change), and
delivery-ledger ids past the maximum message age, and the transcripts of runs ended longer ago
than ``transcript_days`` (what the doer said and ran, the bulkiest rows a run leaves). Work items,
iterations, verdicts, decisions and knowledge are never pruned here.
"""
from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

from state_db.kernel.errors import NotAllowed
from state_db.queries.work import with_status
from state_db.rules import RETENTION_WRITERS
from state_db.vocab import StopReason, WorkStatus
from state_db.writer import StateWriter

DAY = 86400.0


def prune(writer: StateWriter, *, events_days: float, model_calls_days: float, ledger_keep_s: float,
          now: float | None = None, dry_run: bool = False, transcript_days: float | None = None) -> dict:
    """Prune in one transaction; returns counts. ``dry_run`` counts without deleting."""
    if writer.actor not in RETENTION_WRITERS:
        raise NotAllowed(writer.actor, "prune state.db")
    now = now or time.time()
    ev_cut, mc_cut = now - events_days * DAY, now - model_calls_days * DAY
    ended_before = "SELECT id FROM work_items WHERE status = 'ended' AND ended_at < ?"
    with writer.transaction(render=False) as tx:
        c = tx.conn
        kinds = {r[0]: r[1] for r in c.execute(
            """SELECT kind, COUNT(*) FROM events WHERE at < ? AND kind != 'announce'
                 AND (subject IS NULL OR subject NOT IN (SELECT id FROM work_items WHERE status != 'ended'))
               GROUP BY kind""", (ev_cut,))}
        runs = [r[0] for r in c.execute(ended_before + " AND id IN (SELECT work_id FROM model_calls WHERE at < ?)",
                                        (mc_cut, mc_cut))]
        calls = c.execute(f"SELECT COUNT(*) FROM model_calls WHERE at < ? AND work_id IN ({ended_before})",
                          (mc_cut, mc_cut)).fetchone()[0]
        ledger = c.execute("SELECT COUNT(*) FROM delivery_ledger WHERE recorded_at < ?", (now - ledger_keep_s,)).fetchone()[0]
        tr_cut = None if transcript_days is None else now - transcript_days * DAY
        entries = 0 if tr_cut is None else c.execute(
            f"SELECT COUNT(*) FROM transcript WHERE work_id IN ({ended_before})", (tr_cut,)).fetchone()[0]
        result = {"events": sum(kinds.values()), "model_calls": calls, "runs_summarized": len(runs),
                  "ledger_ids": ledger, "transcript_entries": entries, "dry_run": dry_run}
        if dry_run:
            return result
        for wid in runs:
            # retention's own statements: guarded by RETENTION_WRITERS above, inside this transaction
            c.execute("""INSERT INTO usage_summaries(work_id, calls, input_tokens, output_tokens, cache_write_tokens,
                                                     cache_read_tokens, cost_usd, pruned_at)
                         SELECT work_id, COUNT(*), SUM(input_tokens), SUM(output_tokens), SUM(cache_write_tokens),
                                SUM(cache_read_tokens), SUM(cost_usd), ? FROM model_calls WHERE work_id = ? AND at < ?
                         GROUP BY work_id
                         ON CONFLICT(work_id) DO UPDATE SET calls = usage_summaries.calls + excluded.calls,
                           input_tokens = usage_summaries.input_tokens + excluded.input_tokens,
                           output_tokens = usage_summaries.output_tokens + excluded.output_tokens,
                           cache_write_tokens = usage_summaries.cache_write_tokens + excluded.cache_write_tokens,
                           cache_read_tokens = usage_summaries.cache_read_tokens + excluded.cache_read_tokens,
                           cost_usd = usage_summaries.cost_usd + excluded.cost_usd, pruned_at = excluded.pruned_at""",
                      (now, wid, mc_cut))
            c.execute("DELETE FROM model_calls WHERE work_id = ? AND at < ?", (wid, mc_cut))
        c.execute("""DELETE FROM events WHERE at < ? AND kind != 'announce'
                      AND (subject IS NULL OR subject NOT IN (SELECT id FROM work_items WHERE status != 'ended'))""",
                  (ev_cut,))
        # keep the newest announcement: it carries the coordinator's cursor
        c.execute("""DELETE FROM events WHERE kind = 'announce' AND at < ?
                      AND id < (SELECT MAX(id) FROM events WHERE kind = 'announce')""", (ev_cut,))
        c.execute("DELETE FROM delivery_ledger WHERE recorded_at < ?", (now - ledger_keep_s,))
        if entries:
            c.execute(f"DELETE FROM transcript WHERE work_id IN ({ended_before})", (tr_cut,))
        if kinds or runs or ledger or entries:
            tx.journal("journal_pruned", None, {"events_by_kind": kinds, **result})
    return result


def collect(home, cfg, *, dry_run: bool, history: bool, older_than_days: float, actor: str,
            rows: bool, ledger_keep_s: float, stale_outbox: list[Path]) -> dict:
    """Prune old rows (``rows``) and remove the files of runs that ended long enough ago: eval
    snapshots and a joined eval-agent's history copies (``eval/<id>``, ``eval-history/<id>.git``,
    after ``retention.eval_snapshots_days``), the command backend's CLI homes, the stale CLI
    outbox files given (``stale_outbox``), quarantined messages, and with ``history`` the
    histories themselves. A joined host passes ``rows=False``: the rows are the shared store's,
    pruned by the coordinator host; the files are its own. ``ledger_keep_s``: how long delivery
    ledger ids are kept (the transport's limits). Returns the counts (``dry_run``: what would go).

    Both the human's ``org gc`` (``roles/operations/retention``) and the supervisor's automatic
    retention call it: it sits under both."""
    writer = StateWriter(home.db_path, actor)
    try:
        out = prune(writer, events_days=cfg.retention.events_days, model_calls_days=cfg.retention.model_calls_days,
                    ledger_keep_s=ledger_keep_s,
                    dry_run=dry_run, transcript_days=cfg.retention.transcript_days) if rows else {}
        now = time.time()
        rows = with_status(writer.conn, WorkStatus.ENDED)
        ended = {r.id: r.ended_at for r in rows}
        # a forged run's checkpoints are the evidence of what the doer did: kept for review
        forged = {r.id for r in rows if r.stop_reason == StopReason.EVIDENCE_FORGED}
    finally:
        writer.close()
    files = {"eval_snapshots": 0, "eval_histories": 0, "histories": 0, "quarantine": 0, "cli_homes": 0,
             "cli_outbox": 0}
    for f in stale_outbox:
        files["cli_outbox"] += 1
        if not dry_run:
            f.unlink(missing_ok=True)
    eval_dir = home.root / "eval"
    for d in eval_dir.iterdir() if eval_dir.is_dir() else []:
        if d.name in ended and now - ended[d.name] > cfg.retention.eval_snapshots_days * DAY:
            files["eval_snapshots"] += 1
            if not dry_run:
                shutil.rmtree(d, ignore_errors=True)
    # a joined eval-agent's copies of the coordinator host's histories (roles.eval_agent.process)
    for d in (home.root / "eval-history").glob("*.git"):
        at = ended.get(d.name.removesuffix(".git"))
        if d.is_dir() and at is not None and now - at > cfg.retention.eval_snapshots_days * DAY:
            files["eval_histories"] += 1
            if not dry_run:
                shutil.rmtree(d, ignore_errors=True)
    # the command backend's private CLI homes (session transcripts: prompts and tool output)
    by_dir = {re.sub(r"[^A-Za-z0-9_.-]", "_", wid): at for wid, at in ended.items()}
    for d in (home.run_dir / "cli").glob("*/*"):
        at = by_dir.get(d.name)
        if d.is_dir() and at is not None and now - at > cfg.retention.eval_snapshots_days * DAY:
            files["cli_homes"] += 1
            if not dry_run:
                shutil.rmtree(d, ignore_errors=True)
    if history:
        for wid, at in ended.items():
            git_dir = home.history_dir / f"{wid}.git"
            if git_dir.is_dir() and now - at > older_than_days * DAY and wid not in forged:
                files["histories"] += 1
                if not dry_run:
                    shutil.rmtree(git_dir, ignore_errors=True)
    quarantine = home.outbox_dir / ".quarantine"
    for f in quarantine.rglob("*") if quarantine.is_dir() else []:
        if f.is_file() and now - f.stat().st_mtime > cfg.retention.quarantine_days * DAY:
            files["quarantine"] += 1
            if not dry_run:
                f.unlink(missing_ok=True)
    return {**out, **files}
