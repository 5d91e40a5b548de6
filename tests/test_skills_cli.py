"""``org candidates`` and ``org skills`` in-process through scripts.cli.main: durable human
writes recording who and when, idempotent, with clean coded errors."""
from __future__ import annotations

import json
import sys

import pytest

import scripts.cli.main as cli
from skills import candidates as C, registry
from skills.drafting import CandidateDraft
from skills.skillmd import parse
from state_db.vocab import Actor
from tests.test_knowledge_helpers import note, put_notes, rows

BODY = "## When to use\n- {name}\n\n## Steps\n1. do it\n\n## Criteria and thresholds\n- twice\n\n## Pitfalls\n- none\n"


@pytest.fixture(autouse=True)
def commands(monkeypatch):
    assert {"candidates", "skills"} <= set(cli.COMMANDS)


@pytest.fixture
def proposed(writer_for):
    """Three pending candidates, as the curator proposes them."""
    curator = writer_for(Actor.CURATOR)
    ids = []
    for k, name in enumerate(["fix-imports", "mock-network", "sort-sets"]):
        runs = [f"{name}-{i}" for i in range(3)]
        for run in runs:
            put_notes(writer_for, run, [note(f"{name} in {run}.", "When it fails twice, act.")])
        d = CandidateDraft(name, f"Use when {name} is needed.", BODY.format(name=name), 4,
                           {"trigger": {"ok": True, "why": "names `pytest -q`"}},
                           tuple((f"rn-{r}-0", r) for r in runs), "cn-x")
        with curator.transaction() as tx:
            ids.append(C.propose(tx, d, 3)[0])
    return ids


