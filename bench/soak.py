"""Soak run: an org that keeps getting work, with retention applied, keeps a bounded footprint.

Usage: ``bench/soak.py --json [--seconds S] [--gc-every G] [--keep-history]`` (default run ≤ 45 s).

A real org (2 loop-agents, scripted model) gets a steady stream of small work items (the
workload of ``bench/chaos.py``; a few in flight at a time, each on a fresh workspace outside the
org home). org.toml sets a tiny retention: journal events and per-call usage rows of ended runs
older than about two seconds, eval snapshots at once, ledger ids past a 5 s message age, role logs
rotated at 8 kB. Every ``G`` seconds ``roles.operations.retention.collect`` runs as ``org gc``
does — with ``history=True`` and ``older_than_days=0``, i.e. the shadow histories of ended runs
are dropped on request too (``--keep-history`` leaves them, and shows how they grow).

Every second the footprint of the org home is sampled by part: state.db, its WAL (+ SHM), logs,
the scripted server's request log, history, eval, outbox (+ quarantine), other; and, from
SQLite's dbstat, the pages of state.db holding the durable record (work items, iterations,
verdicts, attempts, decisions, knowledge, usage summaries, idempotency keys), which retention
keeps by design. The *managed* footprint is the total less that record, the WAL (bounded by
SQLite's auto-checkpoint; its own target) and the scripted request log (never rotated). After a
warm-up (``--warmup``, 15 s: role logs reach their rotation size, the first prunes free pages
that later writes reuse) the samples are cut in thirds: bounded when the last third's maximum
of the managed footprint is at most 1.2 × the first third's. The record's growth per ended item
and the total's growth are reported beside it. Also checked: usage totals survive pruning
(per-call rows + summaries = what the iterations recorded, per run). Exit 1 when a target fails.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import workload  # noqa: E402

RETENTION = """[retention]
events_days = 0.00002
model_calls_days = 0.00002
eval_snapshots_days = 0
quarantine_days = 0
[logs]
max_bytes = 8192
backups = 1
"""
TRANSPORT = "max_age_s = 5\nclock_skew_s = 1\n"   # ledger ids kept 7 s
BOUND = 1.2
IN_FLIGHT = 4


def du(path: Path) -> int:
    """Bytes of the regular files under ``path`` (files vanishing meanwhile are skipped)."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except FileNotFoundError:
                pass
    return total


# What retention keeps by design (the org's durable record): work items, iterations, verdicts,
# attempts, decisions, knowledge, skills, usage summaries, idempotency keys.
BOOKKEEPING_TABLES = {"events", "model_calls", "delivery_ledger", "transport_counters"}


def records_bytes(home) -> int | None:
    """Bytes of state.db pages holding the durable record (every table and index but the
    bookkeeping that retention prunes), from SQLite's dbstat; None if dbstat is missing."""
    import sqlite3
    try:
        conn = sqlite3.connect(f"file:{home.db_path}?mode=ro", uri=True, timeout=10)
        try:
            rows = conn.execute("""SELECT m.tbl_name, SUM(s.pgsize) FROM dbstat s JOIN sqlite_master m
                                     ON m.name = s.name GROUP BY m.tbl_name""").fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return sum(size for table, size in rows if table not in BOOKKEEPING_TABLES)


def footprint(home) -> dict:
    parts = {"state_db": du(home.db_path) if home.db_path.exists() else 0,
             "state_db_wal": sum(du(home.root / f"state.db{s}") for s in ("-wal", "-shm")
                                 if (home.root / f"state.db{s}").exists()),
             "logs": du(home.logs_dir) - scripted_log_bytes(home), "scripted_log": scripted_log_bytes(home),
             "history": du(home.history_dir), "eval": du(home.root / "eval"),
             "outbox": du(home.outbox_dir)}
    parts["other"] = du(home.root) - sum(parts.values())
    parts["total"] = sum(parts.values())
    records = records_bytes(home)
    parts["records"] = records
    parts["managed"] = parts["total"] - (records or 0) - parts["state_db_wal"] - parts["scripted_log"]
    return parts


def scripted_log_bytes(home) -> int:
    return sum(du(p) for p in home.logs_dir.glob("scripted-*.jsonl"))


