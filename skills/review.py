"""A human's review of candidates as one durable write — shared by ``org candidates`` and chat.

Each call is one ``StateWriter.run_once`` transaction as actor ``human`` (the writer records
the OS user; ``decided_by``/``decided_at`` record who and when): the decisions, the batches they
finish, and for approvals the skill rows. SKILL.md files are rendered after the commit from
state.db (the curator re-renders any that a crash left missing).
"""
from __future__ import annotations

import uuid
from pathlib import Path

from skills import batches, candidates as C, registry


def decide(writer, refs: list[str], action: str, skills_dir: Path, *, key: str | None = None,
           reason: str | None = None) -> dict:
    """Approve, reject or defer candidates (ids or names).

    Args:
        writer: a StateWriter as actor human.
        action: ``approve`` | ``reject`` | ``defer``.
        key: idempotency key (the same key twice decides once); default a fresh one.
        reason: why, in the human's words (kept with each decision).
    Returns: {"results": [{"id", "name", "status", "changed", "skill"?}], "closed_batches", "by", "at"}.
    Raises: CandidateNotFound, CandidateClosed (nothing is written then).
    """
    def do(tx):
        results = [C.decide(tx, ref, action, writer.os_user, reason) for ref in refs]
        return {"results": results, "closed_batches": batches.close_finished(tx), "by": writer.os_user, "at": tx.now}

    out, _ = writer.run_once(key or uuid.uuid4().hex, f"candidates.{action}", do, args={"refs": list(refs)})
    for r in out["results"]:
        if r.get("skill"):
            r["skill"]["file"] = str(registry.render_files(writer.conn, skills_dir, r["skill"]["name"]))
    return out


def edit(writer, ref: str, *, name: str | None = None, description: str | None = None, body: str | None = None,
         key: str | None = None) -> dict:
    """Edit a pending or deferred candidate; returns {"id", "changed": [fields]}.

    Raises: CandidateNotFound, CandidateClosed, BadSkillName, BadSkillText.
    """
    out, _ = writer.run_once(key or uuid.uuid4().hex, "candidates.edit",
                             lambda tx: C.edit(tx, ref, name=name, description=description, body=body),
                             args={"ref": ref, "name": name, "description": description, "body": body})
    return out


def retire(writer, name: str, *, key: str | None = None) -> dict:
    """Retire a skill (a human's decision; the machine only proposes); returns {"name", "changed", "by"}.

    Raises: SkillNotFound.
    """
    out, _ = writer.run_once(key or uuid.uuid4().hex, "skills.retire",
                             lambda tx: {"name": name, "changed": registry.retire(tx, name), "by": writer.os_user},
                             args={"name": name})
    return out
