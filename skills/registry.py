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

from skills.errors import SkillNotFound
from skills.skillmd import SkillText, write_folder
from state_db.queries import knowledge as K
from state_db.queries import skills as Q
from state_db.queries.skills import Candidate, Skill
from state_db.snapshot import write_atomic
from state_db.vocab import SkillStatus

ACTIVE, RETIRED = SkillStatus.ACTIVE, SkillStatus.RETIRED
DAY = 86400.0


def install(tx, candidate: Candidate, who: str) -> dict:
    """Create (or update) the skill row of an approved candidate; returns {"name", "path", "new"}."""
    name = candidate.name
    notes = list(candidate.source_notes)
    runs = list(dict.fromkeys(n.run_id for n in K.raw_notes(tx.conn, notes)))
    origin = {"candidate": candidate.id, "source_notes": notes, "runs": runs,
              "curated_note": candidate.curated_id, "score": candidate.score,
              "approved_by": who, "approved_at": tx.now}
    path = f"skills/{name}/SKILL.md"
    existing = Q.skill(tx.conn, name)
    if existing is None:
        tx.insert("skills", {"name": name, "path": path, "candidate_id": candidate.id, "origin": origin,
                             "status": ACTIVE, "created_at": tx.now})
        return {"name": name, "path": path, "new": True}
    previous = existing.origin
    origin["previous"] = [{k: v for k, v in previous.items() if k != "previous"}] + previous.get("previous", [])
    tx.update("skills", name, candidate_id=candidate.id, origin=origin, path=path)
    if existing.status != ACTIVE:
        tx.set_status("skills", name, ACTIVE)
    return {"name": name, "path": path, "new": False}


def find(conn, name: str) -> Skill:
    """The skill ``name`` with the text of the candidate it was approved from.

    Raises: SkillNotFound.
    """
    found = Q.skill(conn, name)
    if found is None:
        raise SkillNotFound(name)
    return found


def skill(conn, name: str) -> dict:
    """``find`` as plain data (``org skills show --json``, the MCP tool): the row, its origin
    decoded, its description and body.

    Raises: SkillNotFound.
    """
    return find(conn, name).encode()


def text_of(skill: Skill | dict) -> SkillText:
    """The SKILL.md of a skill (or of its plain data, as ``skill`` returns it): the approved
    candidate's text with the skill's origin in its metadata."""
    skill = skill if isinstance(skill, Skill) else Skill.decode(skill)
    origin = skill.origin
    meta = {"origin-candidate": str(origin.get("candidate", "")),
            "origin-runs": ", ".join(origin.get("runs", [])),
            "origin-notes": ", ".join(origin.get("source_notes", [])),
            "approved-by": str(origin.get("approved_by", ""))}
    return SkillText(skill.name, skill.description, skill.body, meta)


def render_files(conn, skills_dir: Path, name: str) -> Path:
    """Write ``<skills_dir>/<name>/SKILL.md`` and ``origin.json`` from state.db; returns SKILL.md.

    Raises: SkillNotFound.
    """
    found = find(conn, name)
    origin = json.dumps(found.origin, ensure_ascii=False, indent=2) + "\n"
    write_atomic(Path(skills_dir) / name / "origin.json", origin)
    return write_folder(text_of(found), skills_dir)


def ensure_rendered(conn, skills_dir: Path) -> list[str]:
    """Render every active skill whose SKILL.md is missing; returns their names."""
    done = []
    for found in Q.skills(conn):
        if not (Path(skills_dir) / found.name / "SKILL.md").is_file():
            render_files(conn, skills_dir, found.name)
            done.append(found.name)
    return done


def idle_since(skill: Skill) -> float:
    """When the skill was last used (or approved, if never)."""
    return skill.last_used_at or skill.created_at


def retirement_due(skill: Skill, now: float, unused_days: int) -> bool:
    """An active skill no run carried for ``unused_days``: its retirement is proposed."""
    return skill.active and now - idle_since(skill) >= unused_days * DAY


def listing(conn, now: float, unused_days: int, *, include_retired: bool = False) -> list[dict]:
    """Skills with use counts, last use, idle days and whether retirement is proposed, as plain
    data (``org skills list --json``: the ``skills`` row, origin decoded; the text is ``skill``'s)."""
    return [{**{k: v for k, v in s.encode().items() if k not in ("description", "body")},
             "idle_days": round(max(0.0, now - idle_since(s)) / DAY, 1),
             "retirement_proposed": retirement_due(s, now, unused_days)}
            for s in Q.skills(conn, include_retired=include_retired)]


def propose_retirements(tx, unused_days: int) -> list[str]:
    """Journal ``skills.retirement_proposed`` for each idle skill not yet proposed in this idle
    stretch (a use after the proposal starts a new one). Proposes only; never retires."""
    proposed = []
    for s in Q.skills(tx.conn):
        if not retirement_due(s, tx.now, unused_days) or Q.retirement_proposed_since(tx.conn, s.name, idle_since(s)):
            continue
        tx.journal("skills.retirement_proposed", s.name,
                   {"idle_days": round(max(0.0, tx.now - idle_since(s)) / DAY, 1), "use_count": s.use_count,
                    "last_used_at": s.last_used_at})
        proposed.append(s.name)
    return proposed


def retire(tx, name: str) -> bool:
    """Retire a skill (a human's decision); returns False if it was retired already.

    Raises: SkillNotFound.
    """
    found = find(tx.conn, name)
    if found.status == RETIRED:
        return False
    tx.set_status("skills", name, RETIRED)
    return True
