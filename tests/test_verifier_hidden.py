"""Held-out checks (``--verify-hidden``): tests outside the workspace, copied into each snapshot
only, never shown to the doer. Real pytest runs, in-process verifier; submit's refusals through
the submit operation."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from roles.workbench.sandbox import held_out as hidden
from roles.eval_agent.verifier import Verifier
from roles.operations.submit import SubmitError, SubmitRequest, check
from state_db.kernel.config import load_config
from state_db.queries import work as work_q
from state_db.vocab import Actor, StopReason
from state_db.writer import StateWriter
from tests.support.loop import commit_iteration, submit

pytestmark = pytest.mark.timeout(240)

CALC = "def mean(xs):\n    return sum(xs) / (len(xs) + 1)\n"
FIXED = "def mean(xs):\n    return sum(xs) / len(xs)\n"
SPECIAL_CASED = "def mean(xs):\n    return 1.5\n"        # passes the visible test only
VISIBLE = ("import os, sys\nsys.path.insert(0, os.getcwd())\nfrom calc import mean\n\n\n"
           "def test_mean():\n    assert mean([1, 2]) == 1.5\n")
HELD_OUT = ("import os, sys\nsys.path.insert(0, os.getcwd())\nfrom calc import mean\n\n\n"
            "def test_mean_of_evens_is_their_middle():\n    assert mean([2, 4, 6]) == 4  # SECRET-EXPECTATION\n")
PYTEST = f"{sys.executable} -m pytest -q -p no:cacheprovider"


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    ws = tmp_path / "ws"
    (ws / "tests").mkdir(parents=True)
    (ws / "calc.py").write_text(CALC)
    (ws / "tests" / "test_calc.py").write_text(VISIBLE)
    folder = tmp_path / "held-out"
    (folder / "tests").mkdir(parents=True)
    (folder / "tests" / "test_calc_more.py").write_text(HELD_OUT)
    return ws, folder


def _verify(org_home, ws, folder, change):
    submit(org_home, ws, work_id="w1", verify=(PYTEST,))
    if folder is not None:
        w = StateWriter(org_home.db_path, Actor.COORDINATOR)
        with w.transaction() as tx:
            tx.update("work_items", "w1", verify_hidden=str(folder))
        w.close()
    verifier = Verifier(org_home, StateWriter(org_home.db_path, Actor.EVAL_AGENT, "eval-agent"), timeout_s=120)
    pre = verifier.verify("w1", 0)
    change(ws)
    commit_iteration(org_home, ws, "w1")
    return pre, verifier.verify("w1", 1), work_q.item(verifier.writer.conn, "w1")


def test_a_special_cased_fix_fails_the_held_out_check_and_the_doer_sees_none_of_it(org_home, tmp_path):
    ws, folder = _setup(tmp_path)
    pre, v, work = _verify(org_home, ws, folder, lambda ws: (ws / "calc.py").write_text(SPECIAL_CASED))
    assert "tests.test_calc_more::test_mean_of_evens_is_their_middle" in pre.checks[0]["junit"]["ids"]
    assert v.outcome == "fail" and not v.goal_met and work.stop_reason is None
    shown = v.feedback + v.checks[0].output_tail
    assert "test_calc_more" not in shown and "evens" not in shown and "SECRET-EXPECTATION" not in shown
    assert not (ws / "tests" / "test_calc_more.py").exists()


def test_control_without_held_out_checks_the_special_cased_fix_reaches_goal_met(org_home, tmp_path):
    ws, _ = _setup(tmp_path)
    _, v, work = _verify(org_home, ws, None, lambda ws: (ws / "calc.py").write_text(SPECIAL_CASED))
    assert v.goal_met and work.stop_reason == StopReason.GOAL_MET


def test_an_honest_fix_passes_the_held_out_checks(org_home, tmp_path):
    ws, folder = _setup(tmp_path)
    _, v, work = _verify(org_home, ws, folder, lambda ws: (ws / "calc.py").write_text(FIXED))
    assert v.goal_met and v.checks[0].tests["passed"] == 2


def test_a_file_the_doer_puts_where_a_held_out_check_stands_is_replaced(org_home, tmp_path):
    ws, folder = _setup(tmp_path)

    def change(ws):
        (ws / "calc.py").write_text(SPECIAL_CASED)
        (ws / "tests" / "test_calc_more.py").write_text("def test_mean_of_evens_is_their_middle():\n    pass\n")
    _, v, work = _verify(org_home, ws, folder, change)
    assert v.outcome == "fail" and not v.goal_met


def test_a_held_out_folder_that_is_gone_is_could_not_verify_never_a_pass(org_home, tmp_path):
    ws, folder = _setup(tmp_path)

    def change(ws):
        (ws / "calc.py").write_text(FIXED)
        (folder / "tests" / "test_calc_more.py").unlink()
        (folder / "tests" / "test_calc_more.py").symlink_to("/etc/hostname")
    _, v, work = _verify(org_home, ws, folder, change)
    assert v.outcome == "error" and not v.goal_met and work.stop_reason == StopReason.VERIFY_UNRUNNABLE


def test_submit_refuses_a_held_out_folder_the_doer_could_see(org_home, tmp_path, monkeypatch):
    ws, folder = _setup(tmp_path)
    cfg = load_config(org_home)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-used")        # the backend check, before ours

    def req(path):
        return SubmitRequest(goal="g", workspace=str(ws), verify=[PYTEST], verify_hidden=str(path))
    inside = ws / "secret"
    inside.mkdir()
    with pytest.raises(SubmitError) as got:
        check(org_home, cfg, req(inside))
    assert got.value.code == "hidden_visible"
    tools = tmp_path / "tools"
    (tools / "bin" / "held").mkdir(parents=True)
    monkeypatch.setenv("PATH", f"{tools / 'bin'}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(SubmitError) as got:
        check(org_home, cfg, req(tools / "bin" / "held"))
    assert got.value.code == "hidden_visible" and "which the doer's sandbox shows" in got.value.message
    assert check(org_home, cfg, req(folder)).verify_hidden == str(folder.resolve())


def test_copy_into_replaces_links_on_the_way_and_refuses_links_in_the_folder(tmp_path):
    folder = tmp_path / "held"
    (folder / "tests").mkdir(parents=True)
    (folder / "tests" / "test_h.py").write_text("def test_h():\n    pass\n")
    snap = tmp_path / "snap"
    snap.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (snap / "tests").symlink_to(outside)                 # the doer's link where the folder stands
    assert hidden.copy_into(snap, str(folder)) == ["tests/test_h.py"]
    assert not (snap / "tests").is_symlink() and not any(outside.iterdir())
    assert {"test_h", "test_h.py", "tests/test_h.py"} <= hidden.names(str(folder))
    (folder / "tests" / "link.py").symlink_to("/etc/hostname")
    with pytest.raises(hidden.HiddenError):
        hidden.copy_into(snap, str(folder))


def test_verify_hidden_in_org_toml_is_every_submits_default_and_the_flag_overrides_it(org_home, tmp_path,
                                                                                    monkeypatch):
    from state_db.kernel.config import Config
    ws, folder = _setup(tmp_path)
    other = tmp_path / "other-held-out"
    other.mkdir()
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-used")
    cfg = Config({"verify": {"hidden": str(folder)}})
    plain = SubmitRequest(goal="g", workspace=str(ws), verify=[PYTEST])
    assert check(org_home, cfg, plain).verify_hidden == str(folder.resolve())
    flagged = SubmitRequest(goal="g", workspace=str(ws), verify=[PYTEST], verify_hidden=str(other))
    assert check(org_home, cfg, flagged).verify_hidden == str(other.resolve())
    assert check(org_home, Config({}), plain).verify_hidden == ""
