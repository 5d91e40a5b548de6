"""`org cost`: tokens (four kinds) and dollars per work item, goal family, model and day, over any
period; pruned usage still counts; the totals equal the org's spend."""
from __future__ import annotations

import json
import time

import pytest

from scripts.cli.commands.cost import since_of
from scripts.cli.main import main
from state_db.queries.usage import org_spend
from state_db.retention import prune
from state_db.vocab import Actor, StopReason, WorkStatus
from tests.support.state import assign_and_run, submit

pytestmark = pytest.mark.timeout(60)
DAY = 86400.0
NOW = time.time()


def call(writer_for, rid, work_id, model, at, tokens=(100, 20, 10, 1000), cost=0.01, actor=Actor.LOOP_AGENT,
         instance="loop-agent-1"):
    with writer_for(actor, instance, clock=lambda: at).transaction() as tx:
        tx.insert("model_calls", {"request_id": rid, "work_id": work_id, "iteration": 1, "attempt": 1,
                                  "instance": instance, "model": model, "input_tokens": tokens[0],
                                  "output_tokens": tokens[1], "cache_write_tokens": tokens[2],
                                  "cache_read_tokens": tokens[3], "cost_usd": cost, "at": at}, journal=False)


@pytest.fixture
def org(org_home, writer_for):
    with writer_for(Actor.HUMAN).transaction() as tx:
        tx.insert("schedules", {"id": "sch-1", "name": "nightly", "kind": "every", "status": "active",
                                "created_by": "human", "created_at": NOW, "updated_at": NOW})
    submit(writer_for, "w-a", "/ws/a", goal="fix  the\nflaky test")
    submit(writer_for, "w-b", "/ws/b", goal="fix the flaky test")               # the same goal again
    with writer_for(Actor.COORDINATOR).transaction() as tx:                   # a standing order's tick
        tx.insert("work_items", {"id": "w-n", "goal": "nightly lint", "workspace": "/ws/n", "backend": "anthropic",
                                 "status": WorkStatus.QUEUED, "created_by": "schedule:nightly", "origin": "schedule",
                                 "origin_id": "sch-1", "created_at": NOW, "updated_at": NOW})
    with writer_for(Actor.COORDINATOR).transaction() as tx:                   # a skill's replay, paid for learning
        tx.insert("work_items", {"id": "w-r", "goal": "fix  the\nflaky test", "workspace": "/ws/r", "backend": "anthropic",
                                 "status": WorkStatus.QUEUED, "created_by": "coordinator", "origin": "replay",
                                 "origin_id": "c-1", "created_at": NOW, "updated_at": NOW})
        tx.insert("replays", {"work_id": "w-r", "subject": "c-1", "subject_kind": "candidate", "source_id": "w-a",
                              "relation": "source", "arm": "with", "skill_name": "run-tests-first",
                              "skill_text": "…", "created_at": NOW})
    for w in ("w-a", "w-b", "w-n", "w-r"):
        assign_and_run(writer_for, w)
    call(writer_for, "r1", "w-a", "small", NOW - 3 * DAY, cost=0.01)
    call(writer_for, "r2", "w-a", "large", NOW - 3 * DAY, cost=0.10)            # a stronger rung
    call(writer_for, "r3", "w-b", "small", NOW - 1 * DAY, cost=0.02)
    call(writer_for, "r4", "w-n", "small", NOW - 0.1 * DAY, cost=0.03)
    call(writer_for, "r5", "w-a", "small", NOW - 0.1 * DAY, cost=0.04, actor=Actor.EVAL_AGENT,
         instance="eval-agent-1")                                              # a review counts too
    call(writer_for, "r6", None, "small", NOW - 0.1 * DAY, cost=0.005, actor=Actor.COORDINATOR,
         instance="coordinator")                                               # the chat's
    call(writer_for, "r7", "w-r", "small", NOW - 0.1 * DAY, cost=0.5)
    return org_home


