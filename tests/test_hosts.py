"""Two hosts on this machine: the coordinator host (coordinator, eval-agent, curator, the work
items' histories served by git daemon) and worker hosts that joined with ``org join``, each in a
mount namespace of its own where the coordinator host's home and the user's workspace do not
exist, and a PID namespace of its own, so killing it kills the whole "machine" at once. They share
only a throwaway PostgreSQL store and talk over ZeroMQ tcp on 127.0.0.1 with CURVE.

- a work item dispatched to a worker's loop-agent reaches goal_met, verified by the coordinator
  host's eval-agent from the checkpoints the worker pushed into its history;
- a joined host follows the org's suspend and resume;
- a worker killed mid-act (the whole namespace, with -9) has its run requeued once its heartbeat
  lapses; a second worker, with a fresh home of its own, joins, fetches the run's history from the
  coordinator host and finishes it with no iteration committed and no model call counted twice;
- a client whose CURVE key nobody registered is refused before any frame, and counted.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.org import query, running_org, wait_for
from tests.support.pg import pg_server, pg_url  # noqa: F401 - fixtures
from tests.test_org_e2e import DEMO, cli, demo_workspace, ended, slow_script, submit

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[1]

CONFIG = """
[org]
loop_agents = 1
[state]
url = "{url}"
[transport]
endpoint = "tcp://127.0.0.1:{port}"
[hosts]
name = "coordinator-host"
loop_agents_here = false
git_listen = "127.0.0.1:{git}"
git_unauthenticated = true
[supervisor]
heartbeat_s = 0.2
heartbeat_timeout_s = 4.0
stop_timeout_s = 6.0
"""


def _unshare() -> list[str]:
    return ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child=SIGKILL",
            "--mount-proc"]


class Worker:
    """A joined host: ``org join --foreground`` in its own mount and PID namespaces, with the
    coordinator host's folder covered by an empty tmpfs."""

    def __init__(self, tmp: Path, name: str, hide: Path, args: list[str], env: dict):
        self.home = tmp / name
        self.log = tmp / f"{name}.log"
        script = 'mount -t tmpfs tmpfs "$1" && shift && exec "$@"'
        argv = [*_unshare(), "sh", "-c", script, "sh", str(hide), sys.executable, "-m", "scripts.cli.main",
                "join", *args, "--name", name, "--foreground"]
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT,
                                     env={**env, "ORG_HOME": str(self.home)})

    def kill(self) -> None:
        """The machine disappears: unshare dies, PID 1 of the namespace with it, then everything in it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def tail(self) -> str:
        text = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
        for log in sorted((self.home / "logs").glob("loop-agent-*.log")) if self.home.exists() else []:
            text += f"\n--- {log.name}\n" + log.read_text(errors="replace")[-3000:]
        return text


def _ended(org, wid, worker, timeout=120):
    try:
        return ended(org, wid, timeout=timeout)
    except AssertionError:
        item = query(org, "SELECT status, stop_reason, stop_detail, assigned_to FROM work_items WHERE id=?", (wid,))
        logs = "".join(f"\n--- {p.name}\n" + p.read_text(errors="replace")[-2000:]
                       for p in sorted([*org.logs_dir.glob("*.log"), *org.logs_dir.glob("*.out")]))
        raise AssertionError(f"{wid} did not end: {item}\n{worker.tail()}\n{logs}") from None


@pytest.fixture
def coordinator_host(pg_url, monkeypatch):
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("the two-host test makes mount and PID namespaces with unshare, as root")
    monkeypatch.delenv("ORG_STATE_URL", raising=False)
    # below the kernel's ephemeral range (32768 and up), so no outgoing connection holds a port
    # the hosts are about to listen on (the base, +200..+500, workers +1000.., git +2000)
    port = random.randrange(20000, 30000, 10)
    with running_org(CONFIG.format(url=pg_url, port=port, git=port + 2000)) as home:
        monkeypatch.setenv("ORG_HOME", str(home.root))
        yield home, port


def test_a_joined_host_runs_the_work_and_a_lost_one_is_replaced_without_anything_twice(
        coordinator_host, pg_url, tmp_path):
    org, port = coordinator_host
    hosts = json.loads(cli(org, "hosts", "--json").stdout)
    key = hosts["coordinator_key"]
    assert hosts["coordinator"] == f"tcp://127.0.0.1:{port + 200}" and hosts["git_url"] == f"git://127.0.0.1:{port + 2000}"
    assert {p["instance"] for p in hosts["peers"]} == {"coordinator", "eval-agent", "curator"}
    assert all("hmac_key" not in p for p in hosts["peers"])

    # the worker's namespace really does not see the coordinator host's home or the workspace
    hidden = org.root.parent
    seen = subprocess.run([*_unshare(), "sh", "-c", 'mount -t tmpfs tmpfs "$1" && ls -A "$1"', "sh", str(hidden)],
                          capture_output=True, text=True, timeout=30)
    assert seen.returncode == 0 and seen.stdout.strip() == "", seen

    join = ["--coordinator", hosts["coordinator"], "--coordinator-key", key, "--role", "loop-agent",
            "--store", pg_url]
    env = {k: v for k, v in os.environ.items() if k not in ("ORG_HOME", "ORG_STATE_URL")}
    first = Worker(tmp_path, "worker-1", hidden, [*join, "--listen", f"tcp://127.0.0.1:{port + 1000}"], env)
    second = None
    try:
        wait_for(lambda: query(org, "SELECT status FROM role_instances WHERE instance='loop-agent-50'")
                 and query(org, "SELECT status FROM role_instances WHERE instance='loop-agent-50'")[0]["status"]
                 == "ready", timeout=60, what=f"the joined loop-agent to be ready: {first.tail()}")

        # 1. the work runs on the joined host and the coordinator host's eval-agent verifies it
        ws = demo_workspace(org)
        wid = submit(org, ws)["id"]
        done = _ended(org, wid, first)
        assert done["stop_reason"] == "goal_met", (done, first.tail())
        assert done["assigned_to"] in (None, "loop-agent-50")
        attempts = query(org, "SELECT instance, outcome FROM attempts WHERE work_id=?", (wid,))
        assert {a["instance"] for a in attempts} == {"loop-agent-50"}
        verdicts = query(org, "SELECT outcome, written_by FROM verdicts WHERE work_id=? ORDER BY iteration", (wid,))
        assert [(v["outcome"], v["written_by"]) for v in verdicts] == [("fail", "eval-agent"), ("pass", "eval-agent")]
        history = org.history_dir / f"{wid}.git"
        for it in query(org, "SELECT n, checkpoint FROM iterations WHERE work_id=? ORDER BY n", (wid,)):
            shown = subprocess.run(["git", "--git-dir", str(history), "rev-parse", f"refs/iterations/{it['n']}"],
                                   capture_output=True, text=True, timeout=30)
            assert shown.stdout.strip() == it["checkpoint"], shown.stderr     # pushed, as the row says
        fsck = subprocess.run(["git", "--git-dir", str(history), "fsck", "--full", "--strict"],
                              capture_output=True, text=True, timeout=60)
        assert fsck.returncode == 0, fsck.stderr
        assert (ws / "textstats.py").read_text() == (DEMO / "project" / "textstats.py").read_text()  # not touched
        local = first.home / "workspaces" / wid / "textstats.py"
        assert local.exists() and local.read_text() != (ws / "textstats.py").read_text()     # the worker's copy

        # 2. a client with a key nobody registered is refused before any frame, and counted
        from tests.test_transport_security import plain_push
        assert plain_push(hosts["coordinator"], [b"not even an envelope"], curve=key, wait_ms=800) == 0
        wait_for(lambda: query(org, "SELECT value FROM transport_counters WHERE instance='coordinator' "
                                    "AND name='curve_refused'"), timeout=20, what="the refusal to be counted")

        # 3. the joined host follows the org: suspended with it, started again when it resumes
        def agent():
            return query(org, "SELECT status, started_at FROM role_instances WHERE instance='loop-agent-50'")[0]
        before = agent()["started_at"]
        cli(org, "suspend")
        wait_for(lambda: agent()["status"] == "stopped", timeout=30, what=f"the joined loop-agent to stop: {first.tail()}")
        cli(org, "resume")
        wait_for(lambda: agent()["status"] == "ready" and agent()["started_at"] > before, timeout=30,
                 what=f"the joined loop-agent to start again: {first.tail()}")

        # 4. the worker disappears mid-act; its run is requeued and a new worker finishes it
        slow = slow_script(tmp_path)
        wid2 = submit(org, demo_workspace(org, "ws-kill"), script=slow)["id"]
        wait_for(lambda: query(org, "SELECT COUNT(*) AS c FROM model_calls WHERE work_id=? AND iteration=2",
                               (wid2,))[0]["c"] >= 3, timeout=90, what=f"iteration 2's act: {first.tail()}")
        first.kill()
        wait_for(lambda: query(org, "SELECT status, assigned_to FROM work_items WHERE id=?", (wid2,))[0]
                 ["assigned_to"] is None, timeout=30, what="the lost worker's run to be requeued")
        second = Worker(tmp_path, "worker-2", hidden, [*join, "--listen", f"tcp://127.0.0.1:{port + 1100}"], env)
        done = _ended(org, wid2, second)
        assert done["stop_reason"] == "goal_met", (done, second.tail())
        assert [i["n"] for i in query(org, "SELECT n FROM iterations WHERE work_id=? ORDER BY n", (wid2,))] == [1, 2]
        calls = query(org, "SELECT request_id FROM model_calls WHERE work_id=?", (wid2,))
        assert len(calls) == len({c["request_id"] for c in calls})
        attempts = query(org, "SELECT instance, outcome FROM attempts WHERE work_id=? ORDER BY attempt", (wid2,))
        outcomes = [a["outcome"] for a in attempts]
        assert outcomes.count("committed") == 2 and "discarded" in outcomes, attempts
        assert {a["instance"] for a in attempts} == {"loop-agent-50", "loop-agent-51"}
    finally:
        for w in (first, second):
            if w is not None:
                w.kill()
