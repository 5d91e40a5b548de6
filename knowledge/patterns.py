"""Patterns: curated notes with ≥ ``notes_per_pattern`` independent notes get scored.

A curated note's members are its archived raw notes; they are *independent* per run (a run's
notes count once). A pattern below the threshold stays ``curated`` with no score; at or above
it, the five signals (knowledge/signals.py) are scored and the score, tier and per-signal
evidence are stored on the curated note.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from knowledge.signals import Score, runs_of, score
from knowledge.thresholds import Thresholds
from state_db.queries import knowledge as Q
from state_db.queries.knowledge import CuratedNote, RawNote


@dataclass(frozen=True)
class Pattern:
    """A scored curated note (``note``, with the tier and score just stored), its member notes
    and its score."""

    note: CuratedNote
    notes: tuple[RawNote, ...]
    score: Score

    @property
    def curated(self) -> dict:
        """The curated note as plain data (what the curator's pass reads its id from)."""
        return self.note.encode()


def score_patterns(writer, curated_ids: list[str], thresholds: Thresholds) -> list[Pattern]:
    """Score the given curated notes and store the results; returns the scored patterns.

    Notes below ``notes_per_pattern`` distinct runs are left ``curated`` with no score.
    """
    if not curated_ids:
        return []
    conn = writer.conn
    members = Q.members(conn, curated_ids)
    rows = {c.id: c for c in Q.curated_notes(conn, curated_ids)}
    out = []
    with writer.transaction() as tx:
        for cid in curated_ids:
            notes = members.get(cid, [])
            if cid not in rows or len(runs_of(notes)) < thresholds.notes_per_pattern:
                continue
            s = score(notes, thresholds.notes_per_pattern)
            tx.update("curated_notes", cid, tier=s.tier, score=s.score, signals=s.encode(), updated_at=tx.now)
            out.append(Pattern(replace(rows[cid], tier=s.tier, score=s.score, signals=s.encode()), tuple(notes), s))
    return out


def queued(conn) -> list[dict]:
    """Curated notes whose pattern scored 2 (waiting for more evidence), as plain data
    (``org candidates list --queued``): id, topic, score, signals, last update."""
    return [{"id": c.id, "topic": c.topic, "score": c.score, "signals": c.signals, "updated_at": c.updated_at}
            for c in Q.queued_patterns(conn)]
