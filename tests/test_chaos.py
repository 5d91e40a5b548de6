"""Faults on purpose: a bounded chaos run of a real org (kill -9 of roles and the supervisor,
suspend/resume), kill -9 of a writer mid-transaction, and proof that the chaos audit can fail."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bench import workload
from bench.chaos_audit import audit
from roles.loop_agent.backends.base import ActOutcome, Usage
from roles.loop_agent.engine import INTERRUPTED
from state_db.bootstrap import init_home
from state_db.kernel.home import OrgHome
from tests.support.loop import engine, submit
from tests.support.org import cleanup, short_home_dir, wait_for

ROOT = Path(__file__).resolve().parents[1]
ZERO = ("lost_items", "iterations_committed_twice", "usage_counted_twice", "acts_replayed_without_reset",
        "runs_without_stop_reason", "usage_without_served_request", "iteration_usage_mismatches", "iteration_gaps")


@pytest.mark.timeout(160)
def test_bounded_chaos_run_loses_no_item_and_commits_no_iteration_twice():
    seed = random.randrange(1_000_000)
    root = short_home_dir()
    try:
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / "chaos.py"), "--json", "--items", "8",
                               "--kills", "3", "--seconds", "6", "--suspends", "1", "--seed", str(seed),
                               "--root", str(root)], capture_output=True, text=True, timeout=150, cwd=ROOT)
    finally:
        cleanup(OrgHome(root / "org"))             # also when the run was cut: no org outlives the test
        shutil.rmtree(root, ignore_errors=True)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    figures = json.loads(proc.stdout)
    seen = {k: figures[k] for k in (*ZERO, "sqlite_integrity", "kills", "suspend_resumes", "seed")}
    assert {k: figures[k] for k in ZERO} == dict.fromkeys(ZERO, 0), seen
    assert figures["sqlite_integrity"] == "ok" and figures["kills"] == 3 and figures["suspend_resumes"] == 1, seen
    assert figures["items"] == 8 and figures["checkpoints_checked"] == figures["iterations"] > 0, seen
    assert proc.returncode == 0, seen


# -- the audit must be able to see what it claims to rule out ---------------------------------------

class TrailActs:
    """An in-process backend doing what the chaos scripts do: append ``it<n>`` to trail.txt, write
    the answer; logs each request like the scripted server. ``cut_first`` ends the first act right
    after its first turn, as a kill or a forced suspend would."""

    name = "anthropic"

    def __init__(self, log: Path, interrupt, cut_first: bool):
        self.log, self.interrupt, self.cut_first, self.acts = log, interrupt, cut_first, 0

    def act(self, ctx, *, on_usage, budget_left):
        self.acts += 1
        rid = f"req-{ctx.work_id}-{ctx.iteration}-{ctx.attempt}"
        with open(self.log, "a") as f:
            f.write(json.dumps({"event": "step", "request_id": rid}) + "\n")
        on_usage(Usage(rid, "scripted", 10, 2))
        with open(ctx.workspace / "trail.txt", "a") as f:
            f.write(f"it{ctx.iteration}\n")
        if self.cut_first and self.acts == 1:
            self.interrupt.set()
            return ActOutcome("budget_exhausted", "cut", error_code=INTERRUPTED, turns=1)
        (ctx.workspace / "answer.txt").write_text("right\n")
        ran = {"name": "run_command", "input": {"command": f"echo it{ctx.iteration} >> trail.txt"}, "ok": True}
        return ActOutcome("ok", "wrote right", tool_calls=(ran,), turns=1)


def replay_once(tmp_path, monkeypatch, *, reset: bool) -> dict:
    import threading

    from roles.workbench.workspace.history import WorkspaceHistory

    home = OrgHome(tmp_path / "org")
    init_home(home)
    ws = workload.make_template(tmp_path / "ws")
    wid = submit(home, ws, work_id="w-trail", verify=(workload.VERIFY,), scope=workload.SCOPE)
    if not reset:
        monkeypatch.setattr(WorkspaceHistory, "reset_to", lambda self, commit: None)
    log = home.logs_dir / "scripted-loop-agent-1.jsonl"
    cut = threading.Event()
    assert engine(home, wid, TrailActs(log, cut, True), interrupt=cut).run() is None       # the act is cut
    decision = engine(home, wid, TrailActs(log, threading.Event(), False)).run()            # a new process
    assert decision.reason == "goal_met"
    return audit(home, {wid: workload.ItemSpec("pass", 1, 0)})


def test_audit_counts_an_attempt_that_started_without_a_reset(tmp_path, monkeypatch):
    leaked = replay_once(tmp_path / "a", monkeypatch, reset=False)
    assert leaked["acts_replayed_without_reset"] == 1 and leaked["replayed_acts"] == 1
    monkeypatch.undo()
    clean = replay_once(tmp_path / "b", monkeypatch, reset=True)
    assert clean["acts_replayed_without_reset"] == 0 and clean["replayed_acts"] == 1
    assert {k: clean[k] for k in ZERO} == dict.fromkeys(ZERO, 0)


def test_audit_counts_usage_that_no_server_served(tmp_path, monkeypatch):
    figures = replay_once(tmp_path, monkeypatch, reset=True)
    assert figures["usage_without_served_request"] == 0
    (tmp_path / "org" / "logs" / "scripted-loop-agent-1.jsonl").write_text("")
    again = audit(OrgHome(tmp_path / "org"), {"w-trail": workload.ItemSpec("pass", 1, 0)})
    assert again["usage_without_served_request"] == again["served_not_counted"] + 2 == 2


# -- kill -9 during writes ------------------------------------------------------------------------

WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from pathlib import Path
    from state_db.writer import StateWriter
    from state_db.snapshot import write_atomic
    from transport.outbox import write_message
    from transport.envelope import new_id
    home, tag = Path(sys.argv[2]), sys.argv[3]
    w = StateWriter(home / "state.db", "human")
    for b in range(10**6):
        wid = f"w-{tag}-{b}"
        def do(tx):
            tx.insert("work_items", {"id": wid, "goal": "g", "workspace": f"/ws/{wid}", "verify": ["true"],
                                     "backend": "anthropic", "status": "queued", "created_by": "t",
                                     "created_at": tx.now, "updated_at": tx.now})
            tx.insert("workspace_locks", {"workspace": f"/ws/{wid}", "work_id": wid, "acquired_at": tx.now})
            for i in range(150):
                tx.journal("bulk", wid, {"i": i, "pad": "x" * 200})
            return {"id": wid}
        w.run_once(f"key-{wid}", "submit", do, args={"id": wid})
        write_message(home / "outbox", "coordinator", new_id(), b'{"work": "%s"}' % wid.encode() + b" " * 50000)
        write_atomic(home / "snapshots" / "org-state.md", ("row\\n" * 20000) + wid)
        print(b, flush=True)
""")


