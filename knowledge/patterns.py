"""Patterns: curated notes with ≥ ``notes_per_pattern`` independent notes get scored.

A curated note's members are its archived raw notes; they are *independent* per run (a run's
notes count once). A pattern below the threshold stays ``curated`` with no score; at or above
it, the five signals (knowledge/signals.py) are scored and the score, tier and per-signal
evidence are stored on the curated note.
"""
from __future__ import annotations

from dataclasses import dataclass

from knowledge import notes as N
from knowledge.signals import Score, runs_of, score
from knowledge.thresholds import Thresholds


@dataclass(frozen=True)
class Pattern:
    """A scored curated note: its row, its member notes and its score."""

    curated: dict
    notes: tuple[N.RawNote, ...]
    score: Score


def score_patterns(writer, curated_ids: list[str], thresholds: Thresholds) -> list[Pattern]:
    """Score the given curated notes and store the results; returns the scored patterns.

    Notes below ``notes_per_pattern`` distinct runs are left ``curated`` with no score.
    """
    if not curated_ids:
        return []
    conn = writer.conn
    members = N.members(conn, curated_ids)
    rows = {r["id"]: dict(r) for r in conn.execute(
        f"SELECT * FROM curated_notes WHERE id IN ({','.join('?' * len(curated_ids))})", curated_ids)}
    out = []
    with writer.transaction() as tx:
        for cid in curated_ids:
            notes = members.get(cid, [])
            if cid not in rows or len(runs_of(notes)) < thresholds.notes_per_pattern:
                continue
            s = score(notes, thresholds.notes_per_pattern)
            tx.update("curated_notes", cid, tier=s.tier, score=s.score, signals=s.encode(), updated_at=tx.now)
            out.append(Pattern({**rows[cid], "tier": s.tier, "score": s.score}, tuple(notes), s))
    return out


def queued(conn) -> list[dict]:
    """Curated notes whose pattern scored 2 (waiting for more evidence)."""
    return [dict(r) for r in conn.execute(
        "SELECT id, topic, score, signals, updated_at FROM curated_notes WHERE tier = 'queued' ORDER BY updated_at")]

