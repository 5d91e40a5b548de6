"""Several eval-agents (``[org] eval_agents``): each verifies its own share of the work items,
every iteration of a work item by the same one; a killed one's share waits for it and is
verified once it is back, never by another and never twice. A preflight a loop-agent waits for
is run once, by its owner or by another eval-agent of the host when the owner has not started it.
Real processes."""
from __future__ import annotations

import os
import signal

import pytest

from roles.base.instances import eval_agent_for, eval_agent_names, eval_agent_shard, org_instances, shard_of
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
    # enough items that both shares are met (the ids are random: more are submitted while one
    # share has none; 16 all in one share is 1 in 32768)
    items = [submit(org, demo_workspace(org, f"ws{i}"))["id"] for i in range(6)]
    while len({eval_agent_for(w, 2) for w in items}) < 2 and len(items) < 16:
        items.append(submit(org, demo_workspace(org, f"ws{len(items)}"))["id"])
    owners = {w: eval_agent_for(w, 2) for w in items}
    assert len(set(owners.values())) == 2, owners
    for w in items:
        assert ended(org, w, timeout=90)["stop_reason"] == "goal_met"
    for w in items:
        verdicts = query(org, "SELECT iteration, written_by FROM verdicts WHERE work_id=? ORDER BY iteration", (w,))
        pre = query(org, "SELECT written_by FROM preflights WHERE work_id=?", (w,))
        assert [v["iteration"] for v in verdicts] == [1, 2]                   # once each, never twice
        assert {v["written_by"] for v in verdicts} == {owners[w]}
        # the preflight, once: by its owner, or by the other eval-agent of this host when the
        # owner had not started it while a loop-agent waited (EvalAgentProcess._order)
        assert len(pre) == 1 and pre[0]["written_by"] in {"eval-agent-1", "eval-agent-2"}, pre

    # kill -9 one eval-agent: its share waits for it (the supervisor restarts it), then is verified
    victim = "eval-agent-2"
    pid = roles(org)[victim]["pid"]
    os.kill(pid, signal.SIGKILL)
    more = [submit(org, demo_workspace(org, f"later{i}"))["id"] for i in range(4)]
    while victim not in {eval_agent_for(w, 2) for w in more} and len(more) < 16:   # one of them waits for it
        more.append(submit(org, demo_workspace(org, f"later{len(more)}"))["id"])
    assert victim in {eval_agent_for(w, 2) for w in more}, more
    for w in more:
        assert ended(org, w, timeout=90)["stop_reason"] == "goal_met"
        verdicts = query(org, "SELECT iteration, written_by FROM verdicts WHERE work_id=? ORDER BY iteration", (w,))
        assert [v["iteration"] for v in verdicts] == [1, 2]
        assert {v["written_by"] for v in verdicts} == {eval_agent_for(w, 2)}
    wait_for(lambda: roles(org)[victim]["status"] == "ready" and roles(org)[victim]["pid"] != pid,
             timeout=30, what="the killed eval-agent back")


def _store_with_eval_agents(home, rows):
    """peers and role_instances rows as the hosts' supervisors and the roles write them:
    ``rows`` is (instance, host, status, heartbeat age in s or None)."""
    import time

    from state_db.queries import peers as peer_q
    from state_db.vocab import Actor
    from state_db.writer import StateWriter

    sup = StateWriter(home.db_path, Actor.SUPERVISOR)
    now = time.time()
    with sup.transaction() as tx:
        if peer_q.peer(tx.conn, "coordinator") is None:
            peer_q.register(tx, instance="coordinator", host="coordinator-host", role="coordinator",
                            endpoint="tcp://127.0.0.1:7200", curve_public="c" * 40, hmac_key="00" * 32)
        for name, host, status, age in rows:
            peer_q.register(tx, instance=name, host=host, role="eval-agent", endpoint=f"tcp://{host}:7400",
                            curve_public=name.ljust(40, "x"), hmac_key="00" * 32)
            tx.insert("role_instances", {"instance": name, "role": "eval-agent", "status": "starting",
                                         "updated_at": now})
            if status != "starting":
                tx.set_status("role_instances", name, status, updated_at=now,
                              heartbeat_at=None if age is None else now - age)
    sup.close()


