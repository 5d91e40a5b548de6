"""The gate over discovery's candidates: recording a scan, accepting, dismissing, expiring.

A scan (``discover.scan_all``) only reads; ``record`` turns its candidates into ``proposals`` rows
in one ``BEGIN IMMEDIATE`` transaction:
- an open proposal whose fingerprint the scan finds again is refreshed (evidence, rank, expiry),
  never duplicated (the database's partial unique index says so too);
- evidence a human dismissed, or that an accepted, still active work item is working on, is not
  proposed again; evidence an ended work item did not fix is proposed anew;
- open proposals from the sources the scan read whose evidence it no longer finds, and those
  nobody acted on within ``discover.expire_days`` of the last scan that found them, expire;
- exactly one open proposal of the workspace is recommended: the scan's first.

Nothing starts here. ``accept`` submits a proposal through the submit operation (the same row,
caps and verifier as any work item; the work item's origin is ``discovery`` and the proposal's id,
and the proposal keeps the work item's id); ``auto_start`` does so for the kinds org.toml's
``discover.auto_start`` names, only when the daily cap on work started without a human
(``limits.daily_spend_usd``) has room, and at most one per scan.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from roles.operations import human_writer, signed
from roles.operations.discover import DiscoverError, ScanResult
from roles.operations.submit import SubmitRequest, submit
from state_db.kernel.config import Config
from state_db.kernel.errors import Conflict, NotFound
from state_db.kernel.home import OrgHome
from state_db.queries import proposals as Q
from state_db.queries.work import Caps
from state_db.queries.schedules import automatic_start_allowed
from state_db.vocab import Origin, ProposalStatus as P

POLICY = "policy:discover.auto_start"      # the client a standing policy's accept comes through
_DAY = 86400.0


@dataclass(frozen=True)
class Edits:
    """What a human changes when accepting (``org discover accept ID --edit ...``): the flags of
    ``org submit``; None keeps the proposal's own."""

    goal: str | None = None
    verify: list[str] | None = None
    protect: list[str] | None = None
    default_protect: bool = True
    caps: Caps = field(default_factory=Caps)   # the caps given replace the proposal's
    backend: str | None = None
    worktree: bool = False
    review: str | None = None


def record(home: OrgHome, cfg: Config, workspace, result: ScanResult, *, limit: int | None = None,
           writer=None, via: str | None = None) -> dict:
    """Write a scan's candidates as proposals (see the module docstring).

    ``writer``: a StateWriter (the coordinator's, for a discover trigger); default the human's,
    through ``via``. Returns {"workspace", "sources", "notes", "found", "proposals": [rows shown,
    at most ``limit``, in rank order], "expired": [ids], "held_back": n}.
    """
    ws = str(Path(workspace).expanduser().resolve())
    limit = limit or cfg.discover.limit
    ttl = float(cfg.discover.expire_days) * _DAY
    own = writer is None
    writer = writer or human_writer(home.db_path, via)
    try:
        with writer.transaction() as tx:
            expired = _expire(tx, ws, result, cfg)
            standing = Q.standing(tx.conn, ws, [c.fingerprint for c in result.proposals])
            shown, held = [], 0
            for cand in result.proposals:
                row = standing.get(cand.fingerprint)
                if row is not None and row.status != P.PROPOSED:
                    held += 1
                    continue
                if row is None and len(shown) >= limit:
                    continue
                fields = {"kind": cand.kind, "source": cand.source, "title": cand.title, "goal": cand.goal,
                          "verify": list(cand.verify), "caps": cand.caps, "evidence": cand.evidence,
                          "rank": cand.rank, "seen_at": tx.now, "expires_at": tx.now + ttl}
                if row is None:
                    pid = f"p-{uuid.uuid4().hex[:8]}"
                    tx.insert("proposals", {"id": pid, "fingerprint": cand.fingerprint, "workspace": ws,
                                            "status": P.PROPOSED, "recommended": 0, "created_by": signed(writer),
                                            "created_at": tx.now, **fields})
                else:
                    pid = row.id
                    tx.update("proposals", pid, **fields)
                if len(shown) < limit:
                    shown.append(pid)
            for p in Q.open_proposals(tx.conn, workspace=ws, now=tx.now):
                want = bool(shown) and p.id == shown[0]
                if p.recommended != want:
                    tx.update("proposals", p.id, recommended=int(want))
            rows = [Q.proposal(tx.conn, pid) for pid in shown]
    finally:
        if own:
            writer.close()
    return {"workspace": ws, "sources": result.sources, "notes": result.notes, "found": len(result.proposals),
            "proposals": [r.as_dict() for r in rows], "expired": expired, "held_back": held}


def _expire(tx, ws: str, result: ScanResult, cfg: Config) -> list[str]:
    """Expire what lapsed anywhere, and what the sources this scan read no longer show."""
    out = []
    for p in Q.lapsed(tx.conn, tx.now):
        tx.set_status("proposals", p.id, P.EXPIRED, decided_at=tx.now,
                      detail=f"nobody acted on it within {cfg.discover.expire_days:g} day(s) of the last scan "
                             "that found it")
        out.append(p.id)
    found = {c.fingerprint for c in result.proposals}
    for p in Q.of_sources(tx.conn, ws, result.sources):
        if p.fingerprint not in found and p.id not in out:
            tx.set_status("proposals", p.id, P.EXPIRED, decided_at=tx.now,
                          detail="a newer scan no longer finds its evidence")
            out.append(p.id)
    return out


