"""``org doctor``: check the org home; exit 0 healthy, 1 warnings, 2 errors."""
from __future__ import annotations

import os
import sqlite3
import time

from roles.supervisor import procs
from scripts.cli.output import add_json, emit_json, home_of
from state_db.kernel import config as config_mod
from state_db.connection import connect
from state_db.kernel.errors import StateError
from state_db.migrations import check_version
from state_db.queries.events import last_at as last_event_at, last_id as last_event_id
from state_db.queries.processes import session as org_session
from state_db.schema import MIGRATIONS
from state_db.snapshot import snapshot_event_id
from state_db.store import describe

NAME = "doctor"
HELP = "check integrity, schema, pid files, outbox, snapshot and sandbox; exit 0 ok / 1 warnings / 2 errors"
STALE_OUTBOX_S = 30.0


def add_arguments(p) -> None:
    add_json(p)


def run(args) -> int:
    home = home_of(args)
    source = ("--home" if getattr(args, "home", None) else "ORG_HOME" if os.environ.get("ORG_HOME")
              else "the default: .org/ in the loop-org checkout")
    findings = [{"level": "ok", "check": "home", "detail": f"{home.root} (from {source})"}] + diagnose(home)
    worst = max((2 if f["level"] == "error" else 1 if f["level"] == "warning" else 0) for f in findings)
    if args.json:
        emit_json({"exit": worst, "findings": findings})
    else:
        for f in findings:
            print(f"{f['level']:<7} {f['check']:<12} {f['detail']}")
    return worst


def diagnose(home, now: float | None = None) -> list[dict]:
    now = now or time.time()
    out: list[dict] = []

    def add(level, check, detail):
        out.append({"level": level, "check": check, "detail": detail})

    try:
        cfg = config_mod.load_config(home)
        add("ok", "config", f"{home.config_path} valid")
    except StateError as exc:
        cfg = None
        add("error", "config", f"[{exc.code}] {exc}")
    from state_db.kernel.credentials import exposed
    loose = exposed(home)
    for path, mode in loose:
        add("warning", "secret files", f"{path} is {mode:04o}: other users of this machine can read what it "
                                       f"holds — 'chmod 600 {path}'")
    if not loose:
        add("ok", "secret files", "every file holding a secret is readable by its owner only")
    if not home.exists():
        add("error", "state.db", f"no state.db at {home.db_path} — start the org with scripts/start-org")
        return out
    try:
        conn = connect(home.db_path, readonly=True)
    except (StateError, sqlite3.Error) as exc:
        add("error", "state.db", f"cannot open: {exc}")
        return out
    try:
        if home.store_url:
            add("ok", "integrity", f"PostgreSQL store {describe(home.store_url)}: its own constraints hold it")
        else:
            result = conn.execute("PRAGMA integrity_check").fetchone()[0]
            add("ok" if result == "ok" else "error", "integrity", result)
        try:
            version = check_version(conn)
            level = "ok" if version == len(MIGRATIONS) else "warning"
            add(level, "schema", f"version {version} of {len(MIGRATIONS)}"
                + ("" if level == "ok" else " — start the org to migrate"))
        except StateError as exc:
            add("error", "schema", f"[{exc.code}] {exc}")
            return out
        session = org_session(conn)
        running = bool(session and session.status in ("running", "suspending"))
        last_event = last_event_id(conn)
        last_at = last_event_at(conn)
    finally:
        conn.close()

    stale = []
    for pidfile in sorted(home.run_dir.glob("*.pid")) if home.run_dir.is_dir() else []:
        info = procs.read_pidfile(pidfile)
        if info is None or not procs.is_alive(*info):
            stale.append(pidfile.name)
    add("warning" if stale else "ok", "pid files",
        f"stale: {', '.join(stale)} — 'org stop' or remove them" if stale else "no stale pid files")

    from roles.operations.retention import CLI_OUTBOX_STALE_S, stale_cli_outbox
    cli_left = stale_cli_outbox(home, now=now)
    stray = []
    if home.outbox_dir.is_dir():
        for folder in home.outbox_dir.iterdir():
            if folder.is_dir() and not folder.name.startswith("."):
                for f in folder.iterdir():
                    if f not in cli_left and (not running or now - f.stat().st_mtime > STALE_OUTBOX_S):
                        stray.append(f"{folder.name}/{f.name}")
    add("warning" if stray else "ok", "outbox",
        f"{len(stray)} undelivered file(s), e.g. {stray[0]} — they are delivered when the recipient starts"
        if stray else "no stray outbox files")
    if cli_left:
        oldest = (now - cli_left[0].stat().st_mtime) / 60
        add("warning", "cli outbox",
            f"{len(cli_left)} wake(s) the CLI left in outbox/ over {CLI_OUTBOX_STALE_S / 60:.0f} min ago "
            f"(oldest {oldest:.0f} min, e.g. {cli_left[0].parent.name}/{cli_left[0].name}): written while the "
            "coordinator was down; nothing waits on them (the coordinator reads every write from state.db "
            "when it starts) — 'org gc' removes them")
    else:
        add("ok", "cli outbox", "no stale wakes left by the CLI")

    snap = home.snapshots_dir / "org-state.md"
    seen = snapshot_event_id(snap)
    if last_event and (seen is None or seen < last_event) and now - last_at > 5:
        add("warning", "snapshot", f"snapshots/org-state.md is behind state.db (event {seen} < {last_event}); "
            "it is re-rendered on the next change")
    else:
        add("ok", "snapshot", "up to date")

    if cfg is not None:
        from roles.workbench.sandbox import describe_mode
        mode = describe_mode(cfg)
        add("warning" if mode.startswith(("agent commands refused", "unsandboxed")) else "ok", "sandbox", mode)
        if mode.startswith("sandbox:"):
            from roles.workbench.sandbox import exposed
            for path, reason in exposed(cfg, home):
                add("ok", "sandbox view", f"{path}: {reason}")
    return out
