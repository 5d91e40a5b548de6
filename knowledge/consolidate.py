"""Consolidation: pending raw notes → curated notes, once enough of them are pending.

Trigger: ``≥ raw_notes_to_consolidate`` pending raw notes (4 do nothing, 5 consolidate all).
Notes are grouped within their kind (outcome / failure / fix / context, see knowledge/retro.py)
by ``knowledge.grouping`` over the TF-IDF vectors of their fact and judgment (the run id left
out); existing curated notes are seed groups, so a note on a known topic joins it. Each group
becomes (or updates) one curated note; every pending note of it is archived with the curated
note's id — raw notes are never edited or deleted.

The grouping is computed outside the write lock; the write transaction then moves each note
``pending → archived``, which fails (and rolls everything back) if another writer archived one
meanwhile, so two curators can never consolidate the same note twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from knowledge import curated as C
from knowledge.errors import ConsolidationRaced
from knowledge.grouping import group
from knowledge.similarity import vectorize
from knowledge.thresholds import Thresholds
from state_db.kernel.errors import Conflict, IllegalTransition
from state_db.queries import knowledge as Q
from state_db.queries.knowledge import CuratedNote, RawNote
from state_db.vocab import NoteStatus


@dataclass(frozen=True)
class Plan:
    """One group: an existing curated note (``curated_id``) or a new one, with its members."""

    curated_id: str | None
    kind: str
    topic: str | None
    old: tuple[RawNote, ...]
    new: tuple[RawNote, ...]


@dataclass(frozen=True)
class Result:
    archived: int = 0
    created: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    curated: tuple[C.Curated, ...] = field(default_factory=tuple, repr=False)

    @property
    def touched(self) -> tuple[str, ...]:
        return self.created + self.updated


def due(conn, thresholds: Thresholds) -> bool:
    return Q.count_pending_notes(conn) >= thresholds.raw_notes_to_consolidate


def plan(pending: list[RawNote], existing: list[CuratedNote], members: dict[str, list[RawNote]],
         similarity: float) -> list[Plan]:
    """Group ``pending`` notes, kind by kind, with ``existing`` curated notes as seeds."""
    out: list[Plan] = []
    kinds = sorted({n.kind for n in pending})
    for kind in kinds:
        seeds = [c for c in existing if c.kind == kind and members.get(c.id)]
        seed_notes = [members[c.id] for c in seeds]
        fresh = [n for n in pending if n.kind == kind]
        corpus = [n for ms in seed_notes for n in ms] + fresh
        vecs = vectorize([n.text for n in corpus], [(n.run_id,) for n in corpus])
        seed_idx, at = [], 0
        for ms in seed_notes:
            seed_idx.append(list(range(at, at + len(ms))))
            at += len(ms)
        groups = group(vecs, similarity, seeds=seed_idx, order=list(range(at, len(corpus))),
                       keys=[n.evidence.get("subject") for n in corpus])
        for g, idx in enumerate(groups):
            new = tuple(corpus[i] for i in idx if i >= at)
            if not new:
                continue
            if g < len(seeds):
                out.append(Plan(seeds[g].id, kind, seeds[g].topic, tuple(seed_notes[g]), new))
            else:
                out.append(Plan(None, kind, None, (), tuple(sorted(new, key=lambda n: (n.created_at, n.id)))))
    return out


def consolidate(writer, thresholds: Thresholds, *, force: bool = False) -> Result | None:
    """Consolidate every pending raw note if the threshold is reached (or ``force``).

    Args:
        writer: a StateWriter as the curator.
    Returns: what was done, or None when below the threshold / nothing pending.
    Raises:
        ConsolidationRaced: another writer consolidated some of these notes meanwhile (nothing
            written).
    """
    conn = writer.conn
    pending = Q.pending_notes(conn)
    if not pending or (len(pending) < thresholds.raw_notes_to_consolidate and not force):
        return None
    plans = plan(pending, Q.curated_notes(conn), Q.members(conn), thresholds.similarity)
    try:
        return _write(writer, plans, len(pending))
    except (Conflict, IllegalTransition) as exc:
        raise ConsolidationRaced(str(exc)) from exc


def _write(writer, plans: list[Plan], archived: int) -> Result:
    created, updated, built = [], [], []
    with writer.transaction() as tx:
        for p in plans:
            note = C.build(p.curated_id, p.kind, p.topic, list(p.old) + list(p.new))
            fields = {"body": note.body, "source_notes": list(note.source_notes),
                      "contradicts": list(note.contradicts), "updated_at": tx.now}
            if p.curated_id is None:
                tx.insert("curated_notes", {"id": note.id, "kind": p.kind, "topic": note.topic,
                                            "created_at": tx.now, **fields})
                created.append(note.id)
            else:
                tx.update("curated_notes", note.id, **fields)
                updated.append(note.id)
            for raw in p.new:
                tx.set_status("raw_notes", raw.id, NoteStatus.ARCHIVED, curated_id=note.id)
            built.append(note)
        tx.journal("knowledge.consolidated", None, {"archived": archived, "created": created, "updated": updated})
    return Result(archived, tuple(created), tuple(updated), tuple(built))

