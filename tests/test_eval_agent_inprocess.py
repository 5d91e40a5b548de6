"""The eval-agent role in-process with a StubTransport: its reconcile finds the work in state.db
(a preflight, an iteration waiting for its verdict), runs the real verifier in its worker thread,
and wakes whoever waits — all observed as the messages it sends."""
from __future__ import annotations

import pytest

from roles.workbench.workspace.history import WorkspaceHistory
from state_db.connection import read_rows
from state_db.vocab import Actor
from state_db.writer import StateWriter
from tests.support.loop import eval_agent_in_process, submit
from transport.kinds import Kind


@pytest.fixture
def eval_agent(org_home):
    proc, stub = eval_agent_in_process(org_home)
    yield proc, stub
    proc.request_stop("test over")
    proc.close()
    assert proc.worker is None or not proc.worker.is_alive()


@pytest.fixture
def ws(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    return ws


def test_reconcile_runs_the_preflight_and_tells_the_assigned_loop_agent(org_home, eval_agent, ws):
    proc, stub = eval_agent
    submit(org_home, ws, "w1", verify=("python3 -c 'import calc'",))
    proc.reconcile()
    got = stub.wait_for(Kind.VERDICT_READY, recipient="loop-agent-1", timeout_s=30)
    assert got[0].payload == {"work_id": "w1", "iteration": 0, "verdict": "preflight"}
    assert read_rows(org_home.db_path, "SELECT work_id FROM preflights") == [{"work_id": "w1"}]
    assert stub.messages(Kind.WAKE) == []                  # the run goes on: nothing for the coordinator


def test_a_verify_command_that_cannot_start_ends_the_run_and_wakes_the_coordinator(org_home, eval_agent, ws):
    proc, stub = eval_agent
    submit(org_home, ws, "w1", verify=("no-such-command-anywhere --check",))
    proc.reconcile()
    wake = stub.wait_for(Kind.WAKE, recipient="coordinator", timeout_s=30)[0]
    assert wake.payload == {"work_id": "w1", "ended": "verify_unrunnable"}
    row = read_rows(org_home.db_path, "SELECT status, stop_reason FROM work_items WHERE id='w1'")[0]
    assert row == {"status": "ended", "stop_reason": "verify_unrunnable"}


def test_a_verify_request_gets_the_verdict_of_the_committed_iteration(org_home, eval_agent, ws):
    proc, stub = eval_agent
    submit(org_home, ws, "w1", verify=("python3 -c 'import calc; assert calc.add(2, 2) == 4'",))
    proc.reconcile()
    stub.wait_for(Kind.VERDICT_READY, recipient="loop-agent-1", timeout_s=30)           # the preflight
    (ws / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    checkpoint = WorkspaceHistory(org_home.history_dir / "w1.git", ws).checkpoint(1)
    la = StateWriter(org_home.db_path, Actor.LOOP_AGENT, "loop-agent-1")
    with la.transaction() as tx:
        tx.insert("iterations", {"work_id": "w1", "n": 1, "attempt": 1, "act_status": "ok", "act_summary": "",
                                 "checkpoint": checkpoint, "committed_at": tx.now})
    la.close()
    stub.deliver(Kind.VERIFY_REQUEST, {"work_id": "w1", "iteration": 1}, sender="loop-agent-1")
    proc.step(max_wait_ms=0)                              # the request reaches handle(): the worker looks again
    got = stub.wait_for(Kind.VERDICT_READY, recipient="loop-agent-1", count=2, timeout_s=30)[1]
    assert got.payload["iteration"] == 1
    verdict = read_rows(org_home.db_path, "SELECT outcome, written_by FROM verdicts WHERE iteration = 1")[0]
    assert verdict == {"outcome": "pass", "written_by": "eval-agent"}


def _committed(org_home, ws, checkpoint: str) -> None:
    """Work item ``w1`` with iteration 1 committed at ``checkpoint``, as its loop-agent writes it."""
    submit(org_home, ws, "w1", verify=("true",))
    la = StateWriter(org_home.db_path, Actor.LOOP_AGENT, "loop-agent-1")
    with la.transaction() as tx:
        tx.insert("iterations", {"work_id": "w1", "n": 1, "attempt": 1, "act_status": "ok", "act_summary": "",
                                 "checkpoint": checkpoint, "committed_at": tx.now})
    la.close()


def test_a_second_verdict_for_an_iteration_is_refused_inside_the_write(org_home, ws):
    """Two eval-agents that disagreed for a moment on whose share an iteration is (the org's
    list changing) may both verify it: the second write finds the first in its own transaction
    and writes nothing — not a second verdict, not an error verdict, no goal_met of its own."""
    from roles.eval_agent.checks import CheckResult
    from roles.eval_agent.verifier import Verifier

    _committed(org_home, ws, "0" * 40)

    def check(passed):
        return CheckResult(name="check", command="true", passed=passed, exit_code=0 if passed else 1,
                           timed_out=False, signature="", output_tail="", duration_ms=1.0)

    first = Verifier(org_home, StateWriter(org_home.db_path, Actor.EVAL_AGENT, "eval-agent"))
    second = Verifier(org_home, StateWriter(org_home.db_path, Actor.EVAL_AGENT, "eval-agent-50"))
    written = first.record("w1", 1, [check(False)], [])
    assert second.existing("w1", 1) is not None
    again = second.record("w1", 1, [check(True)], [])                  # raced: it had verified already
    assert (again.id, again.outcome, again.goal_met) == (written.id, "fail", False)
    error = second.record_error("w1", 1, "git_remote_failed", "the coordinator host is unreachable")
    assert error.id == written.id
    rows = read_rows(org_home.db_path, "SELECT id, outcome, written_by FROM verdicts WHERE work_id='w1'")
    assert rows == [{"id": written.id, "outcome": "fail", "written_by": "eval-agent"}]
    assert read_rows(org_home.db_path, "SELECT status FROM work_items WHERE id='w1'")[0]["status"] != "ended"


def test_a_joined_eval_agent_that_cannot_reach_the_coordinator_host_gets_a_coded_error_never_the_doers(
        org_home, ws):
    """On a joined host the checkpoint comes from the coordinator host's git daemon: none
    registered, or one that does not answer, is a coded error (the process retries it, then
    writes it as an ``error`` verdict: the run ends verify_unrunnable, the doer is not charged)."""
    import socket

    from roles.eval_agent.codes import MACHINE_CODES
    from roles.eval_agent.process import remote_histories
    from roles.eval_agent.verifier import Verifier
    from state_db.kernel.errors import OrgError
    from state_db.queries import peers as peer_q

    _committed(org_home, ws, "ab" * 20)
    writer = StateWriter(org_home.db_path, Actor.EVAL_AGENT, "eval-agent-50")
    verifier = Verifier(org_home, writer, history_factory=remote_histories(org_home, writer.conn))
    with pytest.raises(OrgError) as err:
        verifier.verify("w1", 1)
    assert err.value.code == "no_git_server"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]                     # nothing listens there once closed
    sup = StateWriter(org_home.db_path, Actor.SUPERVISOR)
    with sup.transaction() as tx:
        peer_q.register(tx, instance="coordinator", host="coordinator-host", role="coordinator",
                        endpoint="tcp://127.0.0.1:7200", curve_public="c" * 40, hmac_key="00" * 32,
                        git_url=f"git://127.0.0.1:{port}")
    sup.close()
    with pytest.raises(OrgError) as err:
        verifier.verify("w1", 1)
    assert err.value.code == "git_remote_failed" and f"127.0.0.1:{port}" in str(err.value)
    assert err.value.code in MACHINE_CODES and not (org_home.root / "workspaces" / "w1").exists()
    verdict = verifier.record_error("w1", 1, err.value.code, str(err.value))
    assert verdict.outcome == "error" and verdict.checks[0].code == "git_remote_failed"
    row = read_rows(org_home.db_path, "SELECT status, stop_reason FROM work_items WHERE id='w1'")[0]
    assert row == {"status": "ended", "stop_reason": "verify_unrunnable"}
    writer.close()


@pytest.mark.timeout(60)
def test_one_verification_at_a_time_per_work_item_among_the_eval_agents_of_a_home(tmp_path):
    """Two eval-agents of one home that both took an iteration (the list changing): the second
    skips it while the first verifies, so the snapshot is never rewritten under running checks;
    a holder that dies lets go."""
    import subprocess
    import sys

    from roles.eval_agent.process import WorkLocks

    path = tmp_path / "verify.lock"
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys; from roles.eval_agent.process import WorkLocks; "
                               f"locks = WorkLocks({str(path)!r}); assert locks.take('w-1'); "
                               "print('held', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        mine = WorkLocks(path)
        assert mine._at("w-1") != mine._at("w-2")
        assert not mine.take("w-1")                    # the other process verifies it
        assert mine.take("w-2")                        # another work item is not held up
        mine.release("w-2")
        holder.kill()
        holder.wait(timeout=10)
        assert mine.take("w-1")                        # a holder that died let go
        mine.release("w-1")
        mine.close()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)


