"""The knowledge pipeline's reads as typed data: raw notes, curated notes, what is due for a retro.

``RawNote`` is a retro's note as stored (the four parts with their evidence), ``CuratedNote`` a
consolidated one with how its pattern scored. The retro's note ids follow one scheme,
``note_id``; ``runs_without_retro`` mirrors it in SQL, so both live here, side by side.
A run's own record (its work item, iterations, verdicts, usage, attempts) is read through the
subject modules (``work``, ``iterations``, ``verdicts``, ``usage``); this module adds only what
they do not ask: the models a run called.
"""
from __future__ import annotations

import sqlite3
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from state_db.queries.base import columns, loads, marks, scalar
from state_db.vocab import NoteKind, NoteStatus, StopReason


def note_kind(evidence: dict[str, Any]) -> NoteKind:
    """The kind ``evidence`` names, or context when it names none of ``NoteKind``."""
    kind = evidence.get("kind")
    return NoteKind(kind) if kind in tuple(NoteKind) else NoteKind.CONTEXT


@dataclass(frozen=True)
class RawNote:
    """A stored raw note (one row of ``raw_notes``), its evidence decoded."""

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
        """The evidence's kind; a note of no known kind is context (``curated_notes.kind`` is closed)."""
        return note_kind(self.evidence)

    @property
    def text(self) -> str:
        """What similarity compares: fact and judgment."""
        return f"{self.fact}\n{self.judgment}"

    @classmethod
    def from_row(cls, row: sqlite3.Row | dict) -> "RawNote":
        v = columns(cls, row)
        v["evidence"] = loads(v.get("evidence"), {}) or {}
        return cls(**v)

    def encode(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CuratedNote:
    """One ``curated_notes`` row: a consolidated note and how its pattern scored (``tier``:
    curated | queued | recommended; ``score`` None until scored)."""

    id: str
    topic: str
    body: str
    created_at: float
    updated_at: float
    kind: str = ""
    tier: str = "curated"
    score: int | None = None
    source_notes: tuple[str, ...] = ()
    contradicts: tuple[dict, ...] = ()
    signals: dict = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: sqlite3.Row | dict) -> "CuratedNote":
        v = columns(cls, row)
        v["source_notes"] = tuple(loads(v.get("source_notes"), []) or [])
        v["contradicts"] = tuple(loads(v.get("contradicts"), []) or [])
        v["signals"] = loads(v.get("signals"), {}) or {}
        return cls(**v)

    def encode(self) -> dict[str, Any]:
        """Plain data (JSON-able)."""
        d = asdict(self)
        d["source_notes"], d["contradicts"] = list(self.source_notes), list(self.contradicts)
        return d


@dataclass(frozen=True)
class NoteCounts:
    """How many raw notes there are, by status and by kind, and how many runs they came from."""

    by_status: dict[str, int]
    by_kind: dict[str, int]
    runs: int

    @property
    def total(self) -> int:
        return sum(self.by_status.values())


# -- raw notes -----------------------------------------------------------------------------------

def note_id(run_id: str, k: int, ending: int = 0) -> str:
    """The id of the ``k``-th note of the retro of ``run_id``'s ``ending``-th continuation
    (0: its first ending). ``runs_without_retro`` repeats this scheme in SQL."""
    return f"rn-{run_id}-{k}" if ending == 0 else f"rn-{run_id}.{ending}-{k}"


def endings(conn: sqlite3.Connection, run_id: str) -> int:
    """How many times the run was continued: its current ending is that one (0: never)."""
    return scalar(conn, "SELECT COUNT(*) FROM stop_history WHERE work_id = ?", (run_id,), 0)


def raw_note(conn: sqlite3.Connection, note: str) -> RawNote | None:
    row = conn.execute("SELECT * FROM raw_notes WHERE id = ?", (note,)).fetchone()
    return RawNote.from_row(row) if row else None


def raw_notes(conn: sqlite3.Connection, ids: list[str] | tuple[str, ...]) -> list[RawNote]:
    """The raw notes among ``ids`` that exist, oldest first."""
    if not ids:
        return []
    return [RawNote.from_row(r) for r in conn.execute(
        f"SELECT * FROM raw_notes WHERE id IN ({marks(ids)}) ORDER BY created_at, id", tuple(ids))]


