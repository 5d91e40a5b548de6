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


def _skills_index(conn):
    sig = conn.execute("""SELECT COUNT(*), group_concat(name || ':' || COALESCE(candidate_id, ''), ',') FROM
                            (SELECT name, candidate_id FROM skills WHERE status = 'active' ORDER BY name)""").fetchone()
    key = ("skills", _db(conn), sig[0], sig[1])
    with _lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    rows = [dict(r) for r in conn.execute(
        """SELECT s.name, c.description, c.body FROM skills s JOIN skill_candidates c ON c.id = s.candidate_id
            WHERE s.status = 'active' ORDER BY s.name""")]
    docs = []
    for r in rows:
        when = _WHEN.search(r["body"] or "")
        docs.append(" ".join([r["name"].replace("-", " "), r["description"] or "", when.group(1) if when else ""]))
    value = (Index(docs), rows)
    _remember(key, value)
    return value


def skill_text(row: dict) -> str:
    """What a carried skill puts in the prompt: its description and its SKILL.md body."""
    return f"{row['description']}\n\n{(row['body'] or '').strip()}"


def choose_skills(conn, context: str, *, k: int = SKILL_K, threshold: float = SKILL_THRESHOLD,
                  cap_chars: int = SKILLS_CAP_CHARS, per_skill_chars: int = SKILL_CAP_CHARS) -> list[tuple[str, str]]:
    """Skills for ``LoopSettings.skills``: ``[(name, text)]``, best match first.

    ``text`` is the description and body of the skill's SKILL.md; a skill longer than
    ``per_skill_chars`` or beyond the total ``cap_chars`` is left out.
    """
    index, rows = _skills_index(conn)
    if not rows:
        return []
    out, used = [], 0
    for i, _ in index.query(context, k=k, threshold=threshold):
        text = skill_text(rows[i])
        if len(text) > per_skill_chars or used + len(text) > cap_chars:
            continue
        out.append((rows[i]["name"], text))
        used += len(text)
    return out


def for_run(conn, work: dict) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(skills, knowledge)`` for a run about to (re)start.

    A run that has committed iterations keeps the skills its latest iteration carried (those
    still active, same order), so a resumed run's cacheable prefix stays byte-identical; a new
    run gets a fresh choice. Knowledge is chosen afresh either way (it is not in the prefix).
    """
    context = context_of(work)
    last = conn.execute("SELECT prompt FROM iterations WHERE work_id = ? ORDER BY n DESC LIMIT 1",
                        (work["id"],)).fetchone()
    if last is None:
        return choose_skills(conn, context), choose_knowledge(conn, context)
    names = orjson.loads(last[0] or "{}").get("skills") or []
    _, rows = _skills_index(conn)
    by_name = {r["name"]: r for r in rows}
    return [(n, skill_text(by_name[n])) for n in names if n in by_name], choose_knowledge(conn, context)


def _knowledge_index(conn):
    sig = conn.execute("SELECT COUNT(*), MAX(updated_at) FROM curated_notes").fetchone()
    key = ("knowledge", _db(conn), sig[0], sig[1])
    with _lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    rows = [dict(r) for r in conn.execute("SELECT id, topic, body FROM curated_notes ORDER BY created_at, id")]
    value = (Index([f"{r['topic']}\n{r['body']}" for r in rows]), rows)
    _remember(key, value)
    return value


def choose_knowledge(conn, context: str, *, k: int = KNOWLEDGE_K,
                     threshold: float = KNOWLEDGE_THRESHOLD) -> list[tuple[str, str]]:
    """Curated notes for ``LoopSettings.knowledge``: ``[(curated id, body)]``, most relevant first."""
    index, rows = _knowledge_index(conn)
    if not rows:
        return []
    return [(rows[i]["id"], rows[i]["body"]) for i, _ in index.query(context, k=k, threshold=threshold)]


_USES = """SELECT j.value AS name, COUNT(DISTINCT i.work_id) AS uses, MAX(i.committed_at) AS last
             FROM iterations i, json_each(i.prompt, '$.skills') j {where} GROUP BY j.value"""


def record_use(writer, work_id: str | None = None) -> dict[str, int]:
    """Recount the use of the skills listed in ``work_id``'s manifests (every skill if None).

    Idempotent and crash-safe (derived from committed iterations); writes only what changed.
    Returns {skill name: use_count} for the skills recounted.
    """
    conn = writer.conn
    if work_id is None:
        names = [r[0] for r in conn.execute("SELECT name FROM skills ORDER BY name")]
        counted = {r["name"]: (r["uses"], r["last"]) for r in conn.execute(_USES.format(where=""))}
    else:
        names = [r[0] for r in conn.execute(
            """SELECT DISTINCT j.value FROM iterations i, json_each(i.prompt, '$.skills') j
                WHERE i.work_id = ? ORDER BY j.value""", (work_id,))]
        where = f"WHERE j.value IN ({','.join('?' * len(names))})"
        counted = {r["name"]: (r["uses"], r["last"]) for r in conn.execute(_USES.format(where=where), names)}
    out = {}
    with writer.transaction(render=False) as tx:
        for name in names:
            row = tx.get("skills", name)
            if row is None:
                continue
            count, last = counted.get(name, (0, None))
            if count != row["use_count"] or last != row["last_used_at"]:
                tx.update("skills", name, use_count=count, last_used_at=last)
            out[name] = count
    return out