@pytest.mark.timeout(60)
def test_a_machine_without_bubblewrap_is_named_in_the_error_verdict_not_a_generic_verifier_error(
        org_home, eval_agent, ws, monkeypatch):
    """bubblewrap gone from the machine: the checks cannot run. The eval-agent retries, then
    writes an error whose code says what the machine lacks (``sandbox_unavailable``, every code
    the verifier counts as unrunnable for the machine's sake is kept), and the run ends
    verify_unrunnable, never charged to the doer."""
    import json

    from roles.workbench import sandbox
    from roles.eval_agent.codes import MACHINE_CODES, UNRUNNABLE_CODES
    from roles.workbench.sandbox.mode import RefusingRunner
    from roles.workbench.sandbox.errors import SandboxUnavailable

    monkeypatch.setattr(sandbox, "runner_from_config", lambda *a, **k: RefusingRunner(SandboxUnavailable(
        "bubblewrap (bwrap) is not installed, so agent commands are refused; install the 'bubblewrap' package")))
    proc, stub = eval_agent
    submit(org_home, ws, "w1", verify=("python3 -c 'import calc'",))
    proc.reconcile()
    wake = stub.wait_for(Kind.WAKE, recipient="coordinator", timeout_s=30)[0]
    assert wake.payload == {"work_id": "w1", "ended": "verify_unrunnable"}
    checks = json.loads(read_rows(org_home.db_path, "SELECT checks FROM preflights WHERE work_id='w1'")[0]["checks"])
    assert [c.get("code") for c in checks] == ["sandbox_unavailable"], checks
    assert "bubblewrap" in checks[0]["output_tail"]
    assert set(MACHINE_CODES) == set(UNRUNNABLE_CODES) - {"verify_unrunnable", "verifier_error"}


