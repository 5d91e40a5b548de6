"""``org mcp`` with real clients (issue 22 proof): the official ``mcp`` SDK client over stdio
against a running org, and the real Claude Code CLI loading the server with ``--mcp-config``."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from roles.workbench.scripted.script import parse_script
from roles.workbench.scripted.server import ScriptedServer
from tests.support.org import ONE_AGENT, query, running_org, wait_for
from tests.test_claude_code_real import claude_cli  # noqa: F401 - the fixture: the pinned CLI, or a skip

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "scripts" / "demo"
READS = ["status", "show", "diff", "decisions", "candidates", "skills"]


def mcp_config(*extra: str) -> str:
    return ONE_AGENT + f"[mcp]\ntools = {json.dumps(READS + list(extra))}\n"


@pytest.fixture(scope="module")
def org():
    with running_org(mcp_config("submit")) as home:
        yield home


def workspace(home, name: str) -> Path:
    ws = home.root.parent / name
    shutil.copytree(DEMO / "project", ws)
    return ws


def server_params(home) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "scripts.cli.main", "mcp", "--poll", "0.1"],
                                 env={**os.environ, "ORG_HOME": str(home.root)}, cwd=str(ROOT))


async def client(home, body, name="e2e-client"):
    """Run ``body(session, updates)`` against a fresh ``org mcp``; ``updates`` receives the URIs of
    ``notifications/resources/updated``."""
    send, updates = anyio.create_memory_object_stream(100)

    async def on_message(message) -> None:
        if isinstance(message, types.ServerNotification) and isinstance(message.root, types.ResourceUpdatedNotification):
            await send.send(str(message.root.params.uri))

    async with stdio_client(server_params(home)) as (read, write), ClientSession(
            read, write, client_info=types.Implementation(name=name, version="1"), message_handler=on_message) as s:
        await s.initialize()
        return await body(s, updates)


async def follow(session, updates, wid: str, until, timeout=40.0) -> dict:
    """Read org://runs/WID at each update notification until ``until(run)``; fail with the last seen."""
    seen = None
    with anyio.move_on_after(timeout):
        while True:
            res = await session.read_resource(f"org://runs/{wid}")
            seen = json.loads(res.contents[0].text)
            if until(seen):
                return seen
            uri = await updates.receive()
            while uri != f"org://runs/{wid}":
                uri = await updates.receive()
    raise AssertionError(f"{wid}: not there after {timeout}s; last seen: {seen and seen['status']}")


def data(result: types.CallToolResult) -> dict:
    return result.structuredContent


def test_an_sdk_client_submits_follows_to_goal_met_by_notifications_and_is_refused_decide(org):
    ws = workspace(org, "ws-sdk")

    async def body(s, updates):
        tools = {t.name: t for t in (await s.list_tools()).tools}
        assert set(tools) == {"status", "show", "diff", "decisions", "candidates", "skills", "submit"}
        assert tools["submit"].inputSchema["required"] == ["goal", "workspace", "verify"]
        assert "org://status" in {str(r.uri) for r in (await s.list_resources()).resources}
        args = {"goal": "make word_count right", "workspace": str(ws), "verify": ["python3 -m unittest -q"],
                "backend": f"scripted:{DEMO / 'script.json'}", "max_iterations": 5, "idempotency_key": "mcp-1"}
        first = data(await s.call_tool("submit", args))
        again = data(await s.call_tool("submit", args))
        assert again["id"] == first["id"] and again["replayed"] is True
        await s.subscribe_resource(f"org://runs/{first['id']}")
        done = await follow(s, updates, first["id"], lambda r: r["status"] == "ended")
        assert done["stop_reason"] == "goal_met" and [i["n"] for i in done["iterations_detail"]] == [1, 2]
        patch = data(await s.call_tool("diff", {"id": first["id"]}))["patch"]
        transcript = json.loads((await s.read_resource(f"org://runs/{first['id']}/transcript")).contents[0].text)
        cost = json.loads((await s.read_resource("org://cost")).contents[0].text)
        assert [a["iteration"] for a in transcript["attempts"]] == [1, 2]
        calls = [e["data"] for a in transcript["attempts"] for e in a["entries"] if e["kind"] == "tool_call"]
        assert calls and transcript["attempts"][-1]["verdict"]["outcome"] == "pass"
        spent = {r["key"]: r for r in cost["item"]["rows"]}[first["id"]]
        assert spent["calls"] >= sum(len(a["usage"]) for a in transcript["attempts"]) > 0 and spent["tokens"] > 0
        refused = await s.call_tool("decide", {"id": "d-x", "verdict": "approve"})
        missing = await s.call_tool("show", {"id": "w-nope"})
        return first, patch, refused, missing

    first, patch, refused, missing = anyio.run(client, org, body)
    assert "+    return len(text.split())" in patch
    assert refused.isError and data(refused)["error"]["code"] == "tool_disabled"
    assert "add \"decide\" to tools in [mcp]" in refused.content[0].text
    assert missing.isError and missing.content[0].text.startswith("error[not_found]: no work item w-nope")
    row = query(org, "SELECT created_by FROM work_items WHERE id=?", (first["id"],))[0]
    assert row["created_by"].endswith(" via mcp:e2e-client")
    events = query(org, "SELECT instance FROM events WHERE kind='work_items.created' AND subject=?", (first["id"],))
    assert [e["instance"] for e in events] == ["mcp:e2e-client"]


