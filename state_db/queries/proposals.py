"""Discovery's work candidates (``org discover``) as typed data: every read of ``proposals``.

A proposal is *open* while it is ``proposed`` and its ``expires_at`` is still ahead; a lapsed one
is shown nowhere and is marked ``expired`` by the next write that meets it.
"""
from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field

from state_db.queries.base import columns, loads, marks
from state_db.vocab import ProposalStatus, WorkStatus

_ORDER = "ORDER BY recommended DESC, rank, created_at, id"


@dataclass(frozen=True)
class ProposalRow:
    """One ``proposals`` row; ``verify``, ``caps`` and ``evidence`` decoded."""

    id: str
    fingerprint: str
    workspace: str
    kind: str
    source: str
    title: str
    goal: str
    rank: int
    status: str
    created_by: str
    created_at: float
    seen_at: float
    expires_at: float
    verify: list = field(default_factory=list)
    caps: dict = field(default_factory=dict)
    evidence: dict = field(default_factory=dict)
    recommended: bool = False
    decided_by: str | None = None
    decided_at: float | None = None
    detail: str | None = None
    work_id: str | None = None

    @classmethod
    def from_row(cls, row) -> "ProposalRow":
        v = columns(cls, row)
        v["verify"] = loads(v.get("verify"), []) or []
        v["caps"] = loads(v.get("caps"), {}) or {}
        v["evidence"] = loads(v.get("evidence"), {}) or {}
        v["recommended"] = bool(v.get("recommended"))
        return cls(**v)

    def is_open(self, now: float) -> bool:
        return self.status == ProposalStatus.PROPOSED and self.expires_at > now

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _many(conn: sqlite3.Connection, sql: str, params=()) -> list[ProposalRow]:
    return [ProposalRow.from_row(r) for r in conn.execute(sql, params).fetchall()]


def proposal(conn: sqlite3.Connection, proposal_id: str) -> ProposalRow | None:
    row = conn.execute("SELECT * FROM proposals WHERE id = ?", (proposal_id,)).fetchone()
    return ProposalRow.from_row(row) if row else None


def open_proposals(conn: sqlite3.Connection, *, workspace: str | None = None, now: float | None = None,
                   limit: int = 200) -> list[ProposalRow]:
    """Open proposals (of ``workspace`` when given), the recommended first, then by rank."""
    now = time.time() if now is None else now
    sql, params = "SELECT * FROM proposals WHERE status = ? AND expires_at > ?", [ProposalStatus.PROPOSED, now]
    if workspace is not None:
        sql += " AND workspace = ?"
        params.append(workspace)
    return _many(conn, f"{sql} {_ORDER} LIMIT ?", (*params, limit))


def listing(conn: sqlite3.Connection, *, all_: bool = False, now: float | None = None,
            limit: int = 200) -> list[ProposalRow]:
    """What ``org discover list`` shows: the open proposals, or (``all_``) every proposal, newest
    decisions last."""
    if not all_:
        return open_proposals(conn, now=now, limit=limit)
    return _many(conn, "SELECT * FROM proposals ORDER BY status != 'proposed', created_at DESC, rank LIMIT ?",
                 (limit,))


def lapsed(conn: sqlite3.Connection, now: float) -> list[ProposalRow]:
    """Proposals still marked ``proposed`` whose time is up."""
    return _many(conn, "SELECT * FROM proposals WHERE status = ? AND expires_at <= ?",
                 (ProposalStatus.PROPOSED, now))


def standing(conn: sqlite3.Connection, workspace: str, fingerprints: list[str]) -> dict[str, ProposalRow]:
    """For each fingerprint of ``workspace``, the proposal that keeps the same evidence from being proposed again:
    an open one (refreshed instead), a dismissed one (a human said no), or an accepted one whose
    work item has not ended (it is being worked). An open one wins over the others."""
    if not fingerprints:
        return {}
    listed = marks(fingerprints)
    rows = _many(conn, f"""SELECT p.* FROM proposals p LEFT JOIN work_items w ON w.id = p.work_id
                            WHERE p.workspace = ? AND p.fingerprint IN ({listed})
                              AND (p.status IN (?, ?)
                                   OR (p.status = ? AND (w.status IS NULL OR w.status != ?)))
                            ORDER BY p.status = '{ProposalStatus.PROPOSED}', p.created_at""",
                 (workspace, *fingerprints, ProposalStatus.PROPOSED, ProposalStatus.DISMISSED, ProposalStatus.ACCEPTED,
                  WorkStatus.ENDED))
    return {r.fingerprint: r for r in rows}


def of_sources(conn: sqlite3.Connection, workspace: str, sources: list[str]) -> list[ProposalRow]:
    """Open proposals of ``workspace`` found by one of ``sources`` (what a scan read again)."""
    if not sources:
        return []
    listed = marks(sources)
    return _many(conn, f"SELECT * FROM proposals WHERE status = ? AND workspace = ? AND source IN ({listed}) {_ORDER}",
                 (ProposalStatus.PROPOSED, workspace, *sources))
