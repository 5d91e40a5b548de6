"""A verify command that names a program that does not exist: the hint names the nearest one that
does (a typo in a path, on PATH), and never offers a name that could carry terminal controls."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from roles.eval_agent.nearest import nearest, program_of
from state_db.connection import read_rows
from transport.kinds import Kind
from tests.support.loop import submit
from tests.test_eval_agent_inprocess import eval_agent  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(60)


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_the_nearest_program_by_path_by_folder_and_on_path(tmp_path):
    ws = tmp_path / "ws"
    executable(ws / ".venv" / "bin" / "pytest")
    executable(ws / ".venv" / "bin" / "python")
    tools = tmp_path / "tools"
    executable(tools / "ruff-check")
    assert nearest(".venv/bin/pytset", ws) == ".venv/bin/pytest"
    assert nearest("./.venv/bni/pytest", ws) == "./.venv/bin/pytest"          # a folder's typo too
    assert nearest(str(ws / ".venv/bin/pytset"), Path("/nowhere")) == str(ws / ".venv/bin/pytest")
    assert nearest("ruff-chekc", ws, path=str(tools)) == "ruff-check"
    assert nearest(".venv/bin/pytest", ws) is None                             # it exists: nothing to say
    assert nearest("ruff-check", ws, path=str(tools)) is None
    assert nearest(".venv/bin/zzzzzz", ws) is None                             # nothing near
    assert program_of("PYTHONPATH=src .venv/bin/pytset -q") == ".venv/bin/pytset"


def test_a_name_with_controls_or_spaces_is_never_offered(tmp_path):
    ws = tmp_path / "ws"
    executable(ws / "bin" / "pytest\x1b[2J")
    executable(ws / "bin" / "pytest x")
    assert nearest("bin/pytset", ws) is None


def test_an_unrunnable_verify_command_with_a_typo_names_the_nearest_executable(org_home, eval_agent, tmp_path):  # noqa: F811
    proc, stub = eval_agent
    ws = tmp_path / "ws"
    executable(ws / ".venv" / "bin" / "pytest")
    (ws / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    submit(org_home, ws, "w1", verify=(".venv/bin/pytset -q",))
    proc.reconcile()
    stub.wait_for(Kind.WAKE, recipient="coordinator", timeout_s=30)
    row = read_rows(org_home.db_path, "SELECT w.stop_reason, w.stop_detail, p.detail AS end_detail "
                                      "FROM work_items w JOIN preflights p ON p.work_id = w.id WHERE w.id = 'w1'")[0]
    assert row["stop_reason"] == "verify_unrunnable", row
    assert "the nearest is .venv/bin/pytest" in row["end_detail"], row
    assert "--verify '.venv/bin/pytest -q'" in row["end_detail"], row
    assert "make the command's program reachable" not in row["end_detail"], row
    assert "the nearest is .venv/bin/pytest" in row["stop_detail"], row
    assert os.path.exists(ws / ".venv" / "bin" / "pytest")
