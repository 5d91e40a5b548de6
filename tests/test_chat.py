"""org chat: slash commands, free text with and without a model, live announcements."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.fake_messages_api import FakeMessagesAPI, text_turn, tool_use_turn


def chat(org_home, stdin: str, env_extra=None, timeout=60):
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")}
    env.update({"ORG_HOME": str(org_home.root), **(env_extra or {})})
    return subprocess.run([sys.executable, "-m", "scripts.cli.main", "chat"], input=stdin, capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_slash_commands_work_and_free_text_without_a_model_points_to_help(org_home):
    out = chat(org_home, "/help\n/status\nplease fix my tests\n/nonsense\n/show w-none\n/quit\n")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "slash commands only" in text and "/submit" in text
    assert "session: never started" in text
    assert "no chat model is configured" in text
    assert "error[unknown_command]" in text and "error[not_found]" in text


def test_free_text_goes_to_the_model_which_acts_only_through_org_operations(org_home):
    api = FakeMessagesAPI()
    url = api.start()
    try:
        api.enqueue(tool_use_turn("status", {}), text_turn("The org has no work items yet."))
        out = chat(org_home, "what is going on?\n/quit\n", {"ANTHROPIC_BASE_URL": url})
    finally:
        api.stop()
    assert "did: org status" in out.stdout and "The org has no work items yet." in out.stdout
    tool_result = api.requests[1]["messages"][-1]["content"][0]
    assert tool_result["type"] == "tool_result" and "session: never started" in tool_result["content"]
    assert {t["name"] for t in api.requests[0]["tools"]} >= {"submit", "status", "decide"}


def test_a_failing_chat_model_is_one_line_and_the_session_continues(org_home):
    api = FakeMessagesAPI()
    url = api.start()
    try:
        out = chat(org_home, "hello\n/status\n/quit\n", {"ANTHROPIC_BASE_URL": url})
    finally:
        api.stop()
    assert "error[model_error]" in out.stdout and "session:" in out.stdout


def test_announcements_appear_as_they_happen(org_home):
    from state_db.writer import StateWriter
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")}
    env["ORG_HOME"] = str(org_home.root)
    proc = subprocess.Popen([sys.executable, "-m", "scripts.cli.main", "chat"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert "loop-org chat" in proc.stdout.readline()
        w = StateWriter(org_home.db_path, "coordinator")
        with w.transaction() as tx:
            tx.journal("announce", "w1", {"text": "run w1 ended: goal_met", "upto": 1})
        w.close()
        deadline = time.monotonic() + 10
        seen = ""
        while time.monotonic() < deadline and "run w1 ended" not in seen:
            seen += proc.stdout.readline()
        assert "[coordinator] run w1 ended: goal_met" in seen
    finally:
        proc.stdin.write("/quit\n")
        proc.stdin.close()
        proc.wait(timeout=10)


def test_schedules_and_triggers_are_listed_by_a_slash_command_and_a_tool(org_home, tmp_path):
    from roles.operations import schedules as ops
    from roles.operations.submit import SubmitRequest
    from scripts.cli.chat import TOOLS
    from state_db.kernel import config as config_mod

    ws = tmp_path / "ws"
    ws.mkdir()
    req = SubmitRequest(goal="keep it green", workspace=str(ws), verify=["true"], backend="command")
    ops.add(org_home, config_mod.load(None), name="nightly", kind="cron", rule={"cron": "0 3 * * *"}, req=req, argv=[])
    out = chat(org_home, "/schedules\n/schedule pause nightly\n/trigger list\n/quit\n")
    assert out.returncode == 0, out.stderr
    lines = out.stdout
    assert "ORDER" in lines and "nightly" in lines and "cron 0 3 * * *" in lines and "active" in lines
    assert "schedule nightly: paused" in lines and "no triggers" in lines
    assert TOOLS["schedules"][2]({}) == ["status", "--orders"]
