"""Skill candidates: merge-by-name, dated entries after terminal states, deferral, batches,
approval into SKILL.md, retirement proposals."""
from __future__ import annotations

import json
import time

import pytest

from knowledge.thresholds import Thresholds
from roles.coordinator.announce import announce
from roles.curator.pipeline import Pipeline
from skills import batches, candidates as C, registry
from skills.drafting import CandidateDraft
from skills.errors import CandidateClosed
from skills.skillmd import SECTIONS, parse
from state_db.kernel.errors import NotAllowed
from state_db.vocab import Actor
from tests.test_knowledge_helpers import note, put_notes, rows

BODY = "# {name}\n\n## When to use\n- x\n\n## Steps\n1. y\n\n## Criteria and thresholds\n- z\n\n## Pitfalls\n- w\n"


@pytest.fixture
def curator(writer_for):
    return writer_for(Actor.CURATOR)


@pytest.fixture
def human(writer_for):
    return writer_for(Actor.HUMAN)


def draft(writer_for, name, runs, score=4):
    """A draft whose evidence is one stored note per run."""
    notes = []
    for run in runs:
        if not rows(writer_for(Actor.CURATOR), "SELECT 1 FROM work_items WHERE id = ?", (run,)):
            put_notes(writer_for, run, [note(f"{name} happened in {run}.", "When it happens twice, act.")])
        notes.append((f"rn-{run}-0", run))
    return CandidateDraft(name, f"Use when {name} happens.", BODY.format(name=name), score,
                          {"score": score, "tier": "recommended"}, tuple(notes), "cn-x")


def propose(curator, d, k=3):
    with curator.transaction() as tx:
        return C.propose(tx, d, k)


def decide(human, ref, action):
    with human.transaction() as tx:
        return C.decide(tx, ref, action, human.os_user)


def status(curator, cid):
    return rows(curator, "SELECT status FROM skill_candidates WHERE id = ?", (cid,))[0]["status"]


def test_a_new_candidate_is_a_pending_entry_dated_by_its_id(writer_for, curator):
    cid, what = propose(curator, draft(writer_for, "fix-imports", ["a", "b", "c"]))
    assert what == "created" and cid == f"c-{time.strftime('%Y%m%d', time.gmtime())}-fix-imports"
    c = C.get(curator.conn, cid)
    assert c["status"] == "pending" and c["source_notes"] == ["rn-a-0", "rn-b-0", "rn-c-0"]


def test_a_candidate_with_a_pending_ones_name_merges_into_it_and_notes_already_covered_change_nothing(
        writer_for, curator):
    first, _ = propose(curator, draft(writer_for, "fix-imports", ["a", "b", "c"]))
    assert propose(curator, draft(writer_for, "fix-imports", ["a", "b"])) == (None, "unchanged")
    assert propose(curator, draft(writer_for, "fix-imports", ["b", "d"], score=5)) == (first, "merged-into-pending")
    live = C.get(curator.conn, first)
    assert live["status"] == "pending" and live["source_notes"] == ["rn-a-0", "rn-b-0", "rn-c-0", "rn-d-0"]
    assert live["score"] == 5
    merged = rows(curator, "SELECT * FROM skill_candidates WHERE status = 'merged'")
    assert len(merged) == 1 and merged[0]["merged_into"] == first
    assert len(rows(curator, "SELECT * FROM skill_candidates")) == 2          # nothing deleted, nothing lost


def test_a_deferred_candidate_absorbs_new_evidence_stays_deferred_and_never_counts_toward_a_batch(
        writer_for, curator, human):
    cid, _ = propose(curator, draft(writer_for, "defer-me", ["a", "b", "c"]))
    decide(human, cid, "defer")
    for k in range(4):
        propose(curator, draft(writer_for, f"other-{k}", [f"o{k}a", f"o{k}b", f"o{k}c"]))
    assert propose(curator, draft(writer_for, "defer-me", ["d", "e", "f"])) == (cid, "merged-into-deferred")
    assert status(curator, cid) == "deferred"
    with curator.transaction() as tx:
        assert batches.open_if_due(tx, 5) is None                  # 4 pending + 1 deferred: no batch
    propose(curator, draft(writer_for, "other-4", ["o4a", "o4b", "o4c"]))
    with curator.transaction() as tx:
        bid = batches.open_if_due(tx, 5)
    batched = rows(curator, "SELECT id FROM skill_candidates WHERE batch_id = ?", (bid,))
    assert len(batched) == 5 and cid not in {b["id"] for b in batched}


