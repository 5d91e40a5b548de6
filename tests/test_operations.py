"""Operations are the only command API: each human command is a function in roles/operations
returning a typed result (a frozen dataclass), and ``org <command> --json`` prints exactly that
result's data for the same input. A write given the same idempotency key twice is the same
input: the CLI's replay prints what the operation's replay returns. ``org chat``'s tools and the
MCP tools call the same functions and get the same data."""
from __future__ import annotations

import dataclasses
import json

import orjson
import pytest

import scripts.cli.main as cli
from roles.operations import Result
from roles.operations import candidates as candidate_ops, skills as skill_ops
from roles.operations.cancel import Cancelled, cancel
from roles.operations.continue_run import ContinueRequest, Continued, continue_run
from roles.operations.decide import Decided, decide
from roles.operations.lifecycle import OrgResumed, OrgStopped
from roles.operations.submit import SubmitRequest, Submitted, submit
from scripts.cli.chat import run_operation
from scripts.cli.commands.resume import resume
from scripts.cli.commands.stop import stop
from scripts.cli.commands.suspend import suspend
from scripts.cli.mcp_tools import Caller, call as mcp_call
from state_db.kernel import config as config_mod
from state_db.kernel.errors import OrgError
from state_db.vocab import Actor, DecisionStatus
from state_db.writer import StateWriter
from tests.support.loop import ScriptedActs, engine, make_workspace, submit as insert_item
from tests.support.org import ONE_AGENT, query, running_org
from tests.test_skills_cli import proposed  # noqa: F401 - the fixture: three pending candidates
from state_db.queries.work import Caps

CHECK = "python3 -c 'import calc; assert calc.add(2, 3) == 5'"


