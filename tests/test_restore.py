"""The user's working tree after a run: a run that ends without goal_met says what it left in the
workspace; `org revert ID` restores the baseline and `org apply ID [--iteration N]` a checkpoint,
each a journaled human write that refuses to overwrite changes made since — through the real CLI."""
from __future__ import annotations

import json

import pytest

from tests.support.loop import BUGGY, ScriptedActs, engine, make_workspace, submit
from tests.support.org import query
from tests.test_rough_edges import coded, org

pytestmark = pytest.mark.timeout(120)
ONE = "def add(a, b):\n    return a - b\n"
TWO = "def add(a, b):\n    return a * b\n"


def test_revert_and_apply_restore_the_run_and_refuse_to_overwrite_what_changed_since(org_home, tmp_path):
    ws = make_workspace(tmp_path)
    wid = submit(org_home, ws, caps={"max_iterations": 2})
    running = org(org_home, tmp_path, "revert", wid)
    assert running.returncode == 1 and coded(running.stderr) == "not_ended", running.stderr
    acts = [[{"write": {"calc.py": ONE}}], [{"write": {"calc.py": TWO, "notes.txt": "tried\n"}}]]
    assert engine(org_home, wid, ScriptedActs(acts)).run().reason == "max_iterations"
    assert (ws / "calc.py").read_text() == TWO

    shown = org(org_home, tmp_path, "show", wid).stdout
    assert "workspace: the run left 2 changed file(s)" in shown and "calc.py, notes.txt" in shown, shown
    assert f"'org revert {wid}'" in shown

    # someone edits the workspace after the run: neither command overwrites it
    (ws / "mine.txt").write_text("my own work\n")
    refused = org(org_home, tmp_path, "revert", wid)
    assert refused.returncode == 1 and coded(refused.stderr) == "workspace_changed", refused.stderr
    assert "mine.txt" in refused.stderr and (ws / "mine.txt").exists() and (ws / "calc.py").read_text() == TWO
    (ws / "mine.txt").unlink()

    done = org(org_home, tmp_path, "revert", wid, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["what"] == "baseline"
    assert (ws / "calc.py").read_text() == BUGGY and not (ws / "notes.txt").exists()
    assert "holds the baseline" in org(org_home, tmp_path, "show", wid).stdout

    applied = org(org_home, tmp_path, "apply", wid, "--iteration", "1")
    assert applied.returncode == 0, applied.stderr
    assert (ws / "calc.py").read_text() == ONE and "iteration 1" in applied.stdout
    (ws / "calc.py").write_text("edited by hand\n")
    again = org(org_home, tmp_path, "apply", wid)
    assert again.returncode == 1 and coded(again.stderr) == "workspace_changed" and "calc.py" in again.stderr
    assert (ws / "calc.py").read_text() == "edited by hand\n"
    missing = org(org_home, tmp_path, "apply", wid, "--iteration", "9")
    assert missing.returncode == 1 and coded(missing.stderr) == "no_checkpoint"

    events = query(org_home, "SELECT actor, data FROM events WHERE kind = 'work_items.workspace_set' ORDER BY id")
    assert [(e["actor"], json.loads(e["data"])["what"]) for e in events] == [("human", "baseline"),
                                                                             ("human", "iteration 1")]
