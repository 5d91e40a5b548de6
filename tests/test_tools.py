"""Workspace tools: path confinement, exact edits, bounded reads, searches and commands."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from roles.loop_agent.commands import SubprocessRunner
from roles.loop_agent.tools import ToolLimits, WorkspaceTools, summarize_call


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("x = 1\ny = 2\nx = 1\n")
    (root / "notes.txt").write_text("".join(f"line {n}\n" for n in range(1, 51)))
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("top secret\n")
    return root


@pytest.fixture
def tools(ws: Path) -> WorkspaceTools:
    return WorkspaceTools(ws, SubprocessRunner(), ToolLimits(command_timeout_s=5, command_max_output_bytes=2000,
                                                             search_max_results=5, list_max_entries=50))


ESCAPES = [("../outside/secret.txt", "path_escape"), ("src/../../outside/secret.txt", "path_escape"),
           ("/etc/passwd", "path_absolute"), ("~/x", "path_absolute"),
           ("link_dir/secret.txt", "path_escape"), ("link_file", "path_escape")]


@pytest.fixture
def with_symlinks_out(ws: Path) -> Path:
    (ws / "link_dir").symlink_to(ws.parent / "outside", target_is_directory=True)
    (ws / "link_file").symlink_to(ws.parent / "outside" / "secret.txt")
    return ws


@pytest.mark.parametrize("path, code", ESCAPES)
def test_file_tools_refuse_paths_leading_out_of_the_workspace(tools, with_symlinks_out, path, code):
    calls = [("read_file", {"path": path}), ("write_file", {"path": path, "content": "pwned"}),
             ("edit_file", {"path": path, "old_string": "top", "new_string": "pwned"}),
             ("list_files", {"path": path}), ("search_files", {"pattern": "secret", "path": path})]
    for name, args in calls:
        result = tools.call(name, args)
        assert result.is_error and result.code == code, (name, result)
        assert "top secret" not in result.content
    assert (with_symlinks_out.parent / "outside" / "secret.txt").read_text() == "top secret\n"


def test_search_and_list_do_not_follow_symlinks_out(tools, with_symlinks_out):
    assert "top secret" not in tools.call("search_files", {"pattern": "top secret"}).content
    listing = tools.call("list_files", {"recursive": True}).content
    assert "link_dir@" in listing and "secret.txt" not in listing


def test_symlink_inside_the_workspace_is_allowed(tools, ws):
    (ws / "alias.py").symlink_to(ws / "src" / "app.py")
    assert "x = 1" in tools.call("read_file", {"path": "alias.py"}).content


def test_edit_replaces_an_exact_unique_string(tools, ws):
    result = tools.call("edit_file", {"path": "src/app.py", "old_string": "y = 2", "new_string": "y = 3"})
    assert not result.is_error
    assert (ws / "src" / "app.py").read_text() == "x = 1\ny = 3\nx = 1\n"


def test_edit_refuses_a_string_that_is_not_unique_or_absent(tools, ws):
    twice = tools.call("edit_file", {"path": "src/app.py", "old_string": "x = 1", "new_string": "x = 9"})
    assert (twice.is_error, twice.code) == (True, "edit_not_unique") and "2 times" in twice.content
    absent = tools.call("edit_file", {"path": "src/app.py", "old_string": "z = 0", "new_string": "z = 1"})
    assert (absent.is_error, absent.code) == (True, "edit_no_match")
    assert (ws / "src" / "app.py").read_text() == "x = 1\ny = 2\nx = 1\n"


def test_read_is_ranged_and_numbered(tools):
    result = tools.call("read_file", {"path": "notes.txt", "offset": 10, "limit": 3})
    lines = result.content.splitlines()
    assert [line.split("\t")[1] for line in lines[:3]] == ["line 10", "line 11", "line 12"]
    assert lines[0].strip().startswith("10")
    assert "lines 10-12 of 50" in lines[-1] and "offset=13" in lines[-1]


def test_read_limit_is_capped(ws):
    tools = WorkspaceTools(ws, limits=ToolLimits(read_max_lines=4))
    content = tools.call("read_file", {"path": "notes.txt", "limit": 1000}).content
    assert len([line for line in content.splitlines() if "\t" in line]) == 4


def test_write_creates_parent_directories_and_bounds_size(ws):
    tools = WorkspaceTools(ws, limits=ToolLimits(write_max_bytes=10))
    assert not tools.call("write_file", {"path": "new/dir/f.txt", "content": "short"}).is_error
    assert (ws / "new" / "dir" / "f.txt").read_text() == "short"
    big = tools.call("write_file", {"path": "big.txt", "content": "x" * 11})
    assert big.code == "too_large" and not (ws / "big.txt").exists()


def test_search_finds_substrings_and_regexes_with_bounded_results(tools):
    assert tools.call("search_files", {"pattern": "y = 2"}).content == "src/app.py:2: y = 2"
    regex = tools.call("search_files", {"pattern": r"^line 4\d$", "regex": True, "path": "notes.txt"}).content
    assert regex.splitlines()[0] == "notes.txt:40: line 40"
    assert "results stop at 5" in regex and len(regex.splitlines()) == 6
    assert tools.call("search_files", {"pattern": "(", "regex": True}).code == "bad_regex"


@pytest.mark.parametrize("name, args, field", [
    ("read_file", {}, "path"), ("read_file", {"path": 3}, "path"),
    ("edit_file", {"path": "src/app.py", "old_string": "x"}, "new_string"),
    ("read_file", {"path": "notes.txt", "offset": "2"}, "offset"), ("list_files", {"recursive": "yes"}, "recursive")])
def test_malformed_input_is_a_tool_error_naming_the_field(tools, name, args, field):
    result = tools.call(name, args)
    assert (result.is_error, result.code) == (True, "bad_tool_input") and field in result.content


def test_non_object_input_and_unknown_tool_are_tool_errors(tools):
    assert tools.call("read_file", ["notes.txt"]).code == "bad_tool_input"
    assert tools.call("rm_rf", {}).code == "unknown_tool"
    assert tools.call(None, None).code == "unknown_tool"


def test_command_runs_in_the_workspace_and_reports_failure(tools, ws):
    ok = tools.call("run_command", {"command": "pwd && ls src"})
    assert not ok.is_error and ok.content.startswith("exit code 0") and str(ws) in ok.content and "app.py" in ok.content
    failed = tools.call("run_command", {"command": "echo oops >&2; exit 3"})
    assert (failed.is_error, failed.code) == (True, "command_failed")
    assert failed.content.startswith("exit code 3") and "oops" in failed.content


def test_command_output_is_bounded_keeping_head_and_tail(tools):
    result = tools.call("run_command", {"command": "echo FIRST; head -c 100000 /dev/zero | tr '\\0' x; echo; echo LAST"})
    assert "output truncated" in result.content
    assert len(result.content.encode()) < 2000 + 200
    assert "FIRST" in result.content and "LAST" in result.content


def test_command_time_bound_kills_the_process_group(tools, ws):
    started = time.monotonic()
    result = tools.call("run_command", {"command": "sleep 30 & echo $! > child.pid; sleep 30", "timeout_s": 0.3})
    assert time.monotonic() - started < 5
    assert (result.is_error, result.code) == (True, "command_timeout") and "timed out after 0.3s" in result.content
    child = int((ws / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(child), "the background child must die with its group"


def test_command_timeout_is_capped_by_the_limit(ws):
    tools = WorkspaceTools(ws, limits=ToolLimits(command_timeout_s=0.2))
    started = time.monotonic()
    assert tools.call("run_command", {"command": "sleep 10", "timeout_s": 1000}).code == "command_timeout"
    assert time.monotonic() - started < 5


def test_commands_do_not_inherit_secrets(ws):
    runner = SubprocessRunner(env={"PATH": os.environ["PATH"], "ANTHROPIC_API_KEY": "k1", "GITHUB_TOKEN": "k2",
                                   "HARMLESS": "visible"})
    result = runner.run("env", ws, 5, 10_000)
    assert "HARMLESS=visible" in result.output and "k1" not in result.output and "k2" not in result.output


def test_summarize_call_truncates_long_inputs(tools):
    result = tools.call("write_file", {"path": "f.txt", "content": "y" * 1000})
    record = summarize_call("write_file", {"path": "f.txt", "content": "y" * 1000}, result)
    assert record["ok"] is True and len(record["input"]["content"]) < 250


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie left for init to reap counts as dead
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
