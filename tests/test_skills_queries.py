"""state_db.queries.skills: candidates, batches and skills come back as frozen dataclasses with
their JSON columns decoded; each query asks what its name says (order, status filters, joins),
and use is counted from committed prompt manifests once per run."""
from __future__ import annotations

import dataclasses

import pytest

from roles.loop_agent.engine import LoopSettings
from skills import batches, candidates as C
from skills.drafting import CandidateDraft
from state_db.queries import skills as Q
from state_db.vocab import Actor
from tests.test_knowledge_helpers import GOOD, note, put_notes, run_loop

BODY = "## When to use\n- {name}\n\n## Steps\n1. do it\n"


def propose(writer_for, name: str, runs: list[str], *, score: int = 4) -> str | None:
    for run in runs:
        put_notes(writer_for, run, [note(f"{name} in {run}.", "When it fails twice, act.")])
    d = CandidateDraft(name, f"Use when {name} is needed.", BODY.format(name=name), score,
                       {"trigger": {"ok": True, "why": "names a check"}}, tuple((f"rn-{r}-0", r) for r in runs),
                       f"cn-{name}")
    with writer_for(Actor.CURATOR).transaction() as tx:
        return C.propose(tx, d, 3)[0]


@pytest.fixture
def curator(writer_for):
    return writer_for(Actor.CURATOR)


def test_a_candidate_is_a_frozen_typed_row_that_round_trips_through_its_plain_data(writer_for, curator):
    cid = propose(writer_for, "fix-imports", ["a1", "a2", "a3"])
    c = Q.candidate(curator.conn, cid)
    assert isinstance(c, Q.Candidate) and c.name == "fix-imports" and c.status == "pending" and c.live
    assert c.source_notes == ("rn-a1-0", "rn-a2-0", "rn-a3-0") and c.curated_id == "cn-fix-imports"
    assert c.signals["trigger"]["ok"] is True and c.batch_id is None and c.decided_by is None
    assert Q.Candidate.decode(c.encode()) == c and c.encode()["source_notes"] == list(c.source_notes)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.status = "approved"                                               # type: ignore[misc]
    assert Q.candidate(curator.conn, "c-nope") is None and not Q.candidate_id_taken(curator.conn, "c-nope")
    assert Q.candidate_id_taken(curator.conn, cid)


def test_candidates_by_name_status_and_liveness(writer_for, curator):
    first = propose(writer_for, "fix-imports", ["a1", "a2", "a3"])
    propose(writer_for, "fix-imports", ["a4"])                              # merged into the live one
    other = propose(writer_for, "sort-sets", ["b1", "b2", "b3"])
    named = Q.candidates_named(curator.conn, "fix-imports")
    assert [c.status for c in named] == ["merged", "pending"] and named[0].merged_into == first
    assert Q.live_candidate_named(curator.conn, "fix-imports").id == first
    assert [c.id for c in Q.candidates(curator.conn, ["pending"])] == [first, other]
    assert len(Q.candidates(curator.conn)) == 3 and Q.candidates(curator.conn, ["approved"]) == []
    with writer_for(Actor.HUMAN).transaction() as tx:
        C.decide(tx, first, "reject", "alice")
    assert Q.live_candidate_named(curator.conn, "fix-imports") is None
    rejected = Q.candidate(curator.conn, first)
    assert not rejected.live and rejected.decided_by == "alice" and rejected.decided_at is not None


def test_batches_unbatched_candidates_and_finished_batches(writer_for, curator):
    ids = [propose(writer_for, name, [f"{name}-{k}" for k in range(3)]) for name in ("aa-one", "bb-two")]
    assert Q.unbatched(curator.conn) == ids and Q.batch_count(curator.conn) == 0
    with curator.transaction() as tx:
        bid = batches.open_if_due(tx, 2)
    (batch,) = Q.batches(curator.conn)
    assert isinstance(batch, Q.Batch) and batch.id == bid and batch.status == "open" and batch.closed_at is None
    assert Q.unbatched(curator.conn) == [] and Q.batch_count(curator.conn) == 1
    assert Q.batches(curator.conn, "closed") == [] and Q.finished_batches(curator.conn) == []
    with writer_for(Actor.HUMAN).transaction() as tx:
        C.decide(tx, ids[0], "approve", "alice")
        C.decide(tx, ids[1], "defer", "alice")
    assert [b.id for b in Q.finished_batches(curator.conn)] == [bid]


def test_a_skill_carries_its_origin_decoded_and_the_approved_candidates_text(writer_for, curator):
    cid = propose(writer_for, "fix-imports", ["a1", "a2", "a3"])
    before = Q.active_skills_version(curator.conn)
    with writer_for(Actor.HUMAN).transaction() as tx:
        C.decide(tx, cid, "approve", "alice")
    s = Q.skill(curator.conn, "fix-imports")
    assert isinstance(s, Q.Skill) and s.active and s.candidate_id == cid and s.path == "skills/fix-imports/SKILL.md"
    assert s.origin["runs"] == ["a1", "a2", "a3"] and s.origin["approved_by"] == "alice"
    assert s.description == "Use when fix-imports is needed." and s.body.startswith("## When to use")
    assert s.use_count == 0 and s.last_used_at is None and Q.Skill.decode(s.encode()) == s
    assert Q.active_skills_version(curator.conn) == (1, f"fix-imports:{cid}") != before
    with writer_for(Actor.HUMAN).transaction() as tx:
        tx.set_status("skills", "fix-imports", "retired")
    assert Q.skills(curator.conn) == [] and [x.name for x in Q.skills(curator.conn, include_retired=True)] == \
        ["fix-imports"]
    assert Q.skill_names(curator.conn) == ["fix-imports"] and Q.active_skills_version(curator.conn) == (0, None)
    assert Q.skill(curator.conn, "nope") is None


def test_skill_use_counts_distinct_runs_from_committed_manifests(org_home, tmp_path, writer_for, curator):
    settings = LoopSettings(skills=[("fix-calc", "Check calc.add."), ("mock-net", "Mock the network.")])
    run_loop(org_home, tmp_path, "w1", [[GOOD]], settings=settings)
    run_loop(org_home, tmp_path, "w2", [[GOOD]], settings=LoopSettings(skills=[("fix-calc", "Check calc.add.")]))
    assert Q.skills_carried_by(curator.conn, "w1") == ["fix-calc", "mock-net"]
    uses = Q.skill_uses(curator.conn)
    assert (uses["fix-calc"].runs, uses["mock-net"].runs) == (2, 1)
    last = curator.conn.execute("SELECT MAX(committed_at) FROM iterations").fetchone()[0]
    assert uses["fix-calc"].last_used_at == last
    assert set(Q.skill_uses(curator.conn, ["mock-net"])) == {"mock-net"}
    assert Q.skills_carried_by(curator.conn, "nope") == []


def test_retirement_proposed_since_reads_the_journal(writer_for, curator):
    with curator.transaction() as tx:
        at = tx.now
        tx.journal("skills.retirement_proposed", "old-trick", {"idle_days": 91})
    assert Q.retirement_proposed_since(curator.conn, "old-trick", at)
    assert not Q.retirement_proposed_since(curator.conn, "old-trick", at + 1)
    assert not Q.retirement_proposed_since(curator.conn, "other", 0)
