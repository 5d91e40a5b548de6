"""Every wake that cannot be sent is visible (issue 16): ``org decide`` and ``org cancel`` say so
in one line and still exit 0 (the durable write happened), the CLI's log records it, ``org
status`` counts it per sender; ``org doctor`` explains the stale wakes a CLI left in the outbox
and ``org gc`` removes them, and only them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import orjson
import pytest

from state_db.vocab import Actor, DecisionStatus
from state_db.writer import StateWriter
from tests.support.loop import make_workspace, submit
from tests.support.org import query
from transport.envelope import Envelope
from transport.outbox import write_message

NOTE = "the coordinator was not reached (not sent: keyring_missing)"


def cli(home, *argv):
    return subprocess.run([sys.executable, "-m", "scripts.cli.main", *argv], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "ORG_HOME": str(home.root)})


@pytest.fixture
def decision(org_home, tmp_path):
    """A work item with a pending decision, in an org that has never run (no transport keys)."""
    submit(org_home, make_workspace(tmp_path))
    w = StateWriter(org_home.db_path, Actor.LOOP_AGENT, "loop-agent-1")
    with w.transaction() as tx:
        tx.insert("decisions", {"id": "d-1", "work_id": "w1", "iteration": 1, "kind": "network",
                                "action": {"kind": "network", "command": "true", "reason": "r"},
                                "question": "network: run `true`", "status": DecisionStatus.PENDING,
                                "created_at": tx.now})
    w.close()
    return "d-1"


def unsent(home) -> dict:
    return json.loads(cli(home, "status", "--json").stdout)["unsent_wakes"]


@pytest.mark.timeout(60)
def test_decide_and_cancel_with_the_org_down_say_so_once_exit_0_and_are_counted(org_home, decision):
    decided = cli(org_home, "decide", decision, "approve")
    assert decided.returncode == 0, decided.stderr
    assert decided.stdout.count(NOTE) == 1 and decided.stdout.startswith(f"{decision}: approved")
    assert query(org_home, "SELECT status FROM decisions WHERE id = ?", (decision,))[0]["status"] == "approved"
    assert unsent(org_home) == {"human": 1}
    cancelled = cli(org_home, "cancel", "w1")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.count(NOTE) == 1 and "cancel recorded" in cancelled.stdout
    assert query(org_home, "SELECT cancel_requested FROM work_items WHERE id = 'w1'")[0]["cancel_requested"] == 1
    status = json.loads(cli(org_home, "status", "--json").stdout)
    assert status["unsent_wakes"] == {"human": 2} and status["transport"]["human"]["wake_not_sent"] == 2
    assert "wakes not sent" in cli(org_home, "status").stdout
    logged = [orjson.loads(line) for line in (org_home.logs_dir / "cli.log").read_bytes().splitlines()]
    assert [e["why"] for e in logged if e.get("event") == "wake_not_sent"] == ["not sent: keyring_missing"] * 2


@pytest.mark.timeout(60)
def test_with_json_the_wake_is_a_field_and_the_line_goes_to_stderr(org_home, decision):
    out = cli(org_home, "decide", decision, "respond", "use the mirror", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["wake"] == "not sent: keyring_missing"
    assert out.stderr.count(NOTE) == 1


def plant(home, sender: str, age_s: float) -> str:
    env = Envelope.create("wake", sender, "coordinator", {}, key=b"k" * 32, now=time.time() - age_s)
    path = write_message(home.outbox_dir, "coordinator", env.id, env.encode())
    os.utime(path, (time.time() - age_s, time.time() - age_s))
    return path.name


@pytest.mark.timeout(60)
def test_doctor_explains_stale_cli_wakes_and_gc_removes_only_them(org_home):
    stale = plant(org_home, "human", 3600)
    fresh = plant(org_home, "human", 5)
    other = plant(org_home, "supervisor", 3600)
    doctor = json.loads(cli(org_home, "doctor", "--json").stdout)
    finding = next(f for f in doctor["findings"] if f["check"] == "cli outbox")
    assert finding["level"] == "warning" and finding["detail"].startswith("1 wake(s)")
    assert stale in finding["detail"] and "org gc" in finding["detail"]
    dry = json.loads(cli(org_home, "gc", "--dry-run", "--json").stdout)
    assert dry["cli_outbox"] == 1 and (org_home.outbox_dir / "coordinator" / stale).exists()
    done = cli(org_home, "gc")
    assert done.returncode == 0 and "1 stale CLI wakes" in done.stdout
    left = sorted(p.name for p in (org_home.outbox_dir / "coordinator").iterdir())
    assert left == sorted([fresh, other])
    after = json.loads(cli(org_home, "doctor", "--json").stdout)
    assert next(f for f in after["findings"] if f["check"] == "cli outbox")["level"] == "ok"


@pytest.mark.timeout(60)
def test_the_supervisors_retention_removes_stale_cli_wakes_as_gc_does(org_home):
    """The supervisor's automatic retention and 'org gc' share one collector (state_db.retention),
    so both remove a stale CLI wake and leave the rest."""
    from roles.supervisor.supervisor import Supervisor
    from state_db.kernel import config as config_mod
    stale = plant(org_home, "human", 3600)
    fresh = plant(org_home, "human", 5)
    other = plant(org_home, "supervisor", 3600)
    sup = Supervisor(org_home, config_mod.load(None), spawner=object(), instances=[])
    try:
        sup.apply_retention()
    finally:
        sup.writer.close()
    left = sorted(p.name for p in (org_home.outbox_dir / "coordinator").iterdir())
    assert stale not in left and left == sorted([fresh, other])
