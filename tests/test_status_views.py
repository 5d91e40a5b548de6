"""Truthful status (issue 18): a run's phase, n of max, budgets against caps, the latest verdict
in one line and the current tool call, read through ``state_db.views`` while a scripted run acts,
waits for its verdict, waits for a human and ends; ``org show`` / ``org status --json`` nest
their data; a real org shows its loop-agent busy with the run it works, and every line of its
logs is JSON naming its instance."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import orjson
import pytest

from roles.loop_agent.backends.base import ActOutcome, Usage
from roles.loop_agent.commands import CommandResult
from roles.loop_agent.process import current_tool_recorder
from roles.loop_agent.tools import WorkspaceTools, observed
from state_db import views
from state_db.connection import connect
from tests.support.loop import BUGGY, FIXED, ScriptedActs, engine, make_workspace, submit
from tests.support.org import ONE_AGENT, query, running_org, wait_for
from state_db.queries.work import Caps


class Snapshots:
    """Reads ``run_view`` at chosen moments of a run, through its own read-only connection."""

    def __init__(self, home, work_id):
        self.conn = connect(home.db_path, readonly=True)
        self.work_id = work_id
        self.seen: dict[str, dict] = {}

    def take(self, label: str) -> dict:
        self.seen[label] = views.run_view(self.conn, self.work_id)
        return self.seen[label]


class SnapshotRunner:
    """A command runner that looks at the run while the command 'runs'."""

    def __init__(self, snaps: Snapshots):
        self.snaps = snaps

    def run(self, command, cwd, timeout_s, max_output_bytes):
        self.snaps.take(f"tool:{command}")
        return CommandResult(0, "ok\n", False, False)


class ToolUsingActs:
    """Iteration 1 runs a command and leaves the bug; iteration 2 fixes it."""

    name = "anthropic"

    def __init__(self, snaps: Snapshots):
        self.snaps = snaps

    def act(self, ctx, *, on_usage, budget_left):
        self.snaps.take(f"act:{ctx.iteration}:start")
        on_usage(Usage(f"r-{ctx.iteration}-{ctx.attempt}", "m", 1000, 200, 0, 5000, cost_usd=0.01))
        tools = WorkspaceTools(ctx.workspace, SnapshotRunner(self.snaps))
        tools.call("run_command", {"command": f"pytest -q  # iteration {ctx.iteration}"})
        self.snaps.take(f"act:{ctx.iteration}:after-tool")
        tools.call("write_file", {"path": "calc.py", "content": FIXED if ctx.iteration == 2 else BUGGY})
        return ActOutcome("ok", f"iteration {ctx.iteration}", turns=1)


@pytest.mark.timeout(60)
def test_phases_n_of_max_current_tool_and_verdict_line_through_a_scripted_run(org_home, tmp_path):
    """preflight → acting (n of max, the running tool) → verifying → acting again with the last
    verdict in one line → ended, each seen through run_view while the run is in it."""
    ws = make_workspace(tmp_path)
    wid = submit(org_home, ws, caps={"max_iterations": 4, "budget_tokens": 50_000, "budget_usd": 1.0,
                                     "timeout_s": 600})
    snaps = Snapshots(org_home, wid)
    eng = engine(org_home, wid, ToolUsingActs(snaps))
    real_verify = eng.verify
    eng.verify = lambda w, n: (snaps.take(f"verify:{n}"), real_verify(w, n))
    with observed(current_tool_recorder(eng.w, wid)):
        decision = eng.run()
    assert str(decision.reason) == "goal_met"
    seen = snaps.seen

    assert seen["verify:0"]["phase"] == "preflight"
    assert seen["verify:0"]["iteration"] == {"n": 1, "max": 4, "committed": 0}

    acting = seen["act:1:start"]
    assert acting["phase"] == "acting" and acting["iteration"]["n"] == 1 and acting["iteration"]["max"] == 4
    assert acting["baseline"] and acting["baseline"]["line"]            # preflights.detail
    assert acting["current_tool"] is None
    tool = seen["tool:pytest -q  # iteration 1"]
    assert tool["phase"] == "acting"
    assert tool["current_tool"]["call"] == "run_command pytest -q # iteration 1"
    assert tool["tokens"] == {"used": 1200, "cap": 50_000, "total": 6200}   # cache reads are not budget
    assert tool["cost_usd"] == {"used": 0.01, "cap": 1.0}
    assert tool["elapsed_s"]["cap"] == 600 and tool["elapsed_s"]["used"] >= 0
    assert seen["act:1:after-tool"]["current_tool"] is None               # cleared when the tool ends

    verifying = seen["verify:1"]
    assert verifying["phase"] == "verifying" and verifying["iteration"]["n"] == 1
    assert verifying["current_tool"] is None

    again = seen["act:2:start"]
    assert again["phase"] == "acting" and again["iteration"] == {"n": 2, "max": 4, "committed": 1}
    assert again["verdict"]["iteration"] == 1 and again["verdict"]["outcome"] == "fail"
    assert again["verdict"]["line"].startswith("1 of 1 check fail: "), again["verdict"]["line"]

    end = snaps.take("end")
    assert end["phase"] == "ended" and end["stop"]["reason"] == "goal_met"
    assert end["iteration"] == {"n": 2, "max": 4, "committed": 2}
    assert end["verdict"]["line"].startswith("pass: 1 check")
    # the current tool is bookkeeping: no journal event per tool call
    events = query(org_home, "SELECT data FROM events WHERE kind = 'attempts.updated'")
    assert not [e for e in events if "current_tool" in e["data"]]


GATED = {"kind": "network", "command": "curl -O https://example.org/data.csv", "reason": "the data is online"}


@pytest.mark.timeout(60)
def test_waiting_for_a_human_then_parked_with_its_decision_in_status_json(org_home, tmp_path, capsys):
    """A gated request pauses the run: waiting_for_human while its loop-agent holds it (its
    iteration being verified), parked once let go; org status --json and org show --json nest it."""
    ws = make_workspace(tmp_path)
    wid = submit(org_home, ws, caps={"max_iterations": 3})
    snaps = Snapshots(org_home, wid)
    eng = engine(org_home, wid, ScriptedActs([[{"request": GATED}]]))
    real_verify = eng.verify
    eng.verify = lambda w, n: (snaps.take(f"verify:{n}"), real_verify(w, n))
    assert eng.run() is None                                          # parked on the decision
    waiting = snaps.seen["verify:1"]
    assert waiting["phase"] == "waiting_for_human" and waiting["assigned_to"] == "loop-agent-1"
    parked = snaps.take("parked")
    assert parked["phase"] == "parked" and parked["assigned_to"] is None
    assert parked["iteration"] == {"n": 2, "max": 3, "committed": 1} and len(parked["pending_decisions"]) == 1

    from scripts.cli.main import main
    capsys.readouterr()                                               # the engine's own lines
    assert main(["status", "--json"]) == 0
    st = orjson.loads(capsys.readouterr().out)
    assert st["runs"]["running"][0]["phase"] == "parked"
    assert st["needs_you"]["decisions"][0]["action"]["command"] == GATED["command"]     # data, not text
    assert main(["show", wid, "--json"]) == 0
    item = orjson.loads(capsys.readouterr().out)
    assert isinstance(item["caps"], dict) and item["run"]["phase"] == "parked"
    it = item["iterations_detail"][0]
    assert isinstance(it["tool_calls"], list) and isinstance(it["changed_paths"], list) and isinstance(it["prompt"], dict)
    assert isinstance(item["verdicts"][0]["checks"], list) and isinstance(item["decisions"][0]["action"], dict)
    assert main(["status"]) == 0
    text = capsys.readouterr().out
    assert "parked" in text and "2/3" in text and parked["pending_decisions"][0] in text


def test_verdict_line_names_the_failing_tests_of_each_failing_check():
    junit = {"counts": {}, "truncated": False,
             "ids": {"tests/test_stats.py::test_mean": "failed", "tests/test_stats.py::test_sum": "passed"}}
    checks = [{"name": "tests", "command": "pytest -q", "passed": False, "junit": junit},
              {"name": "types", "command": "mypy .", "passed": True},
              {"name": "build", "command": "make", "passed": True}]
    verdict = {"outcome": "fail", "checks": json.dumps(checks)}
    assert views.verdict_line(verdict) == "1 of 3 checks fail: test_mean"
    checks[1]["passed"] = False
    assert views.verdict_line({**verdict, "checks": json.dumps(checks)}) == "2 of 3 checks fail: test_mean, types"
    passing = [{"name": "tests", "passed": True, "tests": {"passed": 12}}]
    assert views.verdict_line({"outcome": "pass", "checks": passing}) == "pass: 1 check, 12 tests passed"


def test_a_ready_role_is_busy_only_while_it_holds_work_and_dead_when_its_process_is_gone():
    import os

    from state_db.kernel.processes import start_time
    me = {"pid": os.getpid(), "pid_start": start_time(os.getpid())}
    base = {"instance": "loop-agent-1", "role": "loop-agent", "status": "ready", "current_work": "w-1", **me}
    held = {"loop-agent-1": "w-1"}
    assert views.role_view(base, held=held)["activity"] == "busy" and views.role_view(base, held=held)["work_id"] == "w-1"
    # a current_work left behind by a run that ended (or was let go at a suspend) is not work held
    assert views.role_view(base, held={})["activity"] == "idle" and views.role_view(base, held={})["work_id"] is None
    assert views.role_view({**base, "status": "failed"}, held=held)["activity"] == "failed"
    evaluator = {**base, "instance": "eval-agent", "role": "eval-agent", "current_work": "w-2"}
    assert (views.role_view(evaluator)["activity"], views.role_view(evaluator)["work_id"]) == ("busy", "w-2")
    assert views.role_view({**evaluator, "current_work": None})["activity"] == "idle"
    gone = {**base, "pid": 2 ** 22 + 7, "pid_start": "1"}            # no such process
    assert views.role_view(gone, held=held)["activity"] == "dead" and views.role_view(gone, held=held)["work_id"] is None
    reused = {**base, "pid_start": str(int(me["pid_start"]) + 1)}      # this pid, another start: not the role
    assert views.role_view(reused, held=held)["activity"] == "dead"
    # a role of another host is judged by its heartbeat
    remote = {**gone, "heartbeat_at": 1000.0}
    assert views.role_view(remote, held=held, remote=frozenset({"loop-agent-1"}), now=1005.0)["activity"] == "busy"
    assert views.role_view(remote, held=held, remote=frozenset({"loop-agent-1"}), now=1100.0)["activity"] == "dead"


def test_recording_the_current_tool_is_cheap(org_home, tmp_path):
    """The cost of the status write: one small transaction when a tool starts and one when it ends."""
    ws = make_workspace(tmp_path)
    wid = submit(org_home, ws)
    eng = engine(org_home, wid, ScriptedActs([[{}]]))
    with eng.w.transaction() as tx:
        tx.insert("attempts", {"work_id": wid, "attempt": 1, "iteration": 1, "instance": "loop-agent-1",
                               "started_at": time.time()})
    record = current_tool_recorder(eng.w, wid)
    n, t0 = 200, time.perf_counter()
    for i in range(n):
        record(f"read_file f{i}.py")
        record(None)
    per_call_ms = (time.perf_counter() - t0) / n * 1000
    print(f"current tool: {per_call_ms:.3f} ms per tool call (two writes)")
    assert per_call_ms < 25, per_call_ms


# -- a real org ------------------------------------------------------------------------------

# a command that runs until the test lets it go (bounded: 30 s), then writes the answer
HELD = "for i in $(seq 300); do [ -f go ] && break; sleep 0.1; done; echo right > answer.txt"
ENGINE_EVENTS = {"act_started", "iteration_committed", "reflected", "loop_starting", "loop_finished"}


@pytest.mark.timeout(90)
def test_a_real_org_shows_its_loop_agent_busy_the_running_tool_and_logs_only_json(tmp_path):
    """Through real processes: while a command runs, org status says the loop-agent is busy with
    the run and names the tool; every line the roles log is JSON with an instance, engine events
    name the loop-agent, and the HTTP client's lines are among them."""
    script = tmp_path / "slow.json"
    script.write_text(json.dumps({"version": 1, "acts": [[
        {"tool_uses": [{"name": "run_command", "input": {"command": HELD}}]},
        {"text": "Wrote the answer."}]]}))
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "answer.txt").write_text("wrong\n")
    with running_org(ONE_AGENT) as home:
        env = {**os.environ, "ORG_HOME": str(home.root)}

        def cli(*argv):
            proc = subprocess.run([sys.executable, "-m", "scripts.cli.main", *argv], capture_output=True,
                                  text=True, timeout=30, env=env)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            return proc.stdout

        wid = json.loads(cli("submit", "make answer.txt say right", "--workspace", str(ws), "--verify",
                             'grep -q right answer.txt', "--backend", f"scripted:{script}", "--max-iterations", "3",
                             "--no-wait", "--json"))["id"]

        conn = connect(home.db_path, readonly=True)
        wait_for(lambda: views.run_view(conn, wid)["current_tool"], timeout=30, what=f"{wid} running its command")
        conn.close()
        st = json.loads(cli("status", "--json"))
        run = next(r for r in st["runs"]["running"] if r["id"] == wid)
        assert run["phase"] == "acting" and run["iteration"]["n"] == 1 and run["iteration"]["max"] == 3
        assert run["current_tool"]["call"].startswith("run_command for i in")
        agent = next(r for r in st["roles"] if r["instance"] == "loop-agent-1")
        assert agent["activity"] == "busy" and agent["work_id"] == wid
        text = cli("status")
        assert "busy" in text and "running run_command for i in" in text and "acting" in text
        (ws / "go").touch()

        wait_for(lambda: query(home, "SELECT status FROM work_items WHERE id = ?", (wid,))[0]["status"] == "ended",
                 timeout=30, what=f"{wid} to end")
        wait_for(lambda: next(r for r in json.loads(cli("status", "--json"))["roles"]
                              if r["instance"] == "loop-agent-1")["activity"] == "idle",
                 timeout=10, what="the loop-agent idle again")
        lines = [(f.name, line) for f in home.logs_dir.glob("*.log") if f.name != "cli.log"
                 for line in f.read_text().splitlines() if line.strip()]
        entries = []
        for name, line in lines:
            try:
                entries.append((name, orjson.loads(line)))
            except orjson.JSONDecodeError:
                pytest.fail(f"{name}: a line that is not JSON: {line[:200]}")
        assert all(e.get("instance") for _, e in entries), [e for _, e in entries if not e.get("instance")][:3]
        engine_lines = [e for _, e in entries if e.get("event") in ENGINE_EVENTS]
        assert {e["event"] for e in engine_lines} >= {"loop_starting", "act_started", "iteration_committed"}
        assert all(e["instance"] == "loop-agent-1" for e in engine_lines), engine_lines[:3]
        assert any(str(e.get("logger", "")).startswith(("httpx", "httpcore", "anthropic")) for _, e in entries), \
            "the HTTP client's lines are in the logs, as JSON"


