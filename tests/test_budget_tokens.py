"""A token budget counts input, cache-write and output tokens, not cache reads; cost counts them all."""
from __future__ import annotations

import pytest

from roles.loop_agent.backends.base import Usage
from state_db import queries
from state_db.connection import connect
from tests.support.loop import FIXED, ScriptedActs, engine, make_workspace, submit
from tests.support.org import query

GOOD = {"write": {"calc.py": FIXED}}


@pytest.fixture
def ws(tmp_path):
    return make_workspace(tmp_path)


def test_budget_tokens_leave_cache_reads_out_and_total_tokens_keeps_them():
    u = Usage("r", "m", input_tokens=100, output_tokens=20, cache_creation_input_tokens=7,
              cache_read_input_tokens=5000)
    assert (u.budget_tokens, u.total_tokens) == (127, 5127)


def test_a_1500_token_budget_is_not_stopped_by_cache_reads(org_home, ws):
    submit(org_home, ws, caps={"budget_tokens": 1500, "max_iterations": 5})
    # three calls in the act, each re-reading a 5,000-token cached prefix: 360 budget tokens in all
    backend = ScriptedActs([[{}, {}, GOOD]], tokens=(100, 20), cache=(0, 5000))
    decision = engine(org_home, "w1", backend).run()
    assert decision.reason == "goal_met" and len(backend.calls) == 3
    conn = connect(org_home.db_path, readonly=True)
    used = queries.usage(conn, "w1")
    conn.close()
    assert (used["budget_tokens"], used["cache_read_tokens"], used["tokens"]) == (360, 15000, 15360)


def test_cache_writes_count_toward_the_token_budget(org_home, ws):
    submit(org_home, ws, caps={"budget_tokens": 1500, "max_iterations": 5})
    backend = ScriptedActs([[{}, {}, {}, GOOD]], tokens=(100, 20), cache=(1000, 5000))
    decision = engine(org_home, "w1", backend).run()
    assert decision.reason == "token_budget"
    assert len(backend.calls) == 1                      # 1,120; a second would make 2,240 > 1,500: not made
    rows = query(org_home, "SELECT SUM(cache_write_tokens) AS w, SUM(cache_read_tokens) AS r FROM model_calls")
    assert rows == [{"w": 1000, "r": 5000}]
