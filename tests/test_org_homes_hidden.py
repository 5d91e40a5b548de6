"""Every org home is hidden from every sandbox wherever it lies — in the workspace, in a folder
org.toml shows — registered or not (a home carries a marker); submit refuses a workspace holding
one. Through real bubblewrap, each refusal beside a control that the same read works outside."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from roles.operations.submit import SubmitError, SubmitRequest, check
from roles.workbench.sandbox import bubblewrap, runner_from_config
from roles.workbench.sandbox.homes import homes_within
from state_db.bootstrap import init_home
from state_db.kernel.config import Config, defaults
from state_db.kernel.home import HOME_MARKER, OrgHome, known_homes

pytestmark = pytest.mark.skipif(bubblewrap() is None, reason="bubblewrap (bwrap) is not installed")
SECRET = "sk-ant-secret-of-org-b"


def config(**sandbox) -> Config:
    data = defaults()
    data["sandbox"].update(sandbox)
    return Config(data)


def _unregistered_home(root: Path, monkeypatch, tmp_path) -> OrgHome:
    """Org B, made by a user whose registry this org never reads (another XDG_STATE_HOME)."""
    with monkeypatch.context() as m:
        m.setenv("XDG_STATE_HOME", str(tmp_path / "other-users-state"))
        b = OrgHome(root)
        init_home(b)
    assert str(b.root) not in known_homes()
    (b.root / "notes.txt").write_text(SECRET)
    return b


def _sh(runner, line: str, cwd: Path) -> str:
    return runner.run(line, cwd, 30.0, 100_000).output


@pytest.fixture
def org_a(tmp_path):
    home = OrgHome(tmp_path / "a")
    init_home(home)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "code.py").write_text("print('mine')\n")
    return home, ws


@pytest.mark.timeout(90)
def test_an_unregistered_home_inside_the_workspace_can_be_neither_read_nor_written(tmp_path, monkeypatch, org_a):
    home, ws = org_a
    b = _unregistered_home(ws / "vendor" / "org-b", monkeypatch, tmp_path)
    assert (b.root / HOME_MARKER).is_file()
    runner = runner_from_config(config(), home, ws)
    with capture_logs() as logs:
        out = _sh(runner, f"cat {ws}/code.py; head -c 16 {b.db_path}; cat {b.root}/notes.txt; ls -A {b.root}; "
                          f"echo x > {b.root}/planted 2>&1; echo y > {ws}/vendor/neighbour && echo WROTE-NEIGHBOUR",
                  ws)
    told = [e for e in logs if e["event"] == "org_home_in_sandbox_reach"]
    assert told and str(b.root) in told[0]["homes"]                  # the user is told
    assert "mine" in out and "WROTE-NEIGHBOUR" in out, out          # control: the workspace is there, writable
    assert b.db_path.read_bytes().startswith(b"SQLite format 3")    # control: readable outside
    assert "SQLite format 3" not in out and SECRET not in out, out
    assert not (b.root / "planted").exists()


@pytest.mark.timeout(90)
def test_a_registered_home_and_an_old_unmarked_home_inside_the_workspace_are_hidden(tmp_path, org_a):
    home, ws = org_a
    c = OrgHome(ws / "org-c")
    init_home(c)                                                    # registered by this user
    (c.root / "notes.txt").write_text(SECRET)
    old = ws / "old-home"
    old.mkdir()
    (old / "state.db").write_text(SECRET)                          # made before homes carried the marker
    (old / "org.toml").write_text("[org]\n")
    runner = runner_from_config(config(), home, ws)
    out = _sh(runner, f"cat {ws}/code.py; cat {c.root}/notes.txt; cat {old}/state.db", ws)
    assert "mine" in out and SECRET not in out, out


@pytest.mark.timeout(90)
def test_an_unregistered_home_inside_a_folder_org_toml_shows_is_hidden(tmp_path, monkeypatch, org_a):
    home, ws = org_a
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "tool.txt").write_text("a shown neighbour\n")
    b = _unregistered_home(shared / "deep" / "org-b", monkeypatch, tmp_path)
    runner = runner_from_config(config(readonly_binds=[str(shared)]), home, ws)
    out = _sh(runner, f"cat {shared}/tool.txt; cat {b.root}/notes.txt; head -c 16 {b.db_path}", ws)
    assert "a shown neighbour" in out and SECRET not in out and "SQLite" not in out, out


@pytest.mark.timeout(60)
def test_submit_refuses_a_workspace_that_holds_any_org_home(tmp_path, monkeypatch, org_a):
    home, ws = org_a
    req = SubmitRequest(goal="g", workspace=str(ws), verify=["true"], backend="command")
    cfg = config()
    check(home, cfg, req)                                          # control: accepted without one
    _unregistered_home(ws / "a" / "b" / "org-b", monkeypatch, tmp_path)
    with pytest.raises(SubmitError) as got:
        check(home, cfg, req)
    assert got.value.code == "workspace_contains_org_home" and "org-b" in str(got.value)


@pytest.mark.timeout(30)
def test_the_walk_follows_no_link_and_says_when_it_stopped_early(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / HOME_MARKER).write_text("")
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    os.symlink(elsewhere, ws / "d" / "link")
    found = homes_within(ws)
    assert found.homes == () and found.complete
    for i in range(50):
        (ws / f"f{i}").write_text("")
    assert not homes_within(ws, max_entries=10).complete