def test_after_a_rejection_a_new_dated_entry_comes_only_when_the_pattern_recurs_on_its_own(
        writer_for, curator, human):
    cid, _ = propose(curator, draft(writer_for, "retry-harder", ["a", "b", "c"]))
    decide(human, cid, "reject")
    assert propose(curator, draft(writer_for, "retry-harder", ["a", "b", "c", "d", "e"])) == (None, "waiting")
    new, what = propose(curator, draft(writer_for, "retry-harder", ["a", "b", "c", "d", "e", "f"]))
    assert what == "created" and new == f"{cid}-2"
    assert status(curator, cid) == "rejected" and status(curator, new) == "pending"


def test_evidence_for_an_active_skill_is_merged_into_the_skill(writer_for, curator, human, org_home):
    cid, _ = propose(curator, draft(writer_for, "fix-imports", ["a", "b", "c"]))
    decide(human, cid, "approve")
    assert propose(curator, draft(writer_for, "fix-imports", ["d"])) == (None, "merged-into-skill")
    merged = rows(curator, "SELECT merged_into FROM skill_candidates WHERE status = 'merged'")
    assert merged == [{"merged_into": "skill:fix-imports"}]
    assert registry.skill(curator.conn, "fix-imports")["origin"]["reinforced_by"] == ["rn-d-0"]


def test_candidate_states_are_a_state_machine_with_final_terminal_states(writer_for, curator, human):
    a, _ = propose(curator, draft(writer_for, "one", ["a", "b", "c"]))
    b, _ = propose(curator, draft(writer_for, "two", ["d", "e", "f"]))
    with pytest.raises(NotAllowed):
        decide(curator, a, "approve")                       # only a human approves
    assert decide(human, a, "approve")["changed"] is True
    assert decide(human, a, "approve")["changed"] is False
    with pytest.raises(CandidateClosed) as err:
        decide(human, a, "reject")
    assert err.value.code == "candidate_closed"
    decide(human, b, "defer")
    assert decide(human, b, "approve")["status"] == "approved"          # deferred → approved is allowed
    three = draft(writer_for, "three", ["g", "h", "i"])
    with pytest.raises(NotAllowed):
        with human.transaction() as tx:
            C.propose(tx, three, 3)                     # only the curator proposes
    decided = rows(curator, "SELECT actor, os_user FROM events WHERE kind = 'skill_candidates.approved'")
    assert decided == [{"actor": "human", "os_user": human.os_user}] * 2


def test_a_batch_opens_at_five_pending_candidates_is_announced_and_closes_when_reviewed(
        writer_for, curator, human):
    ids = [propose(curator, draft(writer_for, f"skill-{k}", [f"r{k}a", f"r{k}b", f"r{k}c"]))[0] for k in range(4)]
    with curator.transaction() as tx:
        assert batches.open_if_due(tx, 5) is None
    ids.append(propose(curator, draft(writer_for, "skill-4", ["r4a", "r4b", "r4c"]))[0])
    with curator.transaction() as tx:
        bid = batches.open_if_due(tx, 5)
    assert bid and {r["batch_id"] for r in rows(curator, "SELECT batch_id FROM skill_candidates")} == {bid}
    texts = announce(writer_for(Actor.COORDINATOR), 600)
    assert f"skill-candidate batch {bid} is open for review — 'org candidates'" in texts
    for k, cid in enumerate(ids):
        decide(human, cid, ["approve", "reject", "defer"][k % 3])
        with human.transaction() as tx:
            closed = batches.close_finished(tx)
        assert closed == ([bid] if k == 4 else [])


