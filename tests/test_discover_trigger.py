"""The ``discover`` trigger kind: on its period the coordinator's watcher scans the workspace and
records proposals, signed by the trigger; periods missed while the org was down are one scan;
nothing starts unless org.toml's ``discover.auto_start`` names the kind and ``limits.daily_spend_usd``
has room, and then one item, as discovery, with the trigger's submit options; while it is queued
the next period is skipped and counted; a scan whose verify command cannot start records why and
proposes nothing; and a real org scans, starts and works the failing test to goal_met."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from roles.coordinator import schedules as S
from roles.coordinator import triggers as T
from roles.operations import schedules as ops
from roles.operations.submit import SubmitRequest
from state_db.kernel import config as config_mod
from state_db.connection import connect, read_rows
from state_db.queries import schedules as q
from state_db.vocab import Actor, StopReason, WorkStatus
from state_db.writer import StateWriter
from state_db.queries.work import Caps

HOUR = 3600.0
VERIFY = "test ! -e broken"


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def git(ws: Path, *argv: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "Ann", "GIT_AUTHOR_EMAIL": "ann@example.org",
           "GIT_COMMITTER_NAME": "Ann", "GIT_COMMITTER_EMAIL": "ann@example.org"}
    subprocess.run(["git", *argv], cwd=ws, env=env, capture_output=True, text=True, check=True)


@pytest.fixture
def ws(tmp_path):
    """A repository whose verify command fails (``broken`` exists) and with one TODO marker."""
    d = tmp_path / "ws"
    d.mkdir()
    (d / "calc.py").write_text("def add(a, b):\n    return a + b  # TODO: floats\n")
    (d / "broken").write_text("x\n")
    git(d, "init", "-q", "-b", "main")
    git(d, "add", "-A")
    git(d, "commit", "-q", "-m", "first")
    return d


def configure(home, text: str = ""):
    home.config_path.write_text('[model]\nbackend = "command"\n' + text)
    return config_mod.load_config(home)


def make_rig(home, cfg):
    clock = Clock(time.time())
    writer = StateWriter(home.db_path, Actor.COORDINATOR, clock=clock)
    observer = T.Observer(home, cfg)

    def tick(advance: float = 1.0):
        clock.t += advance
        return T.tick(writer, home, cfg, observer)

    tick.close = writer.close
    return tick


@pytest.fixture
def rigs():
    made = []

    def make(home, cfg):
        made.append(make_rig(home, cfg))
        return made[-1]
    yield make
    for r in made:
        r.close()


def add_trigger(home, cfg, ws, name="scan", every_s=HOUR, verify=(VERIFY,), **rule):
    req = SubmitRequest(goal="look for work", workspace=str(ws), verify=list(verify), backend="command",
                        caps=Caps(max_iterations=2))
    return ops.add(home, cfg, name=name, kind="discover", rule={"every_s": every_s, **rule}, req=req, argv=[])["id"]


def order(home, name="scan") -> q.Schedule:
    conn = connect(home.db_path, readonly=True)
    try:
        return q.find(conn, name)
    finally:
        conn.close()


def proposals(home):
    return read_rows(home.db_path, "SELECT id, kind, status, created_by, work_id FROM proposals ORDER BY rank")


def items(home):
    return read_rows(home.db_path, "SELECT * FROM work_items ORDER BY created_at")


@pytest.mark.timeout(90)
def test_it_scans_on_its_period_records_proposals_and_coalesces_missed_periods(org_home, ws, rigs):
    cfg = configure(org_home)
    rig = rigs(org_home, cfg)
    add_trigger(org_home, cfg, ws)
    (first,) = rig()                                    # the first look scans at once
    assert first.result == T.SCANNED and first.work_id is None
    found = proposals(org_home)
    assert [(p["kind"], p["status"]) for p in found] == [("failing_test", "proposed"), ("todo", "proposed")]
    assert all(p["created_by"].endswith("via trigger:scan") for p in found)
    assert rig(HOUR / 2) == []                          # not yet its period
    (again,) = rig(HOUR / 2)
    assert again.result == T.SCANNED
    assert proposals(org_home) == found                 # refreshed, not duplicated
    # the org down for three and a half periods: one scan, standing for the periods missed
    (late,) = rig(3.5 * HOUR)
    assert late.result == T.SCANNED and late.coalesced == 2
    o = order(org_home)
    assert o.watch["scans"] == 3 and o.coalesced == 2 and o.fired == 0 and o.skipped_spend == 0
    assert o.watch["scan"]["found"] == 2 and o.watch["scan"]["proposed"] == [p["id"] for p in found]
    # the failure fixed: the next scan expires its proposal
    (ws / "broken").unlink()
    rig(HOUR)
    assert [(p["kind"], p["status"]) for p in proposals(org_home)] == [("failing_test", "expired"), ("todo", "proposed")]
    assert items(org_home) == []                        # without a policy nothing ever starts


@pytest.mark.timeout(90)
def test_the_policy_starts_one_item_within_the_daily_cap_and_the_next_period_waits_for_it(org_home, ws, rigs):
    cfg = configure(org_home, '[discover]\nauto_start = ["failing_test"]\n[limits]\ndaily_spend_usd = 20.0\n')
    rig = rigs(org_home, cfg)
    tid = add_trigger(org_home, cfg, ws)
    (out,) = rig()
    assert out.result == S.FIRED
    (item,) = items(org_home)
    failing = next(p for p in proposals(org_home) if p["kind"] == "failing_test")
    assert item["id"] == out.work_id and item["origin"] == "discovery" and item["origin_id"] == failing["id"]
    assert failing["status"] == "accepted" and failing["work_id"] == item["id"]
    assert item["created_by"].endswith("via policy:discover.auto_start")
    assert json.loads(item["verify"]) == [VERIFY] and json.loads(item["caps"])["max_iterations"] == 2
    assert item["backend"] == "command"                  # the trigger's submit options
    o = order(org_home)
    assert (o.fired, o.last_work_id, o.id) == (1, item["id"], tid)
    (busy,) = rig(HOUR)                                  # single-flight: it is still queued
    assert busy.result == S.BUSY and item["id"] in busy.reason
    assert len(items(org_home)) == 1 and order(org_home).skipped_busy == 1
    w = StateWriter(org_home.db_path, Actor.COORDINATOR)
    with w.transaction() as tx:
        tx.set_status("work_items", item["id"], WorkStatus.ENDED, stop_reason=StopReason.CANCELLED)
        for row in tx.conn.execute("SELECT workspace FROM workspace_locks WHERE work_id = ?",
                                   (item["id"],)).fetchall():
            tx.delete("workspace_locks", row[0])
    w.close()
    (after,) = rig(HOUR)
    # the same evidence, not fixed by an ended item, is proposed anew and started again
    assert after.result == S.FIRED and after.work_id != item["id"] and len(items(org_home)) == 2


@pytest.mark.timeout(90)
def test_no_policy_kind_or_no_room_in_the_cap_starts_nothing(org_home, ws, rigs):
    cfg = configure(org_home, '[discover]\nauto_start = ["bug"]\n')
    rig = rigs(org_home, cfg)
    add_trigger(org_home, cfg, ws)
    (out,) = rig()
    assert out.result == T.SCANNED and items(org_home) == []
    capped = configure(org_home, '[discover]\nauto_start = ["todo"]\n[limits]\ndaily_spend_usd = 1.0\n')
    rig2 = rigs(org_home, capped)
    (spend,) = rig2(HOUR + 1)
    assert spend.result == S.SPEND and "daily_spend_usd" in spend.reason
    o = order(org_home)
    assert o.skipped_spend == 1 and o.fired == 0 and o.last_skip.startswith("skipped_spend: p-")
    assert items(org_home) == []
    assert all(p["status"] == "proposed" for p in proposals(org_home))


@pytest.mark.timeout(60)
def test_a_scan_that_cannot_run_is_recorded_and_proposes_nothing(org_home, ws, rigs):
    cfg = configure(org_home, '[discover]\nauto_start = ["todo"]\n')
    rig = rigs(org_home, cfg)
    add_trigger(org_home, cfg, ws, verify=("no-such-tool-here --check",))
    assert rig() == []
    o = order(org_home)
    assert o.last_skip.startswith("cannot scan: `no-such-tool-here --check` cannot start in the sandbox (exit 127)")
    assert o.fired == 0 and "why" in o.watch
    assert proposals(org_home) == [] and items(org_home) == []


def cli(home, *argv):
    import contextlib
    import io
    from types import SimpleNamespace

    from scripts.cli.main import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--home", str(home.root), *argv])
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def test_the_cli_makes_a_discover_trigger_and_refuses_what_does_not_fit(org_home, ws, tmp_path):
    issues = tmp_path / "issues.json"
    issues.write_text(json.dumps([{"number": 3, "title": "crash on empty input", "labels": ["bug"]}]))
    tail = ["--", "look for work", "--workspace", str(ws), "--verify", VERIFY, "--backend", "command"]
    made = cli(org_home, "trigger", "add", "scan", "--on", "discover", "--every", "2h", "--issues", str(issues), *tail)
    assert made.returncode == 0, made.stderr
    (listed,) = json.loads(cli(org_home, "trigger", "list", "--json").stdout)
    assert listed["kind"] == "discover" and listed["rule"] == {"every_s": 7200.0, "issues": str(issues)}
    assert f"discovery scan every 2h, issues from {issues}" in cli(org_home, "trigger", "list").stdout
    default = cli(org_home, "trigger", "add", "hourly", "--on", "discover", *tail)
    assert default.returncode == 0 and order(org_home, "hourly").rule == {"every_s": HOUR}
    for flags, code in [(["--glob", "*.py"], "bad_arguments"), (["--debounce", "2s"], "bad_arguments"),
                        (["--issues", str(tmp_path / "gone.json")], "issues_file_missing"),
                        (["--every", "0"], "bad_every")]:
        p = cli(org_home, "trigger", "add", "t1", "--on", "discover", *flags, *tail)
        assert p.returncode != 0 and p.stderr.startswith(f"error[{code}]: "), (flags, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1
    wrong = cli(org_home, "trigger", "add", "t1", "--on", "verify-fails", "--issues", str(issues), *tail)
    assert wrong.returncode != 0 and "--issues has no meaning with --on verify-fails" in wrong.stderr


DEMO = Path(__file__).resolve().parents[1] / "scripts" / "demo"


@pytest.mark.timeout(60)
def test_a_real_org_scans_starts_the_failing_test_by_policy_and_works_it_to_goal_met():
    """Real processes: the coordinator's watcher scans the demo project, records its failing test,
    starts it by policy with the trigger's scripted backend, and the org takes it to goal_met."""
    import shutil

    from tests.support.org import ONE_AGENT, query, running_org, wait_for
    policy = ONE_AGENT + '[discover]\nauto_start = ["failing_test"]\n[limits]\ndaily_spend_usd = 20.0\n'
    started = time.monotonic()
    with running_org(policy) as home:
        ws = home.root.parent / "ws"
        shutil.copytree(DEMO / "project", ws)
        made = cli(home, "trigger", "add", "scan", "--on", "discover", "--every", "1h", "--", "look for work",
                   "--workspace", str(ws), "--verify", "python3 -m unittest -q",
                   "--backend", f"scripted:{DEMO / 'script.json'}", "--max-iterations", "5")
        assert made.returncode == 0, made.stderr
        item = wait_for(lambda: query(home, "SELECT * FROM work_items"), timeout=20, what="the trigger's start")
        assert len(item) == 1 and item[0]["origin"] == "discovery"
        done = wait_for(lambda: (r := query(home, "SELECT * FROM work_items WHERE id = ?", (item[0]["id"],))[0])
                        ["status"] == "ended" and r, timeout=30, what="the started item to end")
        assert done["stop_reason"] == "goal_met" and "text.split()" in (ws / "textstats.py").read_text()
        (p,) = query(home, "SELECT * FROM proposals WHERE kind = 'failing_test'")
        assert p["status"] == "accepted" and p["work_id"] == done["id"]
        shown = json.loads(cli(home, "trigger", "show", "scan", "--json").stdout)
        assert shown["fired"] == 1 and shown["last_work_id"] == done["id"]
    assert time.monotonic() - started < 40


@pytest.mark.timeout(60)
def test_trigger_show_tells_the_scans_and_when_the_next_one_is_due(org_home, ws, rigs):
    cfg = configure(org_home)
    rig = rigs(org_home, cfg)
    add_trigger(org_home, cfg, ws)
    before = cli(org_home, "trigger", "show", "scan")
    assert "scans: 0" in before.stdout and "next check: " in before.stdout
    (out,) = rig()
    shown = json.loads(cli(org_home, "trigger", "show", "scan", "--json").stdout)
    assert shown["next_due"] == shown["watch"]["checked_at"] + HOUR
    text = cli(org_home, "trigger", "show", "scan").stdout
    ids = [p["id"] for p in proposals(org_home)]
    assert "scans: 1; the last at " in text and f"found 2, proposes {', '.join(ids)}" in text
