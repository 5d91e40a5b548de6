"""Every waiting state survives a restart (issue 16), through real org processes: a run paused on
a human decision is decided while the org is running, suspended or killed with -9; each approved
or edited action runs exactly once, its effect is in the final checkpoint, a rejection or an
answer reaches the next prompt, and every run reaches its scripted end. A parked run holds no
loop-agent (the org has one)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from scripts import control
from roles.supervisor import procs
from roles.workbench.workspace.history import WorkspaceHistory
from tests.support.org import ONE_AGENT as CONFIG, kill_everything, query, roles, running_org, wait_for
VERIFY = '[ "$(cat answer.txt)" = right ] || { echo "FAIL: answer.txt is $(cat answer.txt)"; exit 1; }'
# verdict -> (kind of the gated request, what the human says, what action.log must hold at the end)
DECISIONS = {
    "approve": ("outside_workspace", None, "approved\n"),
    "edit": ("network", "echo edited >> action.log", "edited\n"),
    "reject": ("outside_workspace", "not on this machine", None),
    "respond": ("network", "the file is already in vendor/", None),
}
# what the human's decision looks like in the next iteration's prompt
IN_PROMPT = {"approve": "Human approved", "edit": "Human approved", "reject": "Human rejected",
             "respond": "the file is already in vendor/"}


@pytest.fixture(scope="module")
def org():
    with running_org(CONFIG) as home:
        yield home


@pytest.fixture
def live_org(org):
    """The shared org, started again if an earlier test left it down."""
    if not control.supervisor_alive(org):
        control.start_background(org, timeout_s=20)
    return org


def cli(home, *argv, check=True):
    proc = subprocess.run([sys.executable, "-m", "scripts.cli.main", *argv], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "ORG_HOME": str(home.root)})
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def gated_script(folder: Path, kind: str) -> Path:
    """Iteration 1 asks (twice, identically) to run `echo approved >> action.log`; iteration 2
    fixes the answer."""
    ask = {"name": "request_action", "input": {"kind": kind, "command": "echo approved >> action.log",
                                               "reason": "the goal needs a file from outside"}}
    path = folder / f"gated-{kind}.json"
    path.write_text(json.dumps({"version": 1, "acts": [
        [{"tool_uses": [ask]}, {"tool_uses": [ask]}, {"text": "Asked a human; ending my turn."}],
        [{"tool_uses": [{"name": "write_file", "input": {"path": "answer.txt", "content": "right\n"}}]},
         {"text": "Wrote the right answer."}]]}))
    return path


def fixing_script(folder: Path) -> Path:
    path = folder / "fix.json"
    path.write_text(json.dumps({"version": 1, "acts": [
        [{"tool_uses": [{"name": "write_file", "input": {"path": "answer.txt", "content": "right\n"}}]},
         {"text": "Wrote the right answer."}]]}))
    return path


def submit(home, tag: str, script: Path) -> tuple[str, Path]:
    ws = home.root.parent / "ws" / tag
    ws.mkdir(parents=True)
    (ws / "answer.txt").write_text("wrong\n")
    out = cli(home, "submit", f"make answer.txt say right ({tag})", "--workspace", str(ws), "--verify", VERIFY,
              "--scope", "answer.txt", "--backend", f"scripted:{script}", "--max-iterations", "4", "--no-wait", "--json")
    return json.loads(out.stdout)["id"], ws


def work(home, wid: str) -> dict:
    return query(home, "SELECT * FROM work_items WHERE id = ?", (wid,))[0]


def parked(home, wid: str) -> dict | None:
    """The run's one pending decision once the run is paused and let go of."""
    w = work(home, wid)
    ds = query(home, "SELECT * FROM decisions WHERE work_id = ?", (wid,))
    if w["status"] == "paused" and w["assigned_to"] is None and len(ds) == 1 and ds[0]["status"] == "pending":
        return ds[0]
    return None


