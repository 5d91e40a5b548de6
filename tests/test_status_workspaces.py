"""``org status`` leads with the runs, not transport internals (those behind ``--transport``);
every run list shows the run's workspace, so runs of one goal in two projects can be told apart;
a ``verify_unrunnable`` run in "needs you" can be dismissed (``org dismiss``, the watch's ``x``)."""
from __future__ import annotations

import json
import sqlite3

import pytest

import scripts.cli.main as cli
from scripts.cli.commands import watch
from state_db import views
from state_db.connection import connect
from state_db.ending import StopDecision, end_run
from state_db.vocab import Actor, StopReason
from tests.support.loop import submit

pytestmark = pytest.mark.timeout(60)


def org(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def two_projects(org_home, tmp_path, writer_for):
    """The same goal in two workspaces; w-a ended verify_unrunnable, w-b runs; transport counters."""
    for wid, name in (("w-a", "alpha"), ("w-b", "beta")):
        ws = tmp_path / name / "proj"
        ws.mkdir(parents=True)
        submit(org_home, ws, wid)
    with writer_for(Actor.COORDINATOR).transaction() as tx:
        end_run(tx, "w-a", StopDecision(StopReason.VERIFY_UNRUNNABLE, "verify command `pytset` cannot run"))
    raw = sqlite3.connect(org_home.db_path)
    with raw:
        raw.execute("INSERT INTO transport_counters (instance, name, value) VALUES ('coordinator', 'fell_back', 3)")
    raw.close()
    return tmp_path


def test_status_shows_each_runs_workspace_and_keeps_transport_counters_behind_a_flag(capsys, two_projects):
    code, out, _ = org(capsys, "status")
    assert code == 0 and "FELL_BACK" not in out and "INSTANCE" not in out
    header = next(line for line in out.splitlines() if line.startswith("WORK "))
    assert "WORKSPACE" in header.split()
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("w-")}
    assert str(two_projects / "alpha" / "proj") in rows["w-a"] and str(two_projects / "beta" / "proj") in rows["w-b"]
    code, out, _ = org(capsys, "status", "--transport")
    assert code == 0 and "FELL_BACK" in out and "coordinator" in out


def test_an_unrunnable_run_leaves_needs_you_once_dismissed_and_its_record_stays(capsys, org_home, two_projects):
    conn = connect(org_home.db_path, readonly=True)
    try:
        assert [r["id"] for r in views.org_view(conn)["needs_you"]["unrunnable"]] == ["w-a"]
    finally:
        conn.close()
    code, _, err = org(capsys, "dismiss", "w-b")
    assert code == 1 and err.startswith("error[not_ended]: w-b has not ended") and "org cancel w-b" in err
    code, out, _ = org(capsys, "dismiss", "w-a")
    assert code == 0 and out.startswith("w-a (verify_unrunnable): dismissed by ")
    code, out, _ = org(capsys, "dismiss", "w-a")
    assert code == 0 and "dismissed already" in out
    code, out, _ = org(capsys, "status", "--json")
    st = json.loads(out)
    assert st["needs_you"]["unrunnable"] == []
    assert [w["stop_reason"] for w in st["work"]["recent_ended"] if w["id"] == "w-a"] == ["verify_unrunnable"]
    code, _, err = org(capsys, "dismiss", "w-none")
    assert code == 1 and err.startswith("error[not_found]")


def test_the_watch_dismisses_the_selected_unrunnable_run_with_x_and_shows_workspaces(org_home, two_projects):
    conn = connect(org_home.db_path, readonly=True)
    try:
        screen = watch.Screen()
        lines = [text for text, _ in watch.overview_lines(views.org_view(conn), screen)]
        assert any("w-b" in ln and str(two_projects / "beta" / "proj") in ln for ln in lines), lines
        assert any("w-a" in ln and str(two_projects / "alpha" / "proj") in ln for ln in lines), lines
        assert screen.items[0] == ("unrunnable", "w-a")
        assert watch.handle(b"x", screen, conn, org_home) and screen.message == "w-a: dismissed"
        needs = views.org_view(conn)["needs_you"]
        assert needs["unrunnable"] == []
        watch.overview_lines(views.org_view(conn), screen)
        screen.cursor = 0
        assert watch.handle(b"x", screen, conn, org_home)
        assert screen.message.startswith("select a verify_unrunnable run")
    finally:
        conn.close()
