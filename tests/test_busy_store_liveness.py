"""A role that waits for a busy store is alive: its beat (roles/base/beat.py) does not wait for
the store's write lock, so the supervisor does not kill it and the coordinator does not hand its
run away; a role that is really stuck still is killed and restarted; a run handed over all the
same goes on with its new holder (``run_taken``). Real processes on ipc://."""
from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import time

import pytest

from roles.base import beat
from roles.coordinator.dispatch import live_agents, requeue_orphans
from roles.supervisor import procs
from scripts import control
from scripts.cli.commands.status import load
from state_db.bootstrap import init_home
from state_db.connection import connect
from state_db.kernel.home import OrgHome
from state_db.vocab import Actor, RoleStatus, WorkStatus
from state_db.writer import StateWriter
from tests.support.org import cleanup, roles, short_home_dir, wait_for, write_config

pytestmark = pytest.mark.timeout(180)

# one interpreter per role: no idle loop-agent is replaced by a fork of the warm template while
# the test compares which processes run before and after

TIMEOUT_S = 2.0
CONFIG = f"""
[org]
loop_agents = 2
[supervisor]
spawn = "exec"
heartbeat_s = 0.2
heartbeat_timeout_s = {TIMEOUT_S}
restart_max = 5
restart_window_s = 60.0
stop_timeout_s = 5.0
"""


@pytest.fixture
def org(monkeypatch):
    home = OrgHome(short_home_dir() / "org")
    write_config(home, CONFIG)
    init_home(home)
    monkeypatch.setenv("ORG_HOME", str(home.root))
    yield home
    cleanup(home)


WARM_SWAP = "replaced by a fork of the warm template"


def _identities(home) -> dict[str, tuple]:
    """Each role's restart count and how its last process ended: a role killed (stale, crashed)
    is restarted and counted. A loop-agent the supervisor replaced on purpose once its template
    was warm (an idle role forked before that is forked again) is not restarted: that ending
    reads as none."""
    return {n: (r["restarts"], None if r["last_exit"] == WARM_SWAP else r["last_exit"])
            for n, r in roles(home).items()}


def test_roles_waiting_for_a_store_held_past_their_heartbeat_timeout_are_not_killed(org):
    control.start_background(org, timeout_s=30)
    before = _identities(org)
    wait_for(lambda: all(beat.last(org.run_dir, n) for n in before), what="every role's beat file")
    hold = sqlite3.connect(org.db_path, isolation_level=None)
    hold.execute("BEGIN IMMEDIATE")                  # the store busy for three heartbeat timeouts
    held_at = time.time()
    try:
        stale_beats = []
        while time.time() - held_at < 3 * TIMEOUT_S:
            time.sleep(0.25)
            now = time.time()
            stale_beats += [(n, round(now - (beat.last(org.run_dir, n) or 0), 2)) for n in before
                            if now - (beat.last(org.run_dir, n) or 0) > TIMEOUT_S]
        rows = roles(org)
        conn = connect(org.db_path, readonly=True)      # what 'org status' shows meanwhile
        shown = load(conn, run_dir=org.run_dir)["roles"]
        conn.close()
        shown_at = time.time()
    finally:
        hold.execute("ROLLBACK")
        hold.close()
    released_at = time.time()
    # no row was written while the store was held (the lock was real), yet every role beat on
    assert all((r["heartbeat_at"] or 0) <= held_at for r in rows.values()), rows
    assert stale_beats == []
    assert all(shown_at - r["heartbeat_at"] <= TIMEOUT_S and r["activity"] == "idle" for r in shown), shown
    wait_for(lambda: all((r["heartbeat_at"] or 0) > released_at and r["status"] == "ready"
                         for r in roles(org).values()), what="every role's heartbeat row after the store is free")
    assert _identities(org) == before                # same processes, none restarted
    assert all(procs.is_alive(r["pid"], r["pid_start"]) for r in roles(org).values())
    assert control.request(org, "stop", timeout_s=30)["status"] == "stopped"