def test_a_subscribed_transcript_is_notified_as_the_act_goes_not_only_when_it_commits(org, tmp_path):
    from tests.e2e.dashboard_driver import slow_demo_script
    ws = workspace(org, "ws-transcript")
    script = slow_demo_script(tmp_path, delay_s=0.5, reads=4)

    async def body(s, updates):
        args = {"goal": "make word_count right", "workspace": str(ws), "verify": ["python3 -m unittest -q"],
                "backend": f"scripted:{script}", "max_iterations": 5, "idempotency_key": "mcp-transcript"}
        wid = data(await s.call_tool("submit", args))["id"]
        uri = f"org://runs/{wid}/transcript"
        await s.subscribe_resource(uri)
        seen = []
        with anyio.move_on_after(40):
            while True:
                if await updates.receive() != uri:
                    continue
                attempts = json.loads((await s.read_resource(uri)).contents[0].text)["attempts"]
                first = attempts[0] if attempts else None
                seen.append((len(first["entries"]) if first else 0, first["outcome"] if first else None))
                if first and first["outcome"] is not None:
                    return seen
        raise AssertionError(f"the first act never ended; seen {seen}")

    seen = anyio.run(client, org, body)
    growing = {n for n, outcome in seen if outcome is None and n}
    assert len(growing) >= 2, seen          # read while the first act was under way, more each time


def test_an_sdk_client_answers_a_decision_once_decide_is_enabled(org, tmp_path):
    org.config_path.write_text(mcp_config("submit", "decide"))
    script = tmp_path / "gate.json"
    demo = json.loads((DEMO / "script.json").read_text())
    script.write_text(json.dumps({"version": 1, "acts": [
        [{"tool_uses": [{"name": "request_action", "input": {
            "kind": "network", "command": "echo fetched >> fetched.txt", "reason": "needs the upstream file"}}]},
         {"text": "Asked a human for network access."}], demo["acts"][1]]}))
    ws = workspace(org, "ws-gate")

    async def body(s, updates):
        wid = data(await s.call_tool("submit", {
            "goal": "make word_count right", "workspace": str(ws), "verify": ["python3 -m unittest -q"],
            "backend": f"scripted:{script}", "max_iterations": 5}))["id"]
        await s.subscribe_resource(f"org://runs/{wid}")
        parked = await follow(s, updates, wid, lambda r: r["status"] == "paused" and r["run"]["pending_decisions"])
        pending = data(await s.call_tool("decisions", {}))["items"]
        assert [d["id"] for d in pending] == parked["run"]["pending_decisions"]
        decided = data(await s.call_tool("decide", {"id": pending[0]["id"], "verdict": "approve",
                                                     "idempotency_key": "dec-1"}))
        done = await follow(s, updates, wid, lambda r: r["status"] == "ended")
        return pending[0]["id"], decided, done

    did, decided, done = anyio.run(client, org, body)
    assert decided["status"] == "approved" and done["status"] == "ended"
    assert (ws / "fetched.txt").read_text() == "fetched\n"
    row = query(org, "SELECT status, decided_by FROM decisions WHERE id=?", (did,))[0]
    assert row["status"] == "executed" and row["decided_by"].endswith(" via mcp:e2e-client")


