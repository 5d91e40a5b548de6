"""``org watch`` in tmux at 80×24 over a state.db: a burst of 20 ``j`` moves the selection 20
rows (no key lost), and a run's page shows its stop reason and hint whole, the failing output,
and a transcript pane that scrolls."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

import pytest

from roles.loop_agent.backends.anthropic_backend import AnthropicBackend, AnthropicConfig
from roles.loop_agent.backends.retry import RetryPolicy
from roles.workbench.scripted.server import ScriptedServer
from state_db.vocab import Actor, WorkStatus
from state_db.writer import StateWriter
from tests.e2e.test_watch import Tmux
from tests.support.loop import BUGGY, engine, make_workspace, submit
from tests.support.org import wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (.ci/run installs it)"),
              pytest.mark.timeout(90)]


def watch(home) -> Tmux:
    command = (f"cd {shlex.quote(str(ROOT))} && ORG_HOME={shlex.quote(str(home.root))} "
               f"exec {shlex.quote(sys.executable)} -m scripts.cli.main watch --interval 0.5")
    return Tmux(command, {**os.environ, "ORG_HOME": str(home.root)})


def decisions(home, count: int) -> list[str]:
    """``count`` pending decisions, oldest first, on one parked work item."""
    human = StateWriter(home.db_path, Actor.HUMAN)
    with human.transaction() as tx:
        tx.insert("work_items", {"id": "w-ask", "goal": "ask", "workspace": "/ws/ask", "backend": "anthropic",
                                 "status": WorkStatus.QUEUED, "created_by": "human", "created_at": time.time(),
                                 "updated_at": time.time()})
    human.close()
    la = StateWriter(home.db_path, Actor.LOOP_AGENT, "loop-agent-1")
    ids = [f"d-{i:02d}" for i in range(count)]
    for i, did in enumerate(ids):
        with la.transaction() as tx:
            tx.insert("decisions", {"id": did, "work_id": "w-ask", "kind": "outside_workspace", "iteration": 1,
                                    "action": {"command": f"echo {i}"}, "question": f"run echo {i}?",
                                    "status": "pending", "created_at": 1000.0 + i})
    la.close()
    return ids


def test_a_burst_of_twenty_j_moves_the_selection_twenty_rows_then_twenty_k_back(org_home):
    ids = decisions(org_home, 25)
    tmux = watch(org_home)
    try:
        wait_for(lambda: tmux.cursor().startswith(f"› {ids[0]}"), timeout=20, what="the first decision selected")
        tmux.keys("j" * 20)                        # one write: the twenty bytes arrive together
        wait_for(lambda: tmux.cursor().startswith(f"› {ids[20]}"), timeout=10,
                 what=f"the selection on {ids[20]} (seen: {tmux.cursor()!r})")
        tmux.keys(*["Up"] * 7, "k" * 13)           # escape sequences and letters in one burst
        wait_for(lambda: tmux.cursor().startswith(f"› {ids[0]}"), timeout=10,
                 what=f"the selection back on {ids[0]} (seen: {tmux.cursor()!r})")
        time.sleep(1.0)                            # two more draws: nothing moves it any further
        assert tmux.cursor().startswith(f"› {ids[0]}")
        tmux.keys("q")
        wait_for(lambda: "org watch" not in tmux.screen(), timeout=10, what="the watch to quit")
    finally:
        tmux.close()


def test_a_run_page_shows_the_stop_reason_hint_and_failing_output_whole_and_scrolls_its_transcript(
        org_home, tmp_path):
    wrong = BUGGY.replace("a - b", "a * b")
    turns = [{"text": f"Attempt {i}: reading first.", "tool_uses": [{"name": "read_file", "input": {"path": "calc.py"}}]}
             for i in range(6)]
    body = {"version": 1, "acts": [turns + [{"tool_uses": [{"name": "write_file", "input": {"path": "calc.py",
                                                                                             "content": wrong}}]},
                                            {"text": "Done."}]], "repeat_last": True}
    (tmp_path / "script.json").write_text(json.dumps(body))
    srv = ScriptedServer(tmp_path / "script.json", tmp_path / "served.jsonl")
    srv.start()
    try:
        ws = make_workspace(tmp_path)
        submit(org_home, ws, work_id="w-page")
        backend = AnthropicBackend(AnthropicConfig(model="demo-model", base_url=srv.base_url, timeout_s=10,
                                                   retry=RetryPolicy(max_attempts=2, base_delay_s=0.01, jitter=0)),
                                   {"demo-model": {"input": 0, "output": 0, "cache_write": 0, "cache_read": 0}},
                                   environ={})
        decision = engine(org_home, "w-page", backend).run()
    finally:
        srv.stop()
    assert decision.reason == "repeated_failure"
    signature = decision.detail.rsplit("'", 2)[-2]             # the detail's last words: past 80 columns
    tmux = watch(org_home)
    try:
        wait_for(lambda: "w-page" in tmux.screen(), timeout=20, what="the ended run listed")
        for _ in range(5):
            if tmux.cursor().startswith("› w-page"):
                break
            tmux.keys("j")
            time.sleep(0.3)
        tmux.keys("Enter")
        page = wait_for(lambda: (s := tmux.shows("TRANSCRIPT")) and s, timeout=10, what="the run page")
        flat = " ".join(page.split())
        assert "stop: repeated_failure" in flat and signature in flat, page      # the reason whole, wrapped
        assert "next: the same check failed the same way twice" in flat, page
        assert "failing:" in page and "AssertionError" in page, page
        assert "following" in page and "lesson: Failed" in page, page              # the pane shows the end first
        assert all(len(line) <= 80 for line in page.splitlines())
        tmux.keys("g")
        top = wait_for(lambda: (s := tmux.shows("── iteration 1 · attempt 1")) and s, timeout=10,
                       what="the transcript's top after g")
        assert "(1-" in top and "following" not in top
        tmux.keys("G")
        wait_for(lambda: "following" in tmux.screen(), timeout=10, what="the pane back at its end")
    finally:
        tmux.close()