def test_schedules_and_triggers_show_in_status_its_json_and_the_dashboards_org_data(org_home, tmp_path, capsys):
    """Each standing order with its kind, rule in words, state, next due, fired and skipped counts:
    the same rows in ``org status --json``, ``org status --orders`` and the dashboard's org data."""
    from roles.coordinator import schedules as S
    from roles.operations import schedules as ops
    from roles.operations.submit import SubmitRequest
    from scripts.cli.dashboard import data
    from scripts.cli.main import main
    from state_db.kernel import config as config_mod
    from state_db.vocab import Actor
    from state_db.writer import StateWriter

    ws = make_workspace(tmp_path)
    cfg = config_mod.load(None)
    req = SubmitRequest(goal="keep it green", workspace=str(ws), verify=["true"], backend="command", caps=Caps(max_iterations=2))
    nightly = ops.add(org_home, cfg, name="nightly", kind="cron", rule={"cron": "0 3 * * *"}, req=req, argv=[])
    ops.add(org_home, cfg, name="often", kind="every", rule={"every_s": 60.0}, req=req, argv=[])
    ops.add(org_home, cfg, name="scan", kind="discover", rule={"every_s": 3600.0}, req=req, argv=[])
    ops.add(org_home, cfg, name="red", kind="verify-fails", rule={"every_s": 600.0}, req=req, argv=[])
    ops.change(org_home, cfg, "red", "pause")
    # two ticks of "often": one fires, the next is skipped while its item is queued
    clock = [time.time() + 61]
    w = StateWriter(org_home.db_path, Actor.COORDINATOR, clock=lambda: clock[0])
    try:
        first = [o for o in S.tick(w, org_home, cfg) if o.name == "often"]
        clock[0] += 60
        second = [o for o in S.tick(w, org_home, cfg) if o.name == "often"]
    finally:
        w.close()
    assert [o.result for o in first + second] == [S.FIRED, S.BUSY]
    capsys.readouterr()
    assert main(["status", "--json"]) == 0
    orders = {o["name"]: o for o in orjson.loads(capsys.readouterr().out)["standing_orders"]}
    assert list(orders) == ["nightly", "often", "scan", "red"]
    assert orders["nightly"]["what"] == "schedule" and orders["nightly"]["rule"] == "cron 0 3 * * *"
    assert orders["nightly"]["next_due"] == ops.next_due("cron", {"cron": "0 3 * * *"}, orders["nightly"]["next_due"] - 1)
    assert orders["nightly"]["id"] == nightly["id"] and orders["nightly"]["next_due"] > time.time()
    often = orders["often"]
    assert (often["fired"], often["skipped_busy"], often["skipped_spend"]) == (1, 1, 0)
    assert often["last_work_id"] == first[0].work_id and often["last_work_status"] == "queued"
    assert orders["scan"]["what"] == "trigger" and orders["scan"]["rule"] == "discovery scan every 1h"
    assert orders["scan"]["next_due"] is not None                      # not checked yet: due at once
    assert orders["red"]["status"] == "paused" and orders["red"]["next_due"] is None
    assert main(["status"]) == 0
    text = capsys.readouterr().out
    assert "ORDER" in text and "cron 0 3 * * *" in text and "1 busy, 0 cap" in text and first[0].work_id in text
    assert "verify fails (checked every 10m)" in text and "paused" in text
    assert main(["status", "--orders", "--json"]) == 0
    assert [o["name"] for o in orjson.loads(capsys.readouterr().out)] == list(orders)
    conn = connect(org_home.db_path, readonly=True)
    try:
        assert data.org(conn)["standing_orders"] == list(orders.values())
    finally:
        conn.close()
