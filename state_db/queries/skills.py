"""Skill candidates, review batches and approved skills as typed data.

A ``Candidate`` is a proposed skill (its SKILL.md fields, score, signals and source notes); a
``Batch`` groups pending candidates offered to the human together; a ``Skill`` is an approved
one, with the text of the candidate it was approved from. A skill's use is counted from the
prompt manifests of committed iterations (``skill_uses``): once per run, whatever the number of
iterations.
"""
from __future__ import annotations

import sqlite3
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from state_db.queries.base import columns, exists, loads, marks, scalar
from state_db.vocab import BatchStatus, CandidateStatus, SkillStatus

#: candidates still open to a decision (a deferred one is never asked again, but can be decided)
LIVE = (CandidateStatus.PENDING, CandidateStatus.DEFERRED)


@dataclass(frozen=True)
class Candidate:
    """One ``skill_candidates`` row, ``signals`` and ``source_notes`` decoded."""

    id: str
    name: str
    status: str
    created_at: float
    description: str = ""
    body: str = ""
    score: int = 0
    signals: dict = field(default_factory=dict)
    source_notes: tuple[str, ...] = ()
    merged_into: str | None = None
    batch_id: str | None = None
    decided_by: str | None = None
    decided_at: float | None = None
    decided_reason: str | None = None

    @classmethod
    def from_row(cls, row: sqlite3.Row | dict) -> "Candidate":
        v = columns(cls, row)
        v["signals"] = loads(v.get("signals"), {}) or {}
        v["source_notes"] = tuple(loads(v.get("source_notes"), []) or [])
        return cls(**v)

    decode = from_row       # its plain data (``encode``) reads back the same way

    def encode(self) -> dict[str, Any]:
        """Plain data (JSON-able): what ``org candidates show --json`` prints."""
        d = asdict(self)
        d["source_notes"] = list(self.source_notes)
        return d

    @property
    def live(self) -> bool:
        return self.status in LIVE

    @property
    def curated_id(self) -> str | None:
        """The curated note whose pattern the candidate was drafted from."""
        return self.signals.get("curated_id")


@dataclass(frozen=True)
class Batch:
    """One ``candidate_batches`` row."""

    id: str
    status: str
    created_at: float
    announced_at: float | None = None
    closed_at: float | None = None

    @classmethod
    def from_row(cls, row: sqlite3.Row | dict) -> "Batch":
        return cls(**columns(cls, row))


@dataclass(frozen=True)
class Skill:
    """One ``skills`` row, ``origin`` decoded, with the description and body of the candidate it
    was approved from (empty when that candidate is missing)."""

    name: str
    path: str
    status: str
    created_at: float
    candidate_id: str | None = None
    origin: dict = field(default_factory=dict)
    use_count: int = 0
    last_used_at: float | None = None
    description: str = ""
    body: str = ""

    @classmethod
    def from_row(cls, row: sqlite3.Row | dict) -> "Skill":
        v = columns(cls, row)
        v["origin"] = loads(v.get("origin"), {}) or {}
        v["description"], v["body"] = v.get("description") or "", v.get("body") or ""
        return cls(**v)

    decode = from_row

    def encode(self) -> dict[str, Any]:
        """Plain data (JSON-able)."""
        return asdict(self)

    @property
    def active(self) -> bool:
        return self.status == SkillStatus.ACTIVE


@dataclass(frozen=True)
class SkillUse:
    """How many distinct runs carried a skill in a committed iteration's prompt, and when last."""

    name: str
    runs: int
    last_used_at: float | None


# -- candidates ----------------------------------------------------------------------------------

def candidate(conn: sqlite3.Connection, candidate_id: str) -> Candidate | None:
    row = conn.execute("SELECT * FROM skill_candidates WHERE id = ?", (candidate_id,)).fetchone()
    return Candidate.from_row(row) if row else None


def live_candidate_named(conn: sqlite3.Connection, name: str) -> Candidate | None:
    """The latest pending or deferred candidate named ``name``, or None."""
    row = conn.execute(f"""SELECT * FROM skill_candidates WHERE name = ? AND status IN ({marks(LIVE)})
                           ORDER BY created_at DESC, id DESC LIMIT 1""", (name, *LIVE)).fetchone()
    return Candidate.from_row(row) if row else None


def candidates_named(conn: sqlite3.Connection, name: str) -> list[Candidate]:
    """Candidates named ``name``, latest first."""
    return [Candidate.from_row(r) for r in conn.execute(
        "SELECT * FROM skill_candidates WHERE name = ? ORDER BY created_at DESC, id DESC", (name,))]


def candidates(conn: sqlite3.Connection, statuses: Iterable[str] | None = None) -> list[Candidate]:
    """Candidates in any of ``statuses`` (None: all), oldest first."""
    if statuses is None:
        return [Candidate.from_row(r) for r in conn.execute("SELECT * FROM skill_candidates ORDER BY created_at, id")]
    statuses = [str(s) for s in statuses]
    return [Candidate.from_row(r) for r in conn.execute(
        f"SELECT * FROM skill_candidates WHERE status IN ({marks(statuses)}) ORDER BY created_at, id",
        statuses)]


