"""A verdict that cannot be written, or that takes too long, never keeps a run waiting (issue 14):
real org processes, real sandbox, scripted agents."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.org import ONE_AGENT, query, running_org, wait_for

CONFIG = ONE_AGENT + '[model]\nbackend = "scripted"\n'


@pytest.fixture(scope="module")
def org():
    with running_org(CONFIG) as home:
        yield home


def cli(home, *argv):
    return subprocess.run([sys.executable, "-m", "scripts.cli.main", *argv], capture_output=True, text=True,
                          timeout=90, env={**os.environ, "ORG_HOME": str(home.root)})


def _workspace(home, name: str) -> Path:
    ws = home.root.parent / name
    ws.mkdir()
    (ws / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    return ws


def _script(home, name: str, acts: list) -> Path:
    path = home.root.parent / f"{name}.json"
    path.write_text(json.dumps({"version": 1, "acts": acts, "repeat_last": True}))
    return path


def _submit(home, ws, script, *verify, extra=()):
    args = ["submit", "make add() add", "--workspace", str(ws), "--backend", f"scripted:{script}", "--json",
            "--no-wait", *extra]
    for v in verify:
        args += ["--verify", v]
    got = cli(home, *args)
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)["id"]


def _ended(home, wid, timeout=40):
    return wait_for(lambda: (r := query(home, "SELECT * FROM work_items WHERE id=?", (wid,))[0])["status"] == "ended"
                    and r, timeout=timeout, what=f"{wid} to end")


def _log_lines(home, event: str, wid: str) -> list[dict]:
    out = []
    for path in (home.root / "logs").glob("eval-agent*.log"):
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("event") == event and rec.get("work_id") == wid:
                out.append(rec)
    return out


CHECK = f"{sys.executable} -c 'import calc; assert calc.add(2, 3) == 5'"
WRITE = {"text": "I change add.", "tool_uses": [{"name": "write_file", "input": {"path": "note.txt", "content": "x"}}]}


@pytest.mark.timeout(90)
def test_a_verifier_that_keeps_failing_writes_an_error_verdict_after_bounded_retries(org):
    """The snapshot of iteration 1 cannot be written (its directory was replaced by a file after
    the preflight): the eval-agent retries with backoff a bounded number of times, then writes an
    ``error`` verdict coded ``verifier_error`` and the run ends ``verify_unrunnable`` — not
    blamed on the doer, and not waiting forever."""
    ws = _workspace(org, "ws-err")
    slow = [[{**WRITE, "delay_s": 1.5}, {"text": "Done."}]]
    wid = _submit(org, ws, _script(org, "err", slow), CHECK, extra=["--max-iterations", "3"])
    wait_for(lambda: query(org, "SELECT 1 FROM preflights WHERE work_id=?", (wid,)), timeout=30, what="preflight")
    snapshot = org.root / "eval" / wid
    shutil.rmtree(snapshot, ignore_errors=True)
    snapshot.write_text("not a directory")
    t0 = time.monotonic()
    done = _ended(org, wid)
    assert done["stop_reason"] == "verify_unrunnable" and "verifier_error" in done["stop_detail"]
    assert time.monotonic() - t0 < 30
    (v,) = query(org, "SELECT outcome, checks FROM verdicts WHERE work_id=?", (wid,))
    assert v["outcome"] == "error" and json.loads(v["checks"])[0]["code"] == "verifier_error"
    failed = _log_lines(org, "verify_failed", wid)
    assert 1 <= len(failed) <= 2 and len(_log_lines(org, "verify_gave_up", wid)) == 1
    assert [r["attempt"] for r in failed] == list(range(1, len(failed) + 1))
    assert query(org, "SELECT COUNT(*) AS c FROM iterations WHERE work_id=?", (wid,))[0]["c"] == 1
    snapshot.unlink()


@pytest.mark.timeout(90)
def test_cancel_while_the_verdict_is_pending_ends_the_run_within_seconds(org):
    """A verify command that takes a minute once the doer wrote ``slow``: the loop-agent waits
    for the verdict, and ``org cancel`` ends the run while it waits."""
    ws = _workspace(org, "ws-cancel")
    acts = [[{"text": "Slow.", "tool_uses": [{"name": "write_file", "input": {"path": "slow", "content": "1"}}]},
             {"text": "Done."}]]
    verify = "if test -f slow; then sleep 60; fi; exit 1"
    wid = _submit(org, ws, _script(org, "cancel", acts), verify, extra=["--max-iterations", "3"])
    wait_for(lambda: query(org, "SELECT 1 FROM iterations WHERE work_id=? AND n=1", (wid,)), timeout=30,
             what="iteration 1 committed")
    time.sleep(0.5)
    assert query(org, "SELECT status FROM work_items WHERE id=?", (wid,))[0]["status"] == "running"
    t0 = time.monotonic()
    got = cli(org, "cancel", wid)
    assert got.returncode == 0, got.stderr
    done = _ended(org, wid, timeout=15)
    assert done["stop_reason"] == "cancelled" and "waiting for the eval-agent" in done["stop_detail"]
    assert time.monotonic() - t0 < 10


@pytest.mark.timeout(90)
def test_the_runs_timeout_fires_while_the_verdict_is_pending(org):
    ws = _workspace(org, "ws-timeout")
    acts = [[{"text": "Slow.", "tool_uses": [{"name": "write_file", "input": {"path": "slow", "content": "1"}}]},
             {"text": "Done."}]]
    verify = "if test -f slow; then sleep 60; fi; exit 1"
    wid = _submit(org, ws, _script(org, "timeout", acts), verify, extra=["--timeout", "4", "--max-iterations", "3"])
    wait_for(lambda: query(org, "SELECT 1 FROM iterations WHERE work_id=? AND n=1", (wid,)), timeout=30,
             what="iteration 1 committed")
    t0 = time.monotonic()
    done = _ended(org, wid, timeout=20)
    assert done["stop_reason"] == "timeout" and "wait for a verdict" in done["stop_detail"]
    assert time.monotonic() - t0 < 10