def test_approval_renders_skill_md_in_the_agent_skills_format_with_its_origin(writer_for, curator, human, org_home):
    cid, _ = propose(curator, draft(writer_for, "fix-imports", ["a", "b", "c"]))
    out = decide(human, cid, "approve")
    assert out["skill"] == {"name": "fix-imports", "path": "skills/fix-imports/SKILL.md", "new": True}
    path = registry.render_files(curator.conn, org_home.skills_dir, "fix-imports")
    assert path == org_home.skills_dir / "fix-imports" / "SKILL.md"
    text = path.read_text()
    assert text.startswith("---\nname: fix-imports\ndescription: \"Use when fix-imports happens.\"\n")
    parsed = parse(text)
    assert (parsed.name, parsed.description) == ("fix-imports", "Use when fix-imports happens.")
    assert parsed.metadata["origin-candidate"] == cid and parsed.metadata["origin-runs"] == "a, b, c"
    assert all(f"## {s}" in parsed.body for s in SECTIONS)
    origin = json.loads((path.parent / "origin.json").read_text())
    assert origin["source_notes"] == ["rn-a-0", "rn-b-0", "rn-c-0"] and origin["approved_by"] == human.os_user


def test_skill_md_is_rendered_from_state_after_a_crash_between_the_db_write_and_the_file_write(
        writer_for, curator, human, org_home):
    cid, _ = propose(curator, draft(writer_for, "fix-imports", ["a", "b", "c"]))
    decide(human, cid, "approve")                       # committed; the process "dies" before the file write
    target = org_home.skills_dir / "fix-imports" / "SKILL.md"
    assert not target.exists()
    report = Pipeline(curator, Thresholds(), org_home.skills_dir).run()
    assert report.rendered == ["fix-imports"] and parse(target.read_text()).name == "fix-imports"
    assert Pipeline(curator, Thresholds(), org_home.skills_dir).run().rendered == []


def test_a_skill_unused_for_90_days_is_proposed_for_retirement_once_and_never_retired_by_itself(
        writer_for, human, org_home):
    now = [1_000_000.0]
    clocked = writer_for(Actor.CURATOR, clock=lambda: now[0])
    cid, _ = propose(clocked, draft(writer_for, "old-trick", ["a", "b", "c"]))
    with writer_for(Actor.HUMAN, clock=lambda: now[0]).transaction() as tx:
        C.decide(tx, cid, "approve", "someone")
    day = 86400
    now[0] += 89.9 * day
    assert not registry.listing(clocked.conn, now[0], 90)[0]["retirement_proposed"]
    with clocked.transaction() as tx:
        assert registry.propose_retirements(tx, 90) == []
    now[0] += 0.2 * day
    (row,) = registry.listing(clocked.conn, now[0], 90)
    assert row["retirement_proposed"] and row["idle_days"] == 90.1
    for expected in (["old-trick"], []):                      # proposed once per idle stretch
        with clocked.transaction() as tx:
            assert registry.propose_retirements(tx, 90) == expected
    assert registry.skill(clocked.conn, "old-trick")["status"] == "active"
    with human.transaction() as tx:
        assert registry.retire(tx, "old-trick") is True
    assert registry.listing(clocked.conn, now[0], 90) == []


def test_a_drafted_candidate_has_the_four_sections_and_learns_the_fix_from_other_runs(org_home, tmp_path, writer_for):
    from tests.test_knowledge_helpers import BAD, BAD2, BAD_AGAIN, GOOD, run_loop
    pipe = Pipeline(writer_for(Actor.CURATOR), Thresholds(raw_notes_to_consolidate=1), org_home.skills_dir)
    run_loop(org_home, tmp_path, "fixed", [[BAD], [BAD2], [GOOD]])         # one run found the fix
    for run in ("w1", "w2", "w3"):
        run_loop(org_home, tmp_path, run, [[BAD], [BAD_AGAIN]])
    pipe.run()
    (c,) = C.listing(pipe.w.conn)
    text = parse(f"---\nname: {c['name']}\ndescription: {json.dumps(c['description'])}\n---\n{c['body']}")
    assert text.description.startswith("Use for work items verified by `python")
    assert all(f"## {s}" in text.body for s in SECTIONS)
    assert "Look at calc.py first: changing it resolved this failure" in text.body and "(run fixed)." in text.body
    assert "- Seen in 4 independent run(s): fixed, w1, w2, w3." in text.body
    pitfalls = text.body.split("## Pitfalls")[1]
    assert "it did not help in run(s) w1, w2, w3." in pitfalls and "Retrying did not help" not in pitfalls