def org(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_every_new_command_has_help_text():
    parser = cli.build_parser()
    for name in ("candidates", "skills"):
        sub = parser._subparsers._group_actions[0].choices[name]
        assert sub.description and all(a.help for a in sub._actions if a.dest != "help")
        actions = next(a for a in sub._actions if a.dest == "action").choices
        for action in actions.values():
            assert action.description is None or action.description
            assert all(a.help for a in action._actions), action.prog


def test_list_and_show_pending_candidates(capsys, proposed):
    code, out, _ = org(capsys, "candidates")
    assert code == 0 and all(cid in out for cid in proposed) and "pending" in out
    code, out, _ = org(capsys, "candidates", "list", "--json")
    assert [c["id"] for c in json.loads(out)] == proposed
    assert org(capsys, "candidates", "list", "--queued")[1].strip() == "no queued patterns"
    code, out, _ = org(capsys, "candidates", "show", proposed[0])
    assert code == 0 and "[x] trigger: names `pytest -q`" in out and "name: fix-imports" in out


def test_approve_reject_defer_are_durable_human_writes_recording_who_and_when(capsys, proposed, org_home, writer_for):
    a, r, d = proposed
    code, out, _ = org(capsys, "candidates", "approve", a)
    assert code == 0 and f"{a} (fix-imports): approved" in out
    assert parse((org_home.skills_dir / "fix-imports" / "SKILL.md").read_text()).name == "fix-imports"
    assert org(capsys, "candidates", "reject", r)[0] == 0
    assert org(capsys, "candidates", "defer", "sort-sets")[0] == 0           # by name, too
    conn = writer_for(Actor.CURATOR).conn
    got = {c["id"]: c for c in (C.get(conn, x) for x in proposed)}
    assert [got[x]["status"] for x in proposed] == ["approved", "rejected", "deferred"]
    human = writer_for(Actor.HUMAN)
    assert all(got[x]["decided_by"] == human.os_user and got[x]["decided_at"] for x in proposed)
    events = rows(human, "SELECT kind, actor, os_user FROM events WHERE kind LIKE 'skill_candidates.%' "
                         "AND kind != 'skill_candidates.created' ORDER BY id")
    assert [e["kind"] for e in events] == ["skill_candidates.approved", "skill_candidates.rejected",
                                           "skill_candidates.deferred"]
    assert {(e["actor"], e["os_user"]) for e in events} == {("human", human.os_user)}
    code, _, err = org(capsys, "candidates", "reject", a)
    assert code == 1 and err.startswith("error[candidate_closed]: candidate") and "Traceback" not in err


def test_the_same_idempotency_key_decides_once(capsys, proposed, writer_for):
    for _ in range(2):
        assert org(capsys, "candidates", "approve", proposed[0], "--idempotency-key", "k1")[0] == 0
    assert len(rows(writer_for(Actor.HUMAN), "SELECT * FROM events WHERE kind = 'skill_candidates.approved'")) == 1


def test_edit_without_an_editor_changes_name_description_and_body(capsys, proposed, tmp_path, writer_for):
    body = tmp_path / "body.md"
    body.write_text("## When to use\n- imports break\n\n## Steps\n1. vendor it\n")
    code, out, _ = org(capsys, "candidates", "edit", proposed[0], "--name", "vendor-modules",
                       "--description", "Vendor a module the sandbox cannot install.", "--body-file", str(body))
    assert code == 0 and "changed body, description, name" in out
    c = C.get(writer_for(Actor.CURATOR).conn, proposed[0])
    assert (c["name"], c["description"], c["body"]) == ("vendor-modules", "Vendor a module the sandbox cannot install.",
                                                        body.read_text())
    code, _, err = org(capsys, "candidates", "edit", proposed[0], "--name", "Bad Name")
    assert code == 1 and err.startswith("error[bad_skill_name]")


def test_edit_opens_the_editor_on_the_skill_md_text(capsys, proposed, tmp_path, monkeypatch, writer_for):
    editor = tmp_path / "editor.py"
    editor.write_text("import sys\np = sys.argv[1]\nt = open(p).read()\n"
                      "open(p, 'w').write(t.replace('Use when fix-imports is needed.', 'Edited in an editor.'))\n")
    monkeypatch.setenv("EDITOR", f"{sys.executable} {editor}")
    monkeypatch.delenv("VISUAL", raising=False)
    code, out, _ = org(capsys, "candidates", "edit", proposed[0])
    assert code == 0 and "changed description" in out
    assert C.get(writer_for(Actor.CURATOR).conn, proposed[0])["description"] == "Edited in an editor."


def test_skills_list_show_and_retire_with_use_counts(capsys, proposed, writer_for):
    org(capsys, "candidates", "approve", proposed[0], proposed[1])
    code, out, _ = org(capsys, "skills")
    assert code == 0 and "fix-imports" in out and "mock-network" in out and "never" in out
    code, out, _ = org(capsys, "skills", "list", "--json")
    assert [(s["name"], s["use_count"], s["retirement_proposed"]) for s in json.loads(out)] == \
        [("fix-imports", 0, False), ("mock-network", 0, False)]
    code, out, _ = org(capsys, "skills", "show", "fix-imports")
    assert code == 0 and f"candidate {proposed[0]}" in out and "fix-imports-0, fix-imports-1" in out
    assert org(capsys, "skills", "retire", "fix-imports")[0] == 0
    assert registry.skill(writer_for(Actor.CURATOR).conn, "fix-imports")["status"] == "retired"
    code, out, _ = org(capsys, "skills", "list", "--json")
    assert [s["name"] for s in json.loads(out)] == ["mock-network"]
    code, _, err = org(capsys, "skills", "show", "nope")
    assert code == 1 and err.startswith("error[skill_not_found]")


def test_a_rejection_carries_its_reason_and_a_reason_given_as_an_id_says_where_it_goes(capsys, proposed, writer_for):
    r = proposed[1]
    code, _, err = org(capsys, "candidates", "reject", r, "duplicate of the handle- one")
    assert code == 1 and err.startswith("error[candidate_not_found]") and "--reason" in err
    assert C.get(writer_for(Actor.CURATOR).conn, r)["status"] == "pending"      # nothing was written
    code, out, _ = org(capsys, "candidates", "reject", r, "--reason", "duplicate of the handle- one")
    assert code == 0 and f"{r} (mock-network): rejected" in out
    got = C.get(writer_for(Actor.CURATOR).conn, r)
    assert got["status"] == "rejected" and got["decided_reason"] == "duplicate of the handle- one"
    code, out, _ = org(capsys, "candidates", "show", r)
    assert code == 0 and out.splitlines()[0].endswith(": duplicate of the handle- one")
    events = rows(writer_for(Actor.HUMAN), "SELECT data FROM events WHERE kind = 'skill_candidates.rejected'")
    assert len(events) == 1 and "duplicate of the handle- one" in events[0]["data"]


def test_the_chat_tool_and_slash_command_pass_the_reason_on(proposed, org_home, writer_for):
    from scripts.cli.chat import handle_slash, run_operation

    failed, out = run_operation("candidates", {"action": "reject", "ids": [proposed[0]], "reason": "too narrow"},
                                str(org_home.root))
    assert not failed, out
    said = handle_slash(f'/candidates defer {proposed[1]} --reason "ask again next month"', str(org_home.root))
    assert "deferred" in said, said
    conn = writer_for(Actor.CURATOR).conn
    assert [C.get(conn, x)["decided_reason"] for x in proposed[:2]] == ["too narrow", "ask again next month"]