def test_over_tcp_the_eval_agent_list_is_the_stores_and_preflights_stay_on_the_coordinator_host(org_home):
    from roles.base.instances import EvalAgents, OrgEvalAgents, stored_eval_agents
    from state_db.kernel.config import Config
    from state_db.connection import connect

    _store_with_eval_agents(org_home, [("eval-agent", "coordinator-host", "ready", 0.5),
                                       ("eval-agent-50", "worker-1", "ready", 0.5),
                                       ("eval-agent-51", "worker-1", "ready", 60.0),      # heartbeat lapsed
                                       ("eval-agent-52", "worker-2", "starting", None)])
    conn = connect(org_home.db_path, readonly=True)
    agents = stored_eval_agents(conn, heartbeat_timeout_s=10.0)
    assert agents == EvalAgents(("eval-agent", "eval-agent-50"), ("eval-agent",))
    ids = [f"w-{i:04d}" for i in range(200)]
    assert {agents.owner(w, 0) for w in ids} == {"eval-agent"}                 # preflights: coordinator host
    owners = [agents.owner(w, 1) for w in ids]
    assert set(owners) == {"eval-agent", "eval-agent-50"}
    assert all(agents.owner(w, n) == agents.owner(w, 1) for w in ids for n in (2, 7))   # every iteration alike
    assert owners == [("eval-agent", "eval-agent-50")[shard_of(w, 2)] for w in ids]    # the same rule everywhere

    # every process reads the same list: a loop-agent's target is the eval-agent's own share
    tcp = Config({"transport": {"endpoint": "tcp://127.0.0.1:7000"}, "supervisor": {"heartbeat_timeout_s": 10.0}})
    ticks = [0.0]
    seen = OrgEvalAgents(tcp, conn, max_age_s=1.0, clock=lambda: ticks[0])
    assert [seen.target(w, 1) for w in ids] == owners and seen.target(ids[0], 0) == "eval-agent"
    _store_with_eval_agents(org_home, [("eval-agent-53", "worker-2", "ready", 0.1)])
    assert seen.current().everyone == ("eval-agent", "eval-agent-50")        # read at most once a max_age_s
    ticks[0] = 1.5
    assert seen.current().everyone == ("eval-agent", "eval-agent-50", "eval-agent-53")
    conn.close()


def test_over_ipc_the_list_is_the_configured_one_and_the_store_is_not_read():
    from roles.base.instances import OrgEvalAgents
    from state_db.kernel.config import Config

    class NoStore:
        def execute(self, *a, **k):
            raise AssertionError("the store was read over ipc")

    for count in (1, 3):
        cfg = Config({"org": {"eval_agents": count}})
        agents = OrgEvalAgents(cfg, NoStore())
        ids = [f"w-{i}" for i in range(50)]
        assert [agents.target(w, 1) for w in ids] == [eval_agent_for(w, count) for w in ids]
        assert [agents.target(w, 0) for w in ids] == [eval_agent_for(w, count) for w in ids]
        assert agents.current().everyone == tuple(eval_agent_names(count))


def test_with_no_live_eval_agent_in_the_store_a_request_goes_to_the_configured_owner(org_home):
    from roles.base.instances import OrgEvalAgents
    from state_db.kernel.config import Config
    from state_db.connection import connect

    conn = connect(org_home.db_path, readonly=True)
    agents = OrgEvalAgents(Config({"transport": {"endpoint": "tcp://127.0.0.1:7000"}}), conn)
    assert agents.current().owner("w-1", 1) is None and agents.target("w-1", 1) == "eval-agent"
    conn.close()
