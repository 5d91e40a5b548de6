"""``org skills export NAME --to DIR`` writes the Agent Skills layout, and the real Claude Code CLI
lists the exported skill when a project's ``.claude/skills/`` holds it.

The CLI runs offline against a local fake Messages API; the skills it loaded are listed in the
request it sends the model (name and description), which is what the test reads.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from skills.skillmd import parse
from tests.fake_messages_api import FakeMessagesAPI, text_turn
from tests.test_claude_code_real import pinned_cli
from tests.test_skills_cli import commands, org, proposed  # noqa: F401 - fixtures

NAME = "fix-imports"
DESCRIPTION = "Use when fix-imports is needed."


def _exported(capsys, to) -> str:
    assert org(capsys, "candidates", "approve", NAME)[0] == 0
    code, out, err = org(capsys, "skills", "export", NAME, "--to", str(to))
    assert code == 0, err
    return out


def test_export_writes_name_folder_with_skill_md_front_matter_name_and_description(capsys, proposed, tmp_path):
    out = _exported(capsys, tmp_path / "skills")
    target = tmp_path / "skills" / NAME / "SKILL.md"
    assert str(target) in out and ".claude/skills/" in out
    text = target.read_text()
    assert text.startswith(f"---\nname: {NAME}\ndescription: ")
    skill = parse(text)
    assert skill.name == target.parent.name == NAME and skill.description == DESCRIPTION
    assert "## When to use" in skill.body
    code, _, err = org(capsys, "skills", "export", "no-such-skill", "--to", str(tmp_path))
    assert code == 1 and err.startswith("error[skill_not_found]")


def test_the_real_claude_code_cli_lists_an_exported_skill_from_the_project(capsys, proposed, tmp_path):
    version, claude = pinned_cli()
    if not os.access(claude, os.X_OK):
        if os.environ.get("CI") == "true":
            pytest.fail(f"Claude Code {version} is not installed at {claude}")
        pytest.skip(f"Claude Code {version} is not installed at {claude} (scripts/test installs it)")
    project, home = tmp_path / "project", tmp_path / "home"
    home.mkdir()
    _exported(capsys, project / ".claude" / "skills")

    def ask() -> str:
        with FakeMessagesAPI() as fake:
            fake.enqueue(*[text_turn("ok")] * 4)
            env = {"PATH": os.environ["PATH"], "HOME": str(home), "ANTHROPIC_BASE_URL": fake.base_url,
                   "ANTHROPIC_API_KEY": "sk-test-offline", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                   "DISABLE_AUTOUPDATER": "1"}
            done = subprocess.run([str(claude), "-p", "which skills do you have?", "--output-format", "json"],
                                  cwd=project, env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr[-2000:]
            return "\n".join(json.dumps(r) for r in fake.requests)

    sent = ask()
    assert f"- {NAME}: {DESCRIPTION}" in sent, "the CLI did not list the exported skill to the model"
    (project / ".claude" / "skills" / NAME / "SKILL.md").unlink()
    assert f"- {NAME}:" not in ask()                # the listing comes from the exported folder
