"""An idempotency key is bound to its command and arguments, through every front end that takes
one: a key reused for another decision is refused as a conflict (``idempotency_conflict``) and
the second decision stays pending; the same key with the same arguments replays the first answer.
Through the real CLI process and a real ``org mcp`` server with the official SDK client."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from state_db.vocab import Actor, WorkStatus
from state_db.writer import StateWriter
from tests.support.loop import CHECK, ScriptedActs, engine
from tests.support.org import query

ROOT = Path(__file__).resolve().parents[2]
GATED = {"kind": "network", "command": "curl -O https://example.org/data.csv", "reason": "the data is online"}


def _parked(home, tmp_path, work_id: str) -> str:
    """A run parked on a pending network decision; returns the decision's id."""
    ws = tmp_path / work_id
    ws.mkdir()
    (ws / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    human = StateWriter(home.db_path, Actor.HUMAN)
    with human.transaction() as tx:
        tx.insert("work_items", {"id": work_id, "goal": "make add() add", "workspace": str(ws), "verify": [CHECK],
                                 "caps": {"max_iterations": 3}, "backend": "anthropic",
                                 "status": WorkStatus.QUEUED, "created_by": "human",
                                 "created_at": time.time(), "updated_at": time.time()})
    human.close()
    co = StateWriter(home.db_path, Actor.COORDINATOR)
    with co.transaction() as tx:
        tx.set_status("work_items", work_id, WorkStatus.DISPATCHED, assigned_to="loop-agent-1")
    co.close()
    assert engine(home, work_id, ScriptedActs([[{"request": GATED}]])).run() is None
    return query(home, "SELECT id FROM decisions WHERE work_id=? AND status='pending'", (work_id,))[0]["id"]


@pytest.fixture
def two_decisions(org_home, tmp_path):
    return org_home, _parked(org_home, tmp_path, "w1"), _parked(org_home, tmp_path, "w2")


def _status(home, did: str) -> str:
    return query(home, "SELECT status FROM decisions WHERE id=?", (did,))[0]["status"]


def _cli(home, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scripts.cli.main", *argv], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={**os.environ, "ORG_HOME": str(home.root), "PYTHONPATH": str(ROOT)})


@pytest.mark.timeout(120)
def test_org_decide_refuses_a_key_reused_for_another_decision(two_decisions):
    """``org decide d2 approve --idempotency-key K`` after ``d1`` with K: one coded line, exit 1,
    d2 still pending; d1 again with K replays (exit 0) and decides nothing more."""
    home, d1, d2 = two_decisions
    first = _cli(home, "decide", d1, "approve", "--idempotency-key", "K-1")
    assert first.returncode == 0, first.stderr
    second = _cli(home, "decide", d2, "approve", "--idempotency-key", "K-1")
    assert second.returncode == 1 and second.stderr.startswith("error[idempotency_conflict]:"), second.stderr
    assert "Traceback" not in second.stderr and _status(home, d2) == "pending"
    again = _cli(home, "decide", d1, "approve", "--idempotency-key", "K-1")
    assert again.returncode == 0, again.stderr
    assert _status(home, d1) == "approved"
    reject = _cli(home, "decide", d1, "reject", "--idempotency-key", "K-1")     # same decision, other verdict
    assert reject.returncode == 1 and "idempotency_conflict" in reject.stderr


@pytest.mark.timeout(120)
def test_an_mcp_client_reusing_a_key_for_another_decision_gets_a_conflict(two_decisions):
    """Through a real ``org mcp`` server: the first decide answers, the same key for the second
    decision is an error result naming the conflict, and the second decision stays pending."""
    home, d1, d2 = two_decisions
    home.config_path.write_text('[mcp]\ntools = ["status", "decisions", "decide"]\n')
    params = StdioServerParameters(command=sys.executable, args=["-m", "scripts.cli.main", "mcp"],
                                   env={**os.environ, "ORG_HOME": str(home.root), "PYTHONPATH": str(ROOT)},
                                   cwd=str(ROOT))

    async def body():
        async with stdio_client(params) as (read, write), ClientSession(
                read, write, client_info=types.Implementation(name="key-client", version="1")) as s:
            await s.initialize()
            first = await s.call_tool("decide", {"id": d1, "verdict": "approve", "idempotency_key": "mcp-1"})
            second = await s.call_tool("decide", {"id": d2, "verdict": "approve", "idempotency_key": "mcp-1"})
            return first, second

    first, second = anyio.run(body)
    assert not first.isError and first.structuredContent["status"] == "approved"
    assert second.isError and "idempotency_conflict" in json.dumps(second.model_dump(mode="json"))
    assert _status(home, d2) == "pending" and _status(home, d1) == "approved"
