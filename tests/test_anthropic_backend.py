"""The anthropic act backend through the real SDK against a fault-injecting fake Messages API."""
from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from roles.loop_agent.backends.anthropic_backend import AnthropicBackend, AnthropicConfig
from roles.loop_agent.backends.base import ActContext, ActOutcome, BackendConfigError, Usage
from roles.loop_agent.backends.retry import (FileRateGate, Failure, MemoryRateGate, Retrier, RetryPolicy,
                                             parse_retry_after)
from roles.loop_agent.pricing import PriceTable, PricingError
from tests.fake_messages_api import (FakeMessagesAPI, cut_stream, drop, hang, overloaded, rate_limited, reply,
                                     server_error, status, text_turn, tool_use_turn, truncated_json)

FAKE_KEY = "sk-ant-FAKE-KEY-0123456789abcdef"
MODEL = "claude-test"
PRICES = {MODEL: {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_read": 0.3}}
CLIENT_TIMEOUT_S = 0.4


class FakeClock:
    """Wall clock that only moves when something sleeps; records every sleep."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now, self.sleeps = start, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds


@pytest.fixture
def fake():
    server = FakeMessagesAPI()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_text("def greet():\n    return 'hello world'\n")
    return ws


def make_backend(fake: FakeMessagesAPI, clock: FakeClock | None = None, *, gate=None, stream: bool = False,
                 retry: RetryPolicy | None = None, prices=PRICES) -> tuple[AnthropicBackend, FakeClock]:
    clock = clock or FakeClock()
    config = AnthropicConfig(model=MODEL, max_tokens=256, base_url=fake.base_url, timeout_s=CLIENT_TIMEOUT_S,
                             stream=stream, retry=retry or RetryPolicy(jitter=0.0, max_attempts=4))
    backend = AnthropicBackend(config, prices, gate=gate or MemoryRateGate(),
                               environ={"ANTHROPIC_API_KEY": FAKE_KEY}, clock=clock, sleep=clock.sleep)
    return backend, clock


def ctx(workspace: Path, iteration: int = 1) -> ActContext:
    return ActContext(work_id="w-1", iteration=iteration, attempt=1, workspace=workspace,
                      system_prefix="You fix code. Use the tools.",
                      variable_prompt=f"Iteration: {iteration}\nGoal: greet says hello there")


def run_act(backend: AnthropicBackend, workspace: Path, budget=lambda: None) -> tuple[ActOutcome, list[Usage]]:
    usages: list[Usage] = []
    outcome = backend.act(ctx(workspace), on_usage=usages.append, budget_left=budget)
    return outcome, usages


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_tool_use_conversation_edits_file_in_workspace(fake, workspace, stream):
    fake.enqueue(
        tool_use_turn("read_file", {"path": "app.py"}, text="Let me look.", tool_id="toolu_1"),
        tool_use_turn("edit_file", {"path": "app.py", "old_string": "hello world", "new_string": "hello there"},
                      tool_id="toolu_2"),
        text_turn("Changed the greeting."))
    backend, _ = make_backend(fake, stream=stream)
    outcome, usages = run_act(backend, workspace)

    assert (workspace / "app.py").read_text() == "def greet():\n    return 'hello there'\n"
    assert (outcome.status, outcome.stop_reason, outcome.turns) == ("ok", "end_turn", 3)
    assert outcome.summary == "Changed the greeting."
    assert [(c["name"], c["ok"]) for c in outcome.tool_calls] == [("read_file", True), ("edit_file", True)]
    assert len(usages) == 3 and len({u.request_id for u in usages}) == 3
    first, second = fake.requests[0], fake.requests[1]
    assert first["system"] == [{"type": "text", "text": "You fix code. Use the tools.",
                                "cache_control": {"type": "ephemeral"}}]
    assert {t["name"] for t in first["tools"]} == {"list_files", "read_file", "write_file", "edit_file",
                                                   "search_files", "run_command", "request_action",
                                                   "declare_impossible"}
    result = second["messages"][-1]["content"][0]
    assert (result["type"], result["tool_use_id"], result["is_error"]) == ("tool_result", "toolu_1", False)
    assert "hello world" in result["content"]
    assert bool(first.get("stream")) is stream


def test_usage_with_cache_tokens_is_reported_with_cost(fake, workspace):
    counts = {"input_tokens": 1200, "output_tokens": 345, "cache_creation_input_tokens": 2048,
              "cache_read_input_tokens": 4096}
    fake.enqueue(reply([{"type": "text", "text": "ok"}], usage=counts, request_id="req_abc123"))
    backend, _ = make_backend(fake)
    outcome, usages = run_act(backend, workspace)
    assert outcome.status == "ok"
    [usage] = usages
    assert usage.request_id == "req_abc123"
    assert (usage.input_tokens, usage.output_tokens) == (1200, 345)
    assert (usage.cache_creation_input_tokens, usage.cache_read_input_tokens) == (2048, 4096)
    p = PRICES[MODEL]
    expected = (1200 * p["input"] + 345 * p["output"] + 2048 * p["cache_write"] + 4096 * p["cache_read"]) / 1e6
    assert usage.cost_usd == pytest.approx(expected)
    assert Usage.decode(usage.encode()) == usage


def test_usage_is_reported_before_tools_run(fake, workspace):
    fake.enqueue(tool_use_turn("write_file", {"path": "new.txt", "content": "x"}), text_turn("done"))
    backend, _ = make_backend(fake)
    seen: list[bool] = []
    backend.act(ctx(workspace), on_usage=lambda u: seen.append((workspace / "new.txt").exists()),
                budget_left=lambda: None)
    assert seen == [False, True]


def test_rate_limit_honours_retry_after_and_slows_every_agent_sharing_the_gate(fake, workspace, tmp_path):
    gate_dir = tmp_path / "run"
    fake.enqueue(rate_limited(retry_after="7"), text_turn("after the wait"))
    first, clock_a = make_backend(fake, gate=FileRateGate(gate_dir))
    outcome, _ = run_act(first, workspace)
    assert outcome.status == "ok" and clock_a.sleeps == [7.0]
    assert len(fake.requests) == 2

    # another loop-agent (own gate object on the same file, own clock at the same wall time)
    fake.enqueue(text_turn("second agent"))
    second, clock_b = make_backend(fake, FakeClock(), gate=FileRateGate(gate_dir))
    outcome, _ = run_act(second, workspace)
    assert outcome.status == "ok"
    assert clock_b.sleeps == [7.0], "the second agent must wait for the gate before its first call"


def test_retry_after_ms_takes_precedence(fake, workspace):
    fake.enqueue(rate_limited(retry_after="9", retry_after_ms="1500"), text_turn("ok"))
    backend, clock = make_backend(fake)
    assert run_act(backend, workspace)[0].status == "ok"
    assert clock.sleeps == [1.5]


# failure code → fault the fake injects (a hang outlasts the client timeout)
FAULTS = {"rate_limited": lambda: rate_limited("0"), "overloaded": overloaded, "server_error": server_error,
          "timeout": lambda: hang(3.0), "connection": drop, "bad_response": truncated_json}


@pytest.mark.parametrize("code", [c for c in FAULTS if c != "rate_limited"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_transient_fault_is_retried_with_backoff_then_succeeds(fake, workspace, code, stream):
    fault = FAULTS[code]
    fake.enqueue(fault(), fault(), text_turn("recovered"))
    backend, clock = make_backend(fake, stream=stream)
    with structlog.testing.capture_logs() as logs:
        outcome, usages = run_act(backend, workspace)
    assert (outcome.status, outcome.summary, len(usages)) == ("ok", "recovered", 1)
    assert len(fake.requests) == 3
    assert clock.sleeps == [1.0, 2.0], "exponential backoff without jitter: 1 s then 2 s"
    assert [e["code"] for e in logs if e["event"] == "model call failed, retrying"] == [code, code]


@pytest.mark.parametrize("code", list(FAULTS))
def test_exhausted_retries_end_the_act_with_model_error(fake, workspace, code):
    fake.enqueue(FAULTS[code](), FAULTS[code](), text_turn("never served"))
    backend, _ = make_backend(fake, retry=RetryPolicy(max_attempts=2, jitter=0.0))
    outcome, usages = run_act(backend, workspace)
    assert (outcome.status, outcome.error_code) == ("model_error", code)
    assert len(fake.requests) == 2 and fake.pending == 1 and usages == []


def test_stream_cut_before_message_stop_is_retried_as_bad_response(fake, workspace):
    fake.enqueue(cut_stream(), text_turn("whole"))
    backend, clock = make_backend(fake, stream=True)
    with structlog.testing.capture_logs() as logs:
        outcome, usages = run_act(backend, workspace)
    assert (outcome.status, outcome.summary, len(usages)) == ("ok", "whole", 1)
    assert [e["code"] for e in logs if e["event"] == "model call failed, retrying"] == ["bad_response"]


def test_response_without_usage_is_retried_as_bad_response(fake, workspace):
    no_usage = {"id": "msg_1", "type": "message", "role": "assistant", "model": MODEL,
                "content": [{"type": "text", "text": "?"}], "stop_reason": "end_turn"}
    fake.enqueue(lambda ex, _: ex.json(200, no_usage, {"request-id": "req_nousage"}), text_turn("whole"))
    backend, _ = make_backend(fake)
    outcome, usages = run_act(backend, workspace)
    assert (outcome.status, outcome.summary) == ("ok", "whole")
    assert [u.request_id for u in usages] != ["req_nousage"] and len(usages) == 1


def test_non_retryable_status_ends_at_once(fake, workspace):
    fake.enqueue(status(401, "authentication_error", "invalid x-api-key"), text_turn("never served"))
    backend, clock = make_backend(fake)
    outcome, _ = run_act(backend, workspace)
    assert (outcome.status, outcome.error_code) == ("model_error", "auth")
    assert len(fake.requests) == 1 and clock.sleeps == []


def test_retry_wait_bound_stops_before_an_overlong_wait(fake, workspace):
    fake.enqueue(rate_limited(retry_after="500"), text_turn("never served"))
    backend, clock = make_backend(fake, retry=RetryPolicy(max_attempts=5, max_total_wait_s=60, jitter=0.0))
    outcome, _ = run_act(backend, workspace)
    assert (outcome.status, outcome.error_code) == ("model_error", "rate_limited")
    assert len(fake.requests) == 1 and clock.sleeps == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_malformed_tool_input_goes_back_to_the_model_as_tool_error(fake, workspace, stream):
    before = (workspace / "app.py").read_text()
    fake.enqueue(tool_use_turn("edit_file", "not an object", tool_id="toolu_a"),
                 tool_use_turn("edit_file", {"path": "app.py"}, tool_id="toolu_b"),
                 tool_use_turn("no_such_tool", {}, tool_id="toolu_c"),
                 text_turn("giving up"))
    backend, _ = make_backend(fake, stream=stream)
    outcome, _ = run_act(backend, workspace)
    assert (outcome.status, outcome.turns) == ("ok", 4)
    assert [c["code"] for c in outcome.tool_calls] == ["bad_tool_input", "bad_tool_input", "unknown_tool"]
    for request, tool_id in zip(fake.requests[1:], ["toolu_a", "toolu_b", "toolu_c"]):
        result = request["messages"][-1]["content"][0]
        assert result["tool_use_id"] == tool_id and result["is_error"] is True
    echoed = fake.requests[1]["messages"][1]["content"][0]
    assert echoed["input"] == {}, "a non-object input is echoed as {} so the API accepts the history"
    assert (workspace / "app.py").read_text() == before


def test_max_tokens_stop_is_a_failed_act(fake, workspace):
    fake.enqueue(text_turn("I was about to", stop_reason="max_tokens"))
    backend, _ = make_backend(fake)
    outcome, usages = run_act(backend, workspace)
    assert (outcome.status, outcome.stop_reason, outcome.error_code) == ("failed", "max_tokens", "max_tokens")
    assert len(usages) == 1


def test_refusal_stop_is_a_model_error(fake, workspace):
    fake.enqueue(text_turn("I can't help with that.", stop_reason="refusal"))
    backend, _ = make_backend(fake)
    outcome, _ = run_act(backend, workspace)
    assert (outcome.status, outcome.stop_reason, outcome.error_code) == ("model_error", "refusal", "refusal")


def test_model_still_calling_tools_after_max_turns_is_a_failed_act(fake, workspace):
    fake.enqueue(*[tool_use_turn("list_files", {}) for _ in range(3)])
    backend, _ = make_backend(fake)
    usages: list[Usage] = []
    c = ActContext("w-1", 1, 1, workspace, "", "Iteration: 1", max_turns=3)
    outcome = backend.act(c, on_usage=usages.append, budget_left=lambda: None)
    assert (outcome.status, outcome.error_code, outcome.turns, len(usages)) == ("failed", "max_turns", 3, 3)
    assert "system" not in fake.requests[0], "an empty stable prefix sends no system block"


def test_budget_code_before_second_call_means_only_one_call(fake, workspace):
    fake.enqueue(tool_use_turn("list_files", {}), text_turn("never served"))
    backend, _ = make_backend(fake)
    usages: list[Usage] = []
    budget = lambda: "token_budget" if usages else None  # noqa: E731 — spent after the first response
    outcome = backend.act(ctx(workspace), on_usage=usages.append, budget_left=budget)
    assert (outcome.status, outcome.error_code, outcome.turns) == ("budget_exhausted", "token_budget", 1)
    assert len(fake.requests) == 1 and fake.pending == 1 and len(usages) == 1
    assert [c["name"] for c in outcome.tool_calls] == ["list_files"]


def test_budget_is_checked_again_before_a_retry(fake, workspace):
    fake.enqueue(server_error(), text_turn("never served"))
    backend, _ = make_backend(fake)
    calls = []
    budget = lambda: calls.append(1) or ("cost_budget" if len(calls) > 1 else None)  # noqa: E731
    outcome, _ = run_act(backend, workspace, budget)
    assert (outcome.status, outcome.error_code) == ("budget_exhausted", "cost_budget")
    assert len(fake.requests) == 1


def test_api_key_never_reaches_logs_outcomes_or_agent_commands(fake, workspace, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG)  # the SDK's and httpx's own debug logs included
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)  # what run_command's environment would inherit
    fake.enqueue(status(401, "authentication_error", "bad key"))
    fake.enqueue(rate_limited("0"), tool_use_turn("run_command", {"command": "env"}), text_turn("done"))
    backend, _ = make_backend(fake)
    with structlog.testing.capture_logs() as logs:
        first, _ = run_act(backend, workspace)
        second, _ = run_act(backend, workspace)
    sent = fake.headers[0].get("x-api-key") or fake.headers[0].get("authorization", "").removeprefix("Bearer ")
    assert sent == FAKE_KEY, "the key must reach the server (and only it)"
    assert (first.error_code, second.status) == ("auth", "ok")
    env_output = second.tool_calls[0]["result"]
    for text in (repr(logs), caplog.text, repr(first.encode()), repr(second.encode()), repr(backend), env_output):
        assert "FAKE-KEY" not in text


def test_unknown_model_price_is_a_configuration_error_at_construction(fake):
    with pytest.raises(PricingError) as err:
        make_backend(fake, prices={"other-model": PRICES[MODEL]})
    assert err.value.code == "unknown_model" and isinstance(err.value, BackendConfigError)
    assert "claude-test" in str(err.value)


def test_explicit_zero_price_is_allowed_and_costs_nothing(fake, workspace):
    fake.enqueue(text_turn("free", usage={"input_tokens": 50, "output_tokens": 9}))
    zero = {MODEL: {"input": 0, "output": 0, "cache_write": 0, "cache_read": 0}}
    backend, _ = make_backend(fake, prices=zero)
    _, [usage] = run_act(backend, workspace)
    assert usage.cost_usd == 0.0 and usage.input_tokens == 50


@pytest.mark.parametrize("row, code", [({"input": 1, "output": 1, "cache_write": 1}, "bad_price_table"),
                                       ({"input": -1, "output": 1, "cache_write": 1, "cache_read": 1}, "bad_price_table"),
                                       ({"input": True, "output": 1, "cache_write": 1, "cache_read": 1}, "bad_price_table")])
def test_malformed_price_table_is_a_coded_error(row, code):
    with pytest.raises(PricingError) as err:
        PriceTable({MODEL: row})
    assert err.value.code == code


def test_missing_key_is_a_configuration_error_unless_the_server_is_loopback():
    config = AnthropicConfig(model=MODEL, base_url="https://api.example.invalid")
    with pytest.raises(BackendConfigError) as err:
        AnthropicBackend(config, PRICES, environ={})
    assert err.value.code == "missing_api_key"
    local = AnthropicBackend(AnthropicConfig(model=MODEL), PRICES, environ={"ANTHROPIC_BASE_URL": "http://127.0.0.1:9"})
    assert local.base_url == "http://127.0.0.1:9"


def test_retrier_backoff_grows_exponentially_and_caps():
    clock = FakeClock()
    retrier = Retrier(RetryPolicy(max_attempts=6, base_delay_s=1, max_delay_s=5, max_total_wait_s=100, jitter=0.5),
                      MemoryRateGate(), clock=clock, sleep=clock.sleep, rng=lambda: 1.0)

    def always_fails():
        raise RuntimeError("boom")

    got = retrier.call(always_fails, lambda exc: Failure("server_error", True, str(exc)))
    assert got.failure is not None and got.attempts == 6
    assert clock.sleeps == [0.5, 1.0, 2.0, 2.5, 2.5], "full jitter draw halves each capped backoff"


def test_parse_retry_after_reads_seconds_ms_and_http_dates():
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "3"}) == 0.25
    when = parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:10 GMT"}, now=1445412480.0)
    assert when == pytest.approx(10.0)
    assert parse_retry_after({"retry-after": "soon"}) is None and parse_retry_after({}) is None


def test_file_rate_gate_is_shared_across_processes(tmp_path):
    code = ("import sys; from pathlib import Path; from roles.loop_agent.backends.retry import FileRateGate; "
            "FileRateGate(Path(sys.argv[1])).push_back(float(sys.argv[2]))")
    subprocess.run([sys.executable, "-c", code, str(tmp_path), "5000.5"], check=True, cwd=Path(__file__).parents[1],
                   timeout=30)
    gate = FileRateGate(tmp_path)
    assert gate.not_before() == 5000.5
    gate.push_back(10.0)  # never moves backwards
    assert gate.not_before() == 5000.5
    gate.path.write_text("garbage")
    assert gate.not_before() == 0.0, "a corrupt gate file opens the gate rather than stopping the org"


def test_the_runs_of_a_process_share_one_sdk_client_per_endpoint_and_a_fork_starts_without(fake, workspace):
    """A loop-agent builds a backend for each run; the SDK client (and its connection pool) is the
    process's, by key, endpoint and timeout, so the next run's first call does not build one and
    connect again. A process forked from it (the role template's children) holds none of them:
    their connections are the parent's."""
    import os
    from roles.loop_agent.backends import anthropic_backend as ab

    first, _ = make_backend(fake)
    second, _ = make_backend(fake)
    fake.enqueue(text_turn("one"), text_turn("two"))
    assert run_act(first, workspace)[0].status == "ok"
    assert run_act(second, workspace)[0].status == "ok"
    assert first._client is second._client and len(fake.requests) == 2
    other = AnthropicBackend(AnthropicConfig(model=MODEL, max_tokens=256, base_url=fake.base_url, timeout_s=7.0),
                             PRICES, environ={"ANTHROPIC_API_KEY": FAKE_KEY})
    assert other._client_or_new() is not first._client       # another timeout: a client of its own
    pid = os.fork()
    if pid == 0:                                                # the child: nothing inherited
        os._exit(0 if not ab._CLIENTS else 1)
    assert os.waitpid(pid, 0)[1] == 0
