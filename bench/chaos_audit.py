"""Checking a chaos run after the fact: state.db, its journal, the shadow histories and the
scripted servers' logs must tell one consistent story. Each figure's definition is in
``DEFINITIONS`` (printed with the figures)."""
from __future__ import annotations

import sqlite3
import subprocess
from collections import Counter
from pathlib import Path

import orjson

from state_db.vocab import StopReason

DEFINITIONS = {
    "lost_items": "submitted (submit returned an id) but, after the org settled, not a work item with status "
                  "ended and a stop reason",
    "iterations_committed_twice": "(work_id, n) pairs committed more than once: duplicate rows in iterations, "
                                  "more than one iterations.created journal event, or more than one attempt "
                                  "with outcome committed for the same iteration",
    "usage_counted_twice": "request ids counted more than once in model_calls, plus served requests (scripted "
                           "logs, event step) whose request id occurs more than once in model_calls",
    "usage_without_served_request": "model_calls rows whose request id the scripted servers never served",
    "iteration_usage_mismatches": "committed iterations whose recorded tokens differ from the sum of the "
                                  "model_calls of the attempt that committed them",
    "acts_replayed_without_reset": "committed iterations n whose checkpoint (iterations.checkpoint, read from "
                                   "the shadow history) does not hold trail.txt == the lines it<i>, i = 1..n, of "
                                   "the committed iterations whose first tool call (run_command 'echo it<i> >> "
                                   "trail.txt') succeeded, each once and in order: an attempt that started on a "
                                   "workspace still holding a discarded attempt's changes shows a line that no "
                                   "committed act wrote, or a line twice",
    "tool_errors": "failed tool calls recorded in committed iterations, by code (the scripts' tools never fail "
                   "in a healthy org)",
    "checks_not_run": "verify checks in eval-agent verdicts that never ran (no exit code, not timed out), e.g. "
                      "the sandbox could not be set up; the verdict then blames the doer for the machine",
    "unexpected_stop_reasons": "items whose stop reason is not the one their script leads to (item kind -> "
                               "reason): a sign that something other than the script decided the run",
    "runs_without_stop_reason": "work items with status ended whose stop_reason is missing or outside the "
                                "closed set, plus ended items without a work_items.ended journal event",
    "iteration_gaps": "work items whose committed iteration numbers are not exactly 1..max",
    "replayed_acts": "attempts that did not commit (discarded by a crash, suspend or cut) and were followed "
                     "by another attempt of the same iteration: how often a replay was exercised",
    "gated_actions_run_twice": "gated items whose gate.log (each run of the action appends one line; the "
                               "benchmark never approves an action twice) holds more than one line, in the "
                               "workspace or in the run's final checkpoint",
    "gated_actions_lost": "decisions approved or edited but never executed by the end (status approved, edited "
                          "or executing), plus executed ones whose line is missing from gate.log in the final "
                          "checkpoint of a run that went on after it (its effect was not kept)",
    "paused_runs_stuck": "work items still paused at the end with no pending decision (nothing left that a "
                         "human could do would wake them)",
    "elapsed_undercounted_runs": "work items whose elapsed_s is below the sum of their attempts' spans: "
                                 "started_at to ended_at for an attempt that closed itself, to alive_at (its "
                                 "last model response) for one discarded after a crash",
}
# Per attempt, for the two clocks (spans are wall-clock rows, elapsed time is monotonic). An
# attempt's span also holds the reset, prompt and checkpoint around its act, which the act clock
# leaves out; the verdict waits that elapsed time holds cover that many times over (the smallest
# margin seen at --items 120 was +0.044 s for a whole run).
SPAN_SLACK_S = 0.005


def _rows(conn, sql, params=()):
    return [dict(r) for r in conn.execute(sql, params)]


def scripted_log(logs_dir: Path) -> dict:
    """Request ids served (event step) and acts started (event act) by every scripted server.
    A line cut by a kill -9 is skipped and counted."""
    served: Counter = Counter()
    acts = broken = errors = 0
    for path in sorted(logs_dir.glob("scripted-*.jsonl")):
        for line in path.read_bytes().splitlines():
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                broken += 1
                continue
            if entry.get("event") == "step":
                served[entry["request_id"]] += 1
            elif entry.get("event") == "act":
                acts += 1
            elif entry.get("event") == "error":
                errors += 1
    return {"served": served, "acts": acts, "broken_lines": broken, "errors": errors}


