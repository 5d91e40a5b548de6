"""The command backend: an agent CLI run in the sandbox, reaching only the model endpoint.

A fake ``claude`` (a Python script) stands in for Claude Code: it reads the prompt on stdin, posts
to ``ANTHROPIC_BASE_URL`` (a fake Messages API on 127.0.0.1 outside the sandbox), probes what else
it can reach, and prints a Claude-Code-shaped JSON result. Its behaviour comes from ``fake.json``
beside it. Real bubblewrap; skipped only when it is not installed.
"""
from __future__ import annotations

import http.client
import json
import socket
import tempfile
import sys
import time
from pathlib import Path

import pytest

from roles.loop_agent.backends.base import ActContext, BackendConfigError
from roles.loop_agent.backends.command_backend import CommandBackend, CommandConfig, claude_outcome, parse_result
from roles.workbench.sandbox import RefusingRunner, SandboxUnavailable, bubblewrap, runner_from_config
from roles.workbench.relay.endpoint import ModelEndpoint
from state_db.kernel.config import Config, defaults
from tests.fake_messages_api import FakeMessagesAPI, text_turn

PY = sys.executable
REAL_KEY = "sk-ant-outside-only-0123456789"
PRICES = {"claude-sonnet-4-5": {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_read": 0.3}}
MODEL_USAGE = {"input_tokens": 100, "output_tokens": 20, "cache_creation_input_tokens": 7, "cache_read_input_tokens": 50}
pytestmark = pytest.mark.skipif(bubblewrap() is None,
                                reason="bubblewrap (bwrap) is not installed: apt-get install -y bubblewrap")

FAKE_CLAUDE = '''#!{python} -I
import json, os, socket, sys, time, urllib.error, urllib.request
conf = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake.json")))
prompt = sys.stdin.read()
report = {{"argv": sys.argv[1:], "env": dict(os.environ), "prompt": prompt, "cwd": os.getcwd()}}
mode = conf.get("mode", "success")
if mode == "hang":
    time.sleep(60)
if mode == "exit":
    print("boom: the fake CLI failed", file=sys.stderr)
    sys.exit(3)
if mode == "garbage":
    print("this is not JSON")
    sys.exit(0)
usage = {{"input_tokens": 0, "output_tokens": 0}}
text = ""
if conf.get("call_model", True):
    base = os.environ["ANTHROPIC_BASE_URL"]
    body = json.dumps({{"model": conf.get("model", "claude-sonnet-4-5"), "max_tokens": 64,
                        "messages": [{{"role": "user", "content": prompt}}]}}).encode()
    req = urllib.request.Request(base + "/v1/messages", data=body, headers={{
        "content-type": "application/json", "anthropic-version": "2023-06-01",
        "x-api-key": os.environ.get("ANTHROPIC_API_KEY", "")}})
    reply = json.load(urllib.request.urlopen(req, timeout=10))
    text, usage = reply["content"][0]["text"], reply["usage"]
    try:
        urllib.request.urlopen(base + "/admin/keys", timeout=5)
        report["other_path"] = 200
    except urllib.error.HTTPError as exc:
        report["other_path"] = exc.code
for port in conf.get("probe_ports", []):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        report.setdefault("reached", []).append(port)
    except OSError as exc:
        report.setdefault("refused", []).append(type(exc).__name__)
import subprocess
for kind, said in conf.get("exits", []):
    report.setdefault("exit_codes", []).append(subprocess.run(["loop-org-exit", kind, said]).returncode)
with open("cli-report.json", "w") as f:
    json.dump(report, f)
for event in conf.get("stream", []):
    print(json.dumps(event))
result = {{"type": "result", "subtype": conf.get("subtype", "success"), "is_error": conf.get("is_error", False),
          "duration_ms": 5, "num_turns": 2, "result": "done: " + text, "session_id": "sess-123",
          "total_cost_usd": conf.get("cost", 0.0123), "usage": dict(usage, server_tool_use={{}})}}
if result["total_cost_usd"] is None:
    del result["total_cost_usd"]
print(json.dumps(result))
sys.exit(conf.get("exit", 0))
'''


@pytest.fixture
def org(tmp_path):
    home = tmp_path / "org"
    ws = home / "demo" / "ws"
    ws.mkdir(parents=True)
    (home / "run").mkdir(mode=0o700)
    (home / "state.db").write_text(f"ANTHROPIC_API_KEY={REAL_KEY}\n")
    return home, ws


@pytest.fixture
def api():
    fake = FakeMessagesAPI()
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def fake_cli(tmp_path):
    """Writes the fake claude beside its fake.json; returns a function setting its behaviour."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cli = bin_dir / "claude"
    cli.write_text(FAKE_CLAUDE.format(python=PY))
    cli.chmod(0o755)

    def configure(**conf) -> Path:
        (bin_dir / "fake.json").write_text(json.dumps(conf))
        return cli
    return configure


def backend_for(org, api, cli: Path | str, *, environ=None, **overrides) -> CommandBackend:
    home, _ = org
    cfg = Config(defaults())
    conf = CommandConfig(binary=str(cli), **{"timeout_s": 20.0, **overrides})
    env = {"ANTHROPIC_API_KEY": REAL_KEY, "ANTHROPIC_BASE_URL": api.base_url} if environ is None else environ
    return CommandBackend(conf, PRICES, make_runner=lambda ws: runner_from_config(cfg, home, ws),
                          state_dir=home / "run" / "cli", environ=env)


def context(org, iteration=1, attempt=1) -> ActContext:
    return ActContext("w-1", iteration, attempt, org[1], "SYSTEM PREFIX: be careful", "Iteration: 1\nFix the bug.",
                      max_turns=7)


def act(backend, ctx, budget=lambda: None):
    usages = []
    outcome = backend.act(ctx, on_usage=usages.append, budget_left=budget)
    return outcome, usages


def report(org) -> dict:
    return json.loads((org[1] / "cli-report.json").read_text())


def test_a_successful_run_reports_the_usage_the_endpoint_metered_priced_from_the_table(org, api, fake_cli):
    """The CLI's own totals (cost 0.0123) are a cross-check only: the response is what counts."""
    api.enqueue(text_turn("patched it", usage=MODEL_USAGE, request_id="req_fake_success"))
    outcome, usages = act(backend_for(org, api, fake_cli()), context(org))
    assert outcome.status == "ok" and outcome.summary == "done: patched it" and outcome.turns == 2, outcome
    assert len(usages) == 1
    u = usages[0]
    assert u.request_id == "req_fake_success" and u.model == "claude-sonnet-4-5"
    assert (u.input_tokens, u.output_tokens, u.cache_creation_input_tokens, u.cache_read_input_tokens) == (100, 20, 7, 50)
    assert u.cost_usd == pytest.approx((100 * 3.0 + 20 * 15.0 + 7 * 3.75 + 50 * 0.3) / 1_000_000)
    seen = report(org)
    assert seen["argv"][:7] == ["-p", "--output-format", "stream-json", "--verbose", "--permission-mode", "acceptEdits",
                                "--allowedTools"]
    assert seen["argv"][7:] == ["Read,Edit,Write,Glob,Grep,Bash", "--max-turns", "7"]
    assert seen["prompt"].startswith("SYSTEM PREFIX: be careful") and "Iteration: 1" in seen["prompt"]
    assert seen["cwd"] == str(org[1])
    env = seen["env"]
    private = org[0] / "run" / "cli" / "w-1" / "home"
    assert env["HOME"] == str(private) and env["CLAUDE_CONFIG_DIR"] == str(private / ".claude")
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert "CLAUDE_CODE_MAX_RETRIES" not in env                   # the CLI's own default unless set


def test_the_cli_s_stream_events_become_the_act_s_transcript_marked_as_the_cli_s_own_account(org, api, fake_cli):
    """Each assistant message's words and tool calls, each tool result; a broken line is skipped;
    the usage still comes from the endpoint's meter only."""
    api.enqueue(text_turn("ok", usage=MODEL_USAGE))
    stream = [{"type": "system", "subtype": "init", "model": "claude-sonnet-4-5"},
              {"type": "assistant", "message": {"id": "msg_1", "model": "claude-sonnet-4-5", "content": [
                  {"type": "text", "text": "Looking at calc.py"},
                  {"type": "tool_use", "id": "tu_1", "name": "Bash", "input": {"command": "pytest -q"}}]}},
              {"type": "user", "message": {"role": "user", "content": [
                  {"type": "tool_result", "tool_use_id": "tu_1", "is_error": True,
                   "content": [{"type": "text", "text": "1 failed \x1b[31mred\x1b[0m"}]}]}},
              "not an event",
              {"type": "assistant", "message": {"id": "msg_2", "model": "claude-sonnet-4-5", "content": [
                  {"type": "text", "text": "Fixed."}], "usage": {"input_tokens": 10 ** 9}}}]
    got = []
    ctx = ActContext("w-1", 1, 1, org[1], "", "Iteration: 1", max_turns=7, record=lambda k, d: got.append((k, d)))
    outcome, usages = act(backend_for(org, api, fake_cli(stream=stream)), ctx)
    assert outcome.status == "ok", outcome
    assert [k for k, _ in got] == ["turn", "text", "tool_call", "tool_result", "turn", "text"]
    assert got[2][1] == {"id": "tu_1", "name": "Bash", "input": {"command": "pytest -q"}, "source": "cli"}
    assert got[3][1]["ok"] is False and got[3][1]["output"].startswith("1 failed")
    assert [u.input_tokens for u in usages] == [100]        # the meter's, not the CLI's claim


def test_the_orgs_retry_setting_reaches_the_cli(org, api, fake_cli):
    api.enqueue(text_turn("ok", usage=MODEL_USAGE))
    outcome, _ = act(backend_for(org, api, fake_cli(), max_retries=2), context(org))
    assert outcome.status == "ok", outcome
    assert report(org)["env"]["CLAUDE_CODE_MAX_RETRIES"] == "2"


def test_the_cli_never_sees_the_key_and_reaches_only_the_model_endpoint(org, api, fake_cli):
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen(1)
    api_port = int(api.base_url.rsplit(":", 1)[1])
    try:
        api.enqueue(text_turn("hi", usage=MODEL_USAGE))
        cli = fake_cli(probe_ports=[other.getsockname()[1], api_port])
        outcome, _ = act(backend_for(org, api, cli), context(org))
        assert outcome.status == "ok", outcome
        seen = report(org)
        assert REAL_KEY not in json.dumps(seen["env"])  # the placeholder only, whatever the variable
        assert seen["env"]["ANTHROPIC_API_KEY"] == "sandbox-placeholder-key"
        assert api.headers[0]["x-api-key"] == REAL_KEY  # added outside, on the way to the model
        assert seen.get("reached") is None and seen["refused"] == ["ConnectionRefusedError"] * 2
        assert seen["other_path"] == 403 and len(api.requests) == 1  # /admin/keys never left the endpoint
        other.setblocking(False)
        with pytest.raises(BlockingIOError):
            other.accept()
    finally:
        other.close()


def test_cost_is_priced_from_the_table_whatever_the_cli_reports_and_each_response_is_its_own_key(org, api, fake_cli):
    api.enqueue(text_turn("a", usage=MODEL_USAGE), text_turn("b", usage=MODEL_USAGE))
    backend = backend_for(org, api, fake_cli(cost=None), model="claude-sonnet-4-5")
    first, u1 = act(backend, context(org, attempt=1))
    second, u2 = act(backend, context(org, attempt=2))
    assert first.status == second.status == "ok"
    expected = (100 * 3.0 + 20 * 15.0 + 7 * 3.75 + 50 * 0.3) / 1_000_000
    assert u1[0].cost_usd == pytest.approx(expected) and u1[0].model == "claude-sonnet-4-5"
    assert u1[0].request_id != u2[0].request_id
    assert report(org)["argv"][-2:] == ["--model", "claude-sonnet-4-5"]


def test_a_request_for_a_model_without_a_price_is_refused_before_it_is_sent(org, api, fake_cli):
    """An unknown price never counts as free: the call is not made and the run ends."""
    api.enqueue(text_turn("a", usage=MODEL_USAGE))
    outcome, usages = act(backend_for(org, api, fake_cli(cost=None, model="no-such-model")), context(org))
    assert outcome.status == "model_error" and outcome.error_code == "unpriced_model", outcome
    assert not usages and not api.requests


def test_a_missing_binary_is_a_coded_outcome(org, api):
    outcome, usages = act(backend_for(org, api, "/nonexistent/bin/claude"), context(org))
    assert outcome.status == "model_error" and outcome.error_code == "cli_missing" and not usages
    assert "not on the sandbox's PATH" in outcome.error


@pytest.mark.parametrize("conf, status, code", [
    ({"mode": "exit"}, "failed", "cli_exit"),
    ({"mode": "garbage"}, "failed", "bad_output"),
    ({"call_model": False, "is_error": True, "subtype": "success"}, "model_error", "cli_error"),
    ({"call_model": False, "is_error": True, "subtype": "error_max_turns", "exit": 1}, "failed", "max_turns"),
    ({"call_model": False, "is_error": True, "subtype": "error_during_execution", "exit": 1}, "failed",
     "error_during_execution"),
], ids=["non-zero-exit", "no-json", "is-error", "max-turns", "error-subtype"])
def test_cli_failures_become_coded_outcomes(org, api, fake_cli, conf, status, code):
    outcome, _ = act(backend_for(org, api, fake_cli(**conf)), context(org))
    assert (outcome.status, outcome.error_code) == (status, code), outcome
    if code == "cli_exit":
        assert "boom: the fake CLI failed" in outcome.error


def test_a_hung_cli_is_killed_at_the_timeout(org, api, fake_cli):
    t0 = time.monotonic()
    outcome, usages = act(backend_for(org, api, fake_cli(mode="hang"), timeout_s=1.0), context(org))
    assert (outcome.status, outcome.error_code) == ("failed", "timeout") and not usages
    assert time.monotonic() - t0 < 6


def test_budget_is_checked_before_launching(org, api, fake_cli):
    outcome, usages = act(backend_for(org, api, fake_cli()), context(org), budget=lambda: "token_budget")
    assert (outcome.status, outcome.error_code) == ("budget_exhausted", "token_budget") and not usages
    assert not (org[1] / "cli-report.json").exists()


def test_a_budget_code_while_the_cli_runs_stops_it(org, api, fake_cli):
    calls = []

    def budget():
        calls.append(time.monotonic())
        return "cancelled" if len(calls) > 2 else None

    t0 = time.monotonic()
    outcome, _ = act(backend_for(org, api, fake_cli(mode="hang"), poll_s=0.1), context(org), budget=budget)
    assert (outcome.status, outcome.error_code) == ("budget_exhausted", "cancelled")
    assert time.monotonic() - t0 < 5


def test_a_refused_sandbox_is_a_coded_outcome(org, api, fake_cli):
    backend = backend_for(org, api, fake_cli())
    backend._make_runner = lambda ws: RefusingRunner(SandboxUnavailable("bubblewrap missing"))
    outcome, _ = act(backend, context(org))
    assert (outcome.status, outcome.error_code) == ("model_error", "sandbox_unavailable")


def test_configuration_errors_surface_at_construction(org, api, fake_cli):
    with pytest.raises(BackendConfigError) as caught:
        backend_for(org, api, fake_cli(), model="no-such-model")
    assert caught.value.code == "unknown_model"
    with pytest.raises(BackendConfigError) as caught:
        backend_for(org, api, fake_cli(), environ={"ANTHROPIC_BASE_URL": "https://api.example.invalid"})
    assert caught.value.code == "missing_api_key"


def test_result_parsing_tolerates_stray_lines_and_maps_subtypes():
    line = json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": "ok", "num_turns": 3})
    assert parse_result(f"warning: something\n{line}\n")["num_turns"] == 3
    assert parse_result("no json at all") is None
    assert claude_outcome({"subtype": "success", "result": "fine", "num_turns": 1}).status == "ok"
    assert claude_outcome({"subtype": "error_max_turns", "is_error": True}).error_code == "max_turns"


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("sandbox", timeout=10)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def test_endpoint_streams_sse_through_and_replaces_the_credentials(api):
    """What the relay inside reaches: a streamed reply passes whole, with the org's key added outside."""
    api.enqueue(text_turn("streamed " * 30, usage=MODEL_USAGE))
    with tempfile.TemporaryDirectory(prefix="ep-") as d, \
            ModelEndpoint(api.base_url, Path(d) / "m.sock", api_key=REAL_KEY) as endpoint:
        conn = _UnixHTTP(str(endpoint.socket_path))
        body = json.dumps({"model": "m", "max_tokens": 8, "stream": True,
                           "messages": [{"role": "user", "content": "hi"}]})
        conn.request("POST", "/v1/messages", body, {"content-type": "application/json", "x-api-key": "placeholder"})
        resp = conn.getresponse()
        events = resp.read().decode()
        assert resp.status == 200 and resp.getheader("content-type") == "text/event-stream"
        assert events.count("event: content_block_delta") > 3 and events.rstrip().endswith('{"type": "message_stop"}')
        assert api.headers[0]["x-api-key"] == REAL_KEY
        conn.close()
        refused = _UnixHTTP(str(endpoint.socket_path))
        refused.request("GET", "/v1/../admin")
        assert refused.getresponse().status == 403 and endpoint.refused == 1 and len(api.requests) == 1
        refused.close()


def test_a_cli_in_a_hidden_folder_runs_once_org_toml_shows_it(org, api, fake_cli, monkeypatch):
    """A CLI installed where the sandbox hides (node under ~/.nvm, here inside the org home) is
    missing until ``command.path_prepend`` shows its folder read-only and first on PATH."""
    import shutil as _shutil

    from roles.loop_agent.backends.factory import build
    from state_db.kernel.home import OrgHome

    source = fake_cli()
    hidden = org[0] / "tools" / "bin"
    hidden.mkdir(parents=True)
    for f in ("claude", "fake.json"):
        _shutil.copy2(source.parent / f, hidden / f)
    monkeypatch.setenv("ANTHROPIC_API_KEY", REAL_KEY)

    def built(**command):
        data = defaults()
        data["model"]["base_url"] = api.base_url
        data["command"].update({"binary": "claude", "timeout_s": 20, **command})
        return build("command", Config(data), OrgHome(org[0]), "loop-agent-1")

    outcome, _ = act(built().backend, context(org))
    assert outcome.status == "model_error" and outcome.error_code == "cli_missing", outcome
    api.enqueue(text_turn("found it", usage=MODEL_USAGE))
    outcome, usages = act(built(path_prepend=[str(hidden)]).backend, context(org))
    assert outcome.status == "ok" and outcome.summary == "done: found it", outcome
    assert report(org)["env"]["PATH"].split(":")[0] == str(hidden) and len(usages) == 1


def test_the_cli_can_declare_the_goal_impossible_or_ask_a_human_through_its_exit_tool(org, api, fake_cli):
    """``loop-org-exit`` on the CLI's PATH inside the sandbox: its lines become what the anthropic
    backend's tools record — a declare_impossible call (the eval-agent reviews it) and a
    needs_human request (a decision for a human); the prompt tells the CLI how."""
    api.enqueue(text_turn("cannot be done", usage=MODEL_USAGE))
    cli = fake_cli(exits=[["impossible", "the spec asks add(2, 3) to be 6\nand 5"], ["needs_human", "which one?"],
                          ["bogus", "ignored"], ["impossible", ""]])
    outcome, _ = act(backend_for(org, api, cli), context(org))
    assert outcome.status == "ok", outcome
    assert report(org)["exit_codes"] == [0, 0, 2, 2]
    assert "loop-org-exit impossible" in report(org)["prompt"]
    claims = [c for c in outcome.tool_calls if c["name"] == "declare_impossible"]
    assert claims == [{"name": "declare_impossible", "input": {"reason": "the spec asks add(2, 3) to be 6 and 5"},
                       "ok": True, "code": None, "result": "recorded for the eval-agent's review"}]
    from state_db.queries.review import claim_of
    assert claim_of(list(outcome.tool_calls)) == "the spec asks add(2, 3) to be 6 and 5"
    assert outcome.requests == ({"kind": "needs_human", "command": "", "reason": "which one?"},)
    # the next act starts clean: nothing said before is said again
    api.enqueue(text_turn("ok", usage=MODEL_USAGE))
    again, _ = act(backend_for(org, api, fake_cli()), context(org, iteration=2))
    assert again.requests == () and not [c for c in again.tool_calls if c["name"] == "declare_impossible"]


def test_the_exits_file_is_read_as_hostile_input(tmp_path):
    """A link, a folder, a fifo or a huge file is never followed, blocked on or read past its bound."""
    import os

    from roles.loop_agent.backends import exits
    private = tmp_path / "private"
    _, path = exits.prepare(private)
    secret = tmp_path / "secret"
    secret.write_text("impossible\tread through a link\n")
    path.symlink_to(secret)
    assert exits.read(path) == [] and secret.exists()
    os.mkfifo(path)
    assert exits.read(path) == []
    path.write_text("impossible\t" + "x" * 100_000 + "\nneeds_human\tlate\n")
    said = exits.read(path)
    assert said == [("impossible", "x" * exits.MAX_TEXT)] and not path.exists()
    path.write_text("needs_human\t\x1b]0;title\x07ask \x1b[31mred\x1b[0m\n")
    assert exits.read(path) == [("needs_human", "ask red")]
