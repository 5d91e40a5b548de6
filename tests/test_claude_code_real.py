"""The real Claude Code CLI through the ``command`` backend, offline, against the scripted server.

``scripts/test`` installs ``@anthropic-ai/claude-code`` at the version pinned in
``scripts/_bootstrap.sh`` into ``.cache/claude-code/<version>/``. The backend is built from
org.toml by the factory, as a loop-agent builds it; the CLI runs in bubblewrap, reaches the
scripted server only through the model endpoint (which adds the key outside), calls its own
tools (Read, Edit, Bash) on the scripted turns and prints its JSON result.

Skipped when bubblewrap or the cached CLI is missing — except under ``CI=true``, where a missing
CLI fails the test, because CI installs it.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
import structlog

from roles.loop_agent.backends.base import ActContext
from roles.loop_agent.backends.factory import build
from roles.workbench.scripted.script import parse_script
from roles.workbench.scripted.server import ScriptedServer
from roles.workbench.sandbox import bubblewrap, clean_env
from roles.workbench.relay.endpoint import ModelEndpoint
from state_db.kernel.config import load
from tests.fake_messages_api import FakeMessagesAPI, server_error
from tests.support.loop import BUGGY, CHECK, FIXED, engine, make_workspace, submit
from tests.support.org import query

ROOT = Path(__file__).resolve().parents[1]
REAL_KEY = "sk-ant-outside-only-real-cli-0123456789"
PLACEHOLDER = "sandbox-placeholder-key"
INSTANCE = "loop-agent-1"
needs_bwrap = pytest.mark.skipif(bubblewrap() is None,
                                 reason="bubblewrap (bwrap) is not installed: apt-get install -y bubblewrap")


def pinned_cli() -> tuple[str, Path]:
    """The version scripts/_bootstrap.sh pins and where scripts/test caches it."""
    text = (ROOT / "scripts" / "_bootstrap.sh").read_text()
    version = re.search(r'^claude_code_version="([^"]+)"$', text, re.MULTILINE).group(1)
    return version, ROOT / ".cache" / "claude-code" / version / "node_modules" / ".bin" / "claude"


def _cli_problem(version: str, cli: Path) -> str | None:
    if not (cli.parent.parent.parent / ".installed").is_file() or not os.access(cli, os.X_OK):
        return f"Claude Code {version} is not cached at {cli}; scripts/test installs it (needs node and npm)"
    node = shutil.which("node", path=clean_env()["PATH"])
    if node is None or Path(os.path.realpath(node)).is_relative_to(Path.home()):
        return f"node ({node or 'not found'}) is not on the sandbox's PATH outside the hidden home"
    got = subprocess.run([str(cli), "--version"], capture_output=True, text=True, timeout=30, check=False,
                         env={"PATH": clean_env()["PATH"], "HOME": tempfile.gettempdir()})
    if not got.stdout.startswith(version + " "):
        return f"{cli} reports {got.stdout.strip() or got.stderr.strip()[-200:]!r}, not the pinned {version}"
    return None


@pytest.fixture(scope="module")
def claude_cli() -> Path:
    version, cli = pinned_cli()
    problem = _cli_problem(version, cli)
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"error[claude_code_missing]: {problem}", pytrace=False)
        pytest.skip(problem)
    return cli


class RecordingServer(ScriptedServer):
    """The scripted server, also keeping each request's path, headers and body."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.seen: list[dict] = []

    def respond(self, exchange) -> None:
        self.seen.append({"path": exchange.path, "headers": exchange.headers, "body": exchange.body})
        super().respond(exchange)


def org_backend(home, upstream: str, cli: Path, monkeypatch):
    """The command backend exactly as a loop-agent builds it: org.toml, then the factory, with
    the key in the environment only."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", REAL_KEY)
    for var in ("ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "ORG_MODEL"):
        monkeypatch.delenv(var, raising=False)
    home.config_path.write_text(f'[model]\nbackend = "command"\nbase_url = "{upstream}"\n'
                                f'[command]\nbinary = "{cli}"\ntimeout_s = 20\n')
    cfg = load(home.config_path)
    return build(cfg["model.backend"], cfg, home, INSTANCE)


def tool(name: str, **tool_input) -> dict:
    return {"tool_uses": [{"name": name, "input": tool_input}]}


PROBE = ("mkdir -p .probe && cat /proc/self/limits > .probe/limits && id -u > .probe/uid && "
         "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done > .probe/environ 2>/dev/null; "
         "(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo reached > .probe/decoy "
         "|| echo refused > .probe/decoy")


def two_acts(ws: Path, decoy_port: int) -> str:
    """Iteration 1 edits add() wrongly (the check fails); iteration 2 fixes it, then its Bash
    call looks at the sandbox from inside: every process's environment, limits, a host port."""
    calc = str(ws / "calc.py")
    return json.dumps({"acts": [
        [tool("Read", file_path=calc), tool("Edit", file_path=calc, old_string="a - b", new_string="a * b"),
         {"text": "add() now multiplies."}],
        [tool("Read", file_path=calc), tool("Edit", file_path=calc, old_string="a * b", new_string="a + b"),
         tool("Bash", command=PROBE.format(port=decoy_port), description="look around"),
         {"text": "add() adds now."}],
    ]})