def accept(home: OrgHome, cfg: Config, proposal_id: str, edits: Edits | None = None, *,
           via: str | None = None, guard: Callable | None = None) -> dict:
    """Submit the proposal as a work item (``edits`` override its goal, verify commands, caps and
    submit options) whose origin is the proposal, and mark it accepted with the work item's id in
    the same transaction. Accepting twice submits once (the submit's idempotency key is the
    proposal's). ``guard(tx)`` runs first under the write lock and may raise to write nothing.

    Returns {"proposal", "work_id", "status", "replayed", "submit": submit's result | None}.
    Raises NotFound, Conflict (``proposal_closed``), DiscoverError (``proposal_expired``), and what
    submit raises (SubmitError: no verify command, a bad cap, ...): the proposal then stays open.
    """
    edits = edits or Edits()
    writer = human_writer(home.db_path, via)
    try:
        p = Q.proposal(writer.conn, proposal_id)
        if p is None:
            raise NotFound(f"no proposal {proposal_id}", hint="list them with 'org discover list'")
        if p.status == P.ACCEPTED:
            return {"proposal": p.id, "work_id": p.work_id, "status": p.status, "replayed": True, "submit": None}
        _check_open(p.status, p.id)
        if p.expires_at <= writer.clock():
            with writer.transaction() as tx:
                tx.set_status("proposals", p.id, P.EXPIRED, decided_at=tx.now, detail="nobody acted on it in time")
            raise DiscoverError(f"proposal {p.id} has expired", code="proposal_expired",
                                hint="run 'org discover' again: evidence still there is proposed anew")
        caps = Caps.given({**p.caps, **edits.caps.encode()})      # given, as a submit's flags are
        req = SubmitRequest(goal=edits.goal or p.goal, workspace=p.workspace,
                            verify=list(edits.verify) if edits.verify else list(p.verify),
                            protect=list(edits.protect or []), default_protect=edits.default_protect,
                            backend=edits.backend, worktree=edits.worktree, review=edits.review,
                            caps=caps, idempotency_key=f"discover:{p.id}", via=via)
        edited = edits != Edits()

        def mark_accepted(tx, work_id: str) -> None:
            if guard is not None:
                guard(tx)
            row = tx.get("proposals", p.id)
            _check_open(row["status"], p.id)
            tx.set_status("proposals", p.id, P.ACCEPTED, work_id=work_id, decided_by=signed(writer),
                          decided_at=tx.now, detail="accepted with edits" if edited else "accepted")

        result = submit(home, cfg, req, writer=writer, guard=mark_accepted,
                        origin={"origin": Origin.DISCOVERY, "origin_id": p.id})
    finally:
        writer.close()
    return {"proposal": p.id, "work_id": result.id, "status": str(P.ACCEPTED), "replayed": result.replayed,
            "submit": result.as_dict()}


def _check_open(status: str, proposal_id: str) -> None:
    if status != P.PROPOSED:
        raise Conflict(f"proposal {proposal_id} is {status}", code="proposal_closed",
                       hint="run 'org discover' again: evidence still there is proposed anew")


def dismiss(home: OrgHome, proposal_id: str, reason: str | None = None, *, via: str | None = None) -> dict:
    """Mark an open proposal dismissed: the same evidence is not proposed again. Dismissing a
    dismissed one changes nothing. Returns {"proposal", "status", "changed"}. Raises NotFound,
    Conflict (``proposal_closed``: accepted or expired)."""
    writer = human_writer(home.db_path, via)
    try:
        with writer.transaction() as tx:
            row = tx.get("proposals", proposal_id)
            if row is None:
                raise NotFound(f"no proposal {proposal_id}", hint="list them with 'org discover list'")
            if row["status"] == P.DISMISSED:
                return {"proposal": proposal_id, "status": row["status"], "changed": False}
            if row["status"] != P.PROPOSED:
                raise Conflict(f"proposal {proposal_id} is {row['status']}", code="proposal_closed",
                               hint="only an open proposal can be dismissed")
            tx.set_status("proposals", proposal_id, P.DISMISSED, decided_by=signed(writer), decided_at=tx.now,
                          detail=(reason or "dismissed")[:500])
    finally:
        writer.close()
    return {"proposal": proposal_id, "status": str(P.DISMISSED), "changed": True}


def auto_start(home: OrgHome, cfg: Config, shown: list[dict], edits: Edits | None = None) -> dict | None:
    """Start the first shown proposal of a kind ``discover.auto_start`` names, when the daily cap
    on work started without a human (``limits.daily_spend_usd``, the rule every automatic start
    obeys: ``queries.schedules.automatic_start_allowed``) has room for its cost budget; checked
    again under the write lock, so two scans at once cannot both pass it. ``edits``: the submit
    options it starts with (a discover trigger's: backend, caps, review); None keeps the proposal's.

    Returns None (no proposal of such a kind), {"proposal", "started": False, "why"} or
    {"proposal", "started": True, "work_id", "why"}.
    """
    kinds = set(cfg.discover.auto_start)
    first = next((p for p in shown if p["kind"] in kinds and p["status"] == P.PROPOSED), None)
    if first is None:
        return None
    budget = edits.caps.budget_usd if edits is not None and edits.caps.budget_usd is not None \
        else first["caps"].get("budget_usd")
    why = []

    def within_cap(tx) -> None:
        allowed, reason = automatic_start_allowed(tx.conn, tx.now, cap_usd=float(cfg.limits.daily_spend_usd),
                                                  budget_usd=budget)
        why[:] = [reason]
        if not allowed:
            raise _NoRoom(reason)

    try:
        done = accept(home, cfg, first["id"], edits, via=POLICY, guard=within_cap)
    except _NoRoom as exc:
        return {"proposal": first["id"], "started": False, "why": f"{exc}: accept it yourself"}
    return {"proposal": first["id"], "started": True, "work_id": done["work_id"], "why": why[0] if why else ""}


class _NoRoom(DiscoverError):
    code = "daily_spend_cap"
