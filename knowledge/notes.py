"""Raw notes: the four-part form (fact / judgment / rationale / applicability) with evidence.

A retro's notes are written in one transaction with deterministic ids ``rn-<run>-<k>``; the
primary key makes a second retro of the same run impossible (``RetroExists``), whoever tries
and however often the curator restarts. A run reopened by ``org continue`` ends more than once:
each ending gets its own retro, ``rn-<run>.<e>-<k>`` for its e-th continuation (``ending``). Raw notes are never edited or deleted: consolidation
only moves them ``pending → archived`` and records the curated note they went into.
"""
from __future__ import annotations

import sqlite3
from dataclasses import asdict, dataclass, field
from typing import Any

from knowledge.errors import NoteInvalid, RetroExists, RunNotEnded
from state_db.kernel.errors import Conflict
from state_db.queries import knowledge as Q
from state_db.queries import work
from state_db.queries.knowledge import RawNote, note_id, note_kind  # noqa: F401 - the note types live with their queries
from state_db.vocab import NoteKind, NoteStatus, WorkStatus
from state_db.text import clean

PARTS = ("fact", "judgment", "rationale", "applicability")
PART_MAX_CHARS = 2000

#: ``evidence["kind"]`` of the notes a retro writes (see knowledge/retro.py).
KINDS = tuple(NoteKind)


@dataclass(frozen=True)
class NoteDraft:
    """A note before it is stored.

    Args:
        fact, judgment, rationale, applicability: the four parts (non-empty text).
        evidence: JSON-able dict; retros put ``kind``, ``topic``, ``subject``, ``iterations``,
            ``checks`` and ``trigger`` here.
    """

    fact: str
    judgment: str
    rationale: str
    applicability: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> "NoteDraft":
        for part in PARTS:
            text = getattr(self, part)
            if not isinstance(text, str) or not text.strip():
                raise NoteInvalid(part, "is empty")
            if len(text) > PART_MAX_CHARS:
                raise NoteInvalid(part, f"is longer than {PART_MAX_CHARS} characters")
        return self

    @property
    def kind(self) -> str:
        return note_kind(self.evidence)

    def encode(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def decode(cls, data: dict[str, Any]) -> "NoteDraft":
        return cls(str(data["fact"]), str(data["judgment"]), str(data["rationale"]),
                   str(data["applicability"]), dict(data.get("evidence") or {}))


def ending(conn: sqlite3.Connection, run_id: str) -> int:
    """How many times the run was continued: its current ending is that one (0: never)."""
    return Q.endings(conn, run_id)


def write_retro(tx, run_id: str, drafts: list[NoteDraft], *, author: str = "derived") -> list[str]:
    """Insert a run's retro notes in ``tx`` (a curator transaction); returns their ids.

    Raises:
        RunNotEnded: the run is missing or not ended.
        RetroExists: the run has a retro already (nothing written).
        NoteInvalid: a draft misses a part.
    """
    run = work.item(tx.conn, run_id)
    if run is None or run.status != WorkStatus.ENDED:
        raise RunNotEnded(run_id, None if run is None else run.status)
    if not drafts:
        raise NoteInvalid("fact", "is missing: a retro has at least one note")
    ids, e = [], ending(tx.conn, run_id)
    for k, draft in enumerate(drafts):
        draft.validate()
        # whatever wrote the draft (derived from check output, or a model), no terminal control
        # sequence enters knowledge: notes feed curated notes, skills and prompts
        row = {"id": note_id(run_id, k, e), "run_id": run_id, "fact": clean(draft.fact),
               "judgment": clean(draft.judgment), "rationale": clean(draft.rationale),
               "applicability": clean(draft.applicability),
               "evidence": {**draft.evidence, "run": run_id, "author": author},
               "status": NoteStatus.PENDING, "created_at": tx.now}
        try:
            tx.insert("raw_notes", row)
        except Conflict:
            raise RetroExists(run_id) from None
        ids.append(row["id"])
    tx.journal("retro.written", run_id, {"notes": ids, "author": author})
    return ids


def skip_retro(tx, run_id: str, why: str) -> None:
    """Record that the run's current ending teaches nothing (``retro.skipped``): it gets no notes
    and is not offered for a retro again."""
    tx.journal("retro.skipped", run_id, {"ending": ending(tx.conn, run_id), "why": why})


def has_retro(conn: sqlite3.Connection, run_id: str) -> bool:
    """True once the retro of the run's current ending is written."""
    return Q.raw_note(conn, note_id(run_id, 0, ending(conn, run_id))) is not None


def runs_without_retro(conn: sqlite3.Connection, limit: int = 50, since: float | None = None) -> list[str]:
    """Ended runs whose retro of their current ending is not written yet, oldest first. A run
    that ended because its verify commands could not run (``verify_unrunnable``) taught nothing
    about the work: the machine failed, not the doer, so it never becomes lessons, knowledge or
    skills; nor does one whose test report was forged (``evidence_forged``), nor an ending
    recorded as ``retro.skipped`` (``skip_retro``). ``since``: only runs that ended at or after it."""
    return Q.runs_without_retro(conn, limit, since)

