"""Applying retention to an org home: state.db bookkeeping and the files beside it."""
from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

# A run that ended this long ago has no loop-agent left that could still append to its history
# (one notices the end within a step, and an act is bounded by the model's timeouts).
PENDING_QUIET_S = 3600.0


def collect(home, cfg, *, dry_run: bool, history: bool, older_than_days: float, actor: str = "human") -> dict:
    from state_db.retention import DAY, prune
    from state_db.writer import StateWriter
    from transport.envelope import Limits

    writer = StateWriter(home.db_path, actor)
    try:
        out = prune(writer, events_days=cfg["retention.events_days"], model_calls_days=cfg["retention.model_calls_days"],
                    ledger_keep_s=Limits.from_config(cfg.data["transport"]).ledger_keep_s, dry_run=dry_run)
        now = time.time()
        rows = writer.conn.execute("SELECT id, ended_at, workspace FROM work_items WHERE status = 'ended'").fetchall()
        ended = {r["id"]: r["ended_at"] for r in rows}
        workspaces = {r["id"]: r["workspace"] for r in rows}
    finally:
        writer.close()
    files = {"eval_snapshots": 0, "histories": 0, "quarantine": 0, "cli_homes": 0, "histories_written_out": 0}
    eval_dir = home.root / "eval"
    for d in eval_dir.iterdir() if eval_dir.is_dir() else []:
        if d.name in ended and now - ended[d.name] > cfg["retention.eval_snapshots_days"] * DAY:
            files["eval_snapshots"] += 1
            if not dry_run:
                shutil.rmtree(d, ignore_errors=True)
    # the command backend's private CLI homes (session transcripts: prompts and tool output)
    by_dir = {re.sub(r"[^A-Za-z0-9_.-]", "_", wid): at for wid, at in ended.items()}
    for d in (home.run_dir / "cli").glob("*/*"):
        at = by_dir.get(d.name)
        if d.is_dir() and at is not None and now - at > cfg["retention.eval_snapshots_days"] * DAY:
            files["cli_homes"] += 1
            if not dry_run:
                shutil.rmtree(d, ignore_errors=True)
    # objects and refs a killed loop-agent left pending in an ended run's history: readers see
    # them, but git's own files would lag for good, as no run of that item starts again
    from roles.workspace.history import WorkspaceHistory, has_pending
    for wid, at in ended.items():
        git_dir = home.history_dir / f"{wid}.git"
        if now - at > PENDING_QUIET_S and has_pending(git_dir):
            files["histories_written_out"] += 1
            if not dry_run:
                try:
                    WorkspaceHistory(git_dir, Path(workspaces[wid]), defer=True).flush_pending()
                except Exception as exc:  # noqa: BLE001 - readers still see them; the next pass retries
                    import structlog
                    structlog.get_logger("retention").warning("history_not_written_out", work_id=wid,
                                                              error=str(exc), next="the next gc retries")
    if history:
        for wid, at in ended.items():
            git_dir = home.history_dir / f"{wid}.git"
            if git_dir.is_dir() and now - at > older_than_days * DAY:
                files["histories"] += 1
                if not dry_run:
                    shutil.rmtree(git_dir, ignore_errors=True)
    quarantine = home.outbox_dir / ".quarantine"
    for f in quarantine.rglob("*") if quarantine.is_dir() else []:
        if f.is_file() and now - f.stat().st_mtime > cfg["retention.quarantine_days"] * DAY:
            files["quarantine"] += 1
            if not dry_run:
                f.unlink(missing_ok=True)
    return {**out, **files}
