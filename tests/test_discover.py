"""Discovery with a human gate: a fixture repository (a real git repository, a really failing
pytest test run in the real sandbox, FIXMEs and TODOs, an exported issue list) yields the same
proposals on every scan and matches the checked-in snapshot; re-scans never duplicate an open
proposal; accepting submits a queued work item through the submit operation; nothing is submitted
without acceptance unless org.toml's policy names the kind and the daily cap has room; bad input is
one coded line."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from roles.operations import discover as D
from roles.operations import proposals as P
from scripts.cli.dashboard import data
from scripts.cli.main import main
from state_db.kernel import config as config_mod
from state_db.connection import connect, read_rows
from state_db.queries.work import Caps
from state_db.writer import StateWriter
from tests.support.org import ONE_AGENT, query, running_org, wait_for

SNAPSHOT = Path(__file__).parent / "data" / "discover_snapshot.json"
COMMAND_BACKEND = '[model]\nbackend = "command"\n'          # submits need no API key
# the verify command names no path of this machine, so the snapshot (fingerprints included) holds anywhere
PYTEST = "sh run_tests.sh"

CALC = """\
def mean(xs):
    # FIXME: an empty list divides by zero
    return sum(xs) / len(xs)


def median(xs):
    xs = sorted(xs)  # TODO: handle even lengths
    return xs[len(xs) // 2]
"""
TESTS = """\
from calc import mean, median


def test_mean():
    assert mean([1, 2, 3]) == 2


def test_median_even():
    assert median([1, 2, 3, 4]) == 2.5
"""
ISSUES = [
    {"number": 7, "title": "Add a mode() function", "body": "Like statistics.mode.", "labels": [{"name": "enhancement"}]},
    {"number": 12, "title": "mean([]) crashes", "body": "ZeroDivisionError on an empty list.",
     "labels": [{"name": "bug"}, {"name": "good first issue"}]},
]


def _git(ws: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=ws, check=True,
                   capture_output=True)


def make_repo(root: Path) -> Path:
    """The fixture: tracked code with a FIXME and a TODO, a failing test, and markers the scan must
    leave out (a vendored folder, a binary file, an untracked file)."""
    ws = root / "proj"
    (ws / "vendor").mkdir(parents=True)
    (ws / "calc.py").write_text(CALC)
    (ws / "run_tests.sh").write_text(f"exec {sys.executable} -m pytest -q -p no:cacheprovider\n")
    (ws / "test_calc.py").write_text(TESTS)
    (ws / "vendor" / "lib.py").write_text("# TODO: vendored, not ours\n")
    (ws / "blob.bin").write_bytes(b"\x00\x01TODO: inside a binary\n")
    _git(ws, "init", "-q")
    _git(ws, "add", ".")
    _git(ws, "commit", "-q", "-m", "fixture")
    (ws / "notes.txt").write_text("TODO: untracked, not scanned\n")
    return ws


def write_issues(root: Path) -> Path:
    path = root / "issues.json"
    path.write_text(json.dumps(ISSUES))
    return path


def tree_digest(ws: Path) -> str:
    """Every path, mode and content under the workspace (its .git included): no side effects."""
    h = hashlib.sha256()
    for p in sorted(ws.rglob("*")):
        h.update(str(p.relative_to(ws)).encode() + oct(p.lstat().st_mode).encode())
        if p.is_file() and not p.is_symlink():
            h.update(p.read_bytes())
    return h.hexdigest()


def normalised(proposals) -> str:
    return json.dumps([p.encode() for p in proposals], indent=1, sort_keys=True)


def cli(home, *argv) -> int:
    return main(["--home", str(home.root), *argv])


def cfg_with(home, text: str):
    home.config_path.write_text(text)
    return config_mod.load_config(home)


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path), write_issues(tmp_path)


@pytest.mark.timeout(180)          # each scan runs pytest in the sandbox: seconds on a busy machine
def test_the_scan_is_the_same_on_every_run_matches_the_snapshot_and_leaves_the_workspace_alone(org_home, repo):
    ws, issues = repo
    before = tree_digest(ws)
    cfg = config_mod.load_config(org_home)
    first = D.scan(ws, [PYTEST], issues, 10, cfg=cfg, home=org_home)
    second = D.scan(ws, [PYTEST], issues, 10, cfg=cfg, home=org_home)
    assert normalised(first) == normalised(second)
    assert normalised(first) == SNAPSHOT.read_text().strip(), "the scan's output changed: compare with the snapshot"
    assert [p.kind for p in first] == ["failing_test", "bug", "fixme", "todo", "issue"]
    assert [p.recommended for p in first] == [True, False, False, False, False]
    assert first[0].evidence["failing"] == ["test_calc::test_median_even"]
    assert tree_digest(ws) == before
    assert not list((org_home.root / "discover").iterdir())       # the snapshot is gone too
    assert [p.kind for p in D.scan(ws, None, issues, 2, cfg=cfg, home=org_home)] == ["bug", "fixme"]


def test_markers_come_from_tracked_text_files_outside_vendored_folders(org_home, repo, tmp_path):
    ws, _ = repo
    found = D.scan(ws, None, None, None, cfg=config_mod.load_config(org_home), home=org_home)
    assert [(p.kind, p.evidence["path"], p.evidence["line"]) for p in found] == [("fixme", "calc.py", 2),
                                                                                  ("todo", "calc.py", 7)]
    # a tracked folder the doer replaced by a symlink to elsewhere: the scan does not follow it
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "lib.py").write_text("# FIXME: a secret outside the workspace\n")
    (ws / "pkg").mkdir()
    (ws / "pkg" / "lib.py").write_text("x = 1\n")
    _git(ws, "add", "pkg")
    _git(ws, "commit", "-q", "-m", "pkg")
    (ws / "pkg" / "lib.py").unlink()
    (ws / "pkg").rmdir()
    (ws / "pkg").symlink_to(outside)
    again = D.scan(ws, None, None, None, cfg=config_mod.load_config(org_home), home=org_home)
    assert [p.evidence["path"] for p in again] == ["calc.py", "calc.py"]
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "a.py").write_text("# TODO: not in a repository\n")
    result = D.scan_all(plain, None, None, cfg=config_mod.load_config(org_home), home=org_home)
    assert result.proposals == [] and result.notes and "not in a git repository" in result.notes[0]


@pytest.mark.parametrize("line, want", [
    (b"# TODO: x", ("TODO", "x")), (b"    return 1  # FIXME: y", ("FIXME", "y")), (b"// FIXME(ann): z", ("FIXME", "z")),
    (b" * TODO handle it", ("TODO", "handle it")), (b"-- TODO: sql", ("TODO", "sql")),
    (b"<!-- FIXME: html -->", ("FIXME", "html")), (b"/* TODO: c */", ("TODO", "c")),
    (b"`TODO` and `FIXME` markers", None), (b"kind = K.TODO", None), (b'word == "FIXME"', None),
    (b"TODO: a line of its own", ("TODO", "a line of its own")), (b"    FIXME = 'fixme'", None),
    (b"the TODO list", None), (b"# TODOs", None), (b"x = 'TODO: a string'", None),
])
def test_a_marker_opens_a_comment_and_prose_naming_the_words_is_not_one(line, want):
    assert D.marker(line) == want


def test_a_fingerprint_survives_moved_lines_and_a_rescan_refreshes_instead_of_duplicating(org_home, repo):
    ws, issues = repo
    cfg = config_mod.load_config(org_home)
    one = P.record(org_home, cfg, ws, D.scan_all(ws, None, issues, cfg=cfg, home=org_home))
    (ws / "calc.py").write_text("\n\n" + CALC)                    # every marker moves down two lines
    two = P.record(org_home, cfg, ws, D.scan_all(ws, None, issues, cfg=cfg, home=org_home))
    assert [p["id"] for p in one["proposals"]] == [p["id"] for p in two["proposals"]]
    assert [p["evidence"].get("line") for p in two["proposals"]] == [None, 4, 9, None]
    rows = read_rows(org_home.db_path, "SELECT status, recommended FROM proposals")
    assert len(rows) == 4 and sum(r["recommended"] for r in rows) == 1
    assert two["expired"] == [] and one["proposals"][0]["kind"] == "bug" and one["proposals"][0]["recommended"]


@pytest.mark.timeout(180)
def test_accepting_submits_a_queued_work_item_once_and_its_evidence_is_not_proposed_again(org_home, repo):
    ws, issues = repo
    cfg = cfg_with(org_home, COMMAND_BACKEND)
    shown = P.record(org_home, cfg, ws, D.scan_all(ws, [PYTEST], issues, cfg=cfg, home=org_home))["proposals"]
    assert read_rows(org_home.db_path, "SELECT id FROM work_items") == []       # proposed, nothing started
    first = shown[0]
    done = P.accept(org_home, cfg, first["id"])
    again = P.accept(org_home, cfg, first["id"])
    assert again["work_id"] == done["work_id"] and again["replayed"]
    [item] = read_rows(org_home.db_path, "SELECT * FROM work_items")
    assert (item["id"], item["status"], item["origin"], item["origin_id"]) == (done["work_id"], "queued", "discovery",
                                                                               first["id"])
    assert orjson.loads(item["verify"]) == [PYTEST] and item["goal"] == first["goal"]
    assert orjson.loads(item["caps"])["max_iterations"] == first["caps"]["max_iterations"]
    [row] = read_rows(org_home.db_path, "SELECT status, work_id FROM proposals WHERE id = ?", (first["id"],))
    assert (row["status"], row["work_id"]) == ("accepted", done["work_id"])
    rescan = P.record(org_home, cfg, ws, D.scan_all(ws, [PYTEST], issues, cfg=cfg, home=org_home))
    assert first["id"] not in [p["id"] for p in rescan["proposals"]] and rescan["held_back"] == 1
    assert rescan["proposals"][0]["recommended"] and rescan["proposals"][0]["kind"] == "bug"


def test_accept_with_edit_overrides_goal_verify_and_caps_and_needs_edit_to_do_so(org_home, repo, capsys):
    ws, _ = repo
    cfg_with(org_home, COMMAND_BACKEND)
    assert cli(org_home, "discover", "--workspace", str(ws), "--json") == 0
    [fixme, todo] = orjson.loads(capsys.readouterr().out)["proposals"]
    assert cli(org_home, "discover", "accept", fixme["id"], "--max-iterations", "2") == 2
    assert capsys.readouterr().err.startswith("error[bad_arguments]: --max-iterations changes the proposal: add --edit")
    assert cli(org_home, "discover", "accept", fixme["id"], "--edit", "--goal", "guard mean() against []",
               "--verify", "true", "--max-iterations", "2", "--backend", "command") == 0
    [item] = read_rows(org_home.db_path, "SELECT goal, verify, caps FROM work_items")
    assert item["goal"] == "guard mean() against []" and orjson.loads(item["verify"]) == ["true"]
    assert orjson.loads(item["caps"])["max_iterations"] == 2
    # a proposal with no verify command cannot be submitted as it is: a coded error, and it stays open
    assert cli(org_home, "discover", "accept", todo["id"], "--edit", "--backend", "command") == 1
    assert "error[bad_submit]" in capsys.readouterr().err
    assert read_rows(org_home.db_path, "SELECT status FROM proposals WHERE id = ?", (todo["id"],))[0]["status"] == "proposed"


@pytest.mark.timeout(180)
def test_nothing_starts_without_acceptance_unless_the_policy_names_the_kind_and_the_daily_cap_has_room(org_home, repo,
                                                                                                       capsys):
    ws, issues = repo
    scan = ["discover", "--workspace", str(ws), "--verify", PYTEST, "--issues", str(issues), "--json"]
    assert cli(org_home, *scan) == 0
    assert orjson.loads(capsys.readouterr().out)["auto_start"] is None
    assert read_rows(org_home.db_path, "SELECT id FROM work_items") == []
    # the policy names only todo: the recommended failing test is not started, the first todo would be,
    # but a daily cap below the proposal's cost budget has no room
    cfg_with(org_home, COMMAND_BACKEND + "[discover]\nauto_start = [\"todo\"]\n[limits]\ndaily_spend_usd = 1.0\n")
    assert cli(org_home, *scan) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["auto_start"]["started"] is False and "daily_spend_usd" in out["auto_start"]["why"]
    assert out["auto_start"]["proposal"] == next(p["id"] for p in out["proposals"] if p["kind"] == "todo")
    assert read_rows(org_home.db_path, "SELECT id FROM work_items") == []
    # room in the cap: the policy's kind starts, as discovery, signed by the policy; one per scan
    cfg_with(org_home, COMMAND_BACKEND + "[discover]\nauto_start = [\"failing_test\", \"todo\"]\n"
                       "[limits]\ndaily_spend_usd = 20.0\n")
    assert cli(org_home, *scan) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["auto_start"]["started"] is True
    [item] = read_rows(org_home.db_path, "SELECT * FROM work_items")
    started = next(p for p in out["proposals"] if p["id"] == out["auto_start"]["proposal"])
    assert started["kind"] == "failing_test" and item["origin_id"] == started["id"] and item["origin"] == "discovery"
    assert item["created_by"].endswith("via policy:discover.auto_start")


def test_a_dismissed_proposal_is_not_proposed_again(org_home, repo):
    ws, _ = repo
    cfg = cfg_with(org_home, COMMAND_BACKEND)
    first = P.record(org_home, cfg, ws, D.scan_all(ws, None, None, cfg=cfg, home=org_home))["proposals"][0]
    assert P.dismiss(org_home, first["id"], "not now")["changed"]
    assert not P.dismiss(org_home, first["id"])["changed"]
    again = P.record(org_home, cfg, ws, D.scan_all(ws, None, None, cfg=cfg, home=org_home))
    assert first["id"] not in [p["id"] for p in again["proposals"]] and again["held_back"] == 1
    with pytest.raises(Exception) as err:
        P.accept(org_home, cfg, first["id"])
    assert getattr(err.value, "code", None) == "proposal_closed"


def test_proposals_expire_when_a_newer_scan_no_longer_finds_them_or_after_the_days_set(org_home, repo):
    ws, issues = repo
    cfg = config_mod.load_config(org_home)
    shown = P.record(org_home, cfg, ws, D.scan_all(ws, None, issues, cfg=cfg, home=org_home))["proposals"]
    fixme = next(p for p in shown if p["kind"] == "fixme")
    (ws / "calc.py").write_text(CALC.replace("# FIXME: an empty list divides by zero", "if not xs: return 0"))
    # a scan without the issue list does not expire the issues: it did not read them
    later = P.record(org_home, cfg, ws, D.scan_all(ws, None, None, cfg=cfg, home=org_home))
    assert later["expired"] == [fixme["id"]]
    statuses = {r["id"]: r["status"] for r in read_rows(org_home.db_path, "SELECT id, status FROM proposals")}
    assert statuses[fixme["id"]] == "expired" and list(statuses.values()).count("proposed") == 3
    eight_days = StateWriter(org_home.db_path, "human", clock=lambda: time.time() + 8 * 86400)
    try:
        aged = P.record(org_home, cfg, ws, D.scan_all(ws, None, None, cfg=cfg, home=org_home), writer=eight_days)
    finally:
        eight_days.close()
    assert len(aged["expired"]) == 3                 # both issues lapsed; the TODO was refreshed, then lapsed too
    assert [p["kind"] for p in aged["proposals"]] == ["todo"]      # found again: proposed anew


@pytest.mark.parametrize("content, what", [
    ('{"title": "unclosed"', "is not JSON or JSON lines"),
    ('[{"title": ""}]', "item 1: no title"),
    ('{"title": "a"}\n{"title": "b", "labels": [3]}\n', "line 2: a label is neither"),
    ('[1, 2]', "item 1: not an object"),
    ('{"title": "a", "number": "7"}', "number is not an integer"),
])
def test_a_malformed_issues_file_is_one_coded_line(org_home, repo, tmp_path, capsys, content, what):
    ws, _ = repo
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert cli(org_home, "discover", "--workspace", str(ws), "--issues", str(bad)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error[bad_issues_file]: ") and what in err and " — " in err
    assert read_rows(org_home.db_path, "SELECT id FROM proposals") == []


def test_issue_lists_as_json_lines_and_a_missing_file_or_workspace_are_handled(org_home, repo, tmp_path, capsys):
    ws, _ = repo
    lines = tmp_path / "issues.jsonl"
    lines.write_text('{"title": "Crash on NaN", "labels": ["type: bug"]}\n\n{"title": "Docs", "body": "more"}\n')
    found = D.scan(ws, None, lines, None, cfg=config_mod.load_config(org_home), home=org_home)
    assert [(p.kind, p.title) for p in found if p.source == "issues"] == [("bug", "issue Crash on NaN"),
                                                                          ("issue", "issue Docs")]
    assert cli(org_home, "discover", "--workspace", str(ws), "--issues", str(tmp_path / "none.json")) == 1
    assert capsys.readouterr().err.startswith("error[issues_file_missing]: ")
    assert cli(org_home, "discover", "--workspace", str(tmp_path / "gone")) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error[workspace_missing]: ")
    assert cli(org_home, "discover", "show", "p-nothere") == 1
    assert capsys.readouterr().err.startswith("error[not_found]: ")


def test_open_proposals_show_in_status_and_the_needs_you_list(org_home, repo, capsys):
    ws, issues = repo
    assert cli(org_home, "discover", "--workspace", str(ws), "--issues", str(issues)) == 0
    out = capsys.readouterr().out
    assert "recommended:" in out and "bug" in out
    assert cli(org_home, "status") == 0
    assert "4 work proposal(s) from discovery" in capsys.readouterr().out
    assert cli(org_home, "status", "--json") == 0
    needs = orjson.loads(capsys.readouterr().out)["needs_you"]["proposals"]
    assert [p["kind"] for p in needs] == ["bug", "fixme", "todo", "issue"] and needs[0]["recommended"]
    assert cli(org_home, "discover", "list", "--json") == 0
    assert [p["id"] for p in orjson.loads(capsys.readouterr().out)] == [p["id"] for p in needs]
    conn = connect(org_home.db_path, readonly=True)           # what the dashboard's "needs you" draws
    try:
        assert [p["id"] for p in data.org(conn)["needs_you"]["proposals"]] == [p["id"] for p in needs]
    finally:
        conn.close()


DEMO = Path(__file__).resolve().parents[1] / "scripts" / "demo"


@pytest.mark.timeout(240)
def test_an_accepted_proposal_is_worked_by_a_real_org_to_goal_met_and_a_rescan_finds_nothing_failing():
    """The whole gate with real processes: the scan proposes, nothing runs, the human accepts, the
    org's loop-agent and eval-agent take the item to goal_met, and the failure is gone."""
    import shutil
    with running_org(ONE_AGENT) as home:
        ws = home.root.parent / "ws"
        shutil.copytree(DEMO / "project", ws)
        cfg = config_mod.load_config(home)
        verify = "python3 -m unittest -q"
        shown = P.record(home, cfg, ws, D.scan_all(ws, [verify], None, cfg=cfg, home=home))["proposals"]
        assert [p["kind"] for p in shown] == ["failing_test"] and shown[0]["evidence"]["exit_code"] == 1
        assert query(home, "SELECT id FROM work_items") == []
        done = P.accept(home, cfg, shown[0]["id"], P.Edits(backend=f"scripted:{DEMO / 'script.json'}",
                                                            caps=Caps(max_iterations=5)))
        item = wait_for(lambda: (r := query(home, "SELECT * FROM work_items WHERE id = ?", (done["work_id"],))[0])
                        ["status"] == "ended" and r, timeout=120, what=f"{done['work_id']} to end")
        assert item["stop_reason"] == "goal_met" and item["origin_id"] == shown[0]["id"]
        again = P.record(home, cfg, ws, D.scan_all(ws, [verify], None, cfg=cfg, home=home))
        assert again["found"] == 0 and again["proposals"] == []
