"""Approved skills: the ``skills`` row, its files, use counts, retirement.

state.db is the truth; ``<org home>/skills/<name>/SKILL.md`` (Agent Skills format, with the
origin in its ``metadata``) and ``origin.json`` are rendered from it. Approval writes the row in
the human's transaction; the files are written after the commit and re-rendered by the curator
whenever an active skill's SKILL.md is missing — so a crash between the two loses nothing.

Retirement is only ever *proposed* by the machine: an active skill unused (no run carried it)
for ``skill_unused_days`` since its last use (or its approval) is listed as proposed, and the
curator journals ``skills.retirement_proposed`` once per idle stretch; ``retire`` is a human's.
"""
from __future__ import annotations

import json
from pathlib import Path

import orjson

from skills.errors import SkillNotFound
from skills.skillmd import SkillText, write_folder
from state_db.snapshot import write_atomic

ACTIVE, RETIRED = "active", "retired"
DAY = 86400.0


def install(tx, candidate: dict, who: str) -> dict:
    """Create (or update) the skill row of an approved candidate; returns {"name", "path", "new"}."""
    name = candidate["name"]
    signals = candidate.get("signals") or {}
    notes = candidate.get("source_notes") or []
    runs = list(dict.fromkeys(r[0] for r in tx.conn.execute(
        f"SELECT run_id FROM raw_notes WHERE id IN ({','.join('?' * len(notes))}) ORDER BY created_at", notes)))
    origin = {"candidate": candidate["id"], "source_notes": notes, "runs": runs,
              "curated_note": signals.get("curated_id"), "score": candidate.get("score"),
              "approved_by": who, "approved_at": tx.now}
    path = f"skills/{name}/SKILL.md"
    existing = tx.get("skills", name)
    if existing is None:
        tx.insert("skills", {"name": name, "path": path, "candidate_id": candidate["id"], "origin": origin,
                             "status": ACTIVE, "created_at": tx.now})
        return {"name": name, "path": path, "new": True}
    previous = orjson.loads(existing["origin"] or "{}")
    origin["previous"] = [{k: v for k, v in previous.items() if k != "previous"}] + previous.get("previous", [])
    tx.update("skills", name, candidate_id=candidate["id"], origin=origin, path=path)
    if existing["status"] != ACTIVE:
        tx.set_status("skills", name, ACTIVE)
    return {"name": name, "path": path, "new": False}


def skill(conn, name: str) -> dict:
    """A skill row with its origin decoded and its text fields (from the approved candidate).

    Raises: SkillNotFound.
    """
    row = conn.execute("""SELECT s.*, c.description, c.body FROM skills s
                          LEFT JOIN skill_candidates c ON c.id = s.candidate_id WHERE s.name = ?""",
                       (name,)).fetchone()
    if row is None:
        raise SkillNotFound(name)
    d = dict(row)
    d["origin"] = orjson.loads(d["origin"] or "{}")
    return d


def text_of(row: dict) -> SkillText:
    origin = row["origin"]
    meta = {"origin-candidate": str(origin.get("candidate", "")),
            "origin-runs": ", ".join(origin.get("runs", [])),
            "origin-notes": ", ".join(origin.get("source_notes", [])),
            "approved-by": str(origin.get("approved_by", ""))}
    return SkillText(row["name"], row["description"] or "", row["body"] or "", meta)


def render_files(conn, skills_dir: Path, name: str) -> Path:
    """Write ``<skills_dir>/<name>/SKILL.md`` and ``origin.json`` from state.db; returns SKILL.md."""
    row = skill(conn, name)
    origin = json.dumps(row["origin"], ensure_ascii=False, indent=2) + "\n"
    write_atomic(Path(skills_dir) / name / "origin.json", origin)
    return write_folder(text_of(row), skills_dir)


def ensure_rendered(conn, skills_dir: Path) -> list[str]:
    """Render every active skill whose SKILL.md is missing; returns their names."""
    done = []
    for (name,) in conn.execute("SELECT name FROM skills WHERE status = ? ORDER BY name", (ACTIVE,)).fetchall():
        if not (Path(skills_dir) / name / "SKILL.md").is_file():
            render_files(conn, skills_dir, name)
            done.append(name)
    return done


def listing(conn, now: float, unused_days: int, *, include_retired: bool = False) -> list[dict]:
    """Skills with use counts, last use, idle days and whether retirement is proposed."""
    sql = "SELECT * FROM skills" + ("" if include_retired else " WHERE status = 'active'") + " ORDER BY name"
    out = []
    for r in conn.execute(sql).fetchall():
        d = dict(r)
        d["origin"] = orjson.loads(d["origin"] or "{}")
        since = d["last_used_at"] or d["created_at"]
        d["idle_days"] = round(max(0.0, now - since) / DAY, 1)
        d["retirement_proposed"] = d["status"] == ACTIVE and now - since >= unused_days * DAY
        out.append(d)
    return out


def propose_retirements(tx, unused_days: int) -> list[str]:
    """Journal ``skills.retirement_proposed`` for each idle skill not yet proposed in this idle
    stretch (a use after the proposal starts a new one). Proposes only; never retires."""
    proposed = []
    for d in listing(tx.conn, tx.now, unused_days):
        if not d["retirement_proposed"]:
            continue
        since = d["last_used_at"] or d["created_at"]
        seen = tx.one("""SELECT 1 FROM events WHERE kind = 'skills.retirement_proposed' AND subject = ?
                           AND at >= ?""", (d["name"], since))
        if seen is None:
            tx.journal("skills.retirement_proposed", d["name"],
                       {"idle_days": d["idle_days"], "use_count": d["use_count"], "last_used_at": d["last_used_at"]})
            proposed.append(d["name"])
    return proposed


def retire(tx, name: str) -> bool:
    """Retire a skill (a human's decision); returns False if it was retired already."""
    row = tx.get("skills", name)
    if row is None:
        raise SkillNotFound(name)
    if row["status"] == RETIRED:
        return False
    tx.set_status("skills", name, RETIRED)
    return True