def trails(git_dir: Path, checkpoints: list[str], path: str = "trail.txt") -> dict[str, str | None]:
    """``path`` at each checkpoint commit (None if missing), with one ``git cat-file``."""
    if not checkpoints:
        return {}
    query = "".join(f"{c}:{path}\n" for c in checkpoints).encode()
    out = subprocess.run(["git", "--git-dir", str(git_dir), "cat-file", "--batch"], input=query,
                         capture_output=True, check=False).stdout
    found: dict[str, str | None] = {}
    pos = 0
    for commit in checkpoints:
        end = out.index(b"\n", pos)
        header = out[pos:end].split()
        pos = end + 1
        if len(header) == 3 and header[1] == b"blob":
            size = int(header[2])
            found[commit] = out[pos:pos + size].decode("utf-8", "replace")
            pos += size + 1
        else:
            found[commit] = None
    return found


def usage_figures(calls: list[dict], its: list[dict], served: Counter) -> dict:
    """Per-call usage against the scripted logs and against the committed iterations."""
    per_id = Counter(c["request_id"] for c in calls)
    fields = ("input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens")
    sums: dict = {}
    for c in calls:
        key = (c["work_id"], c["iteration"], c["attempt"])
        sums[key] = [a + c[f] for a, f in zip(sums.get(key, [0, 0, 0, 0]), fields)]
    return {
        "usage_counted_twice": sum(1 for c in per_id.values() if c > 1)
                               + sum(1 for r in served if per_id.get(r, 0) > 1),
        "usage_without_served_request": sum(1 for r in per_id if r not in served),
        "iteration_usage_mismatches": sum(1 for i in its if sums.get((i["work_id"], i["n"], i["attempt"]),
                                                                     [0, 0, 0, 0]) != [i[f] for f in fields]),
        "served_requests": len(served), "served_not_counted": sum(1 for r in served if r not in per_id),
    }


def trail_figures(history_dir: Path, its: list[dict]) -> dict:
    """Each committed checkpoint's trail.txt against the acts the committed iterations ran."""
    by_work: dict[str, list[dict]] = {}
    for i in its:
        by_work.setdefault(i["work_id"], []).append(i)
    leaked, tool_errors = 0, Counter()
    for wid, rows in by_work.items():
        found = trails(history_dir / f"{wid}.git", [i["checkpoint"] for i in rows])
        expected = ""
        for i in sorted(rows, key=lambda r: r["n"]):
            tools = orjson.loads(i["tool_calls"])
            tool_errors.update(t.get("code") or "unknown" for t in tools if not t.get("ok"))
            if any(t.get("ok") and t.get("input") == {"command": f"echo it{i['n']} >> trail.txt"} for t in tools):
                expected += f"it{i['n']}\n"
            leaked += found.get(i["checkpoint"]) != expected
    gaps = sum(1 for rows in by_work.values() if sorted(r["n"] for r in rows) != list(range(1, len(rows) + 1)))
    return {"acts_replayed_without_reset": leaked, "checkpoints_checked": len(its), "tool_errors": dict(tool_errors),
            "iteration_gaps": gaps}


def twice_figures(its: list[dict], attempts: list[dict], created: Counter) -> dict:
    twice = sum(1 for c in Counter((i["work_id"], i["n"]) for i in its).values() if c > 1)
    twice += sum(1 for c in created.values() if c > 1)
    twice += sum(1 for c in Counter((a["work_id"], a["iteration"]) for a in attempts
                                     if a["outcome"] == "committed").values() if c > 1)
    last: dict = {}
    for a in attempts:
        last[(a["work_id"], a["iteration"])] = max(a["attempt"], last.get((a["work_id"], a["iteration"]), 0))
    replays = sum(1 for a in attempts if a["outcome"] != "committed" and a["attempt"] < last[(a["work_id"], a["iteration"])])
    return {"iterations_committed_twice": twice, "iterations": len(its), "attempts": len(attempts),
            "attempts_not_committed": sum(1 for a in attempts if a["outcome"] != "committed"),
            "replayed_acts": replays}


