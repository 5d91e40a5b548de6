"""The loop as next-step data: every ending through the stop policy and one end_run; a paused or
parked run as a stored step another engine resumes from; an error class the policy does not know
asks a human (needs_human); a budget that trips buys one wrap-up act within its reserved slice.

The model is the real anthropic backend (official SDK over HTTP) against the scripted server or
a recording fake Messages API, both on 127.0.0.1; the verifier is the eval-agent's own."""
from __future__ import annotations

import json
import sqlite3
import sys
import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from roles.loop_agent import steps
from roles.loop_agent.backends.anthropic_backend import AnthropicBackend, AnthropicConfig
from roles.loop_agent.backends.retry import MemoryRateGate, RetryPolicy
from roles.loop_agent.engine import LoopSettings, policy_for
from roles.loop_agent.policy import policy_from_caps
from state_db.queries.work import Caps
from roles.loop_agent.progress import load
from roles.workbench.scripted.server import ScriptedServer
from roles.loop_agent.steps import (ActAgain, AwaitHuman, AwaitVerdict, Ended, Parked, Paused, AwaitPreflight, Reflect,
                                    WrapUp)
from roles.loop_agent.stop import RunProgress, StopDecision
from roles.operations.decide import decide
from state_db.kernel import config
from state_db import ending
from state_db.connection import connect
from state_db.queries.work import WorkItem
from state_db.vocab import Actor, StopReason, WorkStatus
from state_db import writer as writer_mod
from state_db.kernel.errors import RunTaken, StoreBusy
from state_db.writer import StateWriter
from tests.fake_messages_api import FakeMessagesAPI, text_turn, tool_use_turn
from tests.support.loop import BUGGY, FIXED, ScriptedActs, engine, make_workspace, submit
from tests.support.org import query

