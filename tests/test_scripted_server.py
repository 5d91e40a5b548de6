"""The scripted model server: served through the real SDK and the anthropic backend."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from roles.loop_agent.backends.anthropic_backend import AnthropicBackend, AnthropicConfig
from roles.loop_agent.backends.base import ActContext
from roles.loop_agent.backends.retry import RetryPolicy
from roles.workbench.scripted.script import ScriptError, parse_script, step_of_request
from roles.workbench.scripted.server import ScriptedServer

ROOT = Path(__file__).resolve().parents[1]
MODEL = "demo-model"
PRICES = {MODEL: {"input": 0, "output": 0, "cache_write": 0, "cache_read": 0}}

SCRIPT = {
    "version": 1,
    "acts": [
        [{"text": "Writing the greeting.",
          "tool_uses": [{"name": "write_file", "input": {"path": "hello.txt", "content": "hello\n"}}],
          "usage": {"input_tokens": 300, "output_tokens": 40, "cache_creation_input_tokens": 1000}},
         {"text": "Done with iteration 1.", "usage": {"input_tokens": 350, "output_tokens": 10,
                                                      "cache_read_input_tokens": 1000}}],
        [{"tool_uses": [{"name": "edit_file", "input": {"path": "hello.txt", "old_string": "hello",
                                                       "new_string": "hello there"}}]},
         {"text": "Done with iteration 2."}],
    ],
}


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def script_file(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(SCRIPT, indent=2))
    return path


@pytest.fixture
def server(script_file: Path, tmp_path: Path):
    srv = ScriptedServer(script_file, tmp_path / "scripted.jsonl")
    srv.start()
    yield srv
    srv.stop()


def backend_for(server: ScriptedServer, stream: bool) -> AnthropicBackend:
    config = AnthropicConfig(model=MODEL, base_url=server.base_url, timeout_s=5, stream=stream,
                             retry=RetryPolicy(max_attempts=2, base_delay_s=0.01, jitter=0))
    return AnthropicBackend(config, PRICES, environ={})  # a loopback server needs no key


def act(backend: AnthropicBackend, workspace: Path, iteration: int):
    usages = []
    ctx = ActContext("w-9", iteration, 1, workspace, "Stable instructions.",
                     f"Goal: greet\nIteration: {iteration}\nFeedback: none")
    return backend.act(ctx, on_usage=usages.append, budget_left=lambda: None), usages


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_backend_replays_the_script_through_the_sdk(server, tmp_path, stream):
    ws = tmp_path / "ws"
    ws.mkdir()
    backend = backend_for(server, stream)
    first, usages = act(backend, ws, 1)
    assert (first.status, first.summary, first.turns) == ("ok", "Done with iteration 1.", 2)
    assert (ws / "hello.txt").read_text() == "hello\n"
    assert [(u.input_tokens, u.output_tokens, u.cache_creation_input_tokens, u.cache_read_input_tokens)
            for u in usages] == [(300, 40, 1000, 0), (350, 10, 0, 1000)]
    assert all(u.model == f"scripted/{MODEL}" for u in usages), "served results are labelled scripted"
    second, _ = act(backend, ws, 2)
    assert second.status == "ok" and (ws / "hello.txt").read_text() == "hello there\n"

    log = read_log(server.log_path)
    assert [e["event"] for e in log] == ["act", "step", "step", "act", "step", "step"]
    assert [(e["iteration"], e["turn"]) for e in log if e["event"] == "step"] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert all(e["stream"] is stream for e in log if e["event"] == "step")
    assert len({e["request_id"] for e in log if e["event"] == "step"}) == 4


def test_a_repeated_request_is_served_the_same_step(server):
    import anthropic

    client = anthropic.Anthropic(api_key="unused", base_url=server.base_url, max_retries=0, timeout=5)
    request = {"model": MODEL, "max_tokens": 100, "messages": [{"role": "user", "content": "Iteration: 1"}]}
    a = client.messages.with_raw_response.create(**request)
    b = client.messages.with_raw_response.create(**request)
    ma, mb = a.parse(), b.parse()
    assert [blk.to_dict() for blk in ma.content] == [blk.to_dict() for blk in mb.content]
    assert ma.content[1].id == "toolu_s1_0_0" and ma.stop_reason == "tool_use"
    assert a.headers["request-id"] != b.headers["request-id"], "each request is its own usage record"
    assert a.headers["x-loop-org-served-by"] == "scripted"
    log = read_log(server.log_path)
    assert [e["event"] for e in log] == ["act", "step", "act", "step"]


def test_a_request_past_the_script_fails_loudly(server, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    outcome, usages = act(backend_for(server, stream=False), ws, 3)
    assert (outcome.status, outcome.error_code) == ("model_error", "bad_request")
    assert "no act for iteration 3" in outcome.error and usages == []
    errors = [e for e in read_log(server.log_path) if e["event"] == "error"]
    assert len(errors) == 1, "a refused request is not retried (x-should-retry: false)"
    assert errors[0]["code"] == "script_exhausted" and errors[0]["status"] == 400


def test_a_request_without_an_iteration_line_is_refused(server):
    import anthropic

    client = anthropic.Anthropic(api_key="unused", base_url=server.base_url, max_retries=0, timeout=5)
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert "Iteration: N" in str(err.value)


@pytest.mark.parametrize("extra", [{"repeat_last": True}, {"default": [{"text": "Still nothing to do."}]}])
def test_repeat_last_or_default_serves_iterations_past_the_script(extra):
    script = parse_script(json.dumps({**SCRIPT, **extra}))
    turn = script.step(30, 0)
    expected = SCRIPT["acts"][-1][0]["tool_uses"][0]["name"] if "repeat_last" in extra else None
    assert (turn.tool_uses[0].name if turn.tool_uses else None) == expected
    with pytest.raises(ScriptError) as err:
        parse_script(json.dumps(SCRIPT)).step(30, 0)
    assert err.value.code == "script_exhausted"


def test_step_is_chosen_from_the_iteration_line_and_assistant_turns():
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Goal: x\nIteration: 7\n"}]},
                         {"role": "assistant", "content": []}, {"role": "user", "content": []},
                         {"role": "assistant", "content": []}, {"role": "user", "content": []}]}
    assert step_of_request(body) == (7, 2)


@pytest.mark.parametrize("text, code, where", [
    ('{"acts": [\n  [{"text": "a"}],\n  oops\n]}', "script_syntax", "line 3"),
    ('{"acts": [[{"text": "a", "stop_reson": "end_turn"}]]}', "script_field", "acts[0][0]"),
    ('{"acts": [[{"tool_uses": [{"input": {}}]}]]}', "script_field", "acts[0][0].tool_uses[0].name"),
    ('{"acts": [[{"text": "a", "usage": {"input_tokens": -1}}]]}', "script_field", "acts[0][0].usage.input_tokens"),
    ('{"acts": [[{"text": "a", "stop_reason": "done"}]]}', "script_field", "acts[0][0].stop_reason"),
    ('{"acts": [[]]}', "script_field", "acts[0]"),
    ('{"acts": [], "repeat_last": true, "default": [{"text": "x"}]}', "script_field", "default"),
    ('[]', "script_field", "$")])
def test_bad_script_files_are_coded_errors_naming_line_or_field(text, code, where):
    with pytest.raises(ScriptError) as err:
        parse_script(text)
    assert err.value.code == code and where in str(err.value)


def test_cli_serves_a_script_and_prints_its_url(script_file, tmp_path):
    import anthropic

    log_path = tmp_path / "cli.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "roles.workbench.scripted.server", "--script", str(script_file),
                             "--log", str(log_path)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), (url, proc.poll())
        client = anthropic.Anthropic(api_key="unused", base_url=url, max_retries=0, timeout=5)
        msg = client.messages.create(model=MODEL, max_tokens=10,
                                     messages=[{"role": "user", "content": "Iteration: 2"}])
        assert msg.content[0].name == "edit_file" and msg.model == f"scripted/{MODEL}"
        assert [e["event"] for e in read_log(log_path)] == ["act", "step"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 0


def test_cli_rejects_a_bad_script_with_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"acts": 3}')
    done = subprocess.run([sys.executable, "-m", "roles.workbench.scripted.server", "--script", str(bad),
                           "--log", str(tmp_path / "l.jsonl")], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stderr.strip().startswith("error (script_field)")
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_bad_script_is_an_unbuildable_backend_whoever_submitted_it(tmp_path, org_home):
    """The submit operation does not read scripts (commands do not reach into a role): the CLI checks
    one where it arrives, and the loop-agent's backend factory refuses a bad one as a configuration
    error, which ends the run (model_error) instead of retrying it forever."""
    import pytest as _pytest
    from roles.loop_agent.backends.base import BackendConfigError
    from roles.loop_agent.backends.factory import build
    from state_db.kernel import config as config_mod
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1, "acts": [[{"txt": "x"}]]}')
    with _pytest.raises(BackendConfigError) as got:
        build(f"scripted:{bad}", config_mod.load(None), org_home, "loop-agent-1")
    assert got.value.code == "script_field" and "acts[0][0]" in str(got.value)
