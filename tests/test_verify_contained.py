"""One run cannot stop another: a verification that hangs on the host holds one of the
eval-agent's workers, is shown as its current work, is cut at its bound with a coded verdict
(the machine's, never the doer's), and another work item is verified meanwhile."""
from __future__ import annotations

import json
import threading

import pytest

from roles.eval_agent.process import STUCK_MARGIN_S
from roles.eval_agent.verifier import Verifier
from state_db.connection import read_rows
from state_db.queries.verdicts import Due
from tests.support.loop import eval_agent_in_process, submit
from tests.support.org import wait_for
from transport.kinds import Kind

CHECK = "python3 -c 'import calc'"


def _workspace(tmp_path, name):
    ws = tmp_path / name
    ws.mkdir()
    (ws / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    return ws


@pytest.mark.timeout(120)
def test_a_hung_verification_is_cut_and_shown_while_another_run_is_verified(org_home, tmp_path):
    release = threading.Event()
    entered = threading.Event()

    class Hanging(Verifier):
        def preflight(self, work_id):
            if work_id == "w1":
                entered.set()
                release.wait(60)             # a host-side step that never returns on its own
            return super().preflight(work_id)

    def make(writer):
        from roles.workbench.sandbox import runner_from_config
        return Hanging(org_home, writer, timeout_s=30.0,
                       runner_factory=lambda snap, ws: runner_from_config(proc.cfg, org_home, snap, present_at=ws))

    proc, stub = eval_agent_in_process(org_home, make)
    try:
        submit(org_home, _workspace(tmp_path, "ws1"), "w1", verify=(CHECK,))
        # the bound by default: the command's timeout, every review try and a margin
        cfg = proc.cfg
        assert proc.bound_s(Due("w1", 0, None)) == (cfg.sandbox.cpu_seconds + (cfg.review.retries + 1)
                                                    * cfg.model.request_timeout_s + STUCK_MARGIN_S)
        proc.bound_s = lambda row: 4.0
        proc.reconcile()
        assert entered.wait(30)
        submit(org_home, _workspace(tmp_path, "ws2"), "w2", verify=(CHECK,))

        def busy():
            proc.reconcile()
            return read_rows(org_home.db_path, "SELECT current_work FROM role_instances")[0]["current_work"]
        wait_for(lambda: busy() and "w1" in busy(), timeout=30, what="the eval-agent shown busy with w1")
        wait_for(lambda: proc.reconcile() or read_rows(org_home.db_path, "SELECT work_id FROM preflights "
                                                                        "WHERE work_id='w2'"),
                 timeout=60, what="w2's preflight while w1 hangs")
        wait_for(lambda: proc.reconcile() or read_rows(org_home.db_path, "SELECT checks FROM preflights "
                                                                        "WHERE work_id='w1'"),
                 timeout=60, what="w1 cut at its bound")
        checks = json.loads(read_rows(org_home.db_path, "SELECT checks FROM preflights WHERE work_id='w1'")[0]["checks"])
        assert [c["code"] for c in checks] == ["verify_stuck"]
        at = {r["work_id"]: r["at"] for r in read_rows(org_home.db_path, "SELECT work_id, at FROM preflights")}
        assert at["w2"] < at["w1"]            # verified while w1 hung, not after it was cut
        rows = {r["id"]: r for r in read_rows(org_home.db_path, "SELECT id, status, stop_reason FROM work_items")}
        assert rows["w1"]["stop_reason"] == "verify_unrunnable" and rows["w2"]["status"] != "ended"
        assert "w1" in busy()                  # still shown while its worker hangs
        assert any(m.payload.get("work_id") == "w1" for m in stub.messages(Kind.WAKE))
    finally:
        release.set()
        proc.request_stop("test over")
        proc.close()
    wait_for(lambda: not any(w.is_alive() for w in proc.workers), timeout=30, what="every worker ended")
