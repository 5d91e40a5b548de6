"""What the org has learned, stage by stage: raw notes → curated notes → candidates → skills.

One read of state.db for ``org knowledge`` (and any page that shows the same): the count at each
stage, the evidence behind each item (the runs and notes a curated note rests on, its signals,
a candidate's notes and batch) and, for each skill, how many runs carried it and which. Runs
whose retro was skipped (they failed only because of their environment) are listed with why,
so that what did *not* become knowledge is visible too.
"""
from __future__ import annotations

from collections import Counter

import orjson

SIGNALS = ("recurrence", "multi_step", "trigger", "criteria", "reusable_output")


def _json(text, default):
    return orjson.loads(text) if text else default


def _runs_of_notes(conn, ids: list[str]) -> list[str]:
    if not ids:
        return []
    rows = conn.execute(f"SELECT DISTINCT run_id FROM raw_notes WHERE id IN ({','.join('?' * len(ids))}) "
                        "ORDER BY run_id", ids)
    return [r[0] for r in rows]


def raw(conn) -> dict:
    by_status = Counter({r[0]: r[1] for r in conn.execute("SELECT status, COUNT(*) FROM raw_notes GROUP BY status")})
    by_kind = {r[0] or "": r[1] for r in conn.execute(
        "SELECT json_extract(evidence, '$.kind'), COUNT(*) FROM raw_notes GROUP BY 1 ORDER BY 1")}
    runs = conn.execute("SELECT COUNT(DISTINCT run_id) FROM raw_notes").fetchone()[0]
    skipped = [{"run": r[0], "why": _json(r[1], {}).get("why", "")} for r in conn.execute(
        "SELECT subject, data FROM events WHERE kind = 'retro.skipped' ORDER BY id")]
    return {"count": sum(by_status.values()), "by_status": dict(by_status), "by_kind": by_kind, "runs": runs,
            "skipped_runs": skipped}


def curated(conn) -> list[dict]:
    out = []
    for r in conn.execute("SELECT * FROM curated_notes ORDER BY created_at, id"):
        notes = _json(r["source_notes"], [])
        signals = _json(r["signals"], {}) or {}
        out.append({"id": r["id"], "kind": r["kind"], "topic": r["topic"], "tier": r["tier"], "score": r["score"],
                    "notes": notes, "runs": _runs_of_notes(conn, notes),
                    "signals": {k: signals[k] for k in SIGNALS if isinstance(signals.get(k), dict)}})
    return out


def candidates(conn) -> list[dict]:
    out = []
    for r in conn.execute("SELECT * FROM skill_candidates ORDER BY created_at, id"):
        notes = _json(r["source_notes"], [])
        signals = _json(r["signals"], {}) or {}
        out.append({"id": r["id"], "name": r["name"], "status": r["status"], "score": r["score"],
                    "batch": r["batch_id"], "merged_into": r["merged_into"], "description": r["description"],
                    "curated": signals.get("curated_id"), "notes": notes, "runs": _runs_of_notes(conn, notes),
                    "signals": [k for k in SIGNALS if isinstance(signals.get(k), dict) and signals[k].get("ok")]})
    return out


def skills(conn) -> list[dict]:
    used_in: dict[str, list[str]] = {}
    for name, work_id in conn.execute(
            """SELECT DISTINCT j.value, i.work_id FROM iterations i, json_each(i.prompt, '$.skills') j
               ORDER BY i.work_id"""):
        used_in.setdefault(name, []).append(work_id)
    out = []
    for r in conn.execute("SELECT * FROM skills ORDER BY name"):
        origin = _json(r["origin"], {})
        out.append({"name": r["name"], "status": r["status"], "uses": r["use_count"],
                    "last_used_at": r["last_used_at"], "used_in": used_in.get(r["name"], []),
                    "candidate": origin.get("candidate"), "learned_from": origin.get("runs", []),
                    "notes": origin.get("source_notes", []), "approved_by": origin.get("approved_by"),
                    "path": r["path"]})
    return out


def overview(conn) -> dict:
    """Every stage with its count and items (see the module docstring); plain data for ``--json``."""
    r, cur, cand, sk = raw(conn), curated(conn), candidates(conn), skills(conn)
    return {"counts": {"raw": r["count"], "curated": len(cur),
                       "recommended": sum(1 for c in cur if c["tier"] == "recommended"),
                       "candidates": len(cand), "pending": sum(1 for c in cand if c["status"] == "pending"),
                       "skills": sum(1 for s in sk if s["status"] == "active")},
            "raw": r, "curated": cur, "candidates": cand, "skills": sk}