def runs_without_retro(conn: sqlite3.Connection, limit: int = 50, since: float | None = None) -> list[str]:
    """Ended runs whose current ending has neither a retro (its first note, ``note_id(w.id, 0,
    ending)``) nor a ``retro.skipped`` event, oldest first; runs that ended ``verify_unrunnable``
    (the machine failed, not the doer) or ``evidence_forged`` (the doer's evidence cannot be
    believed, so neither can anything learnt from the run) are left out. ``since``: only runs
    that ended at or after it (the curator's own mark: every earlier ending was seen to)."""
    return [r[0] for r in conn.execute(
        """SELECT w.id FROM work_items w WHERE w.status = 'ended' AND w.ended_at >= ?
             AND w.stop_reason NOT IN (?, ?)
             AND NOT EXISTS (SELECT 1 FROM raw_notes r WHERE r.id = 'rn-' || w.id || COALESCE(
                   '.' || NULLIF((SELECT COUNT(*) FROM stop_history s WHERE s.work_id = w.id), 0), '') || '-0')
             AND NOT EXISTS (SELECT 1 FROM events e WHERE e.kind = 'retro.skipped' AND e.subject = w.id
                   AND json_extract(e.data, '$.ending') = (SELECT COUNT(*) FROM stop_history s WHERE s.work_id = w.id))
           ORDER BY w.ended_at, w.id LIMIT ?""", (since if since is not None else float("-inf"),
                                                  StopReason.VERIFY_UNRUNNABLE, StopReason.EVIDENCE_FORGED, limit))]


def pending_notes(conn: sqlite3.Connection) -> list[RawNote]:
    """Pending raw notes, oldest first."""
    return [RawNote.from_row(r) for r in conn.execute(
        "SELECT * FROM raw_notes WHERE status = ? ORDER BY created_at, id", (NoteStatus.PENDING,))]


def count_pending_notes(conn: sqlite3.Connection) -> int:
    return scalar(conn, "SELECT COUNT(*) FROM raw_notes WHERE status = ?", (NoteStatus.PENDING,), 0)


def members(conn: sqlite3.Connection, curated_ids: list[str] | None = None) -> dict[str, list[RawNote]]:
    """Archived raw notes by the curated note they went into (all curated notes, or the given),
    oldest first."""
    if curated_ids is None:
        rows = conn.execute("SELECT * FROM raw_notes WHERE curated_id IS NOT NULL ORDER BY created_at, id")
    else:
        rows = conn.execute(f"""SELECT * FROM raw_notes WHERE curated_id IN ({marks(curated_ids)})
                                ORDER BY created_at, id""", curated_ids)
    out: dict[str, list[RawNote]] = {}
    for r in rows:
        out.setdefault(r["curated_id"], []).append(RawNote.from_row(r))
    return out


def fix_notes_about(conn: sqlite3.Connection, subjects: list[str]) -> list[RawNote]:
    """Fix notes (any status) whose evidence names one of ``subjects`` (``check:<command>``),
    oldest first."""
    if not subjects:
        return []
    return [RawNote.from_row(r) for r in conn.execute(
        f"""SELECT * FROM raw_notes WHERE json_extract(evidence, '$.kind') = 'fix'
              AND json_extract(evidence, '$.subject') IN ({marks(subjects)})
            ORDER BY created_at, id""", subjects)]


def note_counts(conn: sqlite3.Connection) -> NoteCounts:
    by_status = Counter({r[0]: r[1] for r in conn.execute("SELECT status, COUNT(*) FROM raw_notes GROUP BY status")})
    by_kind = {r[0] or "": r[1] for r in conn.execute(
        "SELECT json_extract(evidence, '$.kind'), COUNT(*) FROM raw_notes GROUP BY 1 ORDER BY 1")}
    return NoteCounts(dict(by_status), by_kind, scalar(conn, "SELECT COUNT(DISTINCT run_id) FROM raw_notes", (), 0))


# -- curated notes -------------------------------------------------------------------------------

def curated_note(conn: sqlite3.Connection, curated_id: str) -> CuratedNote | None:
    row = conn.execute("SELECT * FROM curated_notes WHERE id = ?", (curated_id,)).fetchone()
    return CuratedNote.from_row(row) if row else None


def curated_notes(conn: sqlite3.Connection, ids: list[str] | None = None) -> list[CuratedNote]:
    """Curated notes (all, or those among ``ids``), oldest first."""
    if ids is None:
        rows = conn.execute("SELECT * FROM curated_notes ORDER BY created_at, id")
    else:
        rows = conn.execute(f"SELECT * FROM curated_notes WHERE id IN ({marks(ids)}) "
                            "ORDER BY created_at, id", ids)
    return [CuratedNote.from_row(r) for r in rows]


def curated_version(conn: sqlite3.Connection) -> tuple[int, float | None]:
    """(count, latest update) of the curated notes: changes whenever one is added or updated."""
    row = conn.execute("SELECT COUNT(*), MAX(updated_at) FROM curated_notes").fetchone()
    return row[0], row[1]


def queued_patterns(conn: sqlite3.Connection) -> list[CuratedNote]:
    """Curated notes whose pattern scored 2 (queued: waiting for more evidence), by last update."""
    return [CuratedNote.from_row(r) for r in conn.execute(
        "SELECT * FROM curated_notes WHERE tier = 'queued' ORDER BY updated_at, id")]


# -- a run's record ------------------------------------------------------------------------------

def models_of_run(conn: sqlite3.Connection, run_id: str) -> tuple[str, ...]:
    """The models the run's stored model calls used, sorted."""
    return tuple(r[0] for r in conn.execute(
        "SELECT DISTINCT model FROM model_calls WHERE work_id = ? ORDER BY model", (run_id,)))