@pytest.fixture
def decoy():
    """A listener on the host's 127.0.0.1 that nothing from the sandbox may reach."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    sock.setblocking(False)
    yield sock
    sock.close()


def _recording(backend):
    """Keep each ActOutcome the engine gets from ``backend``."""
    outcomes, act = [], backend.act

    def recorded(ctx, **kw):
        outcomes.append(act(ctx, **kw))
        return outcomes[-1]
    backend.act = recorded
    return outcomes


@needs_bwrap
def test_the_real_cli_fixes_the_bug_with_its_own_tools_in_a_two_iteration_loop(
        org_home, tmp_path, claude_cli, monkeypatch, decoy):
    ws = make_workspace(tmp_path)
    script = parse_script(two_acts(ws, decoy.getsockname()[1]))
    with RecordingServer(script, tmp_path / "scripted.jsonl") as server:
        built = org_backend(org_home, server.base_url, claude_cli, monkeypatch)
        outcomes = _recording(built.backend)
        # the probe's files are in a dot folder, outside the default change scope: widened to it so
        # that the delivered workspace holds them
        submit(org_home, ws, verify=(CHECK,), scope=(".probe/**",))
        with structlog.testing.capture_logs() as logs:
            decision = engine(org_home, "w1", built.backend).run()
    assert decision.reason == "goal_met", (decision, outcomes)
    assert (ws / "calc.py").read_text() == FIXED

    # the CLI's JSON result, parsed: subtype, is_error, num_turns, closing text
    assert [(o.status, o.stop_reason, o.turns) for o in outcomes] == [("ok", "success", 3), ("ok", "success", 4)]
    rows = query(org_home, "SELECT * FROM iterations WHERE work_id='w1' ORDER BY n")
    assert [r["act_summary"] for r in rows] == ["add() now multiplies.", "add() adds now."]
    assert "calc.py" in json.loads(rows[0]["changed_paths"])
    verdicts = query(org_home, "SELECT iteration, outcome FROM verdicts ORDER BY iteration")
    assert verdicts == [{"iteration": 1, "outcome": "fail"}, {"iteration": 2, "outcome": "pass"}]

    # the transcript, from the CLI's own stream events: its tool calls with their input and results
    entries = query(org_home, "SELECT iteration, kind, data FROM transcript WHERE work_id='w1' ORDER BY attempt, seq")
    calls = [json.loads(e["data"]) for e in entries if e["kind"] == "tool_call"]
    assert {c["name"] for c in calls} >= {"Read", "Edit", "Bash"} and all(c["source"] == "cli" for c in calls)
    results = [json.loads(e["data"]) for e in entries if e["kind"] == "tool_result"]
    assert len(results) == len(calls) and any(r["output"] for r in results)
    assert [e["kind"] for e in entries if e["iteration"] == 1][0] == "prompt" and entries[-1]["kind"] == "outcome"

    # usage metered by the endpoint, one row per response under the server's request id (100 in, 20 out each)
    calls = query(org_home, "SELECT * FROM model_calls WHERE work_id='w1' ORDER BY iteration")
    assert [(c["iteration"], c["input_tokens"], c["output_tokens"]) for c in calls] == [(1, 100, 20)] * 3 + [(2, 100, 20)] * 4
    assert all(c["request_id"].startswith("req_scripted_") and c["model"] == "claude-sonnet-4-5" and c["cost_usd"] > 0
               for c in calls)

    # every request was a scripted step carrying the CLI's own tools, with the key added outside
    assert len(server.seen) == 7
    assert all(r["path"].split("?")[0] == "/v1/messages" and r["headers"]["x-api-key"] == REAL_KEY
               for r in server.seen)
    assert all({"Read", "Edit", "Bash"} <= {t["name"] for t in r["body"]["tools"]} for r in server.seen)
    served = [json.loads(line)["event"] for line in (tmp_path / "scripted.jsonl").read_text().splitlines()]
    assert served.count("step") == 7 and "error" not in served

    # nothing but the endpoint: all it forwarded reached the server, it refused nothing, no host port was reached
    ended = [e for e in logs if e["event"] == "cli ended"]
    assert [(e["requests"], e["refused"], e["exit_code"]) for e in ended] == [(3, 0, 0), (4, 0, 0)]
    assert not [e for e in logs if "refused" in e["event"]], logs
    with pytest.raises(BlockingIOError):
        decoy.accept()
    probe = ws / ".probe"
    assert (probe / "decoy").read_text().strip() == "refused"

    # the sandbox never held the key: not in any of its processes' environments, nor in what the CLI wrote
    environ = (probe / "environ").read_text()
    assert f"ANTHROPIC_API_KEY={PLACEHOLDER}" in environ and REAL_KEY not in environ
    assert "CLAUDECODE=1" in environ  # the CLI's own Bash tool was what ran the probe
    cli_home = org_home.run_dir / "cli" / INSTANCE / "w1" / "home"
    written = [p for p in cli_home.rglob("*") if p.is_file()]
    assert written and not [p for p in written if REAL_KEY.encode() in p.read_bytes()]
    # run as the sandbox's uid, without an address-space limit (node reserves huge virtual ranges)
    assert (probe / "uid").read_text().strip() == "65534"
    limit = next(ln for ln in (probe / "limits").read_text().splitlines() if ln.startswith("Max address space"))
    assert limit.split()[3:5] == ["unlimited", "unlimited"], limit


def act_once(backend, ws: Path, max_turns: int = 10):
    usages: list = []
    ctx = ActContext("w-1", 1, 1, ws, "SYSTEM PREFIX", "Iteration: 1\nFix add().", max_turns=max_turns)
    return backend.act(ctx, on_usage=usages.append, budget_left=lambda: None), usages


@needs_bwrap
def test_the_real_cli_stopped_by_max_turns_is_a_failed_act_with_its_usage(org_home, tmp_path, claude_cli, monkeypatch):
    ws = make_workspace(tmp_path)
    calc = str(ws / "calc.py")
    script = parse_script(json.dumps({"acts": [[tool("Read", file_path=calc)] * 4 + [{"text": "never reached"}]]}))
    with RecordingServer(script, tmp_path / "scripted.jsonl") as server:
        built = org_backend(org_home, server.base_url, claude_cli, monkeypatch)
        outcome, usages = act_once(built.backend, ws, max_turns=2)
    assert (outcome.status, outcome.error_code, outcome.stop_reason) == ("failed", "max_turns", "error_max_turns")
    assert len(server.seen) == 2 and sum(u.input_tokens for u in usages) == 200
    assert (ws / "calc.py").read_text() == BUGGY


@needs_bwrap
def test_a_script_that_runs_out_is_a_coded_model_error_naming_the_scripted_server(
        org_home, tmp_path, claude_cli, monkeypatch):
    """The scripted server answers a request past the script with a non-retryable 400; the CLI
    exits 1 with an error result, which ends the run rather than iterating on it."""
    ws = make_workspace(tmp_path)
    script = parse_script(json.dumps({"acts": [[tool("Read", file_path=str(ws / "calc.py"))]]}))
    with RecordingServer(script, tmp_path / "scripted.jsonl") as server:
        built = org_backend(org_home, server.base_url, claude_cli, monkeypatch)
        outcome, usages = act_once(built.backend, ws)
    assert (outcome.status, outcome.error_code) == ("model_error", "cli_error"), outcome
    assert "API Error: 400" in outcome.error and "script" in outcome.error
    assert len(server.seen) == 2 and [u.input_tokens for u in usages] == [100]  # the refused step bills nothing


@needs_bwrap
@pytest.mark.parametrize("behaviour", [None, server_error], ids=["no-retry", "retried-once"])
def test_a_server_error_ends_the_cli_non_zero_as_a_coded_model_error(
        org_home, tmp_path, claude_cli, monkeypatch, behaviour):
    """A 500 marked ``x-should-retry: false`` fails at once; a plain 500 is retried by the CLI
    itself (here the retry gets the non-retryable one)."""
    with FakeMessagesAPI() as api:
        if behaviour is not None:
            api.enqueue(behaviour())
        built = org_backend(org_home, api.base_url, claude_cli, monkeypatch)
        outcome, usages = act_once(built.backend, make_workspace(tmp_path))
    assert (outcome.status, outcome.error_code) == ("model_error", "cli_error"), outcome
    assert "API Error: 500" in outcome.error
    assert len(api.requests) == (1 if behaviour is None else 2)
    assert not usages  # an error response bills nothing


def _over_unix(socket_path: Path, method: str, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("sandbox", timeout=10)
    conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.sock.connect(str(socket_path))
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_the_endpoint_answers_a_warm_up_head_itself_and_still_refuses_other_paths():
    """Claude Code sends ``HEAD /`` to its base URL at start and ignores the answer."""
    with FakeMessagesAPI() as api, tempfile.TemporaryDirectory(prefix="ep-") as d, \
            ModelEndpoint(api.base_url, Path(d) / "m.sock", api_key=REAL_KEY) as endpoint:
        assert _over_unix(endpoint.socket_path, "HEAD", "/") == (200, b"")
        assert _over_unix(endpoint.socket_path, "GET", "/")[0] == 403
        assert _over_unix(endpoint.socket_path, "HEAD", "/admin") == (403, b"")
        assert (endpoint.warmups, endpoint.refused, endpoint.requests, len(api.requests)) == (1, 2, 0, 0)