def cost(capsys, *argv) -> dict:
    capsys.readouterr()
    assert main(["cost", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cost_by_item_goal_model_and_day_adds_up_to_the_org_s_spend(org, capsys, writer_for):
    items = cost(capsys)
    by = {r["key"]: r for r in items["rows"]}
    assert by["w-a"]["cost_usd"] == pytest.approx(0.15) and by["w-a"]["calls"] == 3
    assert by["w-a"]["models"] == {"large": 0.1, "small": 0.05}
    assert by["w-a"]["input_tokens"] == 300 and by["w-a"]["cache_read_tokens"] == 3000
    assert by["w-a"]["tokens"] == 3 * 1130 and by["w-a"]["budget_tokens"] == 3 * 130
    assert by["(org: chat, curation)"]["cost_usd"] == pytest.approx(0.005)
    assert [r["key"] for r in items["rows"]][:2] == ["w-r", "w-a"]            # most expensive first
    assert items["total"]["cost_usd"] == pytest.approx(org_spend(writer_for(Actor.HUMAN).conn))

    goals = {r["key"]: r for r in cost(capsys, "--by", "goal")["rows"]}
    assert goals["goal:fix the flaky test"]["items"] == 2
    assert goals["goal:fix the flaky test"]["cost_usd"] == pytest.approx(0.17)
    assert goals["schedule:nightly"]["cost_usd"] == pytest.approx(0.03)
    assert goals["replay:run-tests-first"]["cost_usd"] == pytest.approx(0.5)     # not the goal it replays

    models = {r["key"]: r["cost_usd"] for r in cost(capsys, "--by", "model")["rows"]}
    assert models == {"large": pytest.approx(0.1), "small": pytest.approx(0.605)}

    days = cost(capsys, "--by", "day")["rows"]
    assert [d["key"] for d in days] == sorted(d["key"] for d in days) and len(days) >= 3

    recent = cost(capsys, "--since", "2d")
    assert {r["key"] for r in recent["rows"]} == {"w-a", "w-b", "w-n", "w-r", "(org: chat, curation)"}
    assert recent["total"]["cost_usd"] == pytest.approx(0.595)
    window = cost(capsys, "--since", "2d", "--until", "12h")                  # one day, two days ago
    assert [r["key"] for r in window["rows"]] == ["w-b"] and window["total"]["cost_usd"] == pytest.approx(0.02)


def test_usage_folded_by_retention_still_counts_and_a_continue_chain_counts_its_endings(org, capsys, writer_for):
    before = cost(capsys)["total"]
    with writer_for(Actor.LOOP_AGENT, "loop-agent-1").transaction() as tx:
        tx.set_status("work_items", "w-a", WorkStatus.ENDED, stop_reason=StopReason.MAX_ITERATIONS)
    sup = writer_for(Actor.SUPERVISOR)
    with sup.transaction() as tx:        # ended long ago, so retention folds its calls into a summary
        tx.conn.execute("UPDATE work_items SET ended_at = ? WHERE id = 'w-a'", (NOW - 40 * DAY,))
    with writer_for(Actor.HUMAN).transaction() as tx:
        tx.insert("stop_history", {"work_id": "w-a", "seq": 1, "stop_reason": "max_iterations", "iterations": 1,
                                   "continued_by": "human", "continued_at": NOW})
    assert prune(sup, events_days=30, model_calls_days=1, ledger_keep_s=1)["model_calls"] == 2
    after = cost(capsys)
    assert after["total"]["cost_usd"] == pytest.approx(before["cost_usd"])
    assert after["total"]["tokens"] == before["tokens"]
    by = {r["key"]: r for r in after["rows"]}
    assert by["w-a"]["models"] == {"(summarised)": pytest.approx(0.11), "small": pytest.approx(0.04)}
    assert by["w-a"]["endings"] == 2 and by["w-a"]["calls"] == 3


def test_since_reads_spans_and_dates_and_refuses_anything_else_in_one_line(org, capsys):
    assert since_of("12h", now=1000.0 * DAY) == 1000.0 * DAY - 12 * 3600
    assert since_of("2026-12-01") == 1796083200.0
    capsys.readouterr()
    assert main(["cost", "--since", "last tuesday"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error[bad_arguments]: --since 'last tuesday'") and err.count("\n") == 1
    assert main(["cost", "--by", "goal"]) == 0
    out = capsys.readouterr().out
    assert "schedule:nightly" in out and out.splitlines()[-1].startswith("total")