def test_a_preflight_that_ran_while_its_item_was_queued_wakes_the_loop_agent_dispatched_meanwhile(org_home, ws):
    """A preflight starts as soon as its item is queued; the coordinator dispatches the item while
    it runs. The wake goes to the loop-agent the item is assigned to when the preflight is
    written, not to nobody (the assignment read when it fell due): that loop-agent waits for it."""
    from roles.eval_agent.verifier import Verifier
    from roles.workbench.sandbox import runner_from_config
    from state_db.vocab import WorkStatus

    human = StateWriter(org_home.db_path, Actor.HUMAN)
    with human.transaction() as tx:
        tx.insert("work_items", {"id": "w1", "goal": "make add() add", "workspace": str(ws),
                                 "verify": ["python3 -c 'import calc'"], "caps": {"max_iterations": 6},
                                 "backend": "anthropic", "status": WorkStatus.QUEUED, "created_by": "human",
                                 "created_at": 1.0, "updated_at": 1.0})
    human.close()

    class DispatchedMeanwhile(Verifier):
        def preflight(self, work_id):
            co = StateWriter(org_home.db_path, Actor.COORDINATOR)
            with co.transaction() as tx:
                tx.set_status("work_items", work_id, WorkStatus.DISPATCHED, assigned_to="loop-agent-7")
            co.close()
            return super().preflight(work_id)

    def make(writer):
        return DispatchedMeanwhile(org_home, writer, timeout_s=30.0,
                                   runner_factory=lambda snap, w: runner_from_config(proc.cfg, org_home, snap,
                                                                                      present_at=w))

    proc, stub = eval_agent_in_process(org_home, make)
    try:
        proc.reconcile()
        got = stub.wait_for(Kind.VERDICT_READY, recipient="loop-agent-7", timeout_s=30)
        assert got[0].payload == {"work_id": "w1", "iteration": 0, "verdict": "preflight"}
    finally:
        proc.request_stop("test over")
        proc.close()