def test_a_role_that_is_stuck_is_still_killed_and_restarted(org):
    """Its beat stops with it (SIGSTOP: neither its main loop nor a store wait goes on)."""
    control.start_background(org, timeout_s=30)
    victim = roles(org)["loop-agent-1"]
    os.kill(victim["pid"], signal.SIGSTOP)
    try:
        after = wait_for(lambda: (r := roles(org)["loop-agent-1"])["status"] == "ready"
                         and r["pid"] != victim["pid"] and r, timeout=30, what="the stuck loop-agent replaced")
    finally:
        if procs.is_alive(victim["pid"], victim["pid_start"]):
            os.kill(victim["pid"], signal.SIGKILL)
    assert after["restarts"] >= 1          # (a replacement slow to start on a loaded host may be replaced again)
    logged = "".join(p.read_text() for p in org.logs_dir.glob("supervisor*.log"))
    stale = [json.loads(line) for line in logged.splitlines() if '"heartbeat_stale"' in line]
    # the stopped process's own event (on a loaded host a role slow to start may have been judged
    # stale before it, running: state R)
    stale = [s for s in stale if s["pid"] == victim["pid"]]
    assert stale, f"no heartbeat_stale for pid {victim['pid']} among {sorted(p.name for p in org.logs_dir.iterdir())}"
    # (silent_s is rounded to 0.1 s: just past the timeout reads as the timeout)
    assert stale[0]["instance"] == "loop-agent-1" and stale[0]["state"] == "T" and stale[0]["silent_s"] >= TIMEOUT_S
    assert control.request(org, "stop", timeout_s=30)["status"] == "stopped"


def test_the_coordinator_keeps_a_run_with_a_loop_agent_whose_row_is_late_but_beats(org_home, tmp_path):
    """Dispatch's liveness: the later of the heartbeat row and the beat file of this host; a
    loop-agent of another host (no file here) by its row alone, as before."""
    w = StateWriter(org_home.db_path, Actor.SUPERVISOR)
    now = time.time()
    with w.transaction() as tx:
        for name in ("loop-agent-1", "loop-agent-2"):
            tx.insert("role_instances", {"instance": name, "role": "loop-agent", "status": RoleStatus.STOPPED,
                                         "updated_at": now})
    for name in ("loop-agent-1", "loop-agent-2"):
        la = StateWriter(org_home.db_path, Actor.LOOP_AGENT, name)
        with la.transaction() as tx:     # ready, its last row 30 s old
            tx.set_status("role_instances", name, RoleStatus.STARTING, updated_at=now)
            tx.set_status("role_instances", name, RoleStatus.READY, heartbeat_at=now - 30, updated_at=now)
        la.close()
    human = StateWriter(org_home.db_path, Actor.HUMAN)
    with human.transaction() as tx:
        tx.insert("work_items", {"id": "w1", "goal": "g", "workspace": str(tmp_path), "verify": [], "caps": {},
                                 "backend": "anthropic", "status": WorkStatus.QUEUED, "created_by": "human",
                                 "created_at": now, "updated_at": now})
    co = StateWriter(org_home.db_path, Actor.COORDINATOR)
    with co.transaction() as tx:
        tx.set_status("work_items", "w1", WorkStatus.DISPATCHED, assigned_to="loop-agent-1")
    b = beat.Beat(org_home.run_dir, "loop-agent-1")
    b.touch(time.time())                              # loop-agent-1 beats; loop-agent-2 does not
    with co.transaction() as tx:
        alive = live_agents(tx, 10.0, org_home.run_dir)
        assert alive == {"loop-agent-1": True, "loop-agent-2": False}
        assert requeue_orphans(tx, alive) == []
        assert live_agents(tx, 10.0) == {"loop-agent-1": False, "loop-agent-2": False}     # the rows alone
    b.touch(time.time() - 60)                         # its beat stopped a minute ago: gone
    with co.transaction() as tx:
        assert requeue_orphans(tx, live_agents(tx, 10.0, org_home.run_dir)) == ["w1"]
    b.close()
    for x in (w, human, co):
        x.close()


