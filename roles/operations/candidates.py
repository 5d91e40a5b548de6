"""Reviewing skill candidates as the human (``org candidates``): list, show, approve / reject /
defer, edit.

The reads are pure over state (skills/, knowledge/); each decision and edit is one durable write as
actor ``human`` (the OS user and the time are recorded with it; ``via`` names the client it came
through), idempotent under its key, then a wake to the coordinator. An approved candidate becomes
``skills/<name>/SKILL.md`` in the org home, rendered from state.db after the commit.
"""
from __future__ import annotations

from dataclasses import dataclass

from knowledge.patterns import queued as queued_patterns
from roles.operations import Result, human_writer
from roles.operations.wake import wake_coordinator
from skills import candidates as C, review
from skills.errors import SkillError
from skills.skillmd import parse, render
from skills import replay
from state_db.kernel.config import Config
from state_db.connection import connect
from state_db.kernel.home import OrgHome
from state_db.vocab import CandidateStatus

STATUSES = tuple(str(s) for s in CandidateStatus)
ACTIONS = ("approve", "reject", "defer")


class ReviewError(SkillError):
    """A review that names no candidate or no decision."""

    code = "bad_review"


@dataclass(frozen=True)
class CandidateList(Result):
    """Candidates in ``statuses``, oldest first, each as ``skills.candidates.get`` gives it."""

    statuses: tuple[str, ...]
    rows: tuple[dict, ...]

    def as_data(self) -> list[dict]:
        return list(self.rows)


@dataclass(frozen=True)
class QueuedPatterns(Result):
    """Curated notes whose pattern scored 2: queued, not proposed (``knowledge.patterns.queued``)."""

    rows: tuple[dict, ...]

    def as_data(self) -> list[dict]:
        return list(self.rows)


@dataclass(frozen=True)
class CandidateView(Result):
    """One candidate: its row (SKILL.md fields, score, per-signal evidence, decision)."""

    candidate: dict

    def as_data(self) -> dict:
        return dict(self.candidate)

    @property
    def skill_md(self) -> str:
        """The candidate's SKILL.md text, as it would be written when approved."""
        return render(C.as_text(self.candidate))


@dataclass(frozen=True)
class CandidateDecisions(Result):
    """What a review did: per candidate {"id", "name", "status", "changed", "skill"?} (an approval's
    skill with its SKILL.md ``file``), the batches it finished, who decided and when."""

    results: tuple[dict, ...]
    closed_batches: tuple[str, ...]
    by: str
    at: float


@dataclass(frozen=True)
class CandidateEdited(Result):
    """An edit: the candidate and the fields it changed (none when the text was the same)."""

    id: str
    changed: tuple[str, ...]


def _read(home: OrgHome, fn):
    conn = connect(home.require().db_path, readonly=True)
    try:
        return fn(conn)
    finally:
        conn.close()


def listing(home: OrgHome, statuses: list[str] | tuple[str, ...] | None = None, *,
            every: bool = False) -> CandidateList:
    """Candidates in ``statuses`` (default: pending; ``every``: whatever their status)."""
    chosen = STATUSES if every else tuple(statuses or ("pending",))

    def rows(conn):
        return [{**r, "replay": replay.of_subject(conn, r["id"])} for r in C.listing(conn, chosen)]
    return CandidateList(chosen, tuple(_read(home, rows)))


def queued(home: OrgHome) -> QueuedPatterns:
    return QueuedPatterns(tuple(_read(home, queued_patterns)))


def show(home: OrgHome, ref: str) -> CandidateView:
    """One candidate by id, or by the name of a pending or deferred one. Raises CandidateNotFound."""
    def one(conn):
        row = C.get(conn, ref)
        return {**row, "replay": replay.of_subject(conn, row["id"])}
    return CandidateView(_read(home, one))


def decide(home: OrgHome, cfg: Config, refs: list[str], action: str, *, idempotency_key: str | None = None,
           via: str | None = None, reason: str | None = None) -> CandidateDecisions:
    """Approve, reject or defer candidates (ids or names) in one write, then wake the coordinator;
    ``reason`` (why, in the human's words) is kept with each decision.

    Raises: CandidateNotFound, CandidateClosed (nothing is written then), ReviewError (an action
    that is not a decision, or no candidate named)."""
    if action not in ACTIONS:
        raise ReviewError(f"unknown candidate action {action!r}", hint=f"use one of {', '.join(ACTIONS)}")
    if not refs:
        raise ReviewError("no candidate named", hint="give one or more candidate ids (see 'org candidates')")
    writer = human_writer(home.require().db_path, via)
    try:
        out = review.decide(writer, list(refs), action, home.skills_dir, key=idempotency_key,
                            reason=(reason or "").strip() or None)
    finally:
        writer.close()
    wake_coordinator(home, cfg)
    return CandidateDecisions(tuple(out["results"]), tuple(out["closed_batches"]), out["by"], out["at"])


def edit(home: OrgHome, cfg: Config, ref: str, *, name: str | None = None, description: str | None = None,
         body: str | None = None, skill_md: str | None = None, idempotency_key: str | None = None,
         via: str | None = None) -> CandidateEdited:
    """Change a pending or deferred candidate's name, description or body (or all three from a
    whole SKILL.md text, ``skill_md``), then wake the coordinator.

    Raises: CandidateNotFound, CandidateClosed, BadSkillName, BadSkillText."""
    if skill_md is not None:
        text = parse(skill_md)
        name, description, body = text.name, text.description, text.body
    writer = human_writer(home.require().db_path, via)
    try:
        current = C.get(writer.conn, ref)
        out = review.edit(writer, current["id"], name=name, description=description, body=body,
                          key=idempotency_key)
    finally:
        writer.close()
    wake_coordinator(home, cfg)
    return CandidateEdited(out["id"], tuple(out["changed"]))
