"""``org gc``: apply retention now (the supervisor also does it hourly)."""
from __future__ import annotations

from scripts.cli.output import add_json, emit_json, home_of

NAME = "gc"
HELP = ("prune old bookkeeping (journal, per-call usage, ledger, snapshots, quarantine, CLI homes, stale "
        "CLI wakes in outbox/); "
        "--history drops shadow histories")


def add_arguments(p) -> None:
    p.add_argument("--dry-run", action="store_true", help="count what would go, change nothing")
    p.add_argument("--history", action="store_true",
                   help="also delete the shadow history of runs ended before --older-than days ('org diff' stops working for them)")
    p.add_argument("--older-than", type=float, default=30.0, help="with --history: days since the run ended (default 30)")
    add_json(p)


def run(args) -> int:
    from roles.operations.retention import collect
    from state_db.kernel import config as config_mod

    home = home_of(args).require()
    cfg = config_mod.load_config(home)
    # a joined host's rows are the shared store's (the coordinator host prunes them): its own files only
    joined = bool(cfg.hosts.coordinator)
    result = collect(home, cfg, dry_run=args.dry_run, history=args.history, older_than_days=args.older_than,
                     rows=not joined)
    if args.json:
        emit_json(result)
    else:
        verb = "would prune" if args.dry_run else "pruned"
        rows = ("no rows (a joined host: the coordinator host prunes the shared store), " if joined else
                f"{result['events']} journal events, {result['model_calls']} model-call rows "
                f"({result['runs_summarized']} runs summarized), {result['ledger_ids']} ledger ids, "
                f"{result['transcript_entries']} transcript entries, ")
        print(f"{verb}: {rows}{result['eval_snapshots']} eval snapshots, {result['eval_histories']} eval history "
              f"copies, {result['histories']} histories, {result['quarantine']} quarantined files, "
              f"{result['cli_homes']} CLI homes, {result['cli_outbox']} stale CLI wakes in outbox/")
    return 0