def test_a_run_handed_over_while_its_loop_agent_acts_goes_on_with_the_new_holder_nothing_asked(tmp_path):
    """Real processes: the coordinator hands a run to loop-agent B while loop-agent A is inside a
    model call (as when A was taken for gone). A's commit is refused (``run_taken``): its act is
    discarded, nothing is asked of a human, A is not restarted; B waits for A to let go, resets
    the workspace and takes the run to its goal, each iteration committed once."""
    from bench import workload
    from roles.operations.submit import SubmitRequest, submit
    from state_db.queries.work import Caps
    from tests.support.org import query

    root = short_home_dir()
    home = None
    try:
        home, cfg = workload.new_org(root, 2)
        control.start_background(home, timeout_s=60)
        acts = [[{"text": "writing", "delay_s": 3.0, "tool_uses": [{"name": "write_file", "input": {
                     "path": "answer.txt", "content": answer + "\n"}}]},
                 {"text": f"wrote {answer}"}] for answer in ("wrong-one", "right")]
        script = root / "acts.json"
        script.write_text(json.dumps({"version": 1, "acts": acts}))
        ws = root / "ws"
        workload.make_template(ws)
        wid = submit(home, cfg, SubmitRequest(goal="make answer.txt say right", workspace=str(ws),
                                              verify=[workload.VERIFY], scope=list(workload.SCOPE),
                                              caps=Caps(max_iterations=4), backend=f"scripted:{script}"))["id"]
        first = wait_for(lambda: (r := query(home, "SELECT instance FROM attempts WHERE work_id = ? AND attempt = 1 "
                                                   "AND ended_at IS NULL", (wid,))) and r[0]["instance"],
                         timeout=60, what="the first attempt acting")
        other = "loop-agent-2" if first == "loop-agent-1" else "loop-agent-1"
        before = _identities(home)
        co = StateWriter(home.db_path, Actor.COORDINATOR)
        with co.transaction() as tx:                   # what dispatch does with a run whose agent it took for gone
            tx.set_status("work_items", wid, WorkStatus.QUEUED, assigned_to=None)
            tx.set_status("work_items", wid, WorkStatus.DISPATCHED, assigned_to=other)
        co.close()
        wait_for(lambda: query(home, "SELECT status FROM work_items WHERE id = ?", (wid,))[0]["status"] == "ended"
                 or query(home, "SELECT id FROM decisions"), timeout=90, what="the run ended (or a question asked)")
        assert query(home, "SELECT kind, question FROM decisions") == []
        item = query(home, "SELECT stop_reason, assigned_to FROM work_items WHERE id = ?", (wid,))[0]
        assert (item["stop_reason"], item["assigned_to"]) == ("goal_met", other)
        its = query(home, "SELECT i.n, a.instance FROM iterations i JOIN attempts a "
                          "ON a.work_id = i.work_id AND a.attempt = i.attempt ORDER BY i.n")
        assert [(r["n"], r["instance"]) for r in its] == [(1, other), (2, other)]
        cut = query(home, "SELECT instance, outcome FROM attempts WHERE work_id = ? AND attempt = 1", (wid,))[0]
        assert (cut["instance"], cut["outcome"]) == (first, "discarded")
        assert '"run_taken"' in (home.logs_dir / f"{first}.log").read_text()
        assert _identities(home)[first] == before[first]       # A went on, not restarted
        assert control.request(home, "stop", timeout_s=60)["status"] == "stopped"
    finally:
        if home is not None:
            procs.kill_org(home)
        shutil.rmtree(root, ignore_errors=True)
