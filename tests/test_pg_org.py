"""The whole org on a PostgreSQL store (``[state] url`` in org.toml): real role processes, the
real CLI and a throwaway PostgreSQL server on a Unix socket. No state.db is ever made; a work item
reaches goal_met with its verdicts from the eval-agent, and a loop-agent killed with -9 mid-act
leaves a run that finishes with no iteration committed twice and no model call counted twice."""
from __future__ import annotations

import json
import os
import signal

import pytest

from tests.support.org import query, roles, running_org, wait_for
from tests.support.pg import pg_server, pg_url  # noqa: F401 - fixtures
from tests.test_org_e2e import cli, demo_workspace, ended, slow_script, submit

pytestmark = pytest.mark.timeout(180)

CONFIG = """
[org]
loop_agents = 2
[state]
url = "{url}"
[supervisor]
heartbeat_s = 0.2
heartbeat_timeout_s = 10.0
stop_timeout_s = 6.0
"""


@pytest.fixture
def org(pg_url, monkeypatch):
    monkeypatch.delenv("ORG_STATE_URL", raising=False)
    with running_org(CONFIG.format(url=pg_url)) as home:
        monkeypatch.setenv("ORG_HOME", str(home.root))
        yield home


def test_the_org_runs_on_postgresql_and_a_killed_loop_agent_costs_nothing_twice(org, tmp_path, pg_url):
    assert org.db_path == pg_url and not (org.root / "state.db").exists()
    assert {r["status"] for r in roles(org).values()} == {"ready"}           # read from PostgreSQL
    doctor = json.loads(cli(org, "doctor", "--json", check=False).stdout)
    assert any(c["check"] == "integrity" and "PostgreSQL" in c["detail"] for c in doctor["findings"])
    assert not [c for c in doctor["findings"] if c["level"] == "error"], doctor

    item = submit(org, demo_workspace(org))
    done = ended(org, item["id"], timeout=90)
    assert done["stop_reason"] == "goal_met"
    v = query(org, "SELECT iteration, outcome, written_by FROM verdicts WHERE work_id=? ORDER BY iteration",
              (item["id"],))
    assert [(x["outcome"], x["written_by"]) for x in v] == [("fail", "eval-agent"), ("pass", "eval-agent")]

    # a loop-agent killed with -9 in the middle of an act, as tests/test_org_e2e.py does on SQLite
    wid = submit(org, demo_workspace(org, "ws-kill"), script=slow_script(tmp_path))["id"]
    wait_for(lambda: query(org, "SELECT COUNT(*) AS c FROM model_calls WHERE work_id=? AND iteration=2",
                           (wid,))[0]["c"] >= 3, timeout=60, what="iteration 2's act to be under way")
    agent = query(org, "SELECT assigned_to FROM work_items WHERE id=?", (wid,))[0]["assigned_to"]
    os.kill(roles(org)[agent]["pid"], signal.SIGKILL)
    assert ended(org, wid, timeout=90)["stop_reason"] == "goal_met"
    assert [i["n"] for i in query(org, "SELECT n FROM iterations WHERE work_id=? ORDER BY n", (wid,))] == [1, 2]
    calls = query(org, "SELECT request_id FROM model_calls WHERE work_id=?", (wid,))
    assert len(calls) == len({c["request_id"] for c in calls})
    outcomes = [a["outcome"] for a in query(org, "SELECT outcome FROM attempts WHERE work_id=? ORDER BY attempt",
                                            (wid,))]
    assert outcomes.count("committed") == 2 and "discarded" in outcomes
    assert not (org.root / "state.db").exists()


@pytest.mark.parametrize("url, code", [("mysql://x", "config_invalid"),
                                       ("postgresql:///nodb?host=/nonexistent-socket-dir", "db_unreachable")])
def test_a_store_url_that_is_wrong_or_unreachable_is_one_coded_line(tmp_path, url, code, monkeypatch):
    monkeypatch.delenv("ORG_STATE_URL", raising=False)
    home = tmp_path / "org"
    home.mkdir()
    (home / "org.toml").write_text(f'[state]\nurl = "{url}"\n')
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "scripts.cli.main", "status"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "ORG_HOME": str(home)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith(f"error[{code}]: "), proc.stderr
    assert "Traceback" not in proc.stderr and not (home / "state.db").exists()
