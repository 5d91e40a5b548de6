"""The plugin's skills name the tools the real Claude Code CLI offers, in each way the README
documents to load it (each ``claude …`` line of its "Claude Code and MCP" section): the CLI runs
offline against a server that records what the model is offered — the tools and the skills."""
from __future__ import annotations

import json
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path

import pytest

from roles.workbench.scripted.server import MessagesServer, message_body, sse_events
from scripts.cli.mcp_tools import TOOLS
from skills.skillmd import parse
from tests.test_claude_code_real import claude_cli  # noqa: F401 - the fixture: the pinned CLI, or a skip

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "claude-plugin"
NAMED = re.compile(r"\bmcp__[A-Za-z0-9_-]+?__[a-z_]+\b")

pytestmark = pytest.mark.timeout(300)


def documented_ways() -> list[list[str]]:
    """The arguments of each ``claude`` command line in the README's Claude Code section."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Claude Code and MCP")
    section = readme[start:readme.index("\n## ", start + 1)]
    lines = [ln.split("  #")[0].strip() for ln in section.splitlines() if ln.startswith("claude ")]
    return [shlex.split(ln)[1:] for ln in lines]


def skill_texts() -> dict[str, str]:
    return {p.parent.name: p.read_text() for p in sorted((PLUGIN / "skills").glob("*/SKILL.md"))}


class Offered(MessagesServer):
    """Answers every request with one short text turn and keeps each request's body."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[dict] = []

    def respond(self, exchange) -> None:
        if isinstance(exchange.body, dict):
            self.bodies.append(exchange.body)
        message = message_body(model="offered", content=[{"type": "text", "text": "ok"}], stop_reason="end_turn",
                               usage={"input_tokens": 1, "output_tokens": 1})
        if isinstance(exchange.body, dict) and exchange.body.get("stream"):
            exchange.sse(sse_events(message))
        else:
            exchange.json(200, message)


def offered(cli: Path, args: list[str], tmp: Path) -> tuple[set[str], str]:
    """Run the CLI once with ``args`` (paths relative to the checkout, as the README writes them);
    return the MCP tool names offered to the model and every request's text (where skills show)."""
    import subprocess

    bin_dir = tmp / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "org").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m scripts.cli.main "$@"\n')
    (bin_dir / "org").chmod(0o755)
    home = tmp / "org"
    home.mkdir()
    (home / "org.toml").write_text(f"[mcp]\ntools = {json.dumps([t.name for t in TOOLS] + ['review'])}\n")
    cli_home = Path(tempfile.mkdtemp(prefix="cc-", dir=tmp))
    with Offered() as server:
        out = subprocess.run([str(cli), "-p", "What can you do with loop-org?", "--output-format", "json", *args],
                             capture_output=True, text=True, timeout=180, cwd=str(ROOT),
                             env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(cli_home),
                                  "CLAUDE_CONFIG_DIR": str(cli_home / ".claude"), "ORG_HOME": str(home),
                                  "PYTHONPATH": str(ROOT), "ANTHROPIC_BASE_URL": server.base_url,
                                  "ANTHROPIC_API_KEY": "sk-ant-fake-key-for-offered",
                                  "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"})
        bodies = list(server.bodies)
    assert out.returncode == 0, (args, out.stdout[-2000:], out.stderr[-2000:])
    tools = {t["name"] for b in bodies for t in b.get("tools", []) if t["name"].startswith("mcp__")}
    return tools, json.dumps(bodies)


def test_the_readme_documents_the_plugin_and_the_server_alone():
    assert [w[0] for w in documented_ways()] == ["--plugin-dir", "--mcp-config"]


def test_every_tool_a_plugin_skill_names_is_offered_in_each_documented_way(claude_cli, tmp_path):  # noqa: F811
    skills = skill_texts()
    named = {name for text in skills.values() for name in NAMED.findall(text)}
    descriptions = [parse(text).description for text in skills.values()]
    assert named, "the skills name no tool"
    loaded_somewhere = False
    for k, args in enumerate(documented_ways()):
        tools, seen = offered(claude_cli, args, tmp_path / f"way-{k}")
        assert len(tools) == len(TOOLS), (args, sorted(tools))       # the org's server answered, every tool
        prefix = os.path.commonprefix(sorted(tools))
        prefix = prefix[:prefix.rindex("__") + 2]
        assert {t.removeprefix(prefix) for t in tools} == {t.name for t in TOOLS}, (args, prefix)
        if all(json.dumps(d)[1:-1] in seen for d in descriptions):   # this way loads the skills
            loaded_somewhere = True
            assert named <= tools, (args, sorted(named - tools))
        for text in skills.values():                                 # a reader of either way finds its names
            assert f"`{prefix}NAME`" in text or prefix in {n[:len(prefix)] for n in NAMED.findall(text)}, args
    assert loaded_somewhere, "no documented way loads the plugin's skills"
