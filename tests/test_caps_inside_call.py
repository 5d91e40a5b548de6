"""Caps cut inside a call: a hung model call and a runaway tool command end at the run's timeout,
and a server billing every token it may never pushes a run past its token or cost budget.

The adversary's tests run a real org (supervisor, loop-agents, eval-agent, the bubblewrap sandbox
org.toml asks for by default) against ``bench.caps.CapsServer`` on 127.0.0.1, reached through the
anthropic backend by ``model.base_url``; the same cases feed ``bench/caps.py``. The in-process
tests below them pin each piece: request bounds, the retrier's deadline, the tool's time limit,
a stream cut at the deadline.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from bench import caps as bench_caps
from roles.loop_agent.backends.anthropic_backend import (AnthropicBackend, AnthropicConfig, RequestBounds, cap_reached,
                                                         request_bounds)
from roles.loop_agent.backends.base import ActContext, Remaining
from roles.loop_agent.backends.retry import Failure, MemoryRateGate, Retrier, RetryPolicy
from roles.loop_agent.commands import SubprocessRunner
from roles.loop_agent.pricing import Price
from roles.workbench.scripted.server import message_body, sse_event
from roles.loop_agent.tools import WorkspaceTools
from tests.fake_messages_api import FakeMessagesAPI, text_turn

TIMEOUT_S = 3.0
BUDGET_TOKENS = 300_000
BUDGET_USD = 5.0
pytestmark = pytest.mark.timeout(300)     # the module's org runs six items at once (its fixture, in the first test)
FEW_SECONDS = 3.0          # what a run may outlive its timeout by: the commit of the cut iteration, the end


# -- the adversary, through real processes --------------------------------------------------------

@pytest.fixture(scope="module")
def runs() -> dict[str, bench_caps.CaseRun]:
    """One org, six items at once: a hung model call, ``sleep 100000``, a token hog, a cost hog, and a
    token and a cost budget that end in a wrap-up."""
    root = Path(tempfile.mkdtemp(prefix="lo-"))   # short: ipc socket paths must stay under ~100 bytes
    try:
        yield bench_caps.run_cases(root, timeout_s=TIMEOUT_S, budget_tokens=BUDGET_TOKENS, budget_usd=BUDGET_USD,
                                   wait_s=120.0, cases=tuple(c for c in bench_caps.CASES if c != "ladder"))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _seen(run: bench_caps.CaseRun) -> str:
    return (f"{run.case}: stop={run.stop_reason} wall={run.wall_s}s elapsed={run.elapsed_s:.2f}s acts={run.act_status} "
            f"requests={[(round(s.at, 2), s.max_tokens, s.usage) for s in run.served]}")


def test_a_hung_model_call_ends_the_run_timeout_within_seconds_of_its_timeout(runs):
    hang = runs["hang"]
    assert hang.stop_reason == "timeout", _seen(hang)
    assert hang.served, _seen(hang)                          # the call was made, and hung
    assert TIMEOUT_S <= hang.wall_s <= TIMEOUT_S + FEW_SECONDS, _seen(hang)
    assert hang.act_status == ["budget_exhausted"], _seen(hang)


def test_a_sleep_100000_tool_call_in_the_sandbox_ends_the_run_timeout_promptly(runs):
    runaway = runs["runaway"]
    assert runaway.stop_reason == "timeout", _seen(runaway)
    assert len(runaway.served) == 1, _seen(runaway)         # the call that asked for the command, no other
    assert TIMEOUT_S <= runaway.wall_s <= TIMEOUT_S + FEW_SECONDS, _seen(runaway)


def test_a_server_billing_all_it_may_overshoots_no_budget(runs):
    tok, cost = runs["hog_tokens"], runs["hog_cost"]
    assert (tok.stop_reason, cost.stop_reason) == ("token_budget", "cost_budget"), (_seen(tok), _seen(cost))
    budget_overshoot_ratio_tokens = tok.counted_tokens / BUDGET_TOKENS
    budget_overshoot_ratio_cost = cost.counted_cost / BUDGET_USD
    assert 0.5 <= budget_overshoot_ratio_tokens <= 1.00, _seen(tok)
    assert 0.5 <= budget_overshoot_ratio_cost <= 1.00, _seen(cost)
    # what was counted is what the server reported, request for request
    assert tok.counted_tokens == tok.served_tokens and cost.counted_tokens == cost.served_tokens, (_seen(tok), _seen(cost))
    assert cost.counted_cost == pytest.approx(sum(s.cost() for s in cost.served))


def test_the_wrap_up_is_paid_from_the_budget_and_the_run_says_what_it_used_in_all(runs):
    """The issue's case: 9,000 tokens a call; the iterations stop early enough that the wrap-up
    act, which runs and writes the note, ends the run within the budget, and the stop detail
    counts it."""
    for case, counted, budget in (("wrapup_tokens", lambda r: r.counted_tokens, bench_caps.WRAPUP_TOKENS),
                                  ("wrapup_cost", lambda r: r.counted_cost, bench_caps.WRAPUP_USD)):
        run = runs[case]
        assert run.stop_reason == ("token_budget" if case == "wrapup_tokens" else "cost_budget"), _seen(run)
        assert run.handoff == "wrapup", _seen(run)
        assert counted(run) <= budget, _seen(run)
        assert run.served_tokens == run.counted_tokens, _seen(run)


def test_max_tokens_sent_never_exceeds_what_the_budget_had_left(runs):
    tok, cost = runs["hog_tokens"], runs["hog_cost"]
    used = 0
    for s in tok.served:
        assert s.max_tokens <= BUDGET_TOKENS - used, _seen(tok)
        used += s.tokens
    spent = 0.0
    for s in cost.served:
        assert s.max_tokens * bench_caps.PRICE["output"] / 1e6 <= BUDGET_USD - spent + 1e-12, _seen(cost)
        spent += s.cost()
    # the first request of each still asks for the configured size: the bound cuts, it does not starve
    assert tok.served[0].max_tokens == cost.served[0].max_tokens == bench_caps.MAX_TOKENS
    assert len(tok.served) >= 2 and tok.served[1].max_tokens < bench_caps.MAX_TOKENS, _seen(tok)


# -- the pieces, in-process -----------------------------------------------------------------------

PRICE = Price(input=3.0, output=15.0, cache_write=3.75, cache_read=0.3)
CONFIG = AnthropicConfig(model="claude-test", max_tokens=8192, timeout_s=120.0)


@pytest.mark.parametrize("remaining, expected", [
    (Remaining(), RequestBounds(8192, 120.0)),
    (Remaining(tokens=500), RequestBounds(500, 120.0)),
    (Remaining(cost_usd=0.03), RequestBounds(2000, 120.0)),             # $0.03 ÷ $15/M
    (Remaining(seconds=2.5), RequestBounds(8192, 2.5)),
    (Remaining(tokens=10_000, cost_usd=0.001, seconds=0.01), RequestBounds(66, 0.1)),
    (Remaining(cost_usd=1e-9), RequestBounds(1, 120.0)),                # the API's minimum
], ids=["none", "tokens", "cost", "seconds", "all-with-floor", "sub-token-cost"])
def test_request_bounds_take_the_smallest_of_config_and_what_is_left(remaining, expected):
    assert request_bounds(CONFIG, PRICE, remaining) == expected


def test_a_cap_with_nothing_left_names_its_stop_code():
    assert cap_reached(Remaining(tokens=0)) == "token_budget"
    assert cap_reached(Remaining(cost_usd=0.0)) == "cost_budget"
    assert cap_reached(Remaining(seconds=0.0)) == "timeout"
    assert cap_reached(Remaining(tokens=1, cost_usd=0.01, seconds=0.5)) is None


def _backend(fake: FakeMessagesAPI, *, stream: bool = False, timeout_s: float = 120.0) -> AnthropicBackend:
    config = AnthropicConfig(model="claude-test", max_tokens=8192, base_url=fake.base_url, timeout_s=timeout_s,
                             stream=stream, retry=RetryPolicy(max_attempts=4, base_delay_s=0.05, jitter=0.0))
    return AnthropicBackend(config, {"claude-test": {"input": 3.0, "output": 15.0, "cache_write": 3.75,
                                                     "cache_read": 0.3}}, gate=MemoryRateGate(), environ={})


def _ctx(ws: Path, remaining) -> ActContext:
    return ActContext("w-caps", 1, 1, ws, "system", "Iteration: 1\nGoal: g", remaining=remaining)


@pytest.fixture
def fake():
    server = FakeMessagesAPI()
    server.start()
    yield server
    server.stop()


def test_a_request_asks_for_no_more_than_the_budget_has_left(fake, tmp_path):
    fake.enqueue(text_turn("done"))
    outcome = _backend(fake).act(_ctx(tmp_path, lambda: Remaining(tokens=700, cost_usd=0.006)),
                                 on_usage=lambda u: None, budget_left=lambda: None)
    assert outcome.status == "ok"
    assert fake.requests[0]["max_tokens"] == 400                        # $0.006 ÷ $15/M < 700 tokens


def test_nothing_left_ends_the_act_with_the_cap_before_any_request(fake, tmp_path):
    outcome = _backend(fake).act(_ctx(tmp_path, lambda: Remaining(cost_usd=0.0)),
                                 on_usage=lambda u: None, budget_left=lambda: None)
    assert (outcome.status, outcome.error_code) == ("budget_exhausted", "cost_budget")
    assert fake.requests == []


class FakeClock:
    def __init__(self) -> None:
        self.now, self.sleeps = 1_000_000.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds


def test_retry_waits_never_sleep_past_the_deadline():
    """A server asking to wait 30 s with 2 s left: the retrier sleeps 2 s and the cap stops it."""
    clock = FakeClock()
    deadline = clock.now + 2.0
    retrier = Retrier(RetryPolicy(max_attempts=5, jitter=0.0), MemoryRateGate(), clock=clock, sleep=clock.sleep)
    calls = []

    def fn():
        calls.append(clock.now)
        raise RuntimeError("overloaded")
    got = retrier.call(fn, lambda exc: Failure("server_error", True, "down", retry_after_s=30.0),
                       before_attempt=lambda: "timeout" if clock.now >= deadline else None,
                       time_left=lambda: deadline - clock.now)
    assert (got.stopped, len(calls), clock.sleeps) == ("timeout", 1, [2.0])


def test_retry_gate_wait_stops_at_the_deadline_and_still_holds_the_others_back():
    clock = FakeClock()
    gate = MemoryRateGate()
    deadline = clock.now + 1.0
    retrier = Retrier(RetryPolicy(max_attempts=5, jitter=0.0), gate, clock=clock, sleep=clock.sleep)
    got = retrier.call(lambda: (_ for _ in ()).throw(RuntimeError("429")),
                       lambda exc: Failure("rate_limited", True, "slow down", retry_after_s=20.0),
                       before_attempt=lambda: "timeout" if clock.now >= deadline else None,
                       time_left=lambda: deadline - clock.now)
    assert (got.stopped, clock.sleeps) == ("timeout", [1.0])
    assert gate.not_before() == pytest.approx(1_000_000.0 + 20.0)


def test_a_command_is_killed_when_the_runs_time_runs_out(tmp_path):
    t0 = time.monotonic()
    tools = WorkspaceTools(tmp_path, SubprocessRunner(), time_left=lambda: 0.5 - (time.monotonic() - t0))
    result = tools.call("run_command", {"command": "sleep 100000"})
    took = time.monotonic() - t0
    assert (result.is_error, result.code) == (True, "command_timeout")
    assert "the run's time limit is reached" in result.content and took < 3.0, (took, result.content)
    late = tools.call("run_command", {"command": "echo never"})
    assert (late.is_error, late.code) == (True, "run_timeout"), late.content


def _slow_stream(seconds: float, usage: dict):
    """message_start, then a ping every 0.1 s for ``seconds``: never silent long enough for a
    read timeout, so only the deadline between events can cut it."""
    def behave(ex, fake):
        body = message_body(model="claude-test", content=[], stop_reason=None, usage=usage)
        h = ex.handler
        h.close_connection = True
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("request-id", "req_slow_stream")
        h.end_headers()
        try:
            h.wfile.write(sse_event("message_start", {"type": "message_start", "message": body}))
            end = time.monotonic() + seconds
            while time.monotonic() < end and not fake.stopping.wait(0.1):
                h.wfile.write(sse_event("ping", {"type": "ping"}))
                h.wfile.flush()
        except OSError:
            pass                                 # the client hung up: what the deadline is for
    return behave


def test_a_stream_that_outlives_the_deadline_is_cut_and_its_reported_usage_counted(fake, tmp_path):
    import anthropic  # noqa: F401 — imported before the clock starts: the act's first client build imports it
    fake.enqueue(_slow_stream(20.0, {"input_tokens": 1234, "output_tokens": 1}))
    t0 = time.monotonic()

    def remaining() -> Remaining:
        return Remaining(seconds=max(0.0, 1.0 - (time.monotonic() - t0)))
    usages = []
    outcome = _backend(fake, stream=True).act(
        _ctx(tmp_path, remaining), on_usage=usages.append,
        budget_left=lambda: "timeout" if remaining().seconds <= 0 else None)
    took = time.monotonic() - t0
    assert (outcome.status, outcome.error_code) == ("budget_exhausted", "timeout"), json.dumps(outcome.encode())
    assert took < 3.0, took
    assert [(u.request_id, u.input_tokens) for u in usages] == [("req_slow_stream", 1234)]