def gate_figures(history_dir: Path, submitted: dict, works: dict, its: list[dict], decisions: list[dict]) -> dict:
    """Gated actions against the workspaces' and final checkpoints' gate.log (see DEFINITIONS)."""
    from bench.workload import GATE_LOG

    last = {}
    for i in its:
        if i["n"] > last.get(i["work_id"], {"n": 0})["n"]:
            last[i["work_id"]] = i
    gated = [w for w, spec in submitted.items() if spec.kind == "gated" and w in works]
    final = {w: trails(history_dir / f"{w}.git", [last[w]["checkpoint"]], GATE_LOG).get(last[w]["checkpoint"])
             for w in gated if w in last}
    twice = 0
    for w in gated:
        log = Path(works[w]["workspace"]) / GATE_LOG
        lines = log.read_text().splitlines() if log.exists() else []
        twice += len(lines) > 1 or len((final.get(w) or "").splitlines()) > 1
    lost = [d["id"] for d in decisions if d["status"] in ("approved", "edited", "executing")]
    for d in decisions:
        went_on = d["work_id"] in last and last[d["work_id"]]["n"] > (d["iteration"] or 0)
        if d["status"] == "executed" and went_on and d["work_id"] in final:
            line = "edited" if d["answer"] else "approved"
            lost += [d["id"]] if line not in (final[d["work_id"]] or "").splitlines() else []
    return {"gated_items": len(gated), "gated_decisions": len(decisions),
            "gated_decision_states": dict(Counter(d["status"] for d in decisions)),
            "gated_actions_run_twice": twice, "gated_actions_lost": len(lost), "gated_lost_ids": lost[:10]}


def elapsed_figures(works: dict, attempts: list[dict]) -> dict:
    spans: dict[str, float] = {}
    for a in attempts:
        closed = a["ended_at"] is not None and a["outcome"] != "discarded"
        end = a["ended_at"] if closed else (a["alive_at"] or a["started_at"])
        spans[a["work_id"]] = spans.get(a["work_id"], 0.0) + max(0.0, end - a["started_at"])
    short = {w: round(spans[w] - r["elapsed_s"], 3) for w, r in works.items()
             if w in spans and r["elapsed_s"] + SPAN_SLACK_S * r["attempts"] < spans[w]}
    return {"elapsed_undercounted_runs": len(short), "elapsed_undercount_samples": dict(list(short.items())[:5]),
            "discarded_s": round(sum(r["discarded_s"] or 0 for r in works.values()), 1)}


def pg_integrity(conn) -> tuple[str, int]:
    """A PostgreSQL store's integrity, by its own constraints: PostgreSQL checks every CHECK,
    UNIQUE, primary and foreign key on every write, so the rows hold them all as long as each
    constraint is in force (validated, its trigger enabled). Returns ("ok" or what is not in
    force, how many foreign keys are not)."""
    raw = conn.raw
    loose = raw.execute("""SELECT conrelid::regclass::text || '.' || conname, contype FROM pg_constraint
                            WHERE connamespace = current_schema()::regnamespace AND NOT convalidated""").fetchall()
    off = raw.execute("""SELECT tgrelid::regclass::text || '.' || tgname FROM pg_trigger t
                          JOIN pg_class c ON c.oid = t.tgrelid
                          WHERE c.relnamespace = current_schema()::regnamespace AND t.tgenabled = 'D'""").fetchall()
    count = raw.execute("""SELECT COUNT(*) FROM pg_constraint WHERE connamespace = current_schema()::regnamespace
                            AND contype IN ('c', 'f', 'u', 'p')""").fetchone()[0]
    if count == 0:
        return "no constraints found", 0
    problems = [r[0] for r in loose] + [f"{r[0]} (disabled)" for r in off]
    return ("ok" if not problems else "not in force: " + ", ".join(problems[:10]),
            sum(1 for r in loose if r[1] == "f"))


