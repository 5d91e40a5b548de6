"""Skill replays benchmark: what replaying candidates before review costs, and what it tells.

Usage: ``bench/replays.py --json`` (a run takes about two minutes: two real orgs on ipc://).

Two families of three similar jobs each (the learning demo's settings check, and a second one
about a port number), the scripted model taking three iterations per job. In the ``helps``
family a skill in the model's prompt makes it write the fix at once (as a model that read the
skill would); in the ``neutral`` family the model ignores skills. Each family gives the curator
a candidate. The same jobs run in two orgs, one with replays on and one with them off (the
baseline, measured in the same run):

- ``batch_delay_s_replays`` / ``batch_delay_s_baseline``: from a candidate's proposal to the
  review batch that offers it — what waiting for the replays costs the reviewer;
- ``candidates_measured_share``: of the candidates offered for review with replays on, the share
  whose WITH / WITHOUT difference was measured when their batch opened (target 1.0);
- ``delta_iterations_helps`` / ``delta_iterations_neutral``: the measured difference in
  iterations to goal (with − without) — negative where the skill helps, 0 where it does not;
- ``replay_submit_ms_p50``: the org's own cost of one replay run before it is dispatched —
  writing the baseline into a new workspace, recording its baseline, the submit (timed in
  process on the stopped org);
- ``replay_tokens_per_candidate``: tokens all replays of one candidate spent (scripted usage).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGETS_MIN = {"candidates_measured_share": 1.0}
CONFIG = """[org]
loop_agents = 3
[supervisor]
heartbeat_s = 0.2
[knowledge]
raw_notes_to_consolidate = 3
notes_per_pattern = 3
candidates_per_batch = 1
[learning]
replay = "{replay}"
replay_items = 2
replay_concurrency = 4
"""
VALIDATOR = '''import json, sys
value = json.load(open("settings.json")).get("{key}")
if not isinstance(value, int) or isinstance(value, bool):
    print(f'expected int for "{key}", got {{type(value).__name__}} {{value!r}}')
    print('{error}: "{key}" must be an integer')
    sys.exit(1)
print("ok")
'''
#: family -> (key, [(job, value as written, whole value)], whether a skill helps, check file, error)
FAMILIES = {
    "helps": ("timeout", [("billing", "30s", 30), ("search", "45s", 45), ("mailer", "90s", 90)], True,
              "validate_config.py", "SettingsError"),
    "neutral": ("port", [("web", "8080/tcp", 8080), ("api", "9090/tcp", 9090), ("db", "5432/tcp", 5432)], False,
                "lint_ports.py", "PortSpecMismatch"),
}


def _edit(key, old, new):
    return [{"tool_uses": [{"name": "edit_file", "input": {"path": "settings.json",
                                                           "old_string": f'"{key}": {json.dumps(old)}',
                                                           "new_string": f'"{key}": {json.dumps(new)}'}}]},
            {"text": f"{key} is now {new!r}."}]


def _job(root: Path, family: str, key: str, job: str, written: str, whole: int, helps: bool, check: str,
         error: str) -> dict:
    ws = root / f"ws-{family}-{job}"
    ws.mkdir(parents=True)
    (ws / check).write_text(VALIDATOR.format(key=key, error=error))
    (ws / "settings.json").write_text(json.dumps({key: written}, indent=2) + "\n")
    stripped = written.rstrip("stcp/")
    script = {"version": 1, "acts": [_edit(key, written, stripped), _edit(key, stripped, float(whole)),
                                     _edit(key, float(whole), whole)]}
    if helps:
        script["when"] = [{"prompt_contains": "## Skill: ", "acts": [_edit(key, written, whole)]}]
    path = root / f"{family}-{job}.json"
    path.write_text(json.dumps(script))
    return {"goal": f"{job}: make settings.json pass {check} — {key} must be an integer",
            "workspace": str(ws), "verify": [f"python3 {check}"], "protect": [check], "scope": ["settings.json"],
            "backend": f"scripted:{path}", "caps": {"max_iterations": 5}}


def _q(home, sql, params=()):
    from state_db.connection import read_rows
    return read_rows(home.db_path, sql, params)


def _wait(pred, timeout, what):
    from transport.probe import wait_until
    try:
        return wait_until(pred, timeout=timeout, what=what, interval=0.2)
    except TimeoutError as exc:
        from bench.common import BenchError
        raise BenchError("bench_timeout", str(exc), "run it on a quieter machine, or look at the org's logs") from None


def run_org(root: Path, replay: str) -> dict:
    from roles.operations.submit import SubmitRequest, submit
    from scripts import control
    from skills.replay import of_subject
    from state_db.bootstrap import init_home
    from state_db.connection import connect
    from state_db.kernel.home import OrgHome

    home = OrgHome(root / "org")
    home.root.mkdir(parents=True)
    home.config_path.write_text(CONFIG.format(replay=replay))
    cfg, _ = init_home(home)
    control.start_background(home, timeout_s=60)
    out: dict = {"home": home}
    try:
        ids = {}
        for family, (key, jobs, helps, check, error) in FAMILIES.items():
            ids[family] = [submit(home, cfg, SubmitRequest.decode(_job(root, family, key, *j, helps, check, error)))["id"]
                           for j in jobs]
        every = [i for v in ids.values() for i in v]
        _wait(lambda: all(r["status"] == "ended" for r in _q(home, "SELECT status FROM work_items WHERE id IN "
                                                                 f"({','.join('?' * len(every))})", every)),
              180, "the jobs to end")
        # every ended job's retro written, then every pending candidate offered in a batch
        _wait(lambda: not _q(home, "SELECT w.id FROM work_items w WHERE w.status = 'ended' AND NOT EXISTS "
                                   "(SELECT 1 FROM events e WHERE e.subject = w.id AND e.kind IN "
                                   "('retro.written', 'retro.skipped'))"), 120, "every run's retro")
        cands = _wait(lambda: (c := _q(home, "SELECT c.id, c.created_at, b.created_at AS batched, c.source_notes "
                                             "FROM skill_candidates c JOIN candidate_batches b ON b.id = c.batch_id"))
                      and not _q(home, "SELECT id FROM skill_candidates WHERE status = 'pending' AND batch_id IS NULL")
                      and c, 300, "every candidate offered in a batch")
        conn = connect(home.db_path, readonly=True)
        try:
            per = []
            for c in cands:
                runs = {r["run_id"] for r in _q(home, "SELECT run_id FROM raw_notes WHERE id IN (SELECT value FROM "
                                                      "json_each(?))", (c["source_notes"],))}
                family = next((f for f, v in ids.items() if runs & set(v)), None)
                summary = of_subject(conn, c["id"])
                measured_at_batch = summary["measured"] and all(
                    r["ended_at"] is not None and r["ended_at"] <= c["batched"] for r in _q(
                        home, "SELECT w.ended_at FROM replays x JOIN work_items w ON w.id = x.work_id "
                              "WHERE x.subject = ?", (c["id"],)))
                per.append({"family": family, "delay_s": c["batched"] - c["created_at"],
                            "measured": measured_at_batch, "summary": summary})
        finally:
            conn.close()
        out["candidates"] = per
    finally:
        control.request(home, "stop", force=True, timeout_s=60)
    return out


def submit_cost(home, runs: int = 5) -> list[float]:
    """Time ``submit_run`` on the stopped org: a new subject replaying its ended jobs."""
    from roles.operations import replays
    from skills.replay import Subject
    from state_db.kernel.config import load_config
    from state_db.queries.replays import ended_items
    from state_db.vocab import Actor
    from state_db.writer import StateWriter
    cfg = load_config(home)
    writer = StateWriter(home.db_path, Actor.HUMAN)
    try:
        items = [e.id for e in ended_items(writer.conn) if (home.history_dir / f"{e.id}.git").is_dir()][:runs]
        subject = Subject("bench-submit", "skill", "bench-skill", "text")
        out = []
        for wid in items:
            t0 = time.perf_counter()
            replays.submit_run(writer, home, cfg, subject, wid, "similar", "with", 2)
            out.append((time.perf_counter() - t0) * 1000)
        return out
    finally:
        writer.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    from bench.common import BenchError, finish, quiet_logs
    quiet_logs()
    tmp = Path(tempfile.mkdtemp(prefix="lo-"))
    try:
        on = run_org(tmp / "on", "on")
        off = run_org(tmp / "off", "off")
        costs = submit_cost(on["home"])
    except BenchError as exc:
        print(exc.line(), file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def delta(family):
        found = [c["summary"]["delta"]["iterations_to_goal"] for c in on["candidates"] if c["family"] == family]
        return found[0] if found else None
    measured = [c["measured"] for c in on["candidates"]]
    tokens = [sum(r["tokens"] for r in c["summary"]["runs"]) for c in on["candidates"]]
    figures = {
        "batch_delay_s_replays": round(statistics.median(c["delay_s"] for c in on["candidates"]), 2),
        "batch_delay_s_baseline": round(statistics.median(c["delay_s"] for c in off["candidates"]), 2),
        "candidates_measured_share": round(sum(measured) / len(measured), 3) if measured else 0.0,
        "delta_iterations_helps": delta("helps"),
        "delta_iterations_neutral": delta("neutral"),
        "replay_submit_ms_p50": round(statistics.median(costs), 1) if costs else None,
        "replay_tokens_per_candidate": round(statistics.median(tokens)) if tokens else None,
        "candidates": len(on["candidates"]),
        "candidates_detail": [{"family": c["family"], "delay_s": round(c["delay_s"], 2), "measured": c["measured"],
                               "delta": c["summary"]["delta"], "items": c["summary"]["items"]}
                              for c in on["candidates"]],
    }
    passes = {k: figures.get(k) is not None and figures[k] >= v for k, v in TARGETS_MIN.items()}
    passes["delta_helps_negative"] = (figures["delta_iterations_helps"] or 0) < 0
    passes["delta_neutral_zero"] = figures["delta_iterations_neutral"] == 0
    return finish(figures, TARGETS_MIN, passes, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
