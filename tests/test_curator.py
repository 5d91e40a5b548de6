"""The curator process: triggers (a run ended, a wake, the slow check), single flight,
thresholds from org.toml, and the whole learning loop in-process."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import scripts.cli.main as cli
from roles.coordinator.announce import announce
from roles.curator.process import CuratorProcess
from roles.loop_agent.engine import LoopSettings
from skills import select
from skills.skillmd import parse
from state_db.vocab import Actor
from tests.support.loop import CHECK
from tests.test_knowledge_helpers import BAD, BAD_AGAIN, GOOD, rows, run_loop
from transport.kinds import Kind
from transport.stub import StubTransport

CONFIG = """
[knowledge]
raw_notes_to_consolidate = 2
notes_per_pattern = 3
candidates_per_batch = 1
skill_unused_days = 30
"""


@pytest.fixture
def curator(org_home):
    org_home.config_path.write_text(CONFIG)
    proc = CuratorProcess(org_home, "curator", transport=StubTransport("curator"))
    passes = []
    real = proc.pipeline.run
    proc.pipeline.run = lambda **kw: passes.append(kw) or real(**kw)
    proc.passes = passes
    yield proc
    proc.writer.close()


def test_thresholds_come_from_the_knowledge_section_of_org_toml(curator):
    t = curator.pipeline.t
    assert (t.raw_notes_to_consolidate, t.notes_per_pattern, t.candidates_per_batch, t.skill_unused_days) == \
        (2, 3, 1, 30)


def test_an_ended_run_triggers_a_pass_on_the_next_tick_and_a_quiet_journal_does_not(org_home, tmp_path, curator):
    curator.reconcile()                                    # the first tick is also the first slow check
    assert curator.passes == [{"slow": True}]
    curator.reconcile()
    assert len(curator.passes) == 1                        # nothing happened: no pass
    run_loop(org_home, tmp_path, "w1", [[BAD], [GOOD]])
    curator.reconcile()
    assert curator.passes[-1] == {"slow": False}
    assert [r["run_id"] for r in rows(curator.writer, "SELECT DISTINCT run_id FROM raw_notes")] == ["w1"]


def test_a_wake_and_the_slow_periodic_check_each_trigger_a_pass(curator):
    curator.reconcile()
    curator.handle(SimpleNamespace(kind=Kind.WAKE))
    assert curator.passes[-1] == {"slow": False} and len(curator.passes) == 2
    curator.next_slow = 0.0
    curator.reconcile()
    assert curator.passes[-1] == {"slow": True}


def test_passes_are_single_flight(curator):
    with curator.pipeline._flight:                         # a pass is running
        assert curator.pipeline.run().skipped
    assert not curator.pipeline.run().skipped


def test_the_learning_loop_from_recurring_failures_to_a_skill_the_next_run_carries(
        org_home, tmp_path, curator, writer_for, capsys, monkeypatch):
    for run in ("w1", "w2", "w3"):
        run_loop(org_home, tmp_path, run, [[BAD], [BAD_AGAIN]])
        curator.reconcile()
    (cand,) = rows(curator.writer, "SELECT * FROM skill_candidates")
    (batch,) = rows(curator.writer, "SELECT * FROM candidate_batches")
    assert cand["status"] == "pending" and cand["batch_id"] == batch["id"] and batch["status"] == "open"
    assert any(batch["id"] in t for t in announce(writer_for(Actor.COORDINATOR), 600))
    (told,) = curator.transport.messages(Kind.BATCH_OPENED, recipient="coordinator")     # the in-process stub
    assert told.payload == {"batch_id": batch["id"]}
    assert "candidates" in cli.COMMANDS
    assert cli.main(["candidates", "approve", cand["id"]]) == 0
    skill_md = org_home.skills_dir / cand["name"] / "SKILL.md"
    assert parse(skill_md.read_text()).name == cand["name"]
    assert rows(curator.writer, "SELECT status FROM candidate_batches") == [{"status": "closed"}]

    carried = select.choose_skills(curator.writer.conn, select.context_of({"goal": "make add() add",
                                                                            "verify": [CHECK]}))
    assert [name for name, _ in carried] == [cand["name"]]
    run_loop(org_home, tmp_path, "w4", [[BAD], [GOOD]], settings=LoopSettings(skills=carried))
    prompts = rows(curator.writer, "SELECT prompt FROM iterations WHERE work_id = 'w4'")
    assert all(f'"skills":["{cand["name"]}"]' in p["prompt"] for p in prompts)
    assert select.record_use(writer_for(Actor.LOOP_AGENT, "loop-agent-1"), "w4") == {cand["name"]: 1}
    curator.reconcile()                                    # w4's retro says whether the skill helped
    context = rows(curator.writer, "SELECT judgment FROM raw_notes WHERE run_id = 'w4' "
                                   "AND json_extract(evidence, '$.kind') = 'context'")
    assert context == [{"judgment": f"Skill {cand['name']} helped: the run reached goal_met with it in the "
                                    "prompt (no act refers to it)."}]
