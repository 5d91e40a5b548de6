"""Curated notes: what a group of raw notes on one topic says, merged, with contradictions kept.

**Contradiction** (deterministic): two notes of one group contradict when their judgments have
opposite polarity (``similarity.polarity``: negation vs approval markers in the head clause)
*and* they speak of the same thing — the same ``evidence.subject`` when both have one (e.g.
``skills:fix-calc``), otherwise judgments with a cosine ≥ ``SAME_CLAIM``. Contradicting notes
are kept side by side in the body and listed in ``contradicts`` as
``[{"subject", "positive": [note ids], "negative": [note ids]}]``; nothing is averaged away.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from knowledge.findings import clip
from knowledge.notes import RawNote
from knowledge.similarity import add_into, dot, normalize, polarity, vectorize

SAME_CLAIM = 0.35
BODY_MAX_CHARS = 1800
TOPIC_MAX_CHARS = 120


@dataclass(frozen=True)
class Curated:
    """A curated note as the pipeline builds it (one row of ``curated_notes``)."""

    id: str
    kind: str
    topic: str
    body: str
    source_notes: tuple[str, ...]
    contradicts: tuple[dict, ...]


def curated_id(first: RawNote) -> str:
    """Deterministic id from the note that started the group (a note starts one group at most)."""
    return "cn-" + first.id.removeprefix("rn-")


def _key(note: RawNote, text: str) -> str:
    return normalize(text, drop=(note.run_id,))


def medoid(notes: Sequence[RawNote]) -> RawNote:
    """The note most similar, on average, to the others (the first one on ties).

    Σ_w v·w = v·Σw: one pass over the group's total instead of every pair, so a topic with
    hundreds of notes costs what a small one does."""
    if len(notes) <= 2:
        return notes[0]
    vecs = vectorize([n.text for n in notes], [(n.run_id,) for n in notes])
    total: dict[str, float] = {}
    for v in vecs:
        add_into(total, v)
    scores = [dot(v, total) for v in vecs]
    return notes[max(range(len(notes)), key=lambda i: (scores[i], -i))]


def topic_of(notes: Sequence[RawNote]) -> str:
    m = medoid(notes)
    return clip(m.evidence.get("topic") or m.fact or m.judgment, TOPIC_MAX_CHARS)


def contradictions(notes: Sequence[RawNote]) -> list[dict]:
    """Sides of each contradiction in ``notes`` (see the module docstring)."""
    pol = [polarity(n.judgment) for n in notes]
    if not (1 in pol and -1 in pol):
        return []
    vecs = vectorize([n.judgment for n in notes], [(n.run_id,) for n in notes])
    sides: dict[str, dict[str, list[str]]] = {}
    for i, a in enumerate(notes):
        for j in range(i + 1, len(notes)):
            b = notes[j]
            if pol[i] * pol[j] != -1:
                continue
            sa, sb = a.evidence.get("subject"), b.evidence.get("subject")
            if sa and sb:
                if sa != sb:
                    continue
                subject = str(sa)
            elif dot(vecs[i], vecs[j]) >= SAME_CLAIM:
                subject = str(sa or sb or "")
            else:
                continue
            entry = sides.setdefault(subject, {"positive": [], "negative": []})
            for note, p in ((a, pol[i]), (b, pol[j])):
                bucket = entry["positive" if p > 0 else "negative"]
                if note.id not in bucket:
                    bucket.append(note.id)
    return [{"subject": s, **v} for s, v in sorted(sides.items())]


def _distinct(notes: Sequence[RawNote], part: str) -> list[tuple[str, list[str]]]:
    """Distinct texts of one part (same after normalisation, run id left out) with their runs."""
    seen: dict[str, tuple[str, list[str]]] = {}
    for n in notes:
        text = getattr(n, part)
        key = _key(n, text)
        if key not in seen:
            seen[key] = (text, [])
        if n.run_id not in seen[key][1]:
            seen[key][1].append(n.run_id)
    return list(seen.values())


def render_body(topic: str, notes: Sequence[RawNote], contra: Sequence[dict]) -> str:
    """The merged text loop-agents are offered: facts, judgments with their runs, the
    contradicting judgments side by side, why, when. Capped at ``BODY_MAX_CHARS``."""
    runs = list(dict.fromkeys(n.run_id for n in notes))
    disputed = {i for c in contra for side in ("positive", "negative") for i in c[side]}
    agreed = [n for n in notes if n.id not in disputed]
    lines = [topic, f"Seen in {len(runs)} run(s), {len(notes)} note(s): {', '.join(runs[:8])}"
             + (" …" if len(runs) > 8 else "")]
    lines.append("Facts:")
    lines += [f"- {clip(t, 200)}" for t, _ in _distinct(notes, "fact")[:3]]
    if agreed:
        lines.append("Judgments:")
        lines += [f"- {clip(t, 300)} (runs: {', '.join(r[:4])})" for t, r in _distinct(agreed, "judgment")[:4]]
    if contra:
        by_id = {n.id: n for n in notes}
        lines.append("Contradicting judgments, kept side by side:")
        for c in contra:
            for mark, side in (("+", "positive"), ("−", "negative")):
                group = [by_id[i] for i in c[side] if i in by_id]
                lines += [f"  {mark} {clip(t, 240)} (runs: {', '.join(r[:4])})"
                          for t, r in _distinct(group, "judgment")[:2]]
    lines.append("Why:")
    lines += [f"- {clip(t, 300)}" for t, _ in _distinct(notes, "rationale")[:2]]
    lines.append("Applies to:")
    lines += [f"- {clip(t, 200)}" for t, _ in _distinct(notes, "applicability")[:2]]
    body = "\n".join(lines)
    return body if len(body) <= BODY_MAX_CHARS else body[: BODY_MAX_CHARS - 1] + "…"


def build(first_id: str | None, kind: str, topic: str | None, notes: Sequence[RawNote]) -> Curated:
    """A curated note over ``notes`` (all of its members, archived and new, oldest first).

    Args:
        first_id: the id of an existing curated note, or None for a new one.
        topic: the existing topic (kept stable once chosen), or None to choose it.
    """
    topic = topic or topic_of(notes)
    contra = contradictions(notes)
    return Curated(first_id or curated_id(notes[0]), kind, topic, render_body(topic, notes, contra),
                   tuple(n.id for n in notes), tuple(contra))
