"""Several eval-agents (``[org] eval_agents``): each verifies its own share of the work items,
the preflight and every iteration of a work item by the same one; a killed one's share waits for
it and is verified once it is back, never by another and never twice. Real processes."""
from __future__ import annotations

import os
import signal

import pytest

from roles.instances import eval_agent_for, eval_agent_names, eval_agent_shard, org_instances, shard_of
from tests.support.org import query, roles, running_org, wait_for
from tests.test_org_e2e import demo_workspace, ended, submit

pytestmark = pytest.mark.timeout(150)

CONFIG = """
[org]
loop_agents = 3
eval_agents = 2
[supervisor]
heartbeat_s = 0.2
heartbeat_timeout_s = 10.0
stop_timeout_s = 6.0
"""


def test_the_shares_are_stable_cover_every_work_item_and_one_eval_agent_keeps_its_name():
    assert eval_agent_names(1) == ["eval-agent"] and eval_agent_for("w-anything", 1) == "eval-agent"
    assert eval_agent_shard("eval-agent", 1) is None
    names = eval_agent_names(3)
    assert names == ["eval-agent-1", "eval-agent-2", "eval-agent-3"]
    ids = [f"w{i:04d}" for i in range(300)]
    owners = [eval_agent_for(w, 3) for w in ids]
    assert owners == [eval_agent_for(w, 3) for w in ids]               # the same answer every time
    assert {o: owners.count(o) > 60 for o in names} == dict.fromkeys(names, True)  # all share the work
    for name in names:
        k, count = eval_agent_shard(name, 3)
        assert all((shard_of(w, count) == k) == (eval_agent_for(w, 3) == name) for w in ids)
    specs = [s.instance for s in org_instances(2, 3)]
    assert specs == ["coordinator", "loop-agent-1", "loop-agent-2", *names, "curator"]


@pytest.fixture
def org(monkeypatch):
    with running_org(CONFIG) as home:
        monkeypatch.setenv("ORG_HOME", str(home.root))
        yield home


def test_each_work_item_is_verified_by_its_own_eval_agent_and_a_killed_one_catches_up(org):
    assert {"eval-agent-1", "eval-agent-2"} <= set(roles(org)) and "eval-agent" not in roles(org)
    # enough items that both shares are met (the ids are random)
    items = [submit(org, demo_workspace(org, f"ws{i}"))["id"] for i in range(6)]
    owners = {w: eval_agent_for(w, 2) for w in items}
    if len(set(owners.values())) < 2:
        pytest.skip("all six random ids fell in one share")      # 1 in 32
    for w in items:
        assert ended(org, w, timeout=90)["stop_reason"] == "goal_met"
    for w in items:
        verdicts = query(org, "SELECT iteration, written_by FROM verdicts WHERE work_id=? ORDER BY iteration", (w,))
        pre = query(org, "SELECT written_by FROM preflights WHERE work_id=?", (w,))
        assert [v["iteration"] for v in verdicts] == [1, 2]                   # once each, never twice
        assert {v["written_by"] for v in verdicts} | {p["written_by"] for p in pre} == {owners[w]}

    # kill -9 one eval-agent: its share waits for it (the supervisor restarts it), then is verified
    victim = "eval-agent-2"
    pid = roles(org)[victim]["pid"]
    os.kill(pid, signal.SIGKILL)
    more = [submit(org, demo_workspace(org, f"later{i}"))["id"] for i in range(4)]
    for w in more:
        assert ended(org, w, timeout=90)["stop_reason"] == "goal_met"
        verdicts = query(org, "SELECT iteration, written_by FROM verdicts WHERE work_id=? ORDER BY iteration", (w,))
        assert [v["iteration"] for v in verdicts] == [1, 2]
        assert {v["written_by"] for v in verdicts} == {eval_agent_for(w, 2)}
    wait_for(lambda: roles(org)[victim]["status"] == "ready" and roles(org)[victim]["pid"] != pid,
             timeout=30, what="the killed eval-agent back")