def test_kill_9_mid_transaction_loop_leaves_integrity_ok_no_partial_rows_and_no_orphans(tmp_path):
    home = OrgHome(tmp_path / "org")
    init_home(home)
    for round_no in range(3):
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(ROOT), str(home.root), str(round_no)],
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "0"          # one whole batch written, then at random
            time.sleep(random.uniform(0.02, 0.3))
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
            child.stdout.close()
    conn = sqlite3.connect(home.db_path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        items = {r[0] for r in conn.execute("SELECT id FROM work_items")}
        locks = {r[0] for r in conn.execute("SELECT work_id FROM workspace_locks")}
        keys = {r[0].removeprefix("key-") for r in conn.execute("SELECT key FROM idempotency")}
        created = {r[0] for r in conn.execute("SELECT subject FROM events WHERE kind = 'work_items.created'")}
        bulk = dict(conn.execute("SELECT subject, COUNT(*) FROM events WHERE kind = 'bulk' GROUP BY subject"))
    finally:
        conn.close()
    assert len(items) >= 3 and items == locks == keys == created == set(bulk)   # whole transactions only
    assert set(bulk.values()) == {150}
    # recovery: the recipient's receiver starts and sweeps; every complete file stays readable
    from transport.ledger import Ledger
    from transport.outbox import OutboxReader
    reader = OutboxReader(home.outbox_dir, "coordinator", max_bytes=1 << 20)
    # a kill lands between a temp file's write and its rename in about one round of ten: make sure of one
    (reader.tmp_dir / "00000000000000000000000000000000.99999.deadbeef").write_bytes(b'{"work": "half')
    assert all(reader.read(p).startswith(b'{"work": "w-') and reader.read(p).endswith(b" " * 50000)
               for p in reader.pending(10_000))
    _sweep_like_a_starting_role(home, Ledger)
    assert list((home.outbox_dir / ".tmp" / "coordinator").iterdir()) == []
    snapshot = (home.snapshots_dir / "org-state.md").read_text()
    assert snapshot.startswith("row\n") and snapshot.rsplit("\n", 1)[1].startswith("w-")


def _sweep_like_a_starting_role(home, ledger_cls) -> None:
    """What a role does at start for its outbox (orphan age 0 here; the org waits a minute)."""
    from transport.keys import Keyring
    from transport.receiver import Receiver
    from roles.base.transport_link import keyring_file

    keyring = Keyring.create(keyring_file(home))
    receiver = Receiver("coordinator", run_dir=home.run_dir, outbox_root=home.outbox_dir, keyring=keyring,
                        handler=lambda env: None, ledger=ledger_cls(home.db_path, "coordinator"),
                        watch=False, orphan_age_s=0.0)
    try:
        receiver.start()
        wait_for(lambda: receiver.poll(50) >= 0 and not list((home.outbox_dir / ".tmp" / "coordinator").iterdir()),
                 timeout=10, what="the sweep to remove orphaned temp files")
    finally:
        receiver.close()


def test_a_snapshot_temp_file_left_by_a_killed_writer_is_removed_by_the_next_render(tmp_path):
    from state_db.snapshot import SnapshotHook

    home = OrgHome(tmp_path / "org")
    init_home(home)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    orphan = home.snapshots_dir / f".org-state.md.{dead}.tmp"
    orphan.write_text("half a snapshot")
    SnapshotHook(home.db_path, debounce_s=0)(None, [{"kind": "x"}])
    assert (home.snapshots_dir / "org-state.md").exists()
    assert not orphan.exists()


def test_resume_after_a_supervisor_crash_waits_for_the_new_processes(tmp_path):
    from roles.base.instances import org_instances
    from scripts import control
    from state_db.writer import StateWriter

    home = OrgHome(tmp_path / "org")
    cfg, _ = init_home(home)
    before = time.time() - 60
    sup = StateWriter(home.db_path, "supervisor")
    with sup.transaction() as tx:                     # what a supervisor killed with -9 leaves behind
        tx.insert("org_session", {"id": 1, "status": "running", "supervisor_pid": 999_999, "started_at": before,
                                  "updated_at": before, "detail": "{}"})
        for spec in org_instances(cfg["org.loop_agents"]):
            tx.insert("role_instances", {"instance": spec.instance, "role": spec.role, "status": "ready",
                                         "pid": 999_998, "started_at": before, "heartbeat_at": before,
                                         "updated_at": before})
    sup.close()

    class NewSupervisor:                              # started, not yet ready
        pid = 424_242

        def poll(self):
            return None

    with pytest.raises(control.ControlError):
        control.wait_ready(home, timeout_s=0.5, proc=NewSupervisor())
