"""The offline demo shown by ``scripts/start-org --demo``: a real org, a bundled project with a
failing test, the scripted model reached through the anthropic SDK, watched live."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from state_db.connection import connect

DEMO_DIR = Path(__file__).resolve().parents[2] / "scripts" / "demo"


def run_demo(home, cfg, *, timeout_s: float = 90.0, out=print) -> int:
    from roles.operations.narrate import line_for
    from roles.operations.submit import SubmitRequest, submit
    from roles.sandbox import describe_mode
    from state_db import config as config_mod
    cfg = config_mod.load(home.config_path)   # as the running org sees it (environment included)

    ws = home.root / "demo" / time.strftime("run-%Y%m%d-%H%M%S")
    shutil.copytree(DEMO_DIR / "project", ws)
    out(f"demo: a small project with a failing test copied to {ws}")
    out(f"demo: agent and verify commands: {describe_mode(cfg)}")
    conn = connect(home.db_path, readonly=True)
    start_event = conn.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]
    result = submit(home, cfg, SubmitRequest(
        goal="Make word_count count words separated by any run of whitespace, and 0 for empty text.",
        workspace=str(ws), verify=["python3 -m unittest -q"], max_iterations=5, budget_tokens=60000,
        backend=f"scripted:{DEMO_DIR / 'script.json'}"))
    work_id = result["id"]
    out(f"demo: caps {result['caps']}; model: scripted (a local Anthropic-compatible server replaying "
        f"scripts/demo/script.json, reached through the anthropic SDK)\n")
    seen, deadline, t0 = start_event, time.monotonic() + timeout_s, time.monotonic()
    ended = None
    while time.monotonic() < deadline and ended is None:
        for ev in conn.execute("SELECT * FROM events WHERE id > ? ORDER BY id", (seen,)).fetchall():
            seen = ev["id"]
            line = line_for(conn, dict(ev))
            if line:
                out(f"  [{time.monotonic() - t0:5.2f}s] {line}")
            if ev["kind"] == "work_items.ended" and ev["subject"] == work_id:
                ended = ev
        time.sleep(0.05)
    item = conn.execute("SELECT status, stop_reason FROM work_items WHERE id = ?", (work_id,)).fetchone()
    conn.close()
    if ended is None:
        out(f"\ndemo: {work_id} did not finish within {timeout_s:.0f}s (status {item['status']}) — see 'scripts/org logs'")
        return 1
    out(f"\ndemo: done — {work_id} stopped with '{item['stop_reason']}', declared by the eval-agent, not the doer.")
    out("  the model was scripted: tokens and cost above are the script's numbers, priced at $0.")
    out(f"  next: 'scripts/org show {work_id}', 'scripts/org diff {work_id}', 'scripts/org status',\n"
        "        'scripts/org logs -f', 'scripts/org stop' (the org keeps running until you stop it)")
    out("  a real model: export ANTHROPIC_API_KEY=… (or ANTHROPIC_BASE_URL=http://… for a compatible local "
        "server) and submit with --backend anthropic")
    return 0 if item["stop_reason"] == "goal_met" else 1