def candidate_id_taken(conn: sqlite3.Connection, candidate_id: str) -> bool:
    return exists(conn, "SELECT 1 FROM skill_candidates WHERE id = ?", (candidate_id,))


def unbatched(conn: sqlite3.Connection) -> list[str]:
    """Ids of the pending candidates in no batch yet, oldest first."""
    return [r[0] for r in conn.execute(
        "SELECT id FROM skill_candidates WHERE status = ? AND batch_id IS NULL ORDER BY created_at, id",
        (CandidateStatus.PENDING,))]


# -- batches -------------------------------------------------------------------------------------

def batch_count(conn: sqlite3.Connection) -> int:
    return scalar(conn, "SELECT COUNT(*) FROM candidate_batches", (), 0)


def batches(conn: sqlite3.Connection, status: str | None = None) -> list[Batch]:
    """Review batches (of ``status`` when given), oldest first."""
    where, params = ("", ()) if status is None else (" WHERE status = ?", (str(status),))
    return [Batch.from_row(r) for r in conn.execute(
        f"SELECT * FROM candidate_batches{where} ORDER BY created_at, id", params)]


def finished_batches(conn: sqlite3.Connection) -> list[Batch]:
    """Open batches with no pending candidate left (each is to be closed)."""
    return [Batch.from_row(r) for r in conn.execute(
        """SELECT b.* FROM candidate_batches b WHERE b.status = ? AND NOT EXISTS
             (SELECT 1 FROM skill_candidates c WHERE c.batch_id = b.id AND c.status = ?)
           ORDER BY b.created_at, b.id""", (BatchStatus.OPEN, CandidateStatus.PENDING))]


# -- skills --------------------------------------------------------------------------------------

_SKILLS = """SELECT s.*, c.description, c.body FROM skills s
             LEFT JOIN skill_candidates c ON c.id = s.candidate_id"""


def skill(conn: sqlite3.Connection, name: str) -> Skill | None:
    row = conn.execute(_SKILLS + " WHERE s.name = ?", (name,)).fetchone()
    return Skill.from_row(row) if row else None


def skills(conn: sqlite3.Connection, *, include_retired: bool = False) -> list[Skill]:
    """Active skills (and retired ones with ``include_retired``), by name."""
    where, params = ("", ()) if include_retired else (" WHERE s.status = ?", (SkillStatus.ACTIVE,))
    return [Skill.from_row(r) for r in conn.execute(_SKILLS + where + " ORDER BY s.name", params)]


def skill_names(conn: sqlite3.Connection) -> list[str]:
    """Every skill's name, retired ones included, sorted."""
    return [r[0] for r in conn.execute("SELECT name FROM skills ORDER BY name")]


def active_skills_version(conn: sqlite3.Connection) -> tuple[int, str | None]:
    """(count, names with their candidates) of the active skills: changes whenever one is
    approved, re-approved from another candidate or retired."""
    rows = conn.execute("SELECT name, candidate_id FROM skills WHERE status = ? ORDER BY name",
                        (SkillStatus.ACTIVE,)).fetchall()
    return len(rows), ",".join(f"{r[0]}:{r[1] or ''}" for r in rows) or None


# a replay carries a skill to measure it, not to use it: its iterations never count
_USES = """SELECT j.value AS name, COUNT(DISTINCT i.work_id) AS runs, MAX(i.committed_at) AS last
             FROM iterations i, json_each(i.prompt, '$.skills') j
            WHERE NOT EXISTS (SELECT 1 FROM replays r WHERE r.work_id = i.work_id) {where}
            GROUP BY j.value"""


def skill_uses(conn: sqlite3.Connection, names: list[str] | None = None) -> dict[str, SkillUse]:
    """Use of the skills named (every skill any manifest lists when None): the distinct runs
    with a committed iteration whose prompt manifest lists it, and the latest such iteration.
    A skill no manifest lists is absent."""
    if names is None:
        rows = conn.execute(_USES.format(where=""))
    else:
        rows = conn.execute(_USES.format(where=f"AND j.value IN ({marks(names)})"), names)
    return {r["name"]: SkillUse(r["name"], r["runs"], r["last"]) for r in rows}


def skills_carried_by(conn: sqlite3.Connection, work_id: str) -> list[str]:
    """The skills any committed iteration of ``work_id`` carried, sorted."""
    return [r[0] for r in conn.execute(
        """SELECT DISTINCT j.value FROM iterations i, json_each(i.prompt, '$.skills') j
            WHERE i.work_id = ? ORDER BY j.value""", (work_id,))]


def retirement_proposed_since(conn: sqlite3.Connection, name: str, since: float) -> bool:
    """True if the skill's retirement was proposed (journalled) at or after ``since``."""
    return exists(conn, """SELECT 1 FROM events WHERE kind = 'skills.retirement_proposed' AND subject = ?
                             AND at >= ?""", (name, since))
