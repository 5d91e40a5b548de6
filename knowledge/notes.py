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

import orjson

from knowledge.errors import NoteInvalid, RetroExists, RunNotEnded
from state_db.errors import Conflict
from state_db.vocab import StopReason, NoteStatus, WorkStatus

PARTS = ("fact", "judgment", "rationale", "applicability")
PART_MAX_CHARS = 2000

#: ``evidence["kind"]`` of the notes a retro writes (see knowledge/retro.py).
KINDS = ("outcome", "failure", "fix", "context")


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
        return str(self.evidence.get("kind", ""))

    def encode(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def decode(cls, data: dict[str, Any]) -> "NoteDraft":
        return cls(str(data["fact"]), str(data["judgment"]), str(data["rationale"]),
                   str(data["applicability"]), dict(data.get("evidence") or {}))


@dataclass(frozen=True)
class RawNote:
    """A stored raw note (one row of ``raw_notes``)."""

    id: str
    run_id: str
    fact: str
    judgment: str
    rationale: str
    applicability: str
    evidence: dict[str, Any]
    status: str
    curated_id: str | None
    created_at: float

    @property
    def kind(self) -> str:
        return str(self.evidence.get("kind", ""))

    @property
    def text(self) -> str:
        """What similarity compares: fact and judgment."""
        return f"{self.fact}\n{self.judgment}"

    @classmethod
    def from_row(cls, row: sqlite3.Row | dict) -> "RawNote":
        r = dict(row)
        return cls(r["id"], r["run_id"], r["fact"], r["judgment"], r["rationale"], r["applicability"],
                   orjson.loads(r["evidence"] or "{}"), r["status"], r["curated_id"], r["created_at"])

    def encode(self) -> dict[str, Any]:
        return asdict(self)


def note_id(run_id: str, k: int, ending: int = 0) -> str:
    return f"rn-{run_id}-{k}" if ending == 0 else f"rn-{run_id}.{ending}-{k}"


def ending(conn: sqlite3.Connection, run_id: str) -> int:
    """How many times the run was continued: its current ending is that one (0: never)."""
    return conn.execute("SELECT COUNT(*) FROM stop_history WHERE work_id = ?", (run_id,)).fetchone()[0]


def write_retro(tx, run_id: str, drafts: list[NoteDraft], *, author: str = "derived") -> list[str]:
    """Insert a run's retro notes in ``tx`` (a curator transaction); returns their ids.

    Raises:
        RunNotEnded: the run is missing or not ended.
        RetroExists: the run has a retro already (nothing written).
        NoteInvalid: a draft misses a part.
    """
    work = tx.get("work_items", run_id)
    if work is None or work["status"] != WorkStatus.ENDED:
        raise RunNotEnded(run_id, None if work is None else work["status"])
    if not drafts:
        raise NoteInvalid("fact", "is missing: a retro has at least one note")
    ids, e = [], ending(tx.conn, run_id)
    for k, draft in enumerate(drafts):
        draft.validate()
        row = {"id": note_id(run_id, k, e), "run_id": run_id, "fact": draft.fact, "judgment": draft.judgment,
               "rationale": draft.rationale, "applicability": draft.applicability,
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
    return conn.execute("SELECT 1 FROM raw_notes WHERE id = ?",
                        (note_id(run_id, 0, ending(conn, run_id)),)).fetchone() is not None


def runs_without_retro(conn: sqlite3.Connection, limit: int = 50) -> list[str]:
    """Ended runs whose retro of their current ending is not written yet, oldest first. A run
    that ended because its verify commands could not run (``verify_unrunnable``) taught nothing
    about the work: the machine failed, not the doer, so it never becomes lessons, knowledge or
    skills; nor does an ending recorded as ``retro.skipped`` (``skip_retro``). The id test is
    ``note_id(w.id, 0, ending)`` in SQL."""
    rows = conn.execute(
        """SELECT w.id FROM work_items w WHERE w.status = ?
             AND w.stop_reason IS NOT ?
             AND NOT EXISTS (SELECT 1 FROM raw_notes r WHERE r.id = 'rn-' || w.id || COALESCE(
                   '.' || NULLIF((SELECT COUNT(*) FROM stop_history s WHERE s.work_id = w.id), 0), '') || '-0')
             AND NOT EXISTS (SELECT 1 FROM events e WHERE e.kind = 'retro.skipped' AND e.subject = w.id
                   AND json_extract(e.data, '$.ending') = (SELECT COUNT(*) FROM stop_history s WHERE s.work_id = w.id))
           ORDER BY w.ended_at, w.id LIMIT ?""", (WorkStatus.ENDED, StopReason.VERIFY_UNRUNNABLE, limit)).fetchall()
    return [r[0] for r in rows]


def pending(conn: sqlite3.Connection) -> list[RawNote]:
    """Pending raw notes, oldest first."""
    rows = conn.execute("SELECT * FROM raw_notes WHERE status = ? ORDER BY created_at, id",
                        (NoteStatus.PENDING,)).fetchall()
    return [RawNote.from_row(r) for r in rows]


def count_pending(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT COUNT(*) FROM raw_notes WHERE status = ?", (NoteStatus.PENDING,)).fetchone()[0]


def members(conn: sqlite3.Connection, curated_ids: list[str] | None = None) -> dict[str, list[RawNote]]:
    """Archived raw notes by the curated note they went into (all curated notes, or the given)."""
    if curated_ids is None:
        rows = conn.execute("SELECT * FROM raw_notes WHERE curated_id IS NOT NULL ORDER BY created_at, id")
    else:
        marks = ",".join("?" * len(curated_ids))
        rows = conn.execute(f"SELECT * FROM raw_notes WHERE curated_id IN ({marks}) ORDER BY created_at, id",
                            curated_ids)
    out: dict[str, list[RawNote]] = {}
    for r in rows.fetchall():
        out.setdefault(r["curated_id"], []).append(RawNote.from_row(r))
    return out
