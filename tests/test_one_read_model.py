"""Every view shows the same numbers for a run: the narrated end (the demo's, org watch's and
chat's line), org status, org show and its JSON (the MCP tool and the dashboard read the same
dict) all take a run's tokens and cost from one read model (state_db.views.run_view)."""
from __future__ import annotations

import json
import re

import pytest

import scripts.cli.main as cli
from roles.operations.narrate import line_for
from state_db.connection import connect
from state_db.queries.events import after
from tests.support.loop import ScriptedActs, engine, make_workspace, submit

pytestmark = pytest.mark.timeout(120)


def run_cli(capsys, home, *argv) -> str:
    capsys.readouterr()
    assert cli.main(["--home", str(home.root), *argv]) == 0
    return capsys.readouterr().out


def test_the_narrated_end_status_and_show_give_the_same_tokens_and_cost(org_home, tmp_path, capsys):
    ws = make_workspace(tmp_path)
    wid = submit(org_home, ws, work_id="w-same", caps={"max_iterations": 2})
    # cache reads count in the total and the cost, not in the token budget: the views must not mix them
    backend = ScriptedActs([[{}, {}]], tokens=(100, 20), cache=(30, 500), cost=0.002)
    assert engine(org_home, wid, backend).run().reason == "max_iterations"

    conn = connect(org_home.db_path, readonly=True)
    try:
        ended = [e for e in after(conn, 0) if e.kind == "work_items.ended" and e.subject == wid]
        narrated = line_for(conn, ended[-1])
    finally:
        conn.close()
    budget_tokens, total, cost = 2 * 2 * (100 + 20 + 30), 2 * 2 * (100 + 20 + 30 + 500), 2 * 2 * 0.002
    assert f"{budget_tokens} budget tokens ({total} in all), ${cost:.4f}" in narrated, narrated

    st = json.loads(run_cli(capsys, org_home, "status", "--json"))
    run = next(r for r in st["runs"]["recent_ended"] if r["id"] == wid)
    assert (run["tokens"]["used"], run["tokens"]["total"], run["cost_usd"]["used"]) == (budget_tokens, total, cost)
    status_row = next(line for line in run_cli(capsys, org_home, "status").splitlines() if line.startswith(wid))
    assert f" {budget_tokens} " in f" {status_row} " and f"${cost:.4f}" in status_row, status_row

    shown = json.loads(run_cli(capsys, org_home, "show", wid, "--json"))
    assert (shown["run"]["tokens"]["used"], shown["run"]["cost_usd"]["used"]) == (budget_tokens, cost)
    text = run_cli(capsys, org_home, "show", wid)
    assert f"used: {budget_tokens} budget tokens, ${cost:.4f}" in text, text
