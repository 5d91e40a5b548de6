"""Applying retention to an org home: state.db bookkeeping and the files beside it."""
from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

from state_db.queries.work import with_status
from state_db.vocab import StopReason, WorkStatus

# A wake a CLI left in the outbox (the coordinator was down) that nobody took within this long is
# only noise: the coordinator reconciles from state.db at every start and every few seconds, so
# the write it announced was seen long ago; and the receiver refuses it as expired anyway.
CLI_OUTBOX_STALE_S = 600.0


def stale_cli_outbox(home, *, now: float | None = None, older_than_s: float = CLI_OUTBOX_STALE_S) -> list[Path]:
    """Outbox files (``outbox/<recipient>/*.msg``) sent by a CLI (human) instance, older than
    ``older_than_s``. The sender is read from the file, unauthenticated: only to explain and
    clean up, never to act on. Returns their paths, oldest first."""
    import orjson

    from state_db.vocab import Actor
    from transport.kinds import BadInstance, role_of
    from transport.outbox import SUFFIX

    now = time.time() if now is None else now
    found = []
    root = home.outbox_dir
    for f in root.glob(f"[!.]*/*{SUFFIX}") if root.is_dir() else []:
        try:
            age = now - f.stat().st_mtime
            if age <= older_than_s:
                continue
            sender = orjson.loads(f.read_bytes()).get("sender")
            if role_of(sender) == Actor.HUMAN:
                found.append((f.stat().st_mtime, f))
        except (OSError, orjson.JSONDecodeError, AttributeError, BadInstance):
            continue                # gone meanwhile, or not a message a CLI wrote
    return [f for _, f in sorted(found)]


def collect(home, cfg, *, dry_run: bool, history: bool, older_than_days: float, actor: str = "human",
            rows: bool = True) -> dict:
    """Prune old rows (``rows``) and remove the files of runs that ended long enough ago: eval
    snapshots and a joined eval-agent's history copies (``eval/<id>``, ``eval-history/<id>.git``,
    after ``retention.eval_snapshots_days``), the command backend's CLI homes, stale CLI outbox
    files, quarantined messages, and with ``history`` the histories themselves. A joined host
    passes ``rows=False``: the rows are the shared store's, pruned by the coordinator host; the
    files are its own. Returns the counts (``dry_run``: what would go)."""
    from state_db.retention import DAY, prune
    from state_db.writer import StateWriter
    from transport.envelope import Limits

    writer = StateWriter(home.db_path, actor)
    try:
        out = prune(writer, events_days=cfg.retention.events_days, model_calls_days=cfg.retention.model_calls_days,
                    ledger_keep_s=Limits.from_config(cfg.data["transport"]).ledger_keep_s,
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
    for f in stale_cli_outbox(home, now=time.time()):
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
