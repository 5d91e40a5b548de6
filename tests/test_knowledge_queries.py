"""state_db.queries.knowledge: raw and curated notes come back as frozen dataclasses with their
JSON columns decoded, the retro-id scheme and its SQL mirror agree, and each query asks what its
name says (order, filters, counts)."""
from __future__ import annotations

import dataclasses
import time

import pytest

from knowledge import consolidate as K
from knowledge.notes import has_retro, runs_without_retro, skip_retro, write_retro
from knowledge.thresholds import Thresholds
from state_db.queries import knowledge as Q
from state_db.vocab import Actor, StopReason
from tests.test_knowledge_helpers import ended_run, note, put_notes


@pytest.fixture
def curator(writer_for):
    return writer_for(Actor.CURATOR)


def test_raw_notes_are_frozen_typed_rows_with_their_evidence_decoded(writer_for, curator):
    (first,) = put_notes(writer_for, "r1", [note("Fact one.", "Judge one.", kind="failure", subject="check:pytest")])
    n = Q.raw_note(curator.conn, first)
    assert isinstance(n, Q.RawNote) and n.id == "rn-r1-0" and n.run_id == "r1"
    assert n.evidence["subject"] == "check:pytest" and n.kind == "failure" and n.status == "pending"
    assert n.text == "Fact one.\nJudge one." and n.curated_id is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        n.status = "archived"                                               # type: ignore[misc]
    assert Q.raw_note(curator.conn, "rn-nope-0") is None


def test_pending_notes_count_and_by_id_come_oldest_first(writer_for, curator):
    ids = []
    for run in ("r2", "r1", "r3"):
        ids += put_notes(writer_for, run, [note(f"Fact of {run}.", "Judge.")])
    assert [n.id for n in Q.pending_notes(curator.conn)] == ["rn-r2-0", "rn-r1-0", "rn-r3-0"]
    assert Q.count_pending_notes(curator.conn) == 3
    assert [n.run_id for n in Q.raw_notes(curator.conn, ["rn-r3-0", "rn-r2-0", "rn-none-0"])] == ["r2", "r3"]
    assert Q.raw_notes(curator.conn, []) == []


def test_curated_notes_and_members_after_consolidation(writer_for, curator):
    for k in range(5):
        put_notes(writer_for, f"r{k}", [note(f"Check `pytest -q` failed with ModuleNotFoundError in r{k}.",
                                             "Vendor the module.", kind="failure")])
    put_notes(writer_for, "fix1", [note("Changing calc.py made `pytest -q` pass.", "Fix the import.",
                                        kind="fix", subject="check:pytest -q")])
    before = Q.curated_version(curator.conn)
    result = K.consolidate(curator, Thresholds(raw_notes_to_consolidate=5))
    assert Q.pending_notes(curator.conn) == [] and Q.count_pending_notes(curator.conn) == 0
    notes = Q.curated_notes(curator.conn)
    assert {c.id for c in notes} == set(result.created) and Q.curated_version(curator.conn) != before
    failure = next(c for c in notes if c.kind == "failure")
    assert isinstance(failure.source_notes, tuple) and len(failure.source_notes) == 5
    assert failure.tier == "curated" and failure.score is None and failure.signals == {}
    assert Q.curated_note(curator.conn, failure.id) == failure
    assert Q.curated_notes(curator.conn, [failure.id]) == [failure]
    assert failure.encode()["source_notes"] == list(failure.source_notes)
    members = Q.members(curator.conn, [failure.id])
    assert [n.id for n in members[failure.id]] == list(failure.source_notes)
    assert all(n.curated_id == failure.id and n.status == "archived" for n in members[failure.id])
    assert set(Q.members(curator.conn)) == {c.id for c in notes}
    assert [n.id for n in Q.fix_notes_about(curator.conn, ["check:pytest -q"])] == ["rn-fix1-0"]
    assert Q.fix_notes_about(curator.conn, ["check:other"]) == [] and Q.fix_notes_about(curator.conn, []) == []
    assert Q.queued_patterns(curator.conn) == []
    with curator.transaction() as tx:
        tx.update("curated_notes", failure.id, tier="queued", score=2, updated_at=tx.now)
    (queued,) = Q.queued_patterns(curator.conn)
    assert queued.id == failure.id and queued.score == 2


def test_note_counts_by_status_kind_and_runs(writer_for, curator):
    put_notes(writer_for, "r1", [note("A.", "a.", kind="failure"), note("B.", "b.", kind="fix")])
    put_notes(writer_for, "r2", [note("C.", "c.", kind="failure")])
    counts = Q.note_counts(curator.conn)
    assert counts.by_status == {"pending": 3} and counts.by_kind == {"failure": 2, "fix": 1}
    assert counts.runs == 2 and counts.total == 3


def test_the_retro_id_scheme_and_its_sql_mirror_agree_across_continued_endings(writer_for, curator):
    ended_run(writer_for, "w1")
    assert Q.endings(curator.conn, "w1") == 0 and Q.note_id("w1", 0) == "rn-w1-0"
    assert Q.runs_without_retro(curator.conn) == ["w1"] and not has_retro(curator.conn, "w1")
    with curator.transaction() as tx:
        write_retro(tx, "w1", [note("First ending.", "Judge.")])
    assert Q.runs_without_retro(curator.conn) == [] and has_retro(curator.conn, "w1")
    with writer_for(Actor.HUMAN).transaction() as tx:            # as 'org continue' records an ending
        tx.insert("stop_history", {"work_id": "w1", "seq": 1, "stop_reason": StopReason.CANCELLED, "iterations": 0,
                                   "continued_by": "alice", "continued_at": time.time()})
    assert Q.endings(curator.conn, "w1") == 1 and Q.note_id("w1", 0, 1) == "rn-w1.1-0"
    assert Q.runs_without_retro(curator.conn) == ["w1"] == runs_without_retro(curator.conn)
    with curator.transaction() as tx:
        skip_retro(tx, "w1", "taught nothing")
    assert Q.runs_without_retro(curator.conn) == []


def test_runs_without_retro_leave_out_unrunnable_verify_and_respect_the_limit(writer_for, curator):
    for run in ("a", "b", "c"):
        ended_run(writer_for, run)
    with writer_for(Actor.HUMAN).transaction() as tx:
        tx.update("work_items", "b", stop_reason=StopReason.VERIFY_UNRUNNABLE)
    assert Q.runs_without_retro(curator.conn) == ["a", "c"]
    assert Q.runs_without_retro(curator.conn, limit=1) == ["a"]


def test_models_of_run_are_distinct_and_sorted(writer_for, curator):
    ended_run(writer_for, "r1")
    with curator.transaction() as tx:
        for k, model in enumerate(["m-b", "m-a", "m-b"]):
            tx.insert("model_calls", {"request_id": f"q{k}", "work_id": "r1", "model": model, "input_tokens": 1,
                                      "output_tokens": 1, "at": tx.now})
    assert Q.models_of_run(curator.conn, "r1") == ("m-a", "m-b")
    assert Q.models_of_run(curator.conn, "r2") == ()
