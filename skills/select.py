"""Choosing what a loop carries: matching skills (stable prefix) and curated knowledge.

Matching is deterministic: the TF-IDF cosine over character n-grams (knowledge/similarity.py)
between the work item's context — its goal and verify commands, ``context_of`` — and each
active skill's name, description and "When to use" section (for knowledge: each curated note's
topic and body). The best ``k`` at or above the threshold are taken, best first, within a size
cap (a skill that does not fit whole is left out, so the prefix stays byte-stable).

Use is counted from the prompt manifests themselves: a skill's ``use_count`` is the number of
distinct runs with a committed iteration whose manifest lists it, ``last_used_at`` the latest
such iteration — so it counts once per run, whatever the number of iterations or retries.
The indexes are cached per database and rebuilt only when the skills or notes change.
"""
from __future__ import annotations

import re
import threading

import orjson

from knowledge.similarity import Index
from state_db.queries import knowledge as K
from state_db.queries import replays
from state_db.queries import skills as Q
from state_db.queries.iterations import last_n, of_work as iterations_of
from state_db.queries.skills import Skill

SKILL_K, SKILL_THRESHOLD, SKILLS_CAP_CHARS, SKILL_CAP_CHARS = 3, 0.15, 6000, 3000
KNOWLEDGE_K, KNOWLEDGE_THRESHOLD = 5, 0.10
_WHEN = re.compile(r"##\s*When to use\s*\n(.*?)(?:\n##\s|\Z)", re.S | re.I)
_cache: dict[tuple, tuple] = {}
_lock = threading.Lock()


def context_of(work: dict) -> str:
    """What a work item is about, for matching: its goal and its verify commands."""
    verify = work.get("verify") or []
    if isinstance(verify, str):
        verify = orjson.loads(verify)
    return "\n".join([work.get("goal") or ""] + [str(v) for v in verify])


def _db(conn) -> str:
    return conn.execute("PRAGMA database_list").fetchone()[2]


def _remember(key: tuple, value: tuple) -> None:
    with _lock:
        if len(_cache) > 32:            # stale versions of changed databases
            _cache.clear()
        _cache[key] = value


def _cached(conn, what: str, version: tuple, build):
    key = (what, _db(conn), *version)
    with _lock:
        hit = _cache.get(key)
    if hit is None:
        hit = build()
        _remember(key, hit)
    return hit


def _skills_index(conn) -> tuple[Index, list[Skill]]:
    def build():
        skills = Q.skills(conn)
        docs = []
        for s in skills:
            when = _WHEN.search(s.body)
            docs.append(" ".join([s.name.replace("-", " "), s.description, when.group(1) if when else ""]))
        return Index(docs), skills
    return _cached(conn, "skills", Q.active_skills_version(conn), build)


def skill_text(skill: Skill) -> str:
    """What a carried skill puts in the prompt: its description and its SKILL.md body."""
    return f"{skill.description}\n\n{skill.body.strip()}"


def choose_skills(conn, context: str, *, k: int = SKILL_K, threshold: float = SKILL_THRESHOLD,
                  cap_chars: int = SKILLS_CAP_CHARS, per_skill_chars: int = SKILL_CAP_CHARS) -> list[tuple[str, str]]:
    """Skills for ``LoopSettings.skills``: ``[(name, text)]``, best match first.

    ``text`` is the description and body of the skill's SKILL.md; a skill longer than
    ``per_skill_chars`` or beyond the total ``cap_chars`` is left out.
    """
    index, skills = _skills_index(conn)
    if not skills:
        return []
    out, used = [], 0
    for i, _ in index.query(context, k=k, threshold=threshold):
        text = skill_text(skills[i])
        if len(text) > per_skill_chars or used + len(text) > cap_chars:
            continue
        out.append((skills[i].name, text))
        used += len(text)
    return out


def for_run(conn, work: dict) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(skills, knowledge)`` for a run about to (re)start.

    A run that has committed iterations keeps the skills its latest iteration carried (those
    still active, same order), so a resumed run's cacheable prefix stays byte-identical; a new
    run gets a fresh choice. Knowledge is chosen afresh either way (it is not in the prefix).
    A replay (skills/replay.py) carries exactly the skill it measures (its ``with`` arm) or none
    (its ``without`` arm), whatever else would match, with the same knowledge in both arms.
    """
    context = context_of(work)
    replay = replays.of_work(conn, work["id"]) if work.get("id") else None
    if replay is not None:
        carried = [(replay["skill_name"], replay["skill_text"])] if replay["arm"] == replays.WITH else []
        return carried, choose_knowledge(conn, context)
    last = last_n(conn, work["id"])
    if last == 0:
        return choose_skills(conn, context), choose_knowledge(conn, context)
    (latest,) = iterations_of(conn, work["id"], after=last - 1)
    names = latest.prompt.get("skills") or []
    _, skills = _skills_index(conn)
    by_name = {s.name: s for s in skills}
    return [(n, skill_text(by_name[n])) for n in names if n in by_name], choose_knowledge(conn, context)


def _knowledge_index(conn):
    def build():
        notes = K.curated_notes(conn)
        return Index([f"{c.topic}\n{c.body}" for c in notes]), notes
    return _cached(conn, "knowledge", K.curated_version(conn), build)


def choose_knowledge(conn, context: str, *, k: int = KNOWLEDGE_K,
                     threshold: float = KNOWLEDGE_THRESHOLD) -> list[tuple[str, str]]:
    """Curated notes for ``LoopSettings.knowledge``: ``[(curated id, body)]``, most relevant first."""
    index, notes = _knowledge_index(conn)
    if not notes:
        return []
    return [(notes[i].id, notes[i].body) for i, _ in index.query(context, k=k, threshold=threshold)]


def record_use(writer, work_id: str | None = None) -> dict[str, int]:
    """Recount the use of the skills listed in ``work_id``'s manifests (every skill if None).

    Idempotent and crash-safe (derived from committed iterations); writes only what changed.
    Returns {skill name: use_count} for the skills recounted.
    """
    conn = writer.conn
    names = Q.skill_names(conn) if work_id is None else Q.skills_carried_by(conn, work_id)
    if not names:                       # a run that carried no skill: nothing to recount
        return {}
    counted = Q.skill_uses(conn, None if work_id is None else names)
    out = {}
    with writer.transaction(render=False) as tx:
        for name in names:
            row = Q.skill(tx.conn, name)
            if row is None:
                continue
            use = counted.get(name)
            count, last = (use.runs, use.last_used_at) if use else (0, None)
            if count != row.use_count or last != row.last_used_at:
                tx.update("skills", name, use_count=count, last_used_at=last)
            out[name] = count
    return out