def audit(home, submitted: dict) -> dict:
    """Figures of one chaos run (see DEFINITIONS). ``submitted``: work id → ItemSpec."""
    from state_db.store import is_postgres
    if is_postgres(home.db_path):
        from state_db.connection import connect
        conn = connect(home.db_path, readonly=True)
        integrity, fk = pg_integrity(conn)
    else:
        conn = sqlite3.connect(f"file:{home.db_path}?mode=ro", uri=True, timeout=30)
        conn.row_factory = sqlite3.Row
    try:
        if not is_postgres(home.db_path):
            integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
            fk = len(conn.execute("PRAGMA foreign_key_check").fetchall())
        items = {r["id"]: r for r in _rows(conn, "SELECT id, status, stop_reason FROM work_items")}
        its = _rows(conn, "SELECT work_id, n, attempt, checkpoint, tool_calls, input_tokens, output_tokens, "
                          "cache_write_tokens, cache_read_tokens FROM iterations ORDER BY work_id, n")
        attempts = _rows(conn, "SELECT work_id, attempt, iteration, outcome, started_at, alive_at, ended_at "
                               "FROM attempts ORDER BY work_id, attempt")
        works = {r["id"]: r for r in _rows(conn, """SELECT w.id, w.status, w.workspace, w.elapsed_s, w.discarded_s,
                     (SELECT COUNT(*) FROM attempts a WHERE a.work_id = w.id) AS attempts FROM work_items w""")}
        decisions = _rows(conn, "SELECT id, work_id, iteration, status, answer FROM decisions")
        stuck = [r["id"] for r in _rows(conn, """SELECT id FROM work_items w WHERE status = 'paused' AND NOT EXISTS
                     (SELECT 1 FROM decisions d WHERE d.work_id = w.id AND d.status = 'pending')""")]
        calls = _rows(conn, "SELECT request_id, work_id, iteration, attempt, input_tokens, output_tokens, "
                            "cache_write_tokens, cache_read_tokens FROM model_calls")
        created = Counter(r["subject"] for r in _rows(conn, "SELECT subject FROM events WHERE kind = 'iterations.created'"))
        ended_events = {r["subject"] for r in _rows(conn, "SELECT subject FROM events WHERE kind = 'work_items.ended'")}
        checks = [c for r in _rows(conn, "SELECT checks FROM verdicts") for c in orjson.loads(r["checks"])]
    finally:
        conn.close()
    lost = [w for w in submitted if w not in items or items[w]["status"] != "ended" or not items[w]["stop_reason"]]
    ended = [r for r in items.values() if r["status"] == "ended"]
    reasons = set(StopReason._value2member_map_)
    no_reason = [r["id"] for r in ended if r["stop_reason"] not in reasons or r["id"] not in ended_events]
    log = scripted_log(home.logs_dir)
    unexpected = Counter(f"{spec.name}->{items[w]['stop_reason']}" for w, spec in submitted.items()
                         if w in items and items[w]["stop_reason"] and items[w]["stop_reason"] != spec.expected_stop)
    return {
        "items": len(submitted), "lost_items": len(lost), "lost_item_ids": lost[:10],
        **twice_figures(its, attempts, created), **usage_figures(calls, its, log["served"]),
        **trail_figures(home.history_dir, its),
        **gate_figures(home.history_dir, submitted, works, its, decisions), **elapsed_figures(works, attempts),
        "paused_runs_stuck": len(stuck), "paused_stuck_ids": stuck[:10],
        "acts_served": log["acts"], "scripted_log_broken_lines": log["broken_lines"],
        "scripted_errors": log["errors"], "runs_without_stop_reason": len(no_reason),
        "checks_not_run": sum(1 for c in checks if c.get("exit_code") is None and not c.get("timed_out")),
        "stop_reasons": dict(Counter(r["stop_reason"] for r in ended)), "unexpected_stop_reasons": dict(unexpected),
        "sqlite_integrity": integrity, "foreign_key_violations": fk, "definitions": DEFINITIONS,
    }