def org_json(capsys, home, *argv):
    """``org --home H ARGV --json`` in this process: the JSON printed (it exits 0)."""
    capsys.readouterr()                      # what was printed before (library logs) is not the command's
    code = cli.main(["--home", str(home.root), *argv, "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def typed(result, cls):
    """The result is the typed one, frozen, and its data survives a JSON round trip unchanged."""
    assert isinstance(result, cls) and isinstance(result, Result) and dataclasses.is_dataclass(result)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(result, dataclasses.fields(result)[0].name, None)
    data = result.as_data()
    assert orjson.loads(orjson.dumps(data)) == data
    return data


def cfg_of(home):
    return config_mod.load_config(home)


def request(ws, key):
    return SubmitRequest(goal="make add() add", workspace=str(ws), verify=[CHECK], backend="command",
                         idempotency_key=key)


def test_submit_returns_submitted_and_the_cli_prints_its_data(capsys, org_home, tmp_path):
    ws = make_workspace(tmp_path)
    first = submit(org_home, cfg_of(org_home), request(ws, "k-submit"))
    assert not typed(first, Submitted)["replayed"] and first.status == "queued" and first.preflight is None
    assert first.org_status == "never started" and first["id"] == first.id      # read as data too
    printed = org_json(capsys, org_home, "submit", "make add() add", "--workspace", str(ws), "--verify", CHECK,
                       "--backend", "command", "--no-wait", "--idempotency-key", "k-submit")
    again = submit(org_home, cfg_of(org_home), request(ws, "k-submit"))
    assert printed == again.as_dict() and again.replayed and again.id == first.id
    assert set(printed) == {"id", "status", "caps", "defaults_applied", "workspace", "branch", "waiting_for",
                            "wake", "replayed", "idempotency_key", "org_status", "preflight", "caps_from"}


def test_cancel_returns_cancelled_and_the_cli_chat_and_mcp_get_the_same_data(capsys, org_home, tmp_path):
    wid = submit(org_home, cfg_of(org_home), request(make_workspace(tmp_path), None)).id
    done = cancel(org_home, cfg_of(org_home), wid, idempotency_key="k-cancel")
    data = typed(done, Cancelled)
    assert (done.status, done.stop_reason, done.changed) == ("ended", "cancelled", True) and "note" not in data
    printed = org_json(capsys, org_home, "cancel", wid, "--idempotency-key", "k-cancel")
    assert printed == cancel(org_home, cfg_of(org_home), wid, idempotency_key="k-cancel").as_dict()
    # a new key on an ended item: nothing changes, and every client gets the operation's data
    ended = cancel(org_home, cfg_of(org_home), wid).as_dict()
    assert ended == {"id": wid, "status": "ended", "stop_reason": "cancelled", "changed": False,
                     "wake": "not needed"}
    assert org_json(capsys, org_home, "cancel", wid) == ended
    failed, text = run_operation("cancel", {"id": wid}, str(org_home.root))
    assert not failed and json.loads(text) == ended
    (tmp_path / "mcp.toml").write_text('[mcp]\ntools = ["status", "cancel"]\n')
    assert mcp_call(Caller(org_home, config_mod.load(tmp_path / "mcp.toml"), "mcp:test"), "cancel", {"id": wid}) == ended
    # an expected failure is an OrgError, the same one line everywhere
    failed, text = run_operation("cancel", {"id": "w-none"}, str(org_home.root))
    assert failed and text.startswith("error[not_found]")
    with pytest.raises(OrgError):
        cancel(org_home, cfg_of(org_home), "w-none")


def test_a_running_item_cancel_has_a_note(capsys, org_home, tmp_path):
    wid = insert_item(org_home, make_workspace(tmp_path))        # dispatched to loop-agent-1
    done = cancel(org_home, cfg_of(org_home), wid, idempotency_key="k-run")
    assert typed(done, Cancelled)["note"] and done.stop_reason is None and done.status == "dispatched"
    assert org_json(capsys, org_home, "cancel", wid, "--idempotency-key", "k-run") == \
        cancel(org_home, cfg_of(org_home), wid, idempotency_key="k-run").as_dict()


@pytest.fixture
def decision(org_home, tmp_path):
    insert_item(org_home, make_workspace(tmp_path))
    w = StateWriter(org_home.db_path, Actor.LOOP_AGENT, "loop-agent-1")
    with w.transaction() as tx:
        tx.insert("decisions", {"id": "d-1", "work_id": "w1", "iteration": 1, "kind": "network",
                                "action": {"kind": "network", "command": "true", "reason": "r"},
                                "question": "network: run `true`", "status": DecisionStatus.PENDING,
                                "created_at": tx.now})
    w.close()
    return "d-1"


def test_decide_returns_decided_and_the_cli_prints_its_data(capsys, org_home, decision):
    done = decide(org_home, cfg_of(org_home), decision, "reject", "no network", idempotency_key="k-decide")
    assert typed(done, Decided) == {"id": "d-1", "work_id": "w1", "status": "rejected", "ended": None,
                                    "replayed": False, "wake": done.wake}
    printed = org_json(capsys, org_home, "decide", decision, "reject", "no network", "--idempotency-key", "k-decide")
    assert printed == decide(org_home, cfg_of(org_home), decision, "reject", "no network",
                             idempotency_key="k-decide").as_dict()
    assert printed["replayed"] is True


def test_continue_returns_continued_and_the_cli_prints_its_data(capsys, org_home, tmp_path):
    ws = make_workspace(tmp_path)
    insert_item(org_home, ws, caps={"max_iterations": 1}, verify=("false",))
    assert engine(org_home, "w1", ScriptedActs([[{"write": {"state": "a"}}]])).run().reason == "max_iterations"
    done = continue_run(org_home, cfg_of(org_home), ContinueRequest("w1", Caps(max_iterations=3), idempotency_key="k-go"))
    data = typed(done, Continued)
    assert (data["status"], data["stopped"], data["caps"], data["replayed"]) == \
        ("queued", "max_iterations", {"max_iterations": 3}, False)
    printed = org_json(capsys, org_home, "continue", "w1", "--max-iterations", "3", "--idempotency-key", "k-go")
    assert printed == continue_run(org_home, cfg_of(org_home), ContinueRequest(
        "w1", Caps(max_iterations=3), idempotency_key="k-go")).as_dict()


def test_candidates_are_operations_the_cli_prints(capsys, org_home, proposed, tmp_path):  # noqa: F811
    listed = candidate_ops.listing(org_home)
    assert [c["id"] for c in typed(listed, candidate_ops.CandidateList)] == proposed
    assert org_json(capsys, org_home, "candidates", "list") == listed.as_data()
    assert org_json(capsys, org_home, "candidates", "list", "--all") == candidate_ops.listing(org_home, every=True).as_data()
    shown = candidate_ops.show(org_home, "fix-imports")
    assert typed(shown, candidate_ops.CandidateView)["id"] == proposed[0] and "name: fix-imports" in shown.skill_md
    assert org_json(capsys, org_home, "candidates", "show", "fix-imports") == shown.as_data()
    assert org_json(capsys, org_home, "candidates", "list", "--queued") == candidate_ops.queued(org_home).as_data()

    edited = candidate_ops.edit(org_home, cfg_of(org_home), proposed[2], description="Use when sets must be sorted.",
                                idempotency_key="k-edit")
    assert typed(edited, candidate_ops.CandidateEdited) == {"id": proposed[2], "changed": ["description"]}
    assert org_json(capsys, org_home, "candidates", "edit", proposed[2], "--description",
                    "Use when sets must be sorted.", "--idempotency-key", "k-edit") == edited.as_data()

    decided = candidate_ops.decide(org_home, cfg_of(org_home), [proposed[0]], "approve", idempotency_key="k-ok")
    data = typed(decided, candidate_ops.CandidateDecisions)
    assert [(r["status"], r["changed"]) for r in data["results"]] == [("approved", True)]
    assert (org_home.skills_dir / "fix-imports" / "SKILL.md").is_file()
    printed = org_json(capsys, org_home, "candidates", "approve", proposed[0], "--idempotency-key", "k-ok")
    assert printed == candidate_ops.decide(org_home, cfg_of(org_home), [proposed[0]], "approve",
                                           idempotency_key="k-ok").as_data()
    with pytest.raises(OrgError) as refused:
        candidate_ops.decide(org_home, cfg_of(org_home), [proposed[1]], "merge")
    assert refused.value.code == "bad_review"


def test_skills_are_operations_the_cli_prints(capsys, org_home, proposed, tmp_path):  # noqa: F811
    candidate_ops.decide(org_home, cfg_of(org_home), proposed[:2], "approve")
    listed = skill_ops.listing(org_home, cfg_of(org_home))
    assert [s["name"] for s in typed(listed, skill_ops.SkillList)] == ["fix-imports", "mock-network"]
    assert org_json(capsys, org_home, "skills", "list") == listed.as_data()
    shown = skill_ops.show(org_home, cfg_of(org_home), "fix-imports")
    assert typed(shown, skill_ops.SkillView)["origin"]["candidate"] == proposed[0]
    assert org_json(capsys, org_home, "skills", "show", "fix-imports") == shown.as_data()

    out = tmp_path / "export"
    exported = skill_ops.export(org_home, "fix-imports", out)
    assert typed(exported, skill_ops.Exported) == {"name": "fix-imports", "status": "active",
                                                    "file": str(out / "fix-imports" / "SKILL.md")}
    assert org_json(capsys, org_home, "skills", "export", "fix-imports", "--to", str(out)) == exported.as_data()

    retired = skill_ops.retire(org_home, "fix-imports", idempotency_key="k-retire")
    assert typed(retired, skill_ops.Retired)["changed"] is True
    assert org_json(capsys, org_home, "skills", "retire", "fix-imports", "--idempotency-key", "k-retire") == \
        retired.as_data()
    assert [s["name"] for s in skill_ops.listing(org_home, cfg_of(org_home)).rows] == ["mock-network"]


def _timeless(data: dict) -> dict:
    return {k: v for k, v in data.items() if k != "stopped_ms"}


@pytest.mark.timeout(120)
def test_suspend_resume_and_stop_of_a_running_org(capsys):
    with running_org(ONE_AGENT) as home:
        running = resume(home)
        assert typed(running, OrgResumed) == {"already_running": True} and running.running_pid
        assert org_json(capsys, home, "resume") == running.as_data()

        suspended = suspend(home, timeout_s=30)
        assert typed(suspended, OrgStopped) == {"status": "suspended", "stopped_ms": suspended.stopped_ms,
                                               "supervisor": "signalled"}
        intent = json.loads(query(home, "SELECT detail FROM org_session")[0]["detail"])
        assert (intent["intent"], intent["force"]) == ("suspend", False)     # recorded by the operation
        printed = org_json(capsys, home, "suspend")                          # nothing left to signal
        assert _timeless(printed) == _timeless(suspend(home, timeout_s=30).as_data()) == \
            {"status": "suspended", "supervisor": "absent"}

        started = org_json(capsys, home, "resume", "--timeout", "30")
        assert set(started) == set(OrgResumed(False, 1, 1.0, ()).as_dict()) and started["already_running"] is False
        assert resume(home).running_pid == started["pid"]

        stopped = stop(home, timeout_s=30)
        assert (typed(stopped, OrgStopped)["status"], stopped.supervisor) == ("stopped", "signalled")
        assert _timeless(org_json(capsys, home, "stop")) == _timeless(stop(home, timeout_s=30).as_data())
        with pytest.raises(OrgError) as refused:                             # a stop is not rewritten
            suspend(home, timeout_s=30)
        assert refused.value.code == "org_stopped"


def test_an_entry_point_prints_an_org_error_as_one_line_and_lets_a_bug_through(capsys, tmp_path):
    from roles.base import runtime

    class Refuses:
        __module__ = "roles.probe"

        def __init__(self, home, instance):
            raise OrgError("no keys for this role", code="keyring_missing", hint="start the org with start-org")

    class Breaks(Refuses):
        def __init__(self, home, instance):
            raise ValueError("a bug")

    assert runtime.main(Refuses, ["--home", str(tmp_path), "--instance", "x"]) == 1
    assert capsys.readouterr().err == "error[keyring_missing]: no keys for this role — start the org with start-org\n"
    with pytest.raises(ValueError):                   # not an OrgError: a bug, with its traceback
        runtime.main(Breaks, ["--home", str(tmp_path), "--instance", "x"])


def test_no_code_reads_an_error_code_by_duck_typing():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    duck = re.compile(r"(getattr|hasattr)\([^,()]+,\s*[\"']code[\"']")
    found = [f"{p.relative_to(root)}:{n}" for top in ("roles", "scripts", "state_db", "transport", "knowledge", "skills")
             for p in sorted((root / top).rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if duck.search(line)]
    assert not found, "read the code from an OrgError instead: " + ", ".join(found)


def test_submits_script_check_is_an_operation_that_names_the_bad_line(org_home, tmp_path, capsys):
    """A scripted backend's script is checked by roles.operations.submit.check_script (the CLI and
    the MCP tool call it): a bad one is refused with its code and line; other backends pass."""
    from roles.operations.submit import check_script
    bad = tmp_path / "bad.json"
    bad.write_text('{"acts": [\n  [{"text": "a"}],\n  oops\n]}')
    with pytest.raises(OrgError, match="line 3") as info:
        check_script(f"scripted:{bad}")
    assert info.value.code == "script_syntax"
    good = tmp_path / "good.json"
    good.write_text('{"acts": [[{"text": "done"}]]}')
    check_script(f"scripted:{good}")
    check_script("anthropic"), check_script(None), check_script(f"scripted:{tmp_path / 'absent.json'}")
    code = cli.main(["--home", str(org_home.root), "submit", "g", "--workspace", str(tmp_path), "--verify", "true",
                     "--backend", f"scripted:{bad}", "--no-wait"])
    assert code != 0 and "error[script_syntax]" in capsys.readouterr().err
