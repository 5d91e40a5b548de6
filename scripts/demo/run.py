"""The offline demos of ``scripts/start-org --demo [fix|learning]``: a real org, the scripted model
reached through the anthropic SDK, watched live.

- ``fix`` (the default): a bundled project with a failing test, fixed in two iterations.
- ``learning``: three similar jobs (three services whose settings.json fails the same check the
  same way twice before it passes) — enough for the curator to write their retros, curate the
  recurring failure into a pattern, propose a skill and open a review batch; the demo waits for
  the batch and says how to review it. Before the batch opens, the candidate is replayed on the
  jobs it came from, with and without it (the demo's scripted model takes the short path when a
  skill is in its prompt), and the demo prints WITH / WITHOUT / Δ. It runs with its own
  thresholds (``LEARNING_THRESHOLDS``, passed to the org it starts as environment overrides) and
  prints them; an org already running (e.g. from ``--demo``) is restarted with them when nothing
  is running on it (``restart_for_learning``). The batch it reports is one holding a candidate
  learned from the runs it just submitted, and each candidate names the runs it came from.

The demos watch the org through the typed queries (the journal, the work items) like any reader.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from skills import candidates as C
from skills.replay import line as replay_line, of_subject as replay_of
from state_db.connection import connect
from state_db.queries import work
from state_db.queries.events import after, last_id
from state_db.queries.replays import source_runs
from state_db.queries.work import Caps

DEMO_DIR = Path(__file__).resolve().parents[2] / "scripts" / "demo"
LEARNING_DIR = DEMO_DIR / "learning"
LEARNING_THRESHOLDS = {"raw_notes_to_consolidate": 3, "notes_per_pattern": 3, "candidates_per_batch": 1}
LEARNING_ENV = {**{f"ORG_{k.upper()}": str(v) for k, v in LEARNING_THRESHOLDS.items()},
                "ORG_LEARNING_REPLAY": "on"}     # the demo's model is scripted: replays cost nothing
LEARNING_CHECK = "python3 validate_config.py"
#: (service, timeout as written, whole seconds)
SERVICES = (("billing", "30s", 30), ("search", "45s", 45), ("mailer", "90s", 90))


def _follow(conn, seen: int, t0: float, out, until) -> int:
    """Narrate the events after ``seen``; returns the last id. ``until(event)`` is told each one."""
    for ev in after(conn, seen):
        seen = ev.id
        from roles.operations.narrate import line_for
        line = line_for(conn, ev)
        if line:
            out(f"  [{time.monotonic() - t0:5.2f}s] {line}")
        until(ev)
    return seen


def run_demo(home, cfg, *, timeout_s: float = 90.0, out=print) -> int:
    from roles.operations.submit import SubmitRequest, submit
    from roles.workbench.sandbox import describe_mode
    from state_db.kernel import config as config_mod
    cfg = config_mod.load(home.config_path)   # as the running org sees it (environment included)

    ws = home.root / "demo" / time.strftime("run-%Y%m%d-%H%M%S")
    shutil.copytree(DEMO_DIR / "project", ws)
    out(f"demo: a small project with a failing test copied to {ws}")
    out(f"demo: agent and verify commands: {describe_mode(cfg)}")
    conn = connect(home.db_path, readonly=True)
    start_event = last_id(conn)
    result = submit(home, cfg, SubmitRequest(
        goal="Make word_count count words separated by any run of whitespace, and 0 for empty text.",
        workspace=str(ws), verify=["python3 -m unittest -q"], caps=Caps(max_iterations=5, budget_tokens=60000),
        backend=f"scripted:{DEMO_DIR / 'script.json'}"))
    work_id = result["id"]
    out(f"demo: caps {result['caps']}; model: scripted (a local Anthropic-compatible server replaying "
        f"scripts/demo/script.json, reached through the anthropic SDK)\n")
    seen, deadline, t0 = start_event, time.monotonic() + timeout_s, time.monotonic()
    ended = []
    while time.monotonic() < deadline and not ended:
        seen = _follow(conn, seen, t0, out, lambda ev: ev.kind == "work_items.ended"
                       and ev.subject == work_id and ended.append(ev))
        time.sleep(0.05)
    item = work.item(conn, work_id)
    conn.close()
    if not ended:
        out(f"\ndemo: {work_id} did not finish within {timeout_s:.0f}s (status {item.status}) — see 'scripts/org logs'")
        return 1
    out(f"\ndemo: done — {work_id} stopped with '{item.stop_reason}', declared by the eval-agent, not the doer.")
    out("  the model was scripted: tokens and cost above are the script's numbers, priced at $0.")
    out(f"  next: 'scripts/org show {work_id}', 'scripts/org diff {work_id}', 'scripts/org status',\n"
        "        'scripts/org logs -f', 'scripts/org stop' (the org keeps running until you stop it)")
    out("  a real model: export ANTHROPIC_API_KEY=… (or ANTHROPIC_BASE_URL=http://… for a compatible local "
        "server) and submit with --backend anthropic")
    return 0 if item.stop_reason == "goal_met" else 1


def _edit(old, new, say: str) -> list[dict]:
    return [{"tool_uses": [{"name": "edit_file", "input": {
                "path": "settings.json", "old_string": f'"timeout": {json.dumps(old)}',
                "new_string": f'"timeout": {json.dumps(new)}'}}]},
            {"text": say}]


def learning_job(root: Path, service: str, timeout: str, seconds: int) -> dict:
    """One job of the learning demo: a workspace and a script that strips the unit (still a string),
    then writes a float, then the int — the same check fails the same way twice, then passes.
    Returns the submit fields (goal, workspace, verify, protect, scope, backend)."""
    ws = root / f"ws-{service}"
    ws.mkdir(parents=True)
    shutil.copy(LEARNING_DIR / "validate_config.py", ws / "validate_config.py")
    (ws / "settings.json").write_text(json.dumps({"service": service, "timeout": timeout, "retries": 3}, indent=2)
                                      + "\n")
    acts = [[{"text": "Let me read the settings first.",
              "tool_uses": [{"name": "read_file", "input": {"path": "settings.json"}}]},
             *_edit(timeout, str(seconds), "Removed the unit from timeout; validate_config.py should accept it.")],
            _edit(str(seconds), float(seconds), "The validator still rejects timeout; I wrote it as a number."),
            _edit(float(seconds), seconds, "timeout is now an integer number of seconds.")]
    # with a skill in its prompt (a replay's 'with' arm, or a later run) the model writes the
    # whole number at once, as a model that read the skill would
    helped = [_edit(timeout, seconds, "The skill says: a whole number of seconds, as an integer.")]
    script = root / f"{service}.script.json"
    script.write_text(json.dumps({"version": 1, "acts": acts,
                                  "when": [{"prompt_contains": "## Skill: ", "acts": helped}]}))
    return {"goal": f"Service {service}: make settings.json pass validate_config.py — the timeout must be a whole "
                    "number of seconds",
            "workspace": str(ws), "verify": [LEARNING_CHECK], "protect": ["validate_config.py"],
            "scope": ["settings.json"],      # the fix is to a settings file: outside the default (code) scope
            "backend": f"scripted:{script}"}


def restart_for_learning(home, running) -> None:
    """An org already running keeps the thresholds it started with; the learning demo needs its
    own, so it restarts the org with them — only when nothing is queued or running on it.
    Returns None (the org is stopped; the caller starts it). Raises OrgError ``demo_org_busy``."""
    from scripts import control
    from state_db.kernel.errors import OrgError
    from state_db.vocab import WorkStatus
    conn = connect(home.db_path, readonly=True)
    try:
        busy = [w.id for w in work.with_status(conn, WorkStatus.QUEUED, WorkStatus.WAITING, WorkStatus.DISPATCHED,
                                               WorkStatus.RUNNING, WorkStatus.PAUSED)]
    finally:
        conn.close()
    if busy:
        raise OrgError(f"the learning demo restarts the org with its own thresholds, but {len(busy)} work item(s) "
                       f"are not ended ({', '.join(busy[:3])})", code="demo_org_busy",
                       hint="let them end (or 'scripts/org cancel ID'), or 'scripts/org stop', then run it again")
    print(f"the org is running (supervisor pid {running[0]}) with its own thresholds; nothing is running on it, "
          "so the learning demo restarts it with the demo's")
    control.request(home, "stop")
    return None


def run_learning_demo(home, cfg, *, timeout_s: float = 90.0, out=print) -> int:
    """Run the learning demo (module docstring); 0 once a review batch is open."""
    from roles.operations.submit import SubmitRequest, submit_many
    from state_db.kernel import config as config_mod
    cfg = config_mod.load(home.config_path)
    root = home.root / "demo" / time.strftime("learning-%Y%m%d-%H%M%S")
    wanted = ", ".join(f"{k} = {v}" for k, v in LEARNING_THRESHOLDS.items())
    have = ", ".join(f"{k} = {cfg[f'knowledge.{k}']}" for k in LEARNING_THRESHOLDS)
    out(f"demo: learning — {len(SERVICES)} similar jobs in {root}; each fails `{LEARNING_CHECK}` the same way twice")
    out(f"demo: curator thresholds for this demo: {wanted} (defaults 5, 3, 5)")
    if have != wanted:
        out(f"demo: this shell's org.toml says {have}; an org started by 'start-org --demo learning' uses the "
            "demo's thresholds, one already running keeps its own")
    conn = connect(home.db_path, readonly=True)
    seen = last_id(conn)
    ids = [done.id for done in submit_many(home, cfg, [SubmitRequest(caps=Caps(max_iterations=5), **learning_job(root, *svc))
                                                      for svc in SERVICES])]
    out(f"demo: submitted {', '.join(ids)}\n")
    deadline, t0, batch = time.monotonic() + timeout_s, time.monotonic(), []

    def ours(ev) -> None:      # a batch holding a candidate learned from this demo's runs
        if ev.kind == "candidate_batches.created" and any(
                set(ids) & set(source_runs(conn, c["source_notes"] or []))
                for c in C.listing(conn, C.LIVE) if c["batch_id"] == ev.subject):
            batch.append(ev.subject)
    while time.monotonic() < deadline and not batch:
        seen = _follow(conn, seen, t0, out, ours)
        time.sleep(0.05)
    ended = work.items(conn, ids)
    if not batch:
        conn.close()
        out(f"\ndemo: no review batch within {timeout_s:.0f}s (runs: "
            + ", ".join(f"{r.id} {r.stop_reason or 'running'}" for r in ended)
            + ") — 'scripts/org knowledge' shows how far the curator got")
        return 1
    cands = sorted((c for c in C.listing(conn, C.LIVE) if c["batch_id"] == batch[0]), key=lambda c: c["id"])
    out(f"\ndemo: batch {batch[0]} is open — {len(cands)} skill candidate(s):")
    for c in cands:
        runs = source_runs(conn, c["source_notes"] or [])
        mine = [r for r in runs if r in ids]
        earlier = [r for r in runs if r not in ids]
        out(f"  {c['id']}  {c['name']}  (score {c['score']}/5)")
        learned = ", ".join(mine) or "none of this demo's runs"
        out(f"    learned from {learned}"
            + (f"; and from earlier runs {', '.join(earlier)}" if earlier else ""))
        out(f"    replayed: {replay_line(replay_of(conn, c['id']))}")
    conn.close()
    first = cands[0]["id"] if cands else "ID"
    out("  review: 'scripts/org candidates list', 'scripts/org candidates show " + first + "',\n"
        "          'scripts/org candidates approve " + first + "' (or reject / defer / edit)")
    out("  see it all: 'scripts/org knowledge' (raw notes → curated → candidates → skills, with the evidence);\n"
        "  an approved skill is carried by later matching runs and can be exported for Claude Code with\n"
        "  'scripts/org skills export NAME --to .claude/skills'")
    return 0
