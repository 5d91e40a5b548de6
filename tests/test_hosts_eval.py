"""An eval-agent on a joined host, on one machine: the coordinator host (coordinator, its own
eval-agent, curator, the histories served by git daemon) and a worker host in mount and PID
namespaces of its own, where the coordinator host's home and the user's workspace do not exist,
sharing only a throwaway PostgreSQL store (tests/test_hosts.py has the set-up).

The worker host joins with an eval-agent and then, into the same home, with a loop-agent:

- joining with the second role while the first runs is one coded line (its supervisor starts the
  instances it was started with); stopped and joined again, the host runs both;
- the org's eval-agent list is the store's (``eval-agent``, ``eval-agent-50``): a work item whose
  share is the joined eval-agent's has its preflight run by the coordinator host's eval-agent (the
  baseline is the real workspace) and every iteration verified by ``eval-agent-50`` from the
  checkpoints the joined loop-agent pushed, fetched from the coordinator host's git daemon into a
  history of the worker's own, and reaches goal_met;
- the joined eval-agent follows the org's suspend and resume.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from roles.base.instances import EvalAgents
from tests.support.org import query, wait_for
from tests.support.pg import pg_server, pg_url  # noqa: F401 - fixtures
from tests.test_hosts import ROOT, Worker, _ended, _unshare, coordinator_host  # noqa: F401 - a fixture
from tests.test_org_e2e import DEMO, cli, demo_workspace, submit


class BothRoles(Worker):
    """A joined host that joins with an eval-agent (its supervisor in the background), is told
    that a second role cannot join while that one runs, stops, and joins with a loop-agent in the
    foreground: its supervisor then runs both."""

    def __init__(self, tmp, name, hide, join, listen, env):
        self.home = tmp / name
        self.log = tmp / f"{name}.log"
        org = [sys.executable, "-m", "scripts.cli.main"]
        args = [*join, "--listen", listen, "--name", name]
        script = "\n".join([
            'mount -t tmpfs tmpfs "$HIDE" || exit 2',
            f"{_sh(org)} join {_sh(args)} --role eval-agent --timeout 60 || exit 3",
            f"{_sh(org)} join {_sh(args)} --role loop-agent; echo \"second join: $?\"",
            f"{_sh(org)} stop || exit 4",
            f"exec {_sh(org)} join {_sh(args)} --role loop-agent --foreground"])
        self.proc = subprocess.Popen([*_unshare(), "sh", "-c", script], cwd=ROOT, stdout=open(self.log, "wb"),
                                     stderr=subprocess.STDOUT,
                                     env={**env, "ORG_HOME": str(self.home), "HIDE": str(hide)})

    def tail(self) -> str:
        text = super().tail()
        for log in sorted((self.home / "logs").glob("eval-agent-*.log")) if self.home.exists() else []:
            text += f"\n--- {log.name}\n" + log.read_text(errors="replace")[-3000:]
        return text


def _sh(argv: list[str]) -> str:
    import shlex
    return " ".join(shlex.quote(a) for a in argv)


def _ready(org, instance: str) -> bool:
    rows = query(org, "SELECT status FROM role_instances WHERE instance=?", (instance,))
    return bool(rows) and rows[0]["status"] == "ready"


@pytest.mark.timeout(300)
def test_a_joined_eval_agent_verifies_the_iterations_of_its_share_from_the_pushed_checkpoints(
        coordinator_host, pg_url, tmp_path):
    org, port = coordinator_host
    hosts = json.loads(cli(org, "hosts", "--json").stdout)
    join = ["--coordinator", hosts["coordinator"], "--coordinator-key", hosts["coordinator_key"], "--store", pg_url]
    env = {k: v for k, v in os.environ.items() if k not in ("ORG_HOME", "ORG_STATE_URL")}
    worker = BothRoles(tmp_path, "worker-1", org.root.parent, join, f"tcp://127.0.0.1:{port + 1000}", env)
    try:
        wait_for(lambda: "second join" in worker.log.read_text(errors="replace") and _ready(org, "loop-agent-50")
                 and _ready(org, "eval-agent-50"), timeout=120, what=f"both joined roles to be ready: {worker.tail()}")
        said = worker.log.read_text(errors="replace")
        refused = [ln for ln in said.splitlines() if ln.startswith("error[")]
        assert len(refused) == 1 and refused[0].startswith("error[already_running]") and "second join: 1" in said, said
        peers = query(org, "SELECT instance, host, role FROM peers WHERE host='worker-1' ORDER BY instance")
        assert [(p["instance"], p["role"]) for p in peers] == [("eval-agent-50", "eval-agent"),
                                                              ("loop-agent-50", "loop-agent")]
        assert json.loads((worker.home / "joined.json").read_text())["instances"] == ["eval-agent-50",
                                                                                      "loop-agent-50"]

        # the org's list, as every process reads it; a work item of the joined eval-agent's share
        # (the ids are random: one of another share is cancelled before it runs, and another submitted)
        agents = EvalAgents(("eval-agent", "eval-agent-50"), ("eval-agent",))
        for attempt in range(24):
            wid = submit(org, demo_workspace(org, f"ws{attempt}"), "--no-wait")["id"]
            if agents.owner(wid, 1) == "eval-agent-50":
                break
            cli(org, "cancel", wid)
        else:
            pytest.fail("24 random work ids all fell in the coordinator host's share")
        done = _ended(org, wid, worker)
        assert done["stop_reason"] == "goal_met", (done, worker.tail())
        pre = query(org, "SELECT written_by FROM preflights WHERE work_id=?", (wid,))
        assert [p["written_by"] for p in pre] == ["eval-agent"]                  # the real workspace's host
        verdicts = query(org, "SELECT iteration, outcome, written_by FROM verdicts WHERE work_id=? ORDER BY iteration",
                         (wid,))
        assert [(v["iteration"], v["outcome"], v["written_by"]) for v in verdicts] == [
            (1, "fail", "eval-agent-50"), (2, "pass", "eval-agent-50")], worker.tail()
        attempts = query(org, "SELECT instance FROM attempts WHERE work_id=?", (wid,))
        assert {a["instance"] for a in attempts} == {"loop-agent-50"}

        # verified from the objects fetched into the worker's own history: the checkpoints the
        # store names, and the coordinator's baseline (never the loop-agent's copy of the same home)
        mine = worker.home / "eval-history" / f"{wid}.git"
        theirs = org.history_dir / f"{wid}.git"

        def rev(git_dir, ref):
            out = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", "--verify", "--quiet", ref],
                                 capture_output=True, text=True, timeout=30)
            return out.stdout.strip()
        assert rev(mine, "refs/loop-org/baseline") == rev(theirs, "refs/loop-org/baseline") != ""
        for it in query(org, "SELECT n, checkpoint FROM iterations WHERE work_id=? ORDER BY n", (wid,)):
            assert rev(mine, f"{it['checkpoint']}^{{commit}}") == it["checkpoint"]
        assert (worker.home / "eval" / wid / "textstats.py").exists()            # its snapshot, on its host
        user = org.root.parent / f"ws{attempt}" / "textstats.py"
        assert user.read_text() == (DEMO / "project" / "textstats.py").read_text()    # the user's workspace untouched

        # the joined eval-agent follows the org: stopped while it is suspended, started on resume
        def agent():
            return query(org, "SELECT status, started_at FROM role_instances WHERE instance='eval-agent-50'")[0]
        before = agent()["started_at"]
        cli(org, "suspend")
        wait_for(lambda: agent()["status"] == "stopped", timeout=30,
                 what=f"the joined eval-agent to stop: {worker.tail()}")
        cli(org, "resume")
        wait_for(lambda: agent()["status"] == "ready" and agent()["started_at"] > before, timeout=30,
                 what=f"the joined eval-agent to start again: {worker.tail()}")
    finally:
        worker.kill()