def thirds(values: list[int]) -> tuple[int, int]:
    """Max of the first and of the last third of ``values``."""
    third = max(1, len(values) // 3)
    return max(values[:third]), max(values[-third:])


def bounded(samples: list[dict], items_ended: int, warmup_s: float) -> dict:
    """The footprint retention manages must not grow. Set apart: the durable record (grows with
    the work done; reported per ended item), the WAL (bounded by SQLite's auto-checkpoint, about
    4 MB; its own target) and the scripted model server's request log (not rotated)."""
    steady = [s for s in samples if s["t"] >= warmup_s] or samples
    first, last = thirds([s["managed"] for s in steady])
    total_first, total_last = thirds([s["total"] for s in steady])
    records = [s["records"] for s in samples if s["records"] is not None]
    return {"managed_first_third_max_bytes": first, "managed_last_third_max_bytes": last,
            "growth_ratio": round(last / first, 3) if first else None, "bounded": last <= BOUND * first,
            "total_first_third_max_bytes": total_first, "total_last_third_max_bytes": total_last,
            "total_growth_ratio": round(total_last / total_first, 3) if total_first else None,
            "records_bytes_per_item": round((records[-1] - records[0]) / items_ended) if records and items_ended
            else None,
            "wal_max_bytes": max(s["state_db_wal"] for s in samples),
            "scripted_log_bytes": samples[-1]["scripted_log"]}


_TOKENS = "COALESCE(SUM(input_tokens + output_tokens + cache_write_tokens + cache_read_tokens), 0)"


def usage_conserved(home) -> dict:
    """Per ended run whose attempts all committed: tokens its iterations recorded vs what its
    per-call rows and its usage summary still hold after pruning (they must be equal)."""
    rows = workload.query(home, f"""
        SELECT w.id, (SELECT {_TOKENS} FROM iterations WHERE work_id = w.id) AS recorded,
               (SELECT {_TOKENS} FROM model_calls WHERE work_id = w.id) AS calls,
               (SELECT {_TOKENS} FROM usage_summaries WHERE work_id = w.id) AS summary
          FROM work_items w WHERE w.status = 'ended'
           AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.work_id = w.id AND a.outcome != 'committed')""")
    off = [r["id"] for r in rows if r["recorded"] != r["calls"] + r["summary"]]
    return {"runs_checked": len(rows), "runs_summarized": sum(1 for r in rows if r["summary"]),
            "usage_mismatched_runs": len(off), "usage_conserved": not off and bool(rows)}


def soak(root: Path, seconds: float, gc_every: float, history: bool, seed: int, warmup_s: float) -> dict:
    from roles.operations.retention import collect
    from scripts import control

    rng = random.Random(seed)
    home, cfg = workload.new_org(root, 2, RETENTION, TRANSPORT)
    control.start_background(home, timeout_s=60)
    template = workload.make_template(root / "template")
    submitted: list[str] = []
    samples: list[dict] = []
    pruned: dict = {}
    t0 = time.monotonic()
    next_sample = next_gc = t0
    try:
        while time.monotonic() - t0 < seconds:
            open_items = workload.unfinished(home, submitted)
            for _ in range(IN_FLIGHT - len(open_items)):
                spec = workload.ItemSpec("pass", rng.randint(1, 3), rng.randint(0, 1))
                n = len(submitted)
                submitted.append(workload.submit_item(home, cfg, template, root / "ws" / f"s{n:05d}",
                                                      workload.write_script(root / "scripts", spec), spec))
            now = time.monotonic()
            if now >= next_gc:
                got = collect(home, cfg, dry_run=False, history=history, older_than_days=0, actor="human")
                for k, v in got.items():
                    if isinstance(v, int) and not isinstance(v, bool):
                        pruned[k] = pruned.get(k, 0) + v
                next_gc = now + gc_every
                for ws in _ended_workspaces(home, root):        # workspaces live outside the org home
                    shutil.rmtree(ws, ignore_errors=True)
            if now >= next_sample:
                samples.append({"t": round(now - t0, 1), **footprint(home)})
                next_sample = now + 1.0
            time.sleep(0.1)
    finally:
        control.request(home, "stop", force=True, timeout_s=60)
    ended = len(submitted) - len(workload.unfinished(home, submitted))
    figures = {"seconds": round(time.monotonic() - t0, 1), "warmup_s": warmup_s, "items_submitted": len(submitted),
               "items_ended": ended,
               "history_pruned": history, "pruned": pruned, **bounded(samples, ended, warmup_s), **usage_conserved(home),
               "final": samples[-1] if samples else None,
               "samples": samples}
    return figures


def _ended_workspaces(home, root: Path) -> list[Path]:
    rows = workload.query(home, "SELECT workspace FROM work_items WHERE status = 'ended'")
    return [Path(r["workspace"]) for r in rows if Path(r["workspace"]).is_dir()
            and Path(r["workspace"]).is_relative_to(root / "ws")]


WAL_MAX = 8 * 2**20     # twice SQLite's default auto-checkpoint (1000 pages of 4 kB)
TARGETS = {"bounded": "== true", "growth_ratio": f"<= {BOUND}", "wal_max_bytes": f"<= {WAL_MAX}",
           "usage_conserved": "== true", "items_ended": ">= 20"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--seconds", type=float, default=36.0, help="how long the org keeps getting work")
    p.add_argument("--gc-every", type=float, default=2.0, help="seconds between retention passes")
    p.add_argument("--warmup", type=float, default=15.0,
                   help="seconds before the comparison starts (log rotation and the first prunes reach their "
                        "steady state; a 240 s run stays flat after it)")
    p.add_argument("--keep-history", action="store_true", help="do not drop ended runs' shadow histories")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", action="store_true", help="keep the org home (path printed)")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # run the cleanup below when stopped
    from bench.common import quiet_logs
    quiet_logs()
    root = Path(tempfile.mkdtemp(prefix="lo-"))
    try:
        figures = soak(root, args.seconds, args.gc_every, not args.keep_history, args.seed, args.warmup)
    finally:
        from state_db.kernel.home import OrgHome
        workload.kill_everything(OrgHome(root / "org"))
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    figures["home"] = str(root) if args.keep else None
    from bench.common import finish
    return finish(figures, TARGETS, {
        "bounded": figures["bounded"] is True,
        "growth_ratio": figures["growth_ratio"] is not None and figures["growth_ratio"] <= BOUND,
        "wal_max_bytes": figures["wal_max_bytes"] <= WAL_MAX,
        "usage_conserved": figures["usage_conserved"] is True,
        "items_ended": figures["items_ended"] >= 20}, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
