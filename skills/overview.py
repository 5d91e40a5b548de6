"""What the org has learned, stage by stage: raw notes → curated notes → candidates → skills.

One read of state.db for ``org knowledge`` (and any page that shows the same): the count at each
stage, the evidence behind each item (the runs and notes a curated note rests on, its signals,
a candidate's notes and batch) and, for each skill, how many runs carried it and which. Runs
whose retro was skipped (they failed only because of their environment) are listed with why,
so that what did *not* become knowledge is visible too.
"""
from __future__ import annotations

from state_db.queries import knowledge as K
from state_db.queries import skills as Q
from state_db.queries.events import after as events_after
from state_db.queries.iterations import skill_first_uses

SIGNALS = ("recurrence", "multi_step", "trigger", "criteria", "reusable_output")


def _runs_of_notes(conn, ids) -> list[str]:
    return sorted({n.run_id for n in K.raw_notes(conn, list(ids))})


def raw(conn) -> dict:
    counts = K.note_counts(conn)
    skipped = [{"run": e.subject, "why": e.data.get("why", "")} for e in events_after(conn, 0, "retro.skipped")]
    return {"count": counts.total, "by_status": counts.by_status, "by_kind": counts.by_kind, "runs": counts.runs,
            "skipped_runs": skipped}


def curated(conn) -> list[dict]:
    return [{"id": c.id, "kind": c.kind, "topic": c.topic, "tier": c.tier, "score": c.score,
             "notes": list(c.source_notes), "runs": _runs_of_notes(conn, c.source_notes),
             "signals": {k: c.signals[k] for k in SIGNALS if isinstance(c.signals.get(k), dict)}}
            for c in K.curated_notes(conn)]


def candidates(conn) -> list[dict]:
    return [{"id": c.id, "name": c.name, "status": c.status, "score": c.score, "batch": c.batch_id,
             "merged_into": c.merged_into, "description": c.description, "curated": c.curated_id,
             "notes": list(c.source_notes), "runs": _runs_of_notes(conn, c.source_notes),
             "signals": [k for k in SIGNALS if isinstance(c.signals.get(k), dict) and c.signals[k].get("ok")]}
            for c in Q.candidates(conn)]


def skills(conn) -> list[dict]:
    used_in: dict[str, set[str]] = {}
    for name, work_id, _ in skill_first_uses(conn):
        used_in.setdefault(name, set()).add(work_id)
    return [{"name": s.name, "status": s.status, "uses": s.use_count, "last_used_at": s.last_used_at,
             "used_in": sorted(used_in.get(s.name, ())), "candidate": s.origin.get("candidate"),
             "learned_from": s.origin.get("runs", []), "notes": s.origin.get("source_notes", []),
             "approved_by": s.origin.get("approved_by"), "path": s.path}
            for s in Q.skills(conn, include_retired=True)]


def overview(conn) -> dict:
    """Every stage with its count and items (see the module docstring); plain data for ``--json``."""
    r, cur, cand, sk = raw(conn), curated(conn), candidates(conn), skills(conn)
    return {"counts": {"raw": r["count"], "curated": len(cur),
                       "recommended": sum(1 for c in cur if c["tier"] == "recommended"),
                       "candidates": len(cand), "pending": sum(1 for c in cand if c["status"] == "pending"),
                       "skills": sum(1 for s in sk if s["status"] == "active")},
            "raw": r, "curated": cur, "candidates": cand, "skills": sk}