def _owned_by(owner: str, count: int, prefix: str) -> list[str]:
    """Work ids the two-eval-agent list gives ``owner`` (their shares are by a hash of the id)."""
    from roles.base.instances import configured_eval_agents
    agents = configured_eval_agents(2)
    return [w for w in (f"{prefix}{k}" for k in range(200)) if agents.owner(w, 0) == owner][:count]


def test_a_waited_preflight_another_eval_agent_owns_is_run_by_one_that_is_free(org_home, ws, tmp_path):
    """Of two eval-agents, the first is away (busy, or not started): the second runs the
    preflight a loop-agent waits for, though the first owns it; a queued item's preflight, which
    nobody waits for, stays with its owner."""
    import time
    toml = org_home.config_path
    toml.write_text(toml.read_text().replace("eval_agents = 1", "eval_agents = 2", 1))
    waited, queued = _owned_by("eval-agent-1", 2, "w-away-")
    submit(org_home, ws, waited, verify=("true",))                       # dispatched: a loop-agent waits
    other = tmp_path / "ws2"
    other.mkdir()
    submit(org_home, other, queued, verify=("true",))
    human = StateWriter(org_home.db_path, Actor.COORDINATOR)
    with human.transaction() as tx:                                      # back to the queue: nobody waits
        tx.set_status("work_items", queued, "queued", assigned_to=None)
    human.close()
    proc, stub = eval_agent_in_process(org_home, instance="eval-agent-2")
    try:
        proc.reconcile()
        got = stub.wait_for(Kind.VERDICT_READY, recipient="loop-agent-1", timeout_s=30)
        assert got[0].payload == {"work_id": waited, "iteration": 0, "verdict": "preflight"}
        time.sleep(1.0)                 # its workers look at what is due again meanwhile: nothing of theirs
        rows = read_rows(org_home.db_path, "SELECT work_id, written_by FROM preflights")
        assert rows == [{"work_id": waited, "written_by": "eval-agent-2"}]
    finally:
        proc.request_stop("test over")
        proc.close()


def test_a_preflight_written_by_another_eval_agent_since_due_was_read_is_not_run_or_told_again(
        org_home, ws, monkeypatch):
    import time
    from roles.eval_agent import process as process_mod
    from state_db.queries.verdicts import Due
    from tests.support.loop import eval_agent_in_process
    submit(org_home, ws, "w1", verify=("true",))
    other = StateWriter(org_home.db_path, Actor.EVAL_AGENT, "eval-agent-2")
    with other.transaction() as tx:                          # the other one ran it and told the loop-agent
        tx.insert("preflights", {"work_id": "w1", "outcome": "ready", "checks": [], "detail": "baseline: ran",
                                 "written_by": "eval-agent-2", "at": tx.now})
    other.close()
    read = []
    monkeypatch.setattr(process_mod, "due", lambda conn: read.append(1) or [Due("w1", 0, "loop-agent-1")])
    proc, stub = eval_agent_in_process(org_home)
    try:
        proc.reconcile()
        deadline = time.monotonic() + 10
        while len(read) < 3 and time.monotonic() < deadline:  # its workers read what is due, again and again
            time.sleep(0.05)
        assert len(read) >= 3
        assert stub.messages(Kind.VERDICT_READY) == []
        assert read_rows(org_home.db_path, "SELECT written_by FROM preflights") == [{"written_by": "eval-agent-2"}]
    finally:
        proc.request_stop("test over")
        proc.close()