def test_the_plugin_skills_are_what_the_skill_md_writer_writes(tmp_path):
    sys.path.insert(0, str(ROOT / "claude-plugin"))
    try:
        import generate_skills
    finally:
        sys.path.remove(str(ROOT / "claude-plugin"))
    for path in generate_skills.main(tmp_path):
        committed = ROOT / "claude-plugin" / "skills" / path.parent.name / "SKILL.md"
        assert committed.read_text() == path.read_text(), f"run python claude-plugin/generate_skills.py ({committed})"
    plugin = json.loads((ROOT / "claude-plugin" / ".claude-plugin" / "plugin.json").read_text())
    servers = json.loads((ROOT / "claude-plugin" / ".mcp.json").read_text())["mcpServers"]
    assert plugin["name"] == "loop-org" and servers["org"]["args"] == ["mcp"]


def test_claude_code_submits_and_reads_status_through_the_mcp_tools(claude_cli, tmp_path):  # noqa: F811
    """The scripted model calls mcp__org__submit then mcp__org__status; the CLI runs them on ``org mcp``."""
    with running_org(mcp_config("submit")) as home:
        ws = workspace(home, "ws-cc")
        goal = {"goal": "make word_count right", "workspace": str(ws), "verify": ["python3 -m unittest -q"],
                "backend": f"scripted:{DEMO / 'script.json'}", "max_iterations": 5, "wait_s": 0}
        script = parse_script(json.dumps({"acts": [[
            {"tool_uses": [{"name": "mcp__org__submit", "input": goal}]},
            {"tool_uses": [{"name": "mcp__org__status", "input": {}}]},
            {"text": "Submitted to loop-org."}]]}))
        config = tmp_path / "mcp.json"
        config.write_text(json.dumps({"mcpServers": {"org": {
            "command": sys.executable, "args": ["-m", "scripts.cli.main", "mcp"],
            "env": {"ORG_HOME": str(home.root), "PYTHONPATH": str(ROOT)}}}}))
        cli_home = Path(tempfile.mkdtemp(prefix="cc-", dir=tmp_path))
        with ScriptedServer(script, tmp_path / "scripted.jsonl") as server:
            out = subprocess.run(
                [str(claude_cli), "-p", "Iteration: 1\nHand the word_count fix to loop-org.", "--output-format", "json",
                 "--mcp-config", str(config), "--strict-mcp-config",
                 "--allowedTools", "mcp__org__submit,mcp__org__status", "--max-turns", "5"],
                capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                env={"PATH": os.environ["PATH"], "HOME": str(cli_home), "CLAUDE_CONFIG_DIR": str(cli_home / ".claude"),
                     "ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": "sk-ant-fake-key-for-scripted",
                     "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"})
        assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-2000:])
        result = json.loads(out.stdout)
        assert result["is_error"] is False and result["result"] == "Submitted to loop-org."
        items = wait_for(lambda: query(home, "SELECT id, created_by FROM work_items"), what="the submitted run")
        assert len(items) == 1 and items[0]["created_by"].endswith(" via mcp:claude-code"), items
        steps = [json.loads(line) for line in (tmp_path / "scripted.jsonl").read_text().splitlines()]
        assert [s["event"] for s in steps].count("step") == 3 and "error" not in [s["event"] for s in steps]


@pytest.mark.timeout(60)
def test_the_server_reports_loop_orgs_version_not_the_sdks(org_home):
    """serverInfo carries what ``org --version`` prints."""
    from scripts.cli.version import version

    async def initialize():
        async with stdio_client(server_params(org_home)) as (read, write), ClientSession(read, write) as s:
            return await s.initialize()

    info = anyio.run(initialize).serverInfo
    printed = subprocess.run([sys.executable, "-m", "scripts.cli.main", "--version"], capture_output=True, text=True,
                             cwd=ROOT, timeout=30, env={**os.environ, "ORG_HOME": str(org_home.root)}).stdout
    assert info.name == "loop-org" and info.version == version() and info.version in printed, (info, printed)
