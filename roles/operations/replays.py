"""Replaying ended work items with and without a skill (skills/replay.py says what and why).

``plan`` chooses the items a subject is measured on and records the choice (``replay_plans``);
``submit_due`` submits the replay runs a plan still lacks, within ``[learning]
replay_concurrency``; the coordinator calls ``tick`` on every reconcile (pending candidates get a
plan as soon as they are proposed), and ``org skills eval NAME`` calls ``evaluate`` for any
skill, approved or not.

A replay run is an ordinary work item, submitted through the submit operation (same checks,
baseline, caps and row): its workspace is a new folder under ``<org home>/replays/`` holding the
baseline of the item it reruns, exactly as its history recorded it; its goal, verify commands,
protect patterns, backend, toolchain and caps are the item's own, except that a ``[learning]``
replay budget, when set, is split evenly between the runs of one subject and caps each. Its
``replays`` row is written in the same transaction as the work item, and its idempotency key
names the subject, the item and the arm, so a crash between the two never submits a run twice.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass

import structlog

from roles.operations import Result, human_writer
from roles.operations.submit import SubmitRequest, submit
from skills import replay as S
from skills.errors import SkillError
from state_db.kernel.config import Config
from state_db.connection import connect
from state_db.kernel.errors import OrgError
from state_db.kernel.home import OrgHome
from state_db.queries import replays as R
from state_db.queries import work as work_q
from state_db.queries.replays import WITH, WITHOUT
from state_db.queries.work import Caps
from state_db.vocab import Origin

log = structlog.get_logger("replays")


class ReplayError(SkillError):
    code = "replay_failed"


def workspace_of(home: OrgHome, subject: str, source: str, arm: str):
    return home.root / "replays" / subject / f"{source}-{arm}"


def _history(home: OrgHome, work_id: str):
    return home.history_dir / f"{work_id}.git"


def plan(writer, home: OrgHome, subject: S.Subject, items: int, *, only: list[str] | None = None) -> R.Plan:
    """Choose the items ``subject`` is measured on (or ``only`` these) and record the plan."""
    conn = writer.conn
    if only:
        chosen = [(i, "source" if i in R.source_runs(conn, subject.source_notes) else "similar") for i in only]
    else:
        chosen = S.choose_items(conn, subject, items, lambda wid: _history(home, wid).is_dir())
    status, reason = ("planned", "") if chosen else (
        "skipped", "no ended item with a recorded baseline matches it (its own runs were pruned or never ended)")
    with writer.transaction() as tx:
        if R.plan(tx.conn, subject.id) is None:
            tx.insert("replay_plans", {"subject": subject.id, "subject_kind": subject.kind, "status": status,
                                       "name": subject.name, "skill_text": subject.text,
                                       "items": [{"id": i, "relation": rel} for i, rel in chosen],
                                       "reason": reason, "planned_by": writer.actor, "created_at": tx.now})
            tx.journal("replays.planned", subject.id, {"items": [i for i, _ in chosen], "status": status,
                                                       "reason": reason, "name": subject.name})
    return R.plan(conn, subject.id)


def _request(item, home: OrgHome, cfg: Config, subject_id: str, source: str, arm: str, runs: int) -> SubmitRequest:
    caps = item.caps
    tokens, usd = caps.budget_tokens, caps.budget_usd
    if cfg.learning.replay_budget_tokens:
        share = max(1, cfg.learning.replay_budget_tokens // max(runs, 1))
        tokens = min(tokens, share) if tokens else share
    if cfg.learning.replay_budget_usd:
        share = cfg.learning.replay_budget_usd / max(runs, 1)
        usd = min(usd, share) if usd else share
    return SubmitRequest(
        goal=item.goal, workspace=str(workspace_of(home, subject_id, source, arm)), verify=list(item.verify),
        protect=list(item.protect), default_protect=item.default_protect, scope=list(item.scope),
        verify_hidden=item.verify_hidden or None, backend=item.backend,
        caps=Caps.given({**caps.encode(), "budget_tokens": tokens, "budget_usd": usd}),
        idempotency_key=f"replay:{subject_id}:{source}:{arm}", toolchain=dict(item.toolchain) or None)


def submit_run(writer, home: OrgHome, cfg: Config, subject: S.Subject, source: str, relation: str, arm: str,
               runs: int) -> str | None:
    """Submit one replay run (None when it exists already). Raises OrgError (the source is gone,
    its baseline cannot be read, the submit checks refuse)."""
    conn = writer.conn
    if any(r.source_id == source and r.arm == arm for r in R.of_subject(conn, subject.id)):
        return None
    item = work_q.item(conn, source)
    if item is None:
        raise ReplayError(f"work item {source} is gone; it cannot be replayed", code="replay_source_missing")
    dest = workspace_of(home, subject.id, source, arm)
    if dest.exists():                       # a submit that crashed before its row: ours to redo
        shutil.rmtree(dest)
    from roles.workbench.workspace.copy import write_commit
    from roles.workbench.workspace.views import BASELINE_REF
    write_commit(_history(home, source), BASELINE_REF, dest)

    def record(tx, work_id):
        tx.insert("replays", {"work_id": work_id, "subject": subject.id, "subject_kind": subject.kind,
                              "source_id": source, "relation": relation, "arm": arm, "skill_name": subject.name,
                              "skill_text": subject.text if arm == WITH else "", "created_at": tx.now})

    done = submit(home, cfg, _request(item, home, cfg, subject.id, source, arm, runs), writer=writer,
                  origin={"origin": Origin.REPLAY, "origin_id": subject.id}, after=record, wake=False)
    return done.id


SUBMIT_TRIES = 3        # passes a replay run's submit may fail before its item leaves the plan
_FAILED: dict[tuple[str, str, str], int] = {}     # (subject, item, arm) -> failed passes, in this process


def submit_due(writer, home: OrgHome, cfg: Config) -> list[str]:
    """Submit the runs planned but not submitted yet, oldest plan first, while fewer than
    ``[learning] replay_concurrency`` replays are active. Returns the new work ids."""
    conn = writer.conn
    out: list[str] = []
    free = cfg.learning.replay_concurrency - R.active_count(conn)
    for p in R.incomplete_plans(conn):
        if free <= 0:
            break
        subject = S.Subject(p.subject, p.subject_kind, p.name, p.text)
        have = {(r.source_id, r.arm) for r in R.of_subject(conn, p.subject)}
        for entry in p.items:
            for arm in (WITH, WITHOUT):
                if free <= 0 or (entry["id"], arm) in have:
                    continue
                key = (p.subject, entry["id"], arm)
                try:
                    wid = submit_run(writer, home, cfg, subject, entry["id"], entry["relation"], arm, 2 * len(p.items))
                except (OrgError, OSError) as exc:
                    # a lock, a full disk or a history being written may pass; an item that is gone
                    # will not, and costs only the tries: each failure waits for a later pass, and
                    # the last one leaves the item out of the plan with its reason
                    _FAILED[key] = tries = _FAILED.get(key, 0) + 1
                    last = tries >= SUBMIT_TRIES
                    log.warning("replay_not_submitted", subject=p.subject, source=entry["id"], arm=arm,
                                error=str(exc), tries=tries,
                                next="left out of the measurement" if last else "tried again at a later pass")
                    if last:
                        _FAILED.pop(key, None)
                        _drop(writer, p.subject, entry["id"], str(exc))
                    break
                _FAILED.pop(key, None)
                if wid:
                    out.append(wid)
                    free -= 1
    return out


def _drop(writer, subject: str, source: str, why: str) -> None:
    """Take an item that cannot be replayed out of a plan (said in the journal)."""
    with writer.transaction() as tx:
        p = R.plan(tx.conn, subject)
        if p is None:
            return
        items = [e for e in p.items if e["id"] != source]
        tx.update("replay_plans", subject, items=items,
                  reason=(p.reason + "; " if p.reason else "") + f"{source} left out: {why}")
        tx.journal("replays.dropped", subject, {"source": source, "why": why})


def tick(writer, home: OrgHome, cfg: Config) -> list[str]:
    """The coordinator's pass: plan every new pending candidate (when replays are on), then
    submit what is due. Returns the work ids submitted."""
    if S.enabled(cfg)[0]:
        for cid in R.unplanned_candidates(writer.conn):
            subject = S.candidate_subject(writer.conn, cid)
            if subject is not None:
                plan(writer, home, subject, cfg.learning.replay_items)
    return submit_due(writer, home, cfg)


@dataclass(frozen=True)
class Evaluation(Result):
    """``org skills eval``: the evaluation's id, the skill, the items chosen (or why none), the
    runs submitted now (the rest follow as replays end) and, with ``--wait``, the figures."""

    id: str
    name: str
    items: list
    submitted: list
    reason: str
    summary: dict | None = None
    OPTIONAL = frozenset({"summary"})


def _eval_id(conn, name: str) -> str:
    base = f"e-{time.strftime('%Y%m%d')}-{name}"
    n = 1
    while R.plan(conn, f"{base}-{n}") is not None:
        n += 1
    return f"{base}-{n}"


def evaluate(home: OrgHome, cfg: Config, name: str, *, items: int | None = None, only: list[str] | None = None,
             wait_s: float = 0.0, via: str | None = None) -> Evaluation:
    """Measure skill (or pending candidate) ``name`` now: plan, submit what the concurrency allows
    (the coordinator submits the rest), and with ``wait_s`` wait for the figures.

    Raises SkillError ``skill_not_found`` / ReplayError."""
    from skills.candidates import find
    from skills.errors import CandidateNotFound
    writer = human_writer(home.require().db_path, via)
    try:
        conn = writer.conn
        eval_id = _eval_id(conn, name)
        subject = S.skill_subject(conn, name, eval_id)
        if subject is None:
            try:
                c = find(conn, name)
            except CandidateNotFound:
                raise ReplayError(f"no skill or candidate named {name}", code="skill_not_found",
                                  hint="'org skills list' and 'org candidates list' show the names") from None
            subject = S.Subject(eval_id, "candidate", c.name, f"{c.description}\n\n{c.body.strip()}",
                                tuple(c.source_notes))
        p = plan(writer, home, subject, items or cfg.learning.replay_items, only=only)
        submitted = submit_due(writer, home, cfg)
    finally:
        writer.close()
    from roles.operations.wake import Waker
    Waker(home, cfg).wake({"replays": eval_id})
    summary = _wait(home, eval_id, wait_s) if wait_s > 0 else None
    return Evaluation(eval_id, subject.name, list(p.items), submitted, p.reason, summary)


def _wait(home: OrgHome, subject: str, wait_s: float) -> dict:
    deadline = time.monotonic() + wait_s
    conn = connect(home.db_path, readonly=True)
    try:
        while True:
            summary = S.of_subject(conn, subject)
            p = summary["plan"]
            done = p is not None and summary["items"] >= len(p["items"]) and summary["running"] == 0 \
                and summary["items_measured"] >= len(p["items"])
            if done or time.monotonic() >= deadline:
                return summary
            time.sleep(0.2)
    finally:
        conn.close()


def summary(home: OrgHome, subject: str) -> dict:
    conn = connect(home.require().db_path, readonly=True)
    try:
        return S.of_subject(conn, subject)
    finally:
        conn.close()
