"""Disk quotas count what the host would write (apparent size), not only what the sandbox paid
(blocks): sparse files fail the sandboxed command, and a tree over the quota is never recorded."""
from __future__ import annotations

import os
import time

import pytest

from roles.loop_agent.backends.base import ActOutcome, Usage
from roles.loop_agent.engine import LoopSettings
from roles.workbench.sandbox import BwrapRunner, Limits, bubblewrap
from roles.workbench.sandbox.limits import over_quota
from roles.workbench.sandbox.mode import default_visible
from roles.workbench.workspace.history import WorkspaceHistory
from tests.support.loop import FIXED, engine, make_workspace, submit
from tests.support.org import query

needs_bwrap = pytest.mark.skipif(bubblewrap() is None, reason="bubblewrap (bwrap) is not installed")


def _sparse(path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)


@pytest.mark.timeout(30)
def test_sparse_files_count_their_apparent_size(tmp_path):
    for i in range(4):
        _sparse(tmp_path / f"s{i}", 8 * 2**20)
    blocks = sum(os.lstat(tmp_path / f"s{i}").st_blocks * 512 for i in range(4))
    assert blocks < 2**20                                       # control: they cost the disk nothing
    used = over_quota(tmp_path, Limits(disk_mb=16))
    assert used is not None and used >= 32 * 2**20
    assert over_quota(tmp_path, Limits(disk_mb=64)) is None


@needs_bwrap
@pytest.mark.timeout(60)
def test_a_sandboxed_command_that_leaves_sparse_files_past_the_quota_fails(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    runner = BwrapRunner(ws, readonly_binds=default_visible(), limits=Limits(disk_mb=16, file_size_mb=16))
    got = runner.run("for i in 1 2 3 4; do truncate -s 8M s$i; done; echo made", ws, 30.0, 10_000)
    assert "made" in got.output and got.exit_code != 0 and "error[disk_quota]" in got.output, got.output


class SparseActs:
    """Iteration 1 leaves 64 MB of sparse files beside a fix; iteration 2 writes the fix alone."""

    name = "anthropic"

    def act(self, ctx, *, on_usage, budget_left):
        on_usage(Usage(f"r-{ctx.iteration}-{ctx.attempt}", "m", 10, 2, 0, 0, cost_usd=0.0))
        (ctx.workspace / "calc.py").write_text(FIXED)
        if ctx.iteration == 1:
            for i in range(8):
                _sparse(ctx.workspace / f"blob{i}.bin", 8 * 2**20)
        return ActOutcome("ok", f"iteration {ctx.iteration} done", turns=1)


@pytest.mark.timeout(120)
def test_a_tree_over_the_quota_is_not_recorded_and_the_act_still_counts(org_home, tmp_path):
    ws = make_workspace(tmp_path)
    submit(org_home, ws, caps={"max_iterations": 3})
    t0 = time.monotonic()
    decision = engine(org_home, "w1", SparseActs(), settings=LoopSettings(disk_mb=32)).run()
    assert time.monotonic() - t0 < 60
    rows = query(org_home, "SELECT n, act_summary, checkpoint FROM iterations ORDER BY n")
    assert "error[disk_quota]" in rows[0]["act_summary"]        # the doer's act, counted and told
    history = WorkspaceHistory(org_home.history_dir / "w1.git", ws)
    assert not any(p.startswith("blob") for p in history.changed_paths(history.baseline_commit(),
                                                                       rows[0]["checkpoint"]))
    assert decision.reason == "goal_met" and len(rows) == 2    # the next act, within the quota, is verified


@pytest.mark.timeout(120)
def test_an_approved_action_that_leaves_the_workspace_over_quota_is_not_recorded(org_home, tmp_path):
    """The action ran (a human approved it) but its effect past the quota is dropped, and its
    result says so to the doer."""
    from roles.operations.decide import decide
    from state_db.kernel import config
    from tests.support.loop import ScriptedActs
    from tests.test_gate import redispatch
    ws = make_workspace(tmp_path)
    submit(org_home, ws, caps={"max_iterations": 3})

    def runner(command, kind, workspace):
        for i in range(8):
            _sparse(os.path.join(workspace, f"big{i}.bin"), 8 * 2**20)
        return 0, "downloaded"

    settings = LoopSettings(disk_mb=32, gate_runner=runner)
    ask = {"request": {"kind": "network", "command": "fetch big files", "reason": "data"}}
    backend = ScriptedActs([[ask], [{"write": {"calc.py": FIXED}}]])
    assert engine(org_home, "w1", backend, settings=settings).run() is None
    d = query(org_home, "SELECT id FROM decisions WHERE status='pending'")[0]
    decide(org_home, config.load(None), d["id"], "approve", None)
    redispatch(org_home)
    decision = engine(org_home, "w1", backend, settings=settings).run()
    row = query(org_home, "SELECT status, result, checkpoint FROM decisions")[0]
    assert row["status"] == "executed" and "error[disk_quota]" in row["result"], row
    assert not any(p.name.startswith("big") for p in ws.iterdir())
    history = WorkspaceHistory(org_home.history_dir / "w1.git", ws)
    assert not any(p.startswith("big") for p in history.changed_paths(history.baseline_commit(), row["checkpoint"]))
    assert decision.reason == "goal_met"
