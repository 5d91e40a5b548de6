"""The model ladder: when repeated_failure (or no_progress) would stop a run and a stronger rung is
left, the run goes on with the next model, within the same caps, told what failed; each iteration
records its model, the stop reason the last rung. A Messages API on 127.0.0.1 answers each model
with its own script (it sees the model each request names)."""
from __future__ import annotations

import json

import pytest

from roles.loop_agent.backends.anthropic_backend import AnthropicBackend, AnthropicConfig
from roles.loop_agent.backends.retry import MemoryRateGate, RetryPolicy
from roles.operations.submit import SubmitError, SubmitRequest, submit
from state_db.kernel import config as config_mod
from state_db.vocab import Actor, WorkStatus
from state_db.writer import StateWriter
from tests.fake_messages_api import FakeMessagesAPI, text_turn, tool_use_turn
from tests.support.loop import BUGGY, CHECK, FIXED, engine, make_workspace
from tests.support.org import query
from tests.test_rough_edges import coded, org
from state_db.queries.work import Caps

pytestmark = pytest.mark.timeout(120)
PRICE = {"input": 1.0, "output": 5.0, "cache_write": 1.25, "cache_read": 0.1}
PRICES = {"weak": PRICE, "strong": {**PRICE, "input": 3.0, "output": 15.0}}
CONFIG = "".join(f'[prices."{m}"]\n' + "".join(f"{k} = {v}\n" for k, v in p.items()) for m, p in PRICES.items())


def backend(base_url: str) -> AnthropicBackend:
    conf = AnthropicConfig(model="weak", max_tokens=1024, base_url=base_url, timeout_s=20.0,
                           retry=RetryPolicy(max_attempts=2, base_delay_s=0.01))
    return AnthropicBackend(conf, PRICES, gate=MemoryRateGate(), environ={})


def act(fake: FakeMessagesAPI, content: str) -> None:
    fake.enqueue(tool_use_turn("write_file", {"path": "calc.py", "content": content}),
                 text_turn(f"wrote calc.py"))


def dispatched(home, ladder, tmp_path, **caps) -> str:
    home.config_path.write_text(CONFIG)
    cfg = config_mod.load_config(home)
    done = submit(home, cfg, SubmitRequest(goal="make add() add", workspace=str(make_workspace(tmp_path)),
                                           verify=[CHECK], backend="command", ladder=ladder, caps=Caps(**caps)), wake=False)
    co = StateWriter(home.db_path, Actor.COORDINATOR)
    with co.transaction() as tx:
        tx.set_status("work_items", done.id, WorkStatus.DISPATCHED, assigned_to="loop-agent-1")
    co.close()
    return done.id


def test_repeated_failure_on_the_weak_model_moves_the_run_to_the_strong_one_which_meets_the_goal(org_home, tmp_path):
    wid = dispatched(org_home, ("weak", "strong"), tmp_path, max_iterations=6)
    fake = FakeMessagesAPI()
    fake.start()
    try:
        act(fake, BUGGY.replace("-", "*"))          # iteration 1, weak: fails
        act(fake, BUGGY.replace("-", "*"))          # iteration 2, weak: fails the same way -> repeated_failure
        act(fake, FIXED)                            # iteration 3, strong: passes
        decision = engine(org_home, wid, backend(fake.base_url)).run()
        models = [r["model"] for r in fake.requests]
        third_prompt = json.dumps(fake.requests[4]["messages"][0])
    finally:
        fake.stop()
    assert decision.reason == "goal_met", decision
    assert models == ["weak"] * 4 + ["strong"] * 2
    assert "stronger model (rung 2 of 2: strong" in third_prompt and "repeated_failure on weak" in third_prompt
    its = query(org_home, "SELECT n, model FROM iterations WHERE work_id=? ORDER BY n", (wid,))
    assert [(r["n"], r["model"]) for r in its] == [(1, "weak"), (2, "weak"), (3, "strong")]
    ladder = json.loads(query(org_home, "SELECT ladder FROM work_items WHERE id=?", (wid,))[0]["ladder"])
    assert (ladder["models"], ladder["rung"], ladder["since"]) == (["weak", "strong"], 1, 2)
    shown = org(org_home, tmp_path, "show", wid).stdout
    assert "ladder: weak → strong (rung 2 of 2: strong" in shown, shown
    climbed = query(org_home, "SELECT data FROM events WHERE kind='work_items.climbed' AND subject=?", (wid,))
    assert [json.loads(e["data"])["to"] for e in climbed] == ["strong"]


def test_the_top_rung_failing_ends_the_run_and_the_stop_reason_names_the_last_rung(org_home, tmp_path):
    wid = dispatched(org_home, ("weak", "strong"), tmp_path, max_iterations=6)
    fake = FakeMessagesAPI()
    fake.start()
    try:
        for _ in range(4):
            act(fake, BUGGY.replace("-", "*"))
        decision = engine(org_home, wid, backend(fake.base_url)).run()
    finally:
        fake.stop()
    assert decision.reason == "repeated_failure" and "(on rung 2 of 2: strong)" in decision.detail, decision
    assert [r["n"] for r in query(org_home, "SELECT n FROM iterations WHERE work_id=?", (wid,))] == [1, 2, 3, 4]


def test_a_ladder_with_an_unpriced_or_repeated_rung_is_refused_at_submit(org_home, tmp_path):
    org_home.config_path.write_text(CONFIG)
    cfg = config_mod.load_config(org_home)
    ws = tmp_path / "w"
    ws.mkdir()
    for ladder in (("weak", "nope"), ("weak", "weak"), ("weak", "")):
        with pytest.raises(SubmitError) as exc:
            submit(org_home, cfg, SubmitRequest(goal="g", workspace=str(ws), verify=["true"], backend="command",
                                                ladder=ladder), wake=False)
        assert exc.value.code == "bad_ladder"
    out = org(org_home, tmp_path, "submit", "g", "--workspace", str(ws), "--verify", "true", "--backend", "command",
              "--ladder", "weak,missing")
    assert out.returncode == 1 and coded(out.stderr) == "bad_ladder", out.stderr
