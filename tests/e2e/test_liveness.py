"""States are true: the eval-agent is busy, with the run's id, while it verifies; a loop-agent is
busy only while it holds a run; and after a kill -9 of every org process, `org status` says at
once, in one line, that the org is not running and how to recover, and no role is shown alive.
Real org processes, the real sandbox, the real CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.org import ONE_AGENT, kill_everything, running_org, wait_for

CONFIG = ONE_AGENT + '[model]\nbackend = "scripted"\n'


def cli(home, *argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scripts.cli.main", *argv], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "ORG_HOME": str(home.root)})


def status(home) -> dict:
    out = cli(home, "status", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def role(st: dict, instance: str) -> dict:
    return next(r for r in st["roles"] if r["instance"] == instance)


@pytest.mark.timeout(150)
def test_roles_show_what_they_do_and_a_killed_org_is_not_running(tmp_path):
    with running_org(CONFIG) as home:
        ws = home.root.parent / "ws-live"
        ws.mkdir()
        (ws / "f.txt").write_text("x\n")
        script = home.root.parent / "live.json"
        script.write_text(json.dumps({"version": 1, "acts": [[{"text": "nothing to do", "usage": {
            "input_tokens": 10, "output_tokens": 5}}]]}))
        verify = "sleep 4; false"          # holds the eval-agent long enough to be seen busy
        got = cli(home, "submit", "nothing", "--workspace", str(ws), "--verify", verify, "--backend",
                  f"scripted:{script}", "--max-iterations", "1", "--no-wait", "--json")
        assert got.returncode == 0, got.stderr
        wid = json.loads(got.stdout)["id"]
        busy = wait_for(lambda: (r := role(status(home), "eval-agent"))["activity"] == "busy" and r, timeout=60,
                        what="the eval-agent busy verifying")
        assert busy["work_id"] == wid
        wait_for(lambda: any(line.startswith("eval-agent") and "busy" in line and wid in line
                             for line in cli(home, "status").stdout.splitlines()),
                 timeout=60, what="org status showing the eval-agent busy with the run (preflight or iteration 1)")
        wait_for(lambda: status(home)["work"]["recent_ended"] and status(home)["work"]["recent_ended"][0]["id"] == wid,
                 timeout=60, what=f"{wid} to end")
        st = wait_for(lambda: (s := status(home)) and all(r["activity"] == "idle" for r in s["roles"]
                                                           if r["role"] in ("loop-agent", "eval-agent")) and s,
                      timeout=20, what="the loop-agent and the eval-agent idle once the run ended")
        assert st["session"]["alive"] is True and st["session"]["line"] == "running"
        assert all(r["work_id"] is None for r in st["roles"] if r["role"] in ("loop-agent", "eval-agent"))

        kill_everything(home)
        out = cli(home, "status")
        assert out.returncode == 0, out.stderr
        first = out.stdout.splitlines()[0]
        assert first.startswith("session: not running") and "scripts/start-org" in first, out.stdout
        st = status(home)
        assert st["session"]["alive"] is False and st["session"]["status"] == "running"   # as recorded
        shown = {r["instance"]: r["activity"] for r in st["roles"]}
        assert shown and all(a in ("dead", "stopped", "crashed", "failed") for a in shown.values()), shown
        assert "idle" not in out.stdout and "busy" not in out.stdout, out.stdout
