"""The org at work, end to end with real processes (issue 6 proof)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from roles.supervisor import procs
from tests.support.org import query, roles, wait_for, running_org

DEMO = Path(__file__).resolve().parents[1] / "scripts" / "demo"
CONFIG = """
[org]
loop_agents = 2
[supervisor]
heartbeat_s = 0.2
heartbeat_timeout_s = 10.0
stop_timeout_s = 6.0
"""


@pytest.fixture
def org(monkeypatch):
    with running_org(CONFIG) as home:
        monkeypatch.setenv("ORG_HOME", str(home.root))
        yield home


def cli(home, *argv, check=True):
    proc = subprocess.run([sys.executable, "-m", "scripts.cli.main", *argv], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "ORG_HOME": str(home.root)})
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def demo_workspace(home, name="ws") -> Path:
    ws = home.root.parent / name
    shutil.copytree(DEMO / "project", ws)
    return ws


def submit(home, ws, *extra, script=DEMO / "script.json"):
    out = cli(home, "submit", "make word_count right", "--workspace", str(ws), "--verify", "python3 -m unittest -q",
              "--backend", f"scripted:{script}", "--max-iterations", "5", "--json", *extra)
    return json.loads(out.stdout)


def ended(home, wid, timeout=40):
    return wait_for(lambda: (r := query(home, "SELECT * FROM work_items WHERE id=?", (wid,))[0])["status"] == "ended" and r,
                    timeout=timeout, what=f"{wid} to end")


def test_demo_flow_fail_then_pass_goal_met_by_the_eval_agent(org):
    ws = demo_workspace(org)
    item = submit(org, ws)
    done = ended(org, item["id"])
    assert done["stop_reason"] == "goal_met"
    its = query(org, "SELECT n, lesson FROM iterations WHERE work_id=? ORDER BY n", (item["id"],))
    assert [i["n"] for i in its] == [1, 2] and its[0]["lesson"]
    v = query(org, "SELECT iteration, outcome, written_by FROM verdicts WHERE work_id=? ORDER BY iteration", (item["id"],))
    assert [(x["outcome"], x["written_by"]) for x in v] == [("fail", "eval-agent"), ("pass", "eval-agent")]
    assert "text.split()" in (ws / "textstats.py").read_text()
    diff = cli(org, "diff", item["id"]).stdout
    assert "-    return text.count(\" \") + 1" in diff and "+    return len(text.split())" in diff
    shown = json.loads(cli(org, "show", item["id"], "--json").stdout)
    assert shown["tokens"] > 0 and shown["stop_reason"] == "goal_met"
    ann = query(org, "SELECT data FROM events WHERE kind='announce'")
    assert any(item["id"] in json.loads(a["data"])["text"] and "goal_met" in json.loads(a["data"])["text"] for a in ann)


def test_same_submit_twice_with_one_idempotency_key_is_one_work_item(org):
    ws = demo_workspace(org)
    a = submit(org, ws, "--idempotency-key", "k-123")
    b = submit(org, ws, "--idempotency-key", "k-123")
    assert a["id"] == b["id"] and b["replayed"] is True
    assert query(org, "SELECT COUNT(*) AS c FROM work_items")[0]["c"] == 1


def test_a_second_item_on_a_busy_workspace_waits_then_runs(org):
    ws = demo_workspace(org)
    # the first item's model takes 3 s over its first answer, so it still holds the workspace
    # when the second arrives (the demo's own run can end before a second CLI call starts)
    slow = json.loads((DEMO / "script.json").read_text())
    slow["acts"][0][0]["delay_s"] = 3
    slow_script = org.root.parent / "slow-script.json"
    slow_script.write_text(json.dumps(slow))
    first = submit(org, ws, script=slow_script)
    second = submit(org, ws)
    assert second["status"] == "waiting" and second["waiting_for"] == first["id"]
    assert ended(org, first["id"])["stop_reason"] == "goal_met"
    # the second starts on the finished workspace: its goal is already met at iteration 1
    assert ended(org, second["id"])["status"] == "ended"
    order = query(org, "SELECT subject FROM events WHERE kind='work_items.dispatched' ORDER BY id")
    assert [o["subject"] for o in order] == [first["id"], second["id"]]


def slow_script(tmp_path) -> Path:
    """The demo script with a slow act in iteration 2 (the model takes seconds to answer its later
    turns), so a kill lands mid-act; the re-attempt is served the same way."""
    slow = tmp_path / "slow.json"
    script = json.loads((DEMO / "script.json").read_text())
    reads = [{"tool_uses": [{"name": "read_file", "input": {"path": "textstats.py"}}], "delay_s": 0.4}
             for _ in range(8)]
    script["acts"][1] = reads + script["acts"][1]
    slow.write_text(json.dumps(script))
    return slow


def test_kill_9_of_a_loop_agent_mid_run_completes_without_an_iteration_twice(org, tmp_path):
    slow = slow_script(tmp_path)
    ws = demo_workspace(org)
    item = submit(org, ws, script=slow)
    wid = item["id"]
    wait_for(lambda: query(org, "SELECT COUNT(*) AS c FROM model_calls WHERE work_id=? AND iteration=2", (wid,))[0]["c"] >= 3,
             what="iteration 2's act to be under way")
    agent = query(org, "SELECT assigned_to FROM work_items WHERE id=?", (wid,))[0]["assigned_to"]
    victim = roles(org)[agent]
    os.kill(victim["pid"], signal.SIGKILL)
    done = ended(org, wid, timeout=60)
    assert done["stop_reason"] == "goal_met"
    its = query(org, "SELECT n FROM iterations WHERE work_id=? ORDER BY n", (wid,))
    assert [i["n"] for i in its] == [1, 2]
    calls = query(org, "SELECT request_id FROM model_calls WHERE work_id=?", (wid,))
    assert len(calls) == len({c["request_id"] for c in calls})
    attempts = query(org, "SELECT outcome FROM attempts WHERE work_id=? ORDER BY attempt", (wid,))
    assert [a["outcome"] for a in attempts].count("committed") == 2 and "discarded" in [a["outcome"] for a in attempts]


def test_kill_9_of_coordinator_and_eval_agent_is_recovered(org):
    for name in ("coordinator", "eval-agent"):
        os.kill(roles(org)[name]["pid"], signal.SIGKILL)
    ws = demo_workspace(org)
    item = submit(org, ws)
    assert ended(org, item["id"], timeout=60)["stop_reason"] == "goal_met"
    restarts = {n: r["restarts"] for n, r in roles(org).items() if n in ("coordinator", "eval-agent")}
    assert restarts["coordinator"] >= 1 and restarts["eval-agent"] >= 1, restarts


def test_suspend_mid_run_then_resume_continues_the_numbering(org, tmp_path):
    slow = tmp_path / "slow.json"
    script = json.loads((DEMO / "script.json").read_text())
    script["acts"][1] = [{"tool_uses": [{"name": "read_file", "input": {"path": "textstats.py"}}]}
                         for _ in range(10)] + script["acts"][1]
    slow.write_text(json.dumps(script))
    ws = demo_workspace(org)
    wid = submit(org, ws, script=slow)["id"]
    wait_for(lambda: query(org, "SELECT COUNT(*) AS c FROM iterations WHERE work_id=?", (wid,))[0]["c"] >= 1,
             what="iteration 1 committed")
    out = cli(org, "suspend", "--json")
    assert json.loads(out.stdout)["status"] == "suspended"
    assert not any(procs.is_alive(r["pid"], r["pid_start"]) for r in roles(org).values())
    before = query(org, "SELECT n FROM iterations WHERE work_id=? ORDER BY n", (wid,))
    cli(org, "resume")
    assert ended(org, wid, timeout=60)["stop_reason"] == "goal_met"
    after = [i["n"] for i in query(org, "SELECT n FROM iterations WHERE work_id=? ORDER BY n", (wid,))]
    assert after == list(range(1, len(after) + 1)) and after[:len(before)] == [b["n"] for b in before]


def test_a_run_whose_agent_edits_a_protected_test_is_not_goal_met(org, tmp_path):
    cheat = tmp_path / "cheat.json"
    cheat.write_text(json.dumps({"version": 1, "acts": [[
        {"tool_uses": [{"name": "write_file", "input": {"path": "test_textstats.py",
                                                          "content": "import unittest\n"}}]},
        {"text": "Removed the failing tests."}]], "repeat_last": True}))
    ws = demo_workspace(org)
    item = submit(org, ws, script=cheat)
    done = ended(org, item["id"])
    assert done["stop_reason"] != "goal_met"
    v = query(org, "SELECT protected_changed FROM verdicts WHERE work_id=?", (item["id"],))
    assert "test_textstats.py" in v[0]["protected_changed"]


def test_cancel_of_a_queued_item_and_bad_submits_are_coded(org):
    ws = demo_workspace(org)
    bad = cli(org, "submit", "x", "--workspace", str(ws / "missing"), "--verify", "true", check=False)
    assert bad.returncode == 1 and bad.stderr.startswith("error[workspace_missing]")
    none = cli(org, "submit", "x", "--workspace", str(ws), check=False)
    assert none.returncode == 1 and "error[bad_submit]" in none.stderr
    unknown = cli(org, "show", "w-nope", check=False)
    assert unknown.returncode == 1 and unknown.stderr.startswith("error[not_found]")


def test_a_gated_action_waits_for_org_decide_and_runs_once_when_approved(org, tmp_path):
    script = tmp_path / "gate.json"
    demo = json.loads((DEMO / "script.json").read_text())
    script.write_text(json.dumps({"version": 1, "acts": [
        [{"tool_uses": [{"name": "request_action", "input": {
            "kind": "network", "command": "echo fetched >> fetched.txt", "reason": "needs the upstream file"}}]},
         {"text": "Asked a human for network access."}],
        demo["acts"][1]]}))
    ws = demo_workspace(org)
    wid = submit(org, ws, script=script)["id"]
    pending = wait_for(lambda: json.loads(cli(org, "decisions", "--json").stdout), what="a pending decision")
    assert pending[0]["work_id"] == wid and "echo fetched" in pending[0]["question"]
    wait_for(lambda: query(org, "SELECT status FROM work_items WHERE id=?", (wid,))[0]["status"] == "paused",
             what="the run to pause for the human")
    assert not (ws / "fetched.txt").exists()
    cli(org, "decide", pending[0]["id"], "approve")
    done = ended(org, wid)
    assert (ws / "fetched.txt").read_text() == "fetched\n"            # ran exactly once
    d = query(org, "SELECT status, result, decided_by FROM decisions WHERE id=?", (pending[0]["id"],))[0]
    assert d["status"] == "executed" and d["result"].startswith("exit 0") and d["decided_by"]
    prompt2 = query(org, "SELECT prompt FROM iterations WHERE work_id=? AND n=2", (wid,))
    assert prompt2, "iteration 2 never ran"
    assert done["stop_reason"] in ("goal_met", "max_iterations", "repeated_failure", "no_progress")
    ann = [json.loads(a["data"])["text"] for a in query(org, "SELECT data FROM events WHERE kind='announce'")]
    assert any(pending[0]["id"] in t and "waiting" in t for t in ann)


def test_reject_with_stop_ends_the_run_human_rejected(org, tmp_path):
    script = tmp_path / "gate.json"
    script.write_text(json.dumps({"version": 1, "acts": [[
        {"tool_uses": [{"name": "request_action", "input": {
            "kind": "network", "command": "curl http://example.invalid", "reason": "download"}}]},
        {"text": "asked"}]], "repeat_last": True}))
    ws = demo_workspace(org)
    wid = submit(org, ws, script=script)["id"]
    pending = wait_for(lambda: json.loads(cli(org, "decisions", "--json").stdout), what="a pending decision")
    cli(org, "decide", pending[0]["id"], "reject", "no downloads here", "--stop")
    assert ended(org, wid)["stop_reason"] == "human_rejected"
    again = cli(org, "decide", pending[0]["id"], "approve", check=False)
    assert again.returncode == 1 and "illegal_transition" in again.stderr


def _store_fds(pid: int, home) -> int:
    """How many of ``pid``'s descriptors are open on the org's store (state.db and its WAL)."""
    n = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd).startswith(str(home.db_path)):
                n += 1
        except OSError:
            continue
    return n


def test_a_loop_agents_runs_share_their_connections_and_leave_none_behind(org):
    """A loop-agent keeps its runs' store connections and sender from one run to the next (each
    opening cost a run milliseconds); after many runs it holds no more than after the first,
    and each run's transport counters reach the store when the run ends."""
    first = submit(org, demo_workspace(org, "ws1"))["id"]
    agent = ended(org, first)["assigned_to"] or query(org, "SELECT instance FROM attempts WHERE work_id=?",
                                                     (first,))[0]["instance"]
    pid = query(org, "SELECT pid FROM role_instances WHERE instance=?", (agent,))[0]["pid"]
    after_one = _store_fds(pid, org)
    sent_one = wait_for(lambda: query(org, "SELECT COALESCE(SUM(value), 0) AS v FROM transport_counters "
                                           "WHERE instance=? AND name = 'pushed'", (agent,))[0]["v"] or None,
                        timeout=10, what="the first run's sends counted")
    for k in range(3):
        item = submit(org, demo_workspace(org, f"ws{k + 2}"))["id"]
        ended(org, item)
    pids = {r["instance"]: r["pid"] for r in query(org, "SELECT instance, pid FROM role_instances")}
    if pids[agent] == pid:                          # the same process ran them all (it was not replaced)
        assert _store_fds(pid, org) <= after_one
    assert query(org, "SELECT COALESCE(SUM(value), 0) AS v FROM transport_counters WHERE name = 'pushed' "
                      "AND instance LIKE 'loop-agent%'")[0]["v"] > sent_one
