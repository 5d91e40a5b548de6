"""Small untruths a newcomer met, each checked where it is made: counts agree with their noun
("1 iteration", never "1 iterations") in stop details, announcements and the chat's narration;
``org doctor``'s private /tmp names the caches that really land there, as the README does; the
README says where the org home is by default, and it is where the code puts it."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from roles.loop_agent.conditions import MaxIterations, NoProgress
from roles.loop_agent.stop import RunProgress
from roles.workbench.sandbox.environment import CACHES, clean_env
from state_db.words import counted

ROOT = Path(__file__).resolve().parents[1]
ONE_PLURAL = re.compile(r"\b1 (iterations|tokens|times)\b")

pytestmark = pytest.mark.timeout(60)


def test_a_count_agrees_with_its_noun():
    assert [counted(n, "iteration") for n in (0, 1, 2)] == ["0 iterations", "1 iteration", "2 iterations"]
    assert counted(1, "entry", "entries") == "1 entry" and counted(3, "entry", "entries") == "3 entries"


def test_stop_details_say_1_iteration():
    said = MaxIterations(1).check(RunProgress(iterations=1)).detail
    assert said == "1 iteration committed, cap 1"
    assert MaxIterations(2).check(RunProgress(iterations=2)).detail == "2 iterations committed, cap 2"
    stuck = NoProgress(2, 2).check(RunProgress(iterations=2, fingerprints=("a" * 12, "a" * 12))).detail
    assert stuck.endswith("seen 2 times in the last 2 iterations") and not ONE_PLURAL.search(stuck)


def test_an_ended_run_with_one_iteration_is_announced_and_narrated_in_the_singular(org_home, tmp_path, writer_for):
    from roles.coordinator.announce import text_for
    from roles.operations.narrate import line_for
    from state_db.connection import connect
    from state_db.ending import StopDecision, end_run
    from state_db.queries.events import after
    from state_db.vocab import Actor, StopReason
    from tests.support.loop import submit

    ws = tmp_path / "ws"
    ws.mkdir()
    submit(org_home, ws, "w1")
    la = writer_for(Actor.LOOP_AGENT, "loop-agent-1")
    with la.transaction() as tx:
        tx.insert("iterations", {"work_id": "w1", "n": 1, "attempt": 1, "act_status": "ok", "act_summary": "",
                                 "checkpoint": "0" * 40, "committed_at": tx.now})
        end_run(tx, "w1", StopDecision(StopReason.MAX_ITERATIONS, "1 iteration committed, cap 1"))
    conn = connect(org_home.db_path, readonly=True)
    try:
        ended = [e for e in after(conn, 0) if e.kind == "work_items.ended"]
        assert len(ended) == 1
        shown = [text_for(conn, ended[0]), line_for(conn, ended[0])]
    finally:
        conn.close()
    assert all(s and "1 iteration," in s for s in shown), shown
    assert not any(ONE_PLURAL.search(s) for s in shown), shown


def _cache_dir(tool: str, env: dict) -> str | None:
    """Where ``tool`` puts its cache under ``env``, by asking the tool itself (None: not installed)."""
    ask = {"pip": [sys.executable, "-m", "pip", "cache", "dir"], "npm": ["npm", "config", "get", "cache"],
           "uv": ["uv", "cache", "dir"]}[tool]
    path = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    exe = shutil.which(ask[0], path=path)
    if exe is None:
        return None
    out = subprocess.run([exe, *ask[1:]], capture_output=True, text=True, timeout=30, env={**env, "PATH": path})
    return out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else None


def test_the_tmp_caches_doctor_and_the_readme_name_are_those_that_land_in_the_private_tmp(org_home):
    from roles.workbench.sandbox.view import exposed
    from state_db.kernel.config import load_config

    tmp_line = dict(exposed(load_config(org_home), org_home))["/tmp"]
    assert tmp_line.endswith(f"(caches: {', '.join(CACHES)})")
    readme = " ".join((ROOT / "README.md").read_text().split())
    named = re.search(r"a private size-capped `/tmp` where (.+?) write their caches", readme).group(1)
    assert re.split(r", | and ", named) == list(CACHES)
    env = clean_env()
    asked = {tool: _cache_dir(tool, env) for tool in CACHES}
    assert asked["pip"] is not None, asked                      # the project's own venv has pip
    for tool, where in asked.items():
        assert where is None or where.startswith("/tmp/"), (tool, where)


def test_the_readme_says_where_the_org_home_is_by_default_and_the_code_agrees(monkeypatch):
    from state_db.kernel.home import ENV_HOME, project_root, resolve_home

    monkeypatch.delenv(ENV_HOME, raising=False)
    assert resolve_home().root == project_root() / ".org"
    for readme, start, end in (("README.md", "## Two commands", "\n## "),
                               ("README.ja.md", "<!-- section: Two commands -->", "<!-- section:")):
        text = (ROOT / readme).read_text()
        at = text.index(start)
        section = text[at:text.index(end, at + len(start))]
        assert "`.org/`" in section and "`ORG_HOME`" in section, readme


def test_elapsed_time_never_goes_back_when_the_verdict_arrives_and_ends_the_run(org_home, writer_for):
    """Acts took 5 s; the verdict came 3 s after the commit and ended the run: 7 s while verifying
    (2 s in), then 8 s, before and after the loop-agent records the wait with its reflection."""
    import time as clock

    from state_db import views
    from state_db.connection import connect
    from state_db.ending import StopDecision, end_run
    from state_db.vocab import Actor, StopReason
    from tests.support.state import assign_and_run, submit as put

    put(writer_for, "w1")
    assign_and_run(writer_for, "w1")
    t = clock.time() - 100
    la = writer_for(Actor.LOOP_AGENT, "loop-agent-1")
    with la.transaction() as tx:
        tx.insert("iterations", {"work_id": "w1", "n": 1, "attempt": 1, "act_status": "ok", "committed_at": t})
        tx.update("work_items", "w1", elapsed_s=5.0)

    def elapsed(now):
        conn = connect(org_home.db_path, readonly=True)
        try:
            run = views.run_view(conn, "w1", now=now)
            return run["phase"], run["elapsed_s"]["used"]
        finally:
            conn.close()

    seen = [elapsed(t + 2)]
    with writer_for(Actor.EVAL_AGENT, "eval-agent").transaction() as tx:
        tx.insert("verdicts", {"id": "v1", "work_id": "w1", "iteration": 1, "outcome": "pass",
                               "written_by": "eval-agent", "at": t + 3})
        end_run(tx, "w1", StopDecision(StopReason.GOAL_MET, "the verify commands pass"))
    seen.append(elapsed(t + 10))
    with la.transaction() as tx:                   # the loop-agent's reflection, with the wait it measured
        tx.update("iterations", ("w1", 1), verdict_id="v1")
        tx.update("work_items", "w1", elapsed_s=8.0)
    seen.append(elapsed(t + 20))
    assert seen == [("verifying", 7.0), ("ended", 8.0), ("ended", 8.0)]


def test_doctor_says_which_org_home_it_reads_and_why(org_home, tmp_path, capsys):
    import scripts.cli.main as cli

    assert cli.main(["doctor"]) in (0, 1, 2)
    first = capsys.readouterr().out.splitlines()[0].split(None, 2)
    assert first == ["ok", "home", f"{org_home.root} (from ORG_HOME)"]
    other = tmp_path / "elsewhere"
    cli.main(["--home", str(other), "doctor", "--json"])
    import json
    found = json.loads(capsys.readouterr().out)["findings"][0]
    assert found == {"level": "ok", "check": "home", "detail": f"{other.resolve()} (from --home)"}
