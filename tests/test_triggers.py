"""Event-triggered loops: a commit and a file change each start one work item, a burst of changes
one, the org's own changes none; verify-fails fires once per failing state and never for a command
that cannot start; bad input is one coded line; and a real org ignores what its own run changed."""
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
from roles.workbench.workspace.history import WorkspaceHistory
from state_db.kernel import config as config_mod
from state_db.connection import connect, read_rows
from state_db.queries import schedules as q
from state_db.vocab import Actor, StopReason, WorkStatus
from state_db.writer import StateWriter
from state_db.queries.work import Caps


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def git(ws: Path, *argv: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "Ann", "GIT_AUTHOR_EMAIL": "ann@example.org",
           "GIT_COMMITTER_NAME": "Ann", "GIT_COMMITTER_EMAIL": "ann@example.org"}
    return subprocess.run(["git", *argv], cwd=ws, env=env, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def ws(tmp_path):
    d = tmp_path / "ws"
    (d / "src").mkdir(parents=True)
    (d / "src" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (d / "README").write_text("calc\n")
    git(d, "init", "-q", "-b", "main")
    git(d, "add", "-A")
    git(d, "commit", "-q", "-m", "first")
    return d


@pytest.fixture
def cfg(org_home):
    return config_mod.load(None)


@pytest.fixture
def rig(org_home, cfg):
    clock = Clock(time.time())
    writer = StateWriter(org_home.db_path, Actor.COORDINATOR, clock=clock)
    observer = T.Observer(org_home, cfg)

    def tick(advance: float = 1.0):
        clock.t += advance
        return T.tick(writer, org_home, cfg, observer)

    tick.clock = clock
    yield tick
    writer.close()


def _trigger(home, cfg, ws, name, kind, rule, verify=("true",)):
    req = SubmitRequest(goal="look after it", workspace=str(ws), verify=list(verify), backend="command",
                        caps=Caps(max_iterations=2))
    return ops.add(home, cfg, name=name, kind=kind, rule=rule, req=req, argv=[])["id"]


def _items(home):
    return read_rows(home.db_path, "SELECT id, goal, created_by, origin, origin_id, status FROM work_items "
                                   "WHERE origin = 'trigger' ORDER BY created_at")


def _end(home, work_id):
    w = StateWriter(home.db_path, Actor.COORDINATOR)
    with w.transaction() as tx:
        tx.set_status("work_items", work_id, WorkStatus.ENDED, stop_reason=StopReason.CANCELLED)
        for row in tx.conn.execute("SELECT workspace FROM workspace_locks WHERE work_id = ?", (work_id,)).fetchall():
            tx.delete("workspace_locks", row[0])
    w.close()


def test_a_new_commit_starts_one_item_with_the_commit_in_its_goal(org_home, cfg, ws, rig):
    tid = _trigger(org_home, cfg, ws, "on-commit", "git-commit", {"branch": "main"})
    assert rig() == []                                  # the first look is the start
    assert rig() == []
    (ws / "src" / "calc.py").write_text("def add(a, b):\n    return b + a\n")
    git(ws, "commit", "-q", "-am", "swap the operands")
    (out,) = rig()
    assert out.result == S.FIRED
    assert rig() == [] and rig() == []                   # one commit, one item
    (item,) = _items(org_home)
    assert item["id"] == out.work_id and item["origin_id"] == tid and item["created_by"] == "trigger:on-commit"
    assert "Started by trigger:on-commit: commit " in item["goal"] and "swap the operands" in item["goal"]
    assert "(by Ann)" in item["goal"]


def test_a_file_change_starts_one_item_and_a_burst_of_changes_one(org_home, cfg, ws, rig):
    _trigger(org_home, cfg, ws, "on-src", "file-change", {"glob": "src/**/*.py", "debounce_s": 2.0})
    assert rig() == []
    (ws / "README").write_text("not watched\n")
    assert rig() == [] and rig(5) == []
    for n in range(6):                                   # a burst: a change every half second
        (ws / "src" / "calc.py").write_text(f"def add(a, b):\n    return a + b + {n}\n")
        assert rig(0.5) == []
    assert rig(1.0) == []                                 # quiet for 1 s: not yet
    (out,) = rig(1.5)                                     # quiet for 2.5 s: one event
    assert out.result == S.FIRED and out.coalesced == 5
    assert rig(5) == []
    assert len(_items(org_home)) == 1
    _end(org_home, out.work_id)
    (ws / "src" / "new.py").write_text("x = 1\n")         # a file added is a change too
    assert rig(0.5) == []
    (second,) = rig(2.5)
    assert second.result == S.FIRED and second.coalesced == 0
    assert "files matching src/**/*.py changed (2 now match)" in _items(org_home)[1]["goal"]


def test_a_change_while_its_item_is_still_queued_is_skipped_and_counted(org_home, cfg, ws, rig):
    tid = _trigger(org_home, cfg, ws, "busy", "file-change", {"glob": "**/*.py", "debounce_s": 0})
    rig()
    (ws / "src" / "calc.py").write_text("x = 1\n")
    (first,) = rig()
    assert first.result == S.FIRED
    (ws / "src" / "calc.py").write_text("x = 2\n")
    (second,) = rig()
    assert second.result == S.BUSY and first.work_id in second.reason
    order = q.find(connect(org_home.db_path, readonly=True), tid)
    assert (order.fired, order.skipped_busy) == (1, 1)


def _org_run(home, ws: Path, change) -> str:
    """A run of the org on ``ws``: baseline, the doer's change, checkpoint 1, as the loop-agent would."""
    from tests.support.state import assign_and_run, submit
    from tests.conftest import ROOT  # noqa: F401 - the project on sys.path
    writers = []

    def writer_for(actor, instance=None):
        writers.append(StateWriter(home.db_path, actor, instance))
        return writers[-1]
    work_id = f"w-org-{time.time_ns() % 10**9}"
    submit(writer_for, work_id, str(ws))
    history = WorkspaceHistory(home.history_dir / f"{work_id}.git", ws)
    history.baseline()
    assign_and_run(writer_for, work_id)
    change()
    commit = history.checkpoint(1)
    with writer_for(Actor.LOOP_AGENT, "loop-agent-1").transaction() as tx:
        tx.insert("iterations", {"work_id": work_id, "n": 1, "attempt": 1, "act_status": "ok",
                                 "checkpoint": commit, "committed_at": time.time()})
    for w in writers:
        w.close()
    return work_id


def test_changes_made_by_the_orgs_own_run_start_nothing(org_home, cfg, ws, rig):
    files = _trigger(org_home, cfg, ws, "files", "file-change", {"glob": "**/*.py", "debounce_s": 0})
    _trigger(org_home, cfg, ws, "commits", "git-commit", {"branch": "main"})
    assert rig() == []
    seen_during = []

    def doer_edits():
        (ws / "src" / "calc.py").write_text("def add(a, b):\n    return a + b  # fixed by the org\n")
        seen_during.append(rig())                        # mid-run: the org is at work, nobody looks
    work_id = _org_run(org_home, ws, doer_edits)
    assert seen_during == [[]]
    git(ws, "commit", "-q", "-am", "the org's result, committed by an approved action")
    _end(org_home, work_id)
    after = rig() + rig()
    assert after == [], after                            # what the org left: seen, not fired
    assert _items(org_home) == []
    order = q.find(connect(org_home.db_path, readonly=True), files)
    assert order.watch["ignored"] == 1 and order.fired == 0
    # a human's change after it is an event again
    (ws / "src" / "calc.py").write_text("def add(a, b):\n    return a + b  # and a human's note\n")
    git(ws, "commit", "-q", "-am", "a human's commit")
    fired = rig()
    assert sorted(o.name for o in fired if o.result == S.FIRED) == ["commits", "files"]


def test_verify_fails_fires_once_per_failing_state_and_not_for_a_command_that_cannot_start(org_home, cfg, ws, rig):
    tid = _trigger(org_home, cfg, ws, "red", "verify-fails", {"every_s": 60}, verify=["test ! -e broken"])
    assert rig() == []                                   # passes: nothing
    (ws / "broken").write_text("x\n")
    assert rig(30) == []                                 # not yet time to check again
    (out,) = rig(31)
    assert out.result == S.FIRED
    goal = _items(org_home)[0]["goal"]
    assert "1 of 1 verify commands fail on the current tree" in goal and "`test ! -e broken` failed (exit 1)" in goal
    _end(org_home, out.work_id)
    assert rig(61) == [] and rig(61) == []               # the same failing state: once
    (ws / "README").write_text("another failing state\n")
    (again,) = rig(61)
    assert again.result == S.FIRED
    _end(org_home, again.work_id)
    _trigger(org_home, cfg, ws, "unrunnable", "verify-fails", {"every_s": 60}, verify=["no-such-tool-here --check"])
    assert [o for o in rig(61) if o.name == "unrunnable"] == []
    order = q.find(connect(org_home.db_path, readonly=True), "unrunnable")
    assert order.fired == 0 and order.last_skip.startswith("cannot look: `no-such-tool-here --check` cannot run (exit 127)")
    assert q.find(connect(org_home.db_path, readonly=True), tid).fired == 2



def test_a_verify_fails_check_and_an_eval_agent_check_run_through_one_sandbox_function(org_home, cfg, ws, rig,
                                                                                         monkeypatch, tmp_path):
    """The coordinator runs no check itself: its verify-fails look and the eval-agent's check both
    call ``roles.workbench.sandbox.run_check_command`` (seen here by wrapping it), on a copy of the tree."""
    import roles.eval_agent.checks as eval_checks
    import roles.workbench.sandbox as sandbox
    from roles.workbench.sandbox.check import run_check_command
    calls = []

    def counted(runner, command, cwd, **kw):
        calls.append((command, Path(cwd)))
        return run_check_command(runner, command, cwd, **kw)
    monkeypatch.setattr(sandbox, "run_check_command", counted)
    monkeypatch.setattr(eval_checks, "run_check_command", counted)
    _trigger(org_home, cfg, ws, "red", "verify-fails", {"every_s": 60}, verify=["test ! -e broken"])
    (ws / "broken").write_text("x\n")
    (out,) = rig()
    assert out.result == S.FIRED
    assert calls == [("test ! -e broken", org_home.root / "triggers" / q.find(
        connect(org_home.db_path, readonly=True), "red").id)]
    from roles.workbench.sandbox import runner_from_config
    (tmp_path / "snap").mkdir()
    eval_checks.run_check("true", tmp_path / "snap", timeout_s=30,
                          runner=runner_from_config(cfg, org_home, tmp_path / "snap"))
    assert calls[-1] == ("true", tmp_path / "snap")


# -- the command line ------------------------------------------------------------------------------

def cli(home, *argv):
    """The org command in-process (the same main(), without an interpreter start per call)."""
    import contextlib
    import io
    from types import SimpleNamespace

    from scripts.cli.main import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--home", str(home.root), *argv])
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def test_bad_trigger_input_is_one_coded_line(org_home, ws, tmp_path):
    tail = ["--", "goal", "--workspace", str(ws), "--verify", "true", "--backend", "command"]
    cases = [
        (["--on", "push"], "bad_trigger_kind"),
        (["--on", "file-change"], "bad_trigger"),
        (["--on", "verify-fails", "--every", "0"], "bad_every"),
        (["--on", "file-change", "--glob", "*.py", "--debounce", "soon"], "bad_every"),
    ]
    for flags, code in cases:
        p = cli(org_home, "trigger", "add", "t1", *flags, *tail)
        assert p.returncode == 1 and p.stderr.startswith(f"error[{code}]: "), (flags, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1
    missing = cli(org_home, "trigger", "add", "t1", "--on", "git-commit", "--", "goal", "--workspace",
                  str(tmp_path / "gone"), "--verify", "true")
    assert missing.returncode == 1 and missing.stderr.startswith("error[workspace_missing]: "), missing.stderr
    plain = tmp_path / "plain"
    plain.mkdir()
    not_git = cli(org_home, "trigger", "add", "t1", "--on", "git-commit", "--", "goal", "--workspace", str(plain),
                  "--verify", "true")
    assert not_git.returncode == 1 and not_git.stderr.startswith("error[not_a_repository]: "), not_git.stderr
    assert read_rows(org_home.db_path, "SELECT COUNT(*) AS n FROM schedules")[0]["n"] == 0


def test_the_cli_makes_and_lists_triggers_apart_from_schedules(org_home, ws):
    made = cli(org_home, "trigger", "add", "on-commit", "--on", "git-commit", "--", "review the commit",
               "--workspace", str(ws), "--verify", "true", "--backend", "command")
    assert made.returncode == 0, made.stderr
    listed = json.loads(cli(org_home, "trigger", "list", "--json").stdout)
    assert [(t["name"], t["kind"], t["rule"]["branch"]) for t in listed] == [("on-commit", "git-commit", "main")]
    assert json.loads(cli(org_home, "schedule", "list", "--json").stdout) == []
    assert "new commit on main" in cli(org_home, "trigger", "list").stdout
    wrong = cli(org_home, "schedule", "pause", "on-commit")
    assert wrong.returncode == 1 and wrong.stderr.startswith("error[no_such_schedule]: ")
    assert cli(org_home, "trigger", "pause", "on-commit").returncode == 0
    assert "already paused" in cli(org_home, "trigger", "pause", "on-commit").stdout


@pytest.mark.timeout(150)
def test_a_real_org_ignores_what_its_own_run_changed_and_fires_on_a_human_change():
    """Real processes: a file-change trigger on the demo project sees the org's run rewrite
    textstats.py and starts nothing; a human's new file then starts one item, as trigger:py."""
    import shutil

    from tests.support.org import ONE_AGENT, query, running_org, wait_for
    demo = Path(__file__).resolve().parents[1] / "scripts" / "demo"
    with running_org(ONE_AGENT) as home:
        ws = home.root.parent / "ws"
        shutil.copytree(demo / "project", ws)
        args = ["--workspace", str(ws), "--verify", "python3 -m unittest -q", "--backend",
                f"scripted:{demo / 'script.json'}", "--max-iterations", "5"]
        made = cli(home, "trigger", "add", "py", "--on", "file-change", "--glob", "**/*.py", "--debounce", "0.5s",
                   "--", "review the change", *args)
        assert made.returncode == 0, made.stderr

        def order():
            return json.loads(cli(home, "trigger", "show", "py", "--json").stdout)
        wait_for(lambda: order()["watch"].get("seen"), timeout=20, what="the watcher's first look")
        run = cli(home, "submit", "make word_count right", *args, "--no-wait", "--json")
        assert run.returncode == 0, run.stderr
        work_id = json.loads(run.stdout)["id"]
        done = wait_for(lambda: (r := query(home, "SELECT * FROM work_items WHERE id = ?", (work_id,))[0])["status"]
                        == "ended" and r, timeout=90, what="the human's run to end")
        assert done["stop_reason"] == "goal_met" and "text.split()" in (ws / "textstats.py").read_text()
        seen = wait_for(lambda: order()["watch"].get("ignored") == 1 and order(), timeout=20,
                        what="the watcher to look at what the run left")
        assert seen["fired"] == 0 and query(home, "SELECT COUNT(*) AS n FROM work_items WHERE origin = 'trigger'")[0]["n"] == 0
        (ws / "helpers.py").write_text("def shout(s):\n    return s.upper()\n")
        item = wait_for(lambda: query(home, "SELECT * FROM work_items WHERE origin = 'trigger'"), timeout=20,
                        what="the trigger's work item")
        assert len(item) == 1 and item[0]["created_by"] == "trigger:py"
        assert "files matching **/*.py changed" in item[0]["goal"]
