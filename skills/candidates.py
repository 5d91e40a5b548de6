"""Skill candidates: proposal with merge-by-name, the human's decisions, edits.

Lifecycle: ``pending → deferred | approved | rejected | merged``; ``deferred → approved |
rejected | merged``; approved, rejected and merged are terminal. Nothing is ever deleted.

When the curator proposes a candidate named N (``propose``), in this order:

1. every source note is covered by an earlier candidate named N → nothing new (``unchanged``);
2. a *pending* or *deferred* candidate named N exists → the new one is recorded ``merged`` into
   it and the live one absorbs its notes and score (a deferred one stays deferred: it is never
   asked again and never counts toward a threshold);
3. an *active skill* named N exists → the new one is recorded ``merged`` into ``skill:N`` and
   the skill's origin record gains its notes (``merged-into-<skill>``);
4. otherwise a new **dated** entry ``c-YYYYMMDD-N`` is created ``pending`` — after a rejected
   (or retired) one only when the notes no earlier candidate covered come from ≥
   ``notes_per_pattern`` distinct runs (the pattern recurred on its own since).
"""
from __future__ import annotations

import time
from typing import Iterable

from skills import registry
from skills.drafting import CandidateDraft
from skills.errors import CandidateClosed, CandidateNotFound
from skills.names import validate_name
from skills.skillmd import SkillText, renamed
from state_db.queries import skills as Q
from state_db.queries.skills import LIVE, Candidate  # noqa: F401 - LIVE: the statuses a decision can still change
from state_db.vocab import CandidateStatus as C

ACTIONS = {"approve": C.APPROVED, "reject": C.REJECTED, "defer": C.DEFERRED}


def find(conn, ref: str) -> Candidate:
    """A candidate by id, or by name (its latest pending or deferred entry).

    Raises: CandidateNotFound.
    """
    found = Q.candidate(conn, ref) or Q.live_candidate_named(conn, ref)
    if found is None:
        raise CandidateNotFound(ref)
    return found


def get(conn, ref: str) -> dict:
    """``find`` as plain data (what ``org candidates show --json`` and the MCP tool print).

    Raises: CandidateNotFound.
    """
    return find(conn, ref).encode()


def listing(conn, statuses: Iterable[str] = (C.PENDING,)) -> list[dict]:
    """Candidates in ``statuses``, oldest first, as plain data (``org candidates list --json``)."""
    return [c.encode() for c in Q.candidates(conn, statuses)]


def new_id(tx, name: str) -> str:
    base = f"c-{time.strftime('%Y%m%d', time.gmtime(tx.now))}-{name}"
    cid, n = base, 1
    while Q.candidate_id_taken(tx.conn, cid):
        n += 1
        cid = f"{base}-{n}"
    return cid


def _row(tx, d: CandidateDraft, status: str, cid: str, merged_into: str | None = None) -> dict:
    return {"id": cid, "name": d.name, "description": d.description, "body": d.body, "score": d.score,
            "signals": {**d.signals, "curated_id": d.curated_id}, "source_notes": d.source_notes,
            "status": status, "merged_into": merged_into, "created_at": tx.now}


def propose(tx, d: CandidateDraft, notes_per_pattern: int) -> tuple[str | None, str]:
    """Apply the proposal rules (module docstring) in ``tx`` (a curator transaction).

    Returns: (the candidate that now holds the evidence, or None; what happened:
        ``unchanged`` | ``waiting`` | ``created`` | ``merged-into-pending`` |
        ``merged-into-deferred`` | ``merged-into-skill``).
    """
    earlier = Q.candidates_named(tx.conn, d.name)
    covered = {n for c in earlier for n in c.source_notes}
    fresh = [(n, run) for n, run in d.notes if n not in covered]
    if not fresh:
        return None, "unchanged"
    live = next((c for c in earlier if c.live), None)
    if live is not None:
        tx.insert("skill_candidates", _row(tx, d, C.MERGED, new_id(tx, d.name), merged_into=live.id))
        notes = list(dict.fromkeys(list(live.source_notes) + d.source_notes))
        tx.update("skill_candidates", live.id, source_notes=notes, score=d.score,
                  signals={**d.signals, "curated_id": d.curated_id})
        return live.id, f"merged-into-{live.status}"
    skill = Q.skill(tx.conn, d.name)
    if skill is not None and skill.active:
        tx.insert("skill_candidates", _row(tx, d, C.MERGED, new_id(tx, d.name), merged_into=f"skill:{d.name}"))
        origin = dict(skill.origin)
        origin["reinforced_by"] = list(dict.fromkeys(origin.get("reinforced_by", []) + [n for n, _ in fresh]))
        tx.update("skills", d.name, origin=origin)
        return None, "merged-into-skill"
    if earlier and len({run for _, run in fresh}) < notes_per_pattern:
        return None, "waiting"
    cid = new_id(tx, d.name)
    tx.insert("skill_candidates", _row(tx, d, C.PENDING, cid))
    return cid, "created"


def decide(tx, ref: str, action: str, who: str, reason: str | None = None) -> dict:
    """A human decision (``approve`` / ``reject`` / ``defer``) on one candidate, in ``tx``
    (a human transaction), with the human's ``reason`` when they gave one. Approving creates or updates the skill row (files are rendered after
    the commit, from state.db). Returns {"id", "name", "status", "changed", "skill"?}.

    Raises: CandidateNotFound, CandidateClosed, ValueError (unknown action).
    """
    status = ACTIONS.get(action)
    if status is None:
        raise ValueError(f"unknown action {action!r}")
    c = find(tx.conn, ref)
    if c.status == status:
        return {"id": c.id, "name": c.name, "status": status, "changed": False}
    if not c.live:
        raise CandidateClosed(c.id, c.status, str(status))
    tx.set_status("skill_candidates", c.id, status, decided_by=who, decided_at=tx.now, decided_reason=reason)
    out = {"id": c.id, "name": c.name, "status": str(status), "changed": True}
    if status == C.APPROVED:
        out["skill"] = registry.install(tx, c, who)
    return out


def edit(tx, ref: str, *, name: str | None = None, description: str | None = None,
         body: str | None = None) -> dict:
    """Change a pending or deferred candidate's name, description or body (a human write). A new
    name is carried through consistently: the old one is replaced in the heading, the description
    and the body (``skillmd.renamed``), whichever of them the edit left as it was.

    Raises: CandidateNotFound, CandidateClosed, BadSkillName, BadSkillText.
    """
    c = find(tx.conn, ref)
    if not c.live:
        raise CandidateClosed(c.id, c.status, "edited")
    new = SkillText(c.name, description if description is not None else c.description,
                    body if body is not None else c.body)
    new = renamed(new, validate_name(name) if name else c.name).validate()
    fields = {k: v for k, v in (("name", new.name), ("description", new.description), ("body", new.body))
              if v != getattr(c, k)}
    if fields:
        tx.update("skill_candidates", c.id, **fields)
    return {"id": c.id, "changed": sorted(fields)}


def as_text(c: Candidate | dict) -> SkillText:
    """The SKILL.md fields of a candidate (or of its plain data, as ``get`` returns it)."""
    c = c if isinstance(c, Candidate) else Candidate.decode(c)
    return SkillText(c.name, c.description, c.body)