GOOD = {"write": {"calc.py": FIXED}}
BAD = {"write": {"calc.py": BUGGY.replace("a - b", "a * b")}}
ASK = {"request": {"kind": "network", "command": "echo fetched", "reason": "need the upstream file"}}
PRICES = {"scripted": {"input": 0.0, "output": 0.0, "cache_write": 0.0, "cache_read": 0.0},
          "fake": {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_read": 0.3}}


@pytest.fixture
def ws(tmp_path):
    return make_workspace(tmp_path)


def _backend(base_url: str, model: str = "scripted") -> AnthropicBackend:
    conf = AnthropicConfig(model=model, max_tokens=4096, base_url=base_url, timeout_s=20.0,
                           retry=RetryPolicy(max_attempts=2, base_delay_s=0.01))
    return AnthropicBackend(conf, PRICES, gate=MemoryRateGate(), environ={})


@pytest.fixture
def scripted(tmp_path):
    """start(acts) -> (backend, log path): the scripted server on 127.0.0.1, stopped after."""
    servers = []

    def start(acts, **extra):
        path = tmp_path / f"script-{len(servers)}.json"
        path.write_text(json.dumps({"version": 1, "acts": acts, **extra}))
        server = ScriptedServer(path, tmp_path / f"served-{len(servers)}.jsonl")
        servers.append(server)
        return _backend(server.start()), server.log_path

    yield start
    for server in servers:
        server.stop()


def served(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def work(home, wid="w1"):
    return query(home, "SELECT * FROM work_items WHERE id=?", (wid,))[0]


def redispatch(home, wid="w1", agent="loop-agent-1"):
    from roles.coordinator.dispatch import unpark
    co = StateWriter(home.db_path, Actor.COORDINATOR)
    with co.transaction() as tx:
        assert unpark(tx) == [wid]
        tx.set_status("work_items", wid, WorkStatus.DISPATCHED, assigned_to=agent)
    co.close()


# -- every ending through the policy and end_run ------------------------------------------------

def test_a_refusal_from_the_model_service_fires_the_policys_model_error(org_home, ws, scripted):
    """A real backend failure (the scripted server answers with a refusal) reaches the stop policy
    as its model_error flag: ModelError ends the run, the act discarded, nothing committed."""
    submit(org_home, ws)
    backend, log = scripted([[{"text": "I will not do that.", "stop_reason": "refusal"}]])
    decision = engine(org_home, "w1", backend).run()
    assert decision.reason == StopReason.MODEL_ERROR and decision.detail.startswith("refusal: ")
    row = work(org_home)
    assert (row["status"], row["stop_reason"], row["stop_detail"]) == ("ended", "model_error", decision.detail)
    assert query(org_home, "SELECT outcome, detail FROM attempts") == [{"outcome": "model_error", "detail": "refusal"}]
    assert query(org_home, "SELECT * FROM iterations") == [] and (ws / "calc.py").read_text() == BUGGY
    assert [e["event"] for e in served(log)].count("step") == 1
    # the decision is the policy's: the same flag through progress.load fires ModelError alone
    conn = connect(org_home.db_path, readonly=True)
    progress, _, _ = load(conn, WorkItem.from_row(query(org_home, "SELECT * FROM work_items")[0]),
                          model_error=decision.detail)
    conn.close()
    assert policy_from_caps(Caps(max_iterations=6)).evaluate(progress) == StopDecision(StopReason.MODEL_ERROR, decision.detail)


def test_a_script_with_no_act_left_is_a_model_error_through_the_policy(org_home, ws, scripted):
    """The scripted server refusing a request it has no step for (HTTP 400, not retried) ends the
    run model_error after the iterations it could serve."""
    submit(org_home, ws, caps={"max_iterations": 5})
    backend, _ = scripted([[{"text": "First try.", "tool_uses": [{"name": "write_file", "input": {
        "path": "calc.py", "content": BUGGY.replace("a - b", "a * b")}}]}, {"text": "Done."}]])
    decision = engine(org_home, "w1", backend).run()
    assert decision.reason == StopReason.MODEL_ERROR and "bad_request" in decision.detail
    assert [r["n"] for r in query(org_home, "SELECT n FROM iterations")] == [1]


def test_goal_met_ends_through_the_policy_and_the_verdicts_one_rule(org_home, ws):
    """The eval-agent's passing verdict ends the run by the rule GoalMet evaluates
    (state_db.ending.goal_met), and the engine's own GoalMet decision meets that ending in
    end_run instead of being skipped."""
    submit(org_home, ws)
    with capture_logs() as logs:
        decision = engine(org_home, "w1", ScriptedActs([[BAD], [GOOD]])).run()
    assert decision.reason == StopReason.GOAL_MET
    row = work(org_home)
    assert row["stop_detail"].startswith("iteration 2 passed every check")
    ended = [e for e in logs if e["event"] == "run_ended"]
    assert [(e["policy"], e["reason"], e["recorded"]) for e in ended] == [("goal_met", "goal_met", "earlier")]
    assert query(org_home, "SELECT actor FROM events WHERE kind='work_items.ended'") == [{"actor": "eval-agent"}]
    # one rule: the policy's GoalMet and the verdict agree on the same iteration
    from tests.test_stop import PASS, fail
    assert policy_from_caps(Caps(max_iterations=6)).evaluate(RunProgress(iterations=2, verdicts=(fail(), PASS))).reason \
        == StopReason.GOAL_MET
    assert ending.goal_met(2, 2, True, True) is not None and ending.goal_met(1, 2, True, True) is None


def test_end_run_keeps_the_first_ending_and_refuses_goal_met_to_the_doer(org_home, ws):
    from state_db.kernel.errors import NotAllowed
    submit(org_home, ws)
    la = StateWriter(org_home.db_path, Actor.LOOP_AGENT, "loop-agent-1")
    with pytest.raises(NotAllowed), la.transaction() as tx:
        ending.end_run(tx, "w1", StopDecision(StopReason.GOAL_MET, "the doer says so"))
    with la.transaction() as tx:
        first = ending.end_run(tx, "w1", StopDecision(StopReason.MAX_ITERATIONS, "6 iterations"))
        again = ending.end_run(tx, "w1", StopDecision(StopReason.CANCELLED, "late"))
    la.close()
    assert first == again == StopDecision(StopReason.MAX_ITERATIONS, "6 iterations")
    assert len(query(org_home, "SELECT id FROM events WHERE kind='work_items.ended'")) == 1


def test_cancel_org_limit_and_the_spend_cap_end_through_end_run(org_home, ws, tmp_path):
    """The operations' cancel of a queued run and the coordinator's spend cap record their
    StopDecision through end_run, like the loop."""
    from roles.coordinator.dispatch import enforce_spend_cap
    from roles.operations.cancel import cancel
    human = StateWriter(org_home.db_path, Actor.HUMAN)
    for wid in ("q1", "q2"):
        with human.transaction() as tx:
            tx.insert("work_items", {"id": wid, "goal": "g", "workspace": str(ws), "verify": ["true"],
                                     "caps": {"max_iterations": 1}, "backend": "anthropic", "status": "queued",
                                     "created_by": "human", "created_at": 1.0, "updated_at": 1.0})
    human.close()
    out = cancel(org_home, config.load(None), "q1")
    assert (out["stop_reason"], work(org_home, "q1")["stop_reason"]) == ("cancelled", "cancelled")
    co = StateWriter(org_home.db_path, Actor.COORDINATOR)
    with co.transaction() as tx:
        assert enforce_spend_cap(tx, 0.0000001) == [] and enforce_spend_cap(tx, 0.0) == ["q2"]
    co.close()
    assert work(org_home, "q2")["stop_detail"].startswith("org spend $0.00 reached the cap")


# -- next steps as data -------------------------------------------------------------------------

def test_every_step_round_trips_through_its_encoding():
    decision = StopDecision(StopReason.TOKEN_BUDGET, "9600 tokens used, budget 10000")
    every = [AwaitPreflight(), ActAgain(3), AwaitVerdict(3), Reflect(3), WrapUp(decision), AwaitHuman(("d-1",)),
             Parked(("d-1", "d-2")), Paused(ActAgain(4)), Paused(AwaitVerdict(2)), Ended(decision)]
    for step in every:
        assert steps.decode(steps.dumps(step)) == step
    with pytest.raises(ValueError):
        steps.decode({"kind": "teleport"})


def test_a_parked_run_is_a_stored_step_that_another_engine_resumes(org_home, ws):
    submit(org_home, ws)
    backend = ScriptedActs([[ASK], [GOOD]])
    settings = LoopSettings(gate_runner=lambda c, k, w: (0, "fetched"))
    assert engine(org_home, "w1", backend, settings=settings).run() is None
    row = work(org_home)
    pending = query(org_home, "SELECT id FROM decisions WHERE status='pending'")
    stored = steps.decode(row["next_step"])
    assert stored == Parked((pending[0]["id"],)) and row["status"] == "paused" and row["assigned_to"] is None
    decide(org_home, config.load(None), pending[0]["id"], "approve")
    redispatch(org_home)
    resumed = engine(org_home, "w1", backend, settings=settings)
    assert resumed.resume() == AwaitHuman((pending[0]["id"],))     # from the stored step, not derived
    decision = engine(org_home, "w1", backend, settings=settings).run()
    assert decision.reason == StopReason.GOAL_MET
    assert query(org_home, "SELECT status FROM decisions") == [{"status": "executed"}]


def test_a_paused_run_stores_where_it_goes_on_and_resumes_there(org_home, ws):
    submit(org_home, ws)
    pause = threading.Event()

    class PauseAfterFirst(ScriptedActs):
        def act(self, ctx, *, on_usage, budget_left):
            pause.set()                     # the next safe boundary is after this iteration's verdict
            return super().act(ctx, on_usage=on_usage, budget_left=budget_left)

    assert engine(org_home, "w1", PauseAfterFirst([[BAD], [GOOD]]), pause=pause).run() is None
    assert steps.decode(work(org_home)["next_step"]) == Paused(ActAgain(2))
    assert [r["n"] for r in query(org_home, "SELECT n FROM iterations")] == [1]
    again = engine(org_home, "w1", ScriptedActs([[BAD], [GOOD]]))
    assert again.resume() == ActAgain(2)
    assert engine(org_home, "w1", ScriptedActs([[BAD], [GOOD]])).run().reason == StopReason.GOAL_MET
    assert work(org_home)["next_step"] is None                      # cleared when the act began


def test_a_stored_step_the_run_has_moved_past_is_derived_again(org_home, ws):
    """A stored step is never trusted over state.db: one behind the run is replaced by the step
    state.db says comes next."""
    submit(org_home, ws)
    la = StateWriter(org_home.db_path, Actor.LOOP_AGENT, "loop-agent-1")
    with la.transaction() as tx:
        tx.update("work_items", "w1", next_step=steps.dumps(Paused(ActAgain(7))))
    la.close()
    eng = engine(org_home, "w1", ScriptedActs([[BAD], [GOOD]]))
    stored = eng.resume()
    assert stored == ActAgain(7)
    assert eng.advance(stored) == AwaitPreflight()                       # nothing committed yet: the preflight first


# -- an error the policy does not know -----------------------------------------------------------

LOOP_READ = {"text": "Reading the notes.", "tool_uses": [{"name": "read_file", "input": {"path": "notes"}}]}


def _fix_turns(word: str) -> list[dict]:
    return [LOOP_READ, {"text": f"Fix {word}.", "tool_uses": [{"name": "write_file", "input": {
        "path": "calc.py", "content": FIXED if word == "right" else BUGGY.replace("a - b", "a * b")}}]},
        {"text": f"I wrote the {word} fix."}]


@pytest.mark.timeout(90)
def test_an_unknown_tool_error_pauses_for_a_human_who_confirms_the_stop(org_home, ws, scripted):
    """A tool failing in a way the policy does not know (a symlink loop in the workspace) parks
    the run with an unknown_error decision before another iteration is bought; approving it ends
    the run needs_human through the policy."""
    (ws / "notes").symlink_to("notes")
    submit(org_home, ws)
    backend, log = scripted([_fix_turns("wrong"), _fix_turns("right")])
    assert engine(org_home, "w1", backend).run() is None
    asked = query(org_home, "SELECT * FROM decisions")
    assert [(d["kind"], d["status"], d["iteration"]) for d in asked] == [("unknown_error", "pending", 1)]
    assert "tool_failed: RuntimeError" in asked[0]["question"] and "Symlink loop" in asked[0]["question"]
    assert steps.decode(work(org_home)["next_step"]) == Parked((asked[0]["id"],))
    acts = [e for e in served(log) if e["event"] == "act"]
    assert len(acts) == 1                                   # iteration 1 only: no iteration bought meanwhile
    decide(org_home, config.load(None), asked[0]["id"], "approve")
    redispatch(org_home)
    decision = engine(org_home, "w1", backend).run()
    assert decision.reason == StopReason.NEEDS_HUMAN and "tool_failed: RuntimeError" in decision.detail
    assert len([e for e in served(log) if e["event"] == "act"]) == 1


@pytest.mark.timeout(90)
def test_a_human_answer_goes_on_and_the_same_error_class_never_asks_twice(org_home, ws, scripted):
    (ws / "notes").symlink_to("notes")
    submit(org_home, ws)
    backend, log = scripted([_fix_turns("wrong"), _fix_turns("right")])
    assert engine(org_home, "w1", backend).run() is None
    did = query(org_home, "SELECT id FROM decisions")[0]["id"]
    decide(org_home, config.load(None), did, "respond", "the notes link is broken on purpose; ignore it")
    redispatch(org_home)
    decision = engine(org_home, "w1", backend).run()
    assert decision.reason == StopReason.GOAL_MET           # iteration 2 met the same error: no second question
    assert len(query(org_home, "SELECT id FROM decisions")) == 1
    prompt = json.loads(query(org_home, "SELECT prompt FROM iterations WHERE n=2")[0]["prompt"])
    assert prompt["iteration"] == 2
    firsts = [e for e in served(log) if e["event"] == "act"]
    assert [e["iteration"] for e in firsts] == [1, 2]


# -- the wrap-up -----------------------------------------------------------------------------------

SHOW_AND_FAIL = f"{sys.executable} -c 'import sys; print(\"error: state \" + open(\"state\").read()); sys.exit(1)'"


def _u(inp: int, out: int) -> dict:
    return {"input_tokens": inp, "output_tokens": out, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


@pytest.mark.timeout(90)
def test_the_wrap_up_request_is_bounded_by_the_slice_and_offers_no_tool_that_writes(org_home, ws):
    """What the model is asked for: max_tokens within the reserved slice, only the reading tools,
    a prompt that fits the slice; the stop reason stays the budget's and the note is stored."""
    (ws / "state").write_text("start")
    submit(org_home, ws, caps={"budget_tokens": 10_000, "max_iterations": 10}, verify=(SHOW_AND_FAIL,),
           scope=("state",))
    fake = FakeMessagesAPI()
    fake.start()
    try:
        for word in ("alpha", "beta", "gamma"):        # 2,500 tokens an act, the largest call 2,100
            fake.enqueue(tool_use_turn("write_file", {"path": "state", "content": word}, usage=_u(300, 100)))
            fake.enqueue(text_turn(f"wrote {word}", usage=_u(2000, 100)))
        # a fourth act would begin at 7,500 with a call of about 2,100: past where the budget trips
        # (10,000 less a slice of at least one such call), so it is not begun
        fake.enqueue(text_turn("Done: four tries.\nRemains: the state check.\nLearned: words do not help.",
                               usage=_u(250, 60)))
        settings = LoopSettings(wrapup_reserve=0.05)
        decision = engine(org_home, "w1", _backend(fake.base_url, "fake"), settings=settings).run()
        wrap = fake.requests[-1]
    finally:
        fake.stop()
    assert decision.reason == StopReason.TOKEN_BUDGET
    note = query(org_home, "SELECT * FROM handoffs")[0]
    allowance = json.loads(note["allowance"])
    assert 2_300 <= allowance["tokens"] <= 2_500     # one input the size of the largest and a note, within what is left
    assert wrap["max_tokens"] <= allowance["tokens"]
    assert sorted(t["name"] for t in wrap["tools"]) == ["list_files", "read_file", "search_files"]
    assert len(json.dumps(wrap["messages"][0]["content"])) <= allowance["tokens"] * 3
    assert (note["source"], note["remains"], note["learned"]) == ("wrapup", "the state check.", "words do not help.")
    assert note["tokens"] == 310 <= allowance["tokens"]
    total = query(org_home, "SELECT SUM(input_tokens + output_tokens + cache_write_tokens) AS t FROM model_calls")[0]
    assert total["t"] == 7_810 <= 10_000
    assert query(org_home, "SELECT COUNT(*) AS n FROM iterations")[0]["n"] == 3
    assert "with the wrap-up's 310 tokens" in query(org_home, "SELECT stop_detail FROM work_items")[0]["stop_detail"]


def test_no_wrap_up_without_a_reserve_and_a_record_note_when_no_slice_is_left(org_home, ws):
    """With no reserve the run ends as it always did (no act, no note); with a reserve too small
    for a wrap-up, the hand-off note comes from the record and no model call is made."""
    submit(org_home, ws, caps={"budget_tokens": 250, "max_iterations": 10})
    backend = ScriptedActs([[{}, {}, {}, {}, {}, BAD]], tokens=(100, 0))
    assert engine(org_home, "w1", backend).run().reason == StopReason.TOKEN_BUDGET
    assert len(backend.calls) == 2 and query(org_home, "SELECT * FROM handoffs") == []   # a third would pass 250
    ws2 = make_workspace(ws.parent / "two")
    submit(org_home, ws2, work_id="w2", caps={"budget_tokens": 250, "max_iterations": 10})
    backend = ScriptedActs([[{}, {}, {}, {}, {}, BAD]], tokens=(100, 0))
    decision = engine(org_home, "w2", backend, settings=LoopSettings(wrapup_reserve=0.1)).run()
    # 10 % of 250 tokens is too small a slice for a wrap-up: nothing is kept back, the cap fires at 250
    assert decision.reason == StopReason.TOKEN_BUDGET and "kept for the wrap-up" not in decision.detail
    assert len(backend.calls) == 2
    note = query(org_home, "SELECT * FROM handoffs WHERE work_id='w2'")[0]
    assert note["source"] == "record" and note["attempt"] is None and note["tokens"] == 0
    assert note["act"].startswith("not made: ") and "tokens were left" in note["act"]
    assert "Iteration 1" in note["done"] and "No lesson" not in note["remains"]


def test_an_exception_out_of_an_act_asks_a_human_once_then_propagates_as_before(org_home, ws):
    """An environment error raised out of an act (here the disk failing under it) is a class the
    policy does not know: the first one parks the run with a question; once answered, the same
    class propagates as it always did (the loop-agent retries the run on a later tick)."""
    submit(org_home, ws)

    class DiskFails(ScriptedActs):
        def act(self, ctx, *, on_usage, budget_left):
            raise OSError(5, "Input/output error")

    assert engine(org_home, "w1", DiskFails([[BAD]])).run() is None
    asked = query(org_home, "SELECT * FROM decisions")
    assert [(d["kind"], json.loads(d["action"])["command"]) for d in asked] == [("unknown_error", "exception: OSError")]
    assert work(org_home)["status"] == "paused" and work(org_home)["assigned_to"] is None
    decide(org_home, config.load(None), asked[0]["id"], "reject")
    redispatch(org_home)
    with pytest.raises(OSError):
        engine(org_home, "w1", DiskFails([[BAD]])).run()
    assert len(query(org_home, "SELECT id FROM decisions")) == 1
    assert engine(org_home, "w1", ScriptedActs([[GOOD]])).run().reason == StopReason.GOAL_MET
    assert query(org_home, "SELECT outcome FROM attempts ORDER BY attempt")[0] == {"outcome": "discarded"}


def test_a_wrap_up_cut_by_a_crash_is_never_bought_twice(org_home, ws):
    """The wrap-up's attempt is committed before the model is called: a run that dies in it ends,
    on resume, with the budget's reason and a note from the record, and no second wrap-up act."""
    submit(org_home, ws, caps={"budget_tokens": 10_000, "max_iterations": 5})
    wrapups = []

    class DiesInWrapUp(ScriptedActs):
        def act(self, ctx, *, on_usage, budget_left):
            if "Wrap-up:" in ctx.variable_prompt:
                wrapups.append(ctx.attempt)
                raise KeyboardInterrupt("killed during the wrap-up")
            return super().act(ctx, on_usage=on_usage, budget_left=budget_left)

    settings = LoopSettings(wrapup_reserve=0.05)
    acts = [[{}, {}, {}, {}, {}, {}, BAD]]              # 1,900 tokens a call: the fifth reaches 9,500
    with pytest.raises(KeyboardInterrupt):
        engine(org_home, "w1", DiesInWrapUp(acts, tokens=(1900, 0)), settings=settings).run()
    assert wrapups == [2] and query(org_home, "SELECT * FROM handoffs") == []
    decision = engine(org_home, "w1", DiesInWrapUp(acts, tokens=(1900, 0)), settings=settings).run()
    assert decision.reason == StopReason.TOKEN_BUDGET and wrapups == [2]
    note = query(org_home, "SELECT * FROM handoffs")[0]
    assert (note["source"], note["attempt"], note["tokens"]) == ("record", 2, 0)
    assert query(org_home, "SELECT attempt, wrapup, outcome FROM attempts ORDER BY attempt") == [
        {"attempt": 1, "wrapup": 0, "outcome": "committed"}, {"attempt": 2, "wrapup": 1, "outcome": "discarded"}]


def test_only_end_run_ends_a_run():
    """No code ends a work item by hand: every ending is a StopDecision through end_run."""
    import re
    root = Path(__file__).resolve().parents[1]
    by_hand = re.compile(r"set_status\(\s*[\"']work_items[\"'][^)]*(?:WorkStatus\.ENDED|[\"']ended[\"'])", re.S)
    found = [str(p.relative_to(root)) for top in ("roles", "scripts", "knowledge", "skills", "state_db", "transport")
             for p in (root / top).rglob("*.py") if p.name != "ending.py" and by_hand.search(p.read_text())]
    assert found == []


def test_a_store_lock_held_past_its_wait_is_the_machines_and_is_retried_not_asked(org_home, ws, monkeypatch):
    """SQLite's busy timeout out of an act (a writer waited past it, as on a host running 128
    loop-agents) is never a question for a human: it propagates, the loop-agent retries the run
    on a later tick, and the run goes on to its goal."""
    submit(org_home, ws)
    monkeypatch.setattr(writer_mod, "BUSY_TIMEOUT_MS", 200)     # a short busy timeout: provoked at once

    class LockHeld(ScriptedActs):
        def act(self, ctx, *, on_usage, budget_left):
            other = sqlite3.connect(org_home.db_path, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")          # another writer holds the store past the wait
            try:
                return super().act(ctx, on_usage=on_usage, budget_left=budget_left)
            finally:
                other.execute("ROLLBACK")
                other.close()

    with pytest.raises(StoreBusy):
        run = engine(org_home, "w1", LockHeld([[BAD]]))
        run.w.conn.execute("PRAGMA busy_timeout=200")
        run.w._busy_ms = 200
        run.run()
    assert query(org_home, "SELECT id FROM decisions") == []
    assert work(org_home)["status"] != "paused"
    assert engine(org_home, "w1", ScriptedActs([[GOOD]])).run().reason == StopReason.GOAL_MET


def test_a_write_into_the_repositorys_metadata_is_a_tool_error_the_policy_knows(org_home, ws, scripted):
    """The doer's write into .git is refused (``path_protected``) and fed back to the model like
    any tool error it can correct: no question for a human."""
    (ws / ".git").mkdir()
    (ws / ".git" / "config").write_text("[core]\n")
    submit(org_home, ws)
    turns = [{"text": "Set the config.", "tool_uses": [{"name": "write_file", "input": {"path": ".git/config", "content": "[core]\n\tfsmonitor = x\n"}}]},
             *_fix_turns("right")]
    backend, _ = scripted([turns])
    decision = engine(org_home, "w1", backend).run()
    assert query(org_home, "SELECT id FROM decisions") == []
    assert decision is not None and decision.reason == StopReason.GOAL_MET
    assert (ws / ".git" / "config").read_text() == "[core]\n"


def test_a_commit_refused_after_a_hand_off_discards_the_act_asks_nothing_and_the_holder_goes_on(org_home, ws):
    """The coordinator took loop-agent-1 for gone and gave its run to loop-agent-2 while
    loop-agent-1 acted: loop-agent-1's commit is refused as ``run_taken`` (the coded error its
    loop knows), its act is discarded with nothing asked and nothing written to the run, and
    loop-agent-2 goes on from the last committed iteration: no iteration twice, usage once."""
    from roles.coordinator.dispatch import dispatch, requeue_orphans
    submit(org_home, ws)

    class HandedOff(ScriptedActs):
        def act(self, ctx, *, on_usage, budget_left):
            outcome = super().act(ctx, on_usage=on_usage, budget_left=budget_left)
            if ctx.iteration == 2:        # the coordinator's reconcile, while this act runs
                co = StateWriter(org_home.db_path, Actor.COORDINATOR)
                with co.transaction() as tx:
                    assert requeue_orphans(tx, {"loop-agent-1": False, "loop-agent-2": True}) == ["w1"]
                    assert dispatch(tx, {"loop-agent-2": True}) == [("w1", "loop-agent-2")]
                co.close()
            return outcome

    first = HandedOff([[BAD], [BAD]])
    with pytest.raises(RunTaken) as err:
        engine(org_home, "w1", first).run()
    assert err.value.code == "run_taken" and err.value.holder == "loop-agent-2"
    assert query(org_home, "SELECT id FROM decisions") == []
    after = work(org_home)
    assert (after["status"], after["assigned_to"], after["next_step"]) == ("dispatched", "loop-agent-2", None)
    assert [r["n"] for r in query(org_home, "SELECT n FROM iterations ORDER BY n")] == [1]
    decision = engine(org_home, "w1", ScriptedActs([[GOOD]]), instance="loop-agent-2").run()
    assert decision.reason == StopReason.GOAL_MET
    its = query(org_home, "SELECT n, attempt FROM iterations ORDER BY n")
    assert [r["n"] for r in its] == [1, 2] and its[1]["attempt"] == 3      # attempt 2 was loop-agent-1's
    attempts = {r["attempt"]: r for r in query(org_home, "SELECT * FROM attempts WHERE work_id='w1'")}
    assert (attempts[2]["instance"], attempts[2]["outcome"]) == ("loop-agent-1", "discarded")
    calls = query(org_home, "SELECT request_id FROM model_calls")
    assert len(calls) == len({c["request_id"] for c in calls}) == len(first.calls) + 1


def test_a_run_handed_off_mid_act_makes_no_more_model_calls(org_home, ws):
    """The hand-off lands between two model calls of one act: the next call is not made (the
    run is checked before each), the act ends ``run_taken`` with nothing asked, and the usage
    of the call already made stays counted once."""
    from roles.coordinator.dispatch import dispatch, requeue_orphans
    submit(org_home, ws)

    class HandedOffBetweenCalls(ScriptedActs):
        def act(self, ctx, *, on_usage, budget_left):
            def counted(u):
                on_usage(u)
                if ctx.iteration == 2 and len(self.calls) == 2:   # the first call of iteration 2 is in
                    co = StateWriter(org_home.db_path, Actor.COORDINATOR)
                    with co.transaction() as tx:
                        requeue_orphans(tx, {"loop-agent-1": False, "loop-agent-2": True})
                        dispatch(tx, {"loop-agent-2": True})
                    co.close()
            return super().act(ctx, on_usage=counted, budget_left=budget_left)

    first = HandedOffBetweenCalls([[BAD], [BAD, BAD, BAD]])
    with pytest.raises(RunTaken) as err:
        engine(org_home, "w1", first).run()
    assert err.value.holder == "loop-agent-2"
    assert len(first.calls) == 2                      # iteration 1's call, then one of iteration 2's three
    assert query(org_home, "SELECT id FROM decisions") == []
    calls = query(org_home, "SELECT request_id FROM model_calls")
    assert sorted(c["request_id"] for c in calls) == sorted(first.calls)