def submit_parked(home, tmp_path: Path, case: str) -> dict[str, tuple[str, Path, dict]]:
    """One run per human verdict, each parked on its decision: verdict -> (work id, workspace, decision)."""
    runs = {}
    for verdict, (kind, _, _) in DECISIONS.items():
        wid, ws = submit(home, f"{case}-{verdict}", gated_script(tmp_path, kind))
        runs[verdict] = (wid, ws)
    out = {}
    for verdict, (wid, ws) in runs.items():
        d = wait_for(lambda: parked(home, wid), timeout=40, what=f"{wid} parked on one pending decision")
        assert not (ws / "action.log").exists()
        out[verdict] = (wid, ws, d)
    return out


def decide_all(home, runs: dict) -> None:
    for verdict, (_, _, d) in runs.items():
        text = DECISIONS[verdict][1]
        out = cli(home, "decide", d["id"], verdict, *([text] if text else []))
        assert "not reached" not in out.stdout, out.stdout       # pushed, or filed for the next start


def processes_running(needle: str) -> list[int]:
    """Pids whose command line holds ``needle``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and needle.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def prompts_of(home, tag: str, iteration: int) -> list[str]:
    """The prompts the scripted model was sent for ``iteration`` of the run whose goal names ``tag``
    (in its ``## Goal`` section: another run's prompt may quote this goal in a curated note)."""
    found = []
    goal = f"## Goal\nmake answer.txt say right ({tag})"
    for path in home.logs_dir.glob("scripted-*.jsonl*"):
        for line in path.read_bytes().splitlines():
            entry = orjson.loads(line)
            if entry.get("event") == "act" and entry.get("iteration") == iteration and goal in entry.get("prompt", ""):
                found.append(entry["prompt"])
    return found


def assert_kept_once_and_ended(home, case: str, runs: dict) -> None:
    for verdict, (wid, ws, d) in runs.items():
        done = wait_for(lambda: (w := work(home, wid))["status"] == "ended" and w, timeout=60, what=f"{wid} to end")
        assert done["stop_reason"] == "goal_met", (verdict, done["stop_reason"], done["stop_detail"])
        its = query(home, "SELECT n, checkpoint FROM iterations WHERE work_id = ? ORDER BY n", (wid,))
        assert [i["n"] for i in its] == [1, 2], verdict
        row = query(home, "SELECT * FROM decisions WHERE work_id = ?", (wid,))
        assert len(row) == 1, f"{verdict}: identical requests must be one decision, got {len(row)}"
        row = row[0]
        log = DECISIONS[verdict][2]
        history = WorkspaceHistory(home.history_dir / f"{wid}.git", ws)
        final = history.diff(None, its[-1]["checkpoint"])
        if log is None:
            assert not (ws / "action.log").exists(), verdict
            assert row["status"] == {"reject": "rejected", "respond": "responded"}[verdict]
            assert "action.log" not in final
        else:
            assert (ws / "action.log").read_text() == log, f"{verdict}: the action must run exactly once"
            assert row["status"] == "executed" and row["result"].startswith("exit 0"), (verdict, row["result"])
            assert row["checkpoint"] and row["executor"], verdict
            assert "action.log" in final and f"+{log.strip()}" in final, f"{verdict}: effect lost\n{final}"
            assert "action.log" in history.diff(None, row["checkpoint"]), f"{verdict}: the action's checkpoint"
        prompts = prompts_of(home, f"{case}-{verdict}", 2)
        assert prompts and all(IN_PROMPT[verdict] in p for p in prompts), (verdict, prompts[:1])


@pytest.mark.timeout(120)
def test_decided_while_running_each_verdict_takes_effect_once(live_org, tmp_path):
    runs = submit_parked(live_org, tmp_path, "running")
    decide_all(live_org, runs)
    assert_kept_once_and_ended(live_org, "running", runs)


@pytest.mark.timeout(120)
def test_decided_while_suspended_takes_effect_on_resume(live_org, tmp_path):
    runs = submit_parked(live_org, tmp_path, "suspend")
    assert json.loads(cli(live_org, "suspend", "--json").stdout)["status"] == "suspended"
    assert not any(procs.is_alive(r["pid"], r["pid_start"]) for r in roles(live_org).values())
    decide_all(live_org, runs)
    assert all(work(live_org, wid)["status"] == "paused" for wid, _, _ in runs.values())
    cli(live_org, "resume")
    assert_kept_once_and_ended(live_org, "suspend", runs)


@pytest.mark.timeout(120)
def test_decided_after_kill_9_of_every_process_takes_effect_on_start(live_org, tmp_path):
    runs = submit_parked(live_org, tmp_path, "kill")
    kill_everything(live_org)
    wait_for(lambda: not control.supervisor_alive(live_org), timeout=10, what="the killed supervisor to be gone")
    decide_all(live_org, runs)
    start = subprocess.run([sys.executable, "-m", "scripts.cli.start_org", "--home", str(live_org.root)],
                           capture_output=True, text=True, timeout=60)
    assert start.returncode == 0, start.stdout + start.stderr
    assert_kept_once_and_ended(live_org, "kill", runs)


@pytest.mark.timeout(90)
def test_a_parked_run_holds_no_loop_agent_and_other_work_is_dispatched_to_it(live_org, tmp_path):
    gated, _ = submit(live_org, "parked", gated_script(tmp_path, "outside_workspace"))
    d = wait_for(lambda: parked(live_org, gated), timeout=40, what=f"{gated} parked")
    wait_for(lambda: roles(live_org)["loop-agent-1"]["current_work"] is None, timeout=10,
             what="the loop-agent to show no current work while the run is parked")
    other, _ = submit(live_org, "meanwhile", fixing_script(tmp_path))
    done = wait_for(lambda: (w := work(live_org, other))["status"] == "ended" and w, timeout=40,
                    what=f"{other} to run on the only loop-agent")
    assert done["stop_reason"] == "goal_met" and done["assigned_to"] in (None, "loop-agent-1")
    assert parked(live_org, gated) is not None, "the parked run must still wait for its human"
    cli(live_org, "decide", d["id"], "reject", "--stop")
    ended = wait_for(lambda: (w := work(live_org, gated))["status"] == "ended" and w, timeout=30, what=f"{gated} to end")
    assert ended["stop_reason"] == "human_rejected"


@pytest.mark.timeout(120)
def test_kill_9_while_an_approved_action_runs_asks_the_human_again_and_never_reruns_it(live_org, tmp_path):
    """The worst moment: every process killed while the action runs (in the network sandbox,
    which dies with its loop-agent). After the start the decision is a question again, the
    action has not run on its own, and the run goes on once the human decides."""
    script = gated_script(tmp_path, "network")
    script.write_text(script.read_text().replace("echo approved >> action.log",
                                                 "echo pushing now; sleep 4; echo approved >> action.log"))
    wid, ws = submit(live_org, "killed-mid-action", script)
    d = wait_for(lambda: parked(live_org, wid), timeout=40, what=f"{wid} parked")
    cli(live_org, "decide", d["id"], "approve")
    wait_for(lambda: query(live_org, "SELECT status FROM decisions WHERE id = ?", (d["id"],))[0]["status"] == "executing",
             timeout=30, what="the approved action to be running")
    wait_for(lambda: processes_running("sleep 4; echo approved"), timeout=10, what="the action's process")
    kill_everything(live_org)
    wait_for(lambda: not processes_running("sleep 4; echo approved"), timeout=10,
             what="the action's process to die with its loop-agent")
    control.start_background(live_org, timeout_s=20)
    again = wait_for(lambda: parked(live_org, wid), timeout=40, what="the decision to be a question again")
    assert again["id"] == d["id"] and "interrupted" in again["result"] and again["executor"] is None
    # the question says what happened: approved before, started, what it printed, may have run partly
    for said in ("ASKED AGAIN", "was approved by", "started at", "may have run partly", "pushing now"):
        assert said in again["question"], again["question"]
    assert not (ws / "action.log").exists(), "the action must not run again on its own"
    cli(live_org, "decide", d["id"], "reject", "it was cut; go on without it")
    done = wait_for(lambda: (w := work(live_org, wid))["status"] == "ended" and w, timeout=60, what=f"{wid} to end")
    assert done["stop_reason"] == "goal_met" and not (ws / "action.log").exists()
