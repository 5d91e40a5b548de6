"""What may change, and who may change it: the allow-lists StateWriter enforces.

Transitions: ``TRANSITIONS[table][old] -> set of allowed new statuses``; a status absent as a key
is terminal. Writers: ``WRITERS[(table, op)] -> actors`` for op in insert / update / status.
Special rules that need the database (goal_met needs a passing eval-agent verdict on the latest
committed iteration) live in ``writer.py`` next to the code that checks them.
"""
from __future__ import annotations

from state_db.vocab import (Actor, BatchStatus as B, CandidateStatus as C, DecisionStatus as D,
                            NoteStatus as N, ProposalStatus as P, RoleStatus as R, SessionStatus as S,
                            SkillStatus as K, WorkStatus as W)
from state_db.vocab import Origin, ScheduleStatus as SC

TRANSITIONS: dict[str, dict[str, set[str]]] = {
    "work_items": {
        W.QUEUED: {W.DISPATCHED, W.WAITING, W.ENDED},
        W.WAITING: {W.QUEUED, W.DISPATCHED, W.ENDED},
        W.DISPATCHED: {W.RUNNING, W.QUEUED, W.ENDED},
        W.RUNNING: {W.PAUSED, W.QUEUED, W.ENDED},
        W.PAUSED: {W.RUNNING, W.QUEUED, W.ENDED},
        # 'org continue': only the human reopens an ended run (CONTINUERS, checked in writer.py)
        W.ENDED: {W.QUEUED, W.WAITING},
    },
    "org_session": {
        S.NEW: {S.RUNNING, S.STOPPED},
        S.RUNNING: {S.SUSPENDING, S.SUSPENDED, S.STOPPED},
        S.SUSPENDING: {S.SUSPENDED, S.STOPPED, S.RUNNING},
        S.SUSPENDED: {S.RUNNING, S.STOPPED},
        S.STOPPED: {S.RUNNING, S.SUSPENDED},
    },
    "role_instances": {
        R.STARTING: {R.READY, R.CRASHED, R.STOPPING, R.STOPPED, R.FAILED},
        R.READY: {R.STOPPING, R.STOPPED, R.CRASHED},
        R.STOPPING: {R.STOPPED, R.CRASHED},
        R.CRASHED: {R.STARTING, R.FAILED, R.STOPPED},
        R.STOPPED: {R.STARTING},
        R.FAILED: {R.STARTING},
    },
    "decisions": {
        D.PENDING: {D.APPROVED, D.REJECTED, D.EDITED, D.RESPONDED},
        D.APPROVED: {D.EXECUTING},
        D.EDITED: {D.EXECUTING},
        # a resume that finds the marker asks the human again instead of re-running
        D.EXECUTING: {D.EXECUTED, D.PENDING},
    },
    "skill_candidates": {
        C.PENDING: {C.DEFERRED, C.APPROVED, C.REJECTED, C.MERGED},
        C.DEFERRED: {C.APPROVED, C.REJECTED, C.MERGED},
    },
    "candidate_batches": {B.OPEN: {B.CLOSED}},
    "raw_notes": {N.PENDING: {N.ARCHIVED}},
    "skills": {K.ACTIVE: {K.RETIRED}, K.RETIRED: {K.ACTIVE}},
    "schedules": {SC.ACTIVE: {SC.PAUSED, SC.REMOVED}, SC.PAUSED: {SC.ACTIVE, SC.REMOVED}},
    "proposals": {P.PROPOSED: {P.ACCEPTED, P.DISMISSED, P.EXPIRED}},
}

# Primary key column of each table that has a status.
KEYS = {"work_items": "id", "org_session": "id", "role_instances": "instance", "decisions": "id",
        "skill_candidates": "id", "candidate_batches": "id", "raw_notes": "id", "skills": "name",
        "iterations": ("work_id", "n"), "verdicts": "id", "preflights": "work_id", "model_calls": "request_id",
        "curated_notes": "id", "workspace_locks": "workspace", "attempts": ("work_id", "attempt"),
        "stop_history": ("work_id", "seq"), "attention": "key", "handoffs": ("work_id", "ending"), "proposals": "id",
        "peers": "instance", "replays": "work_id", "replay_plans": "subject",
        "transcript": ("work_id", "attempt", "seq")}

H, SUP, CO, LA, EV, CU = (Actor.HUMAN, Actor.SUPERVISOR, Actor.COORDINATOR, Actor.LOOP_AGENT,
                          Actor.EVAL_AGENT, Actor.CURATOR)

WRITERS: dict[tuple[str, str], set[str]] = {
    ("org_session", "insert"): {SUP, H},
    ("org_session", "status"): {SUP, H},
    ("org_session", "update"): {SUP, H},
    ("role_instances", "insert"): {SUP},
    ("role_instances", "status"): {SUP, CO, LA, EV, CU},
    ("role_instances", "update"): {SUP, CO, LA, EV, CU},
    ("work_items", "insert"): {H, CO},
    ("work_items", "status"): {H, CO, LA, EV},
    ("work_items", "update"): {H, CO, LA},
    ("attempts", "insert"): {LA},
    ("attempts", "update"): {LA, CO},
    ("iterations", "insert"): {LA},
    ("iterations", "update"): {LA},
    ("handoffs", "insert"): {LA},
    ("model_calls", "insert"): {LA, CO, CU, EV},
    ("transcript", "insert"): {LA},     # EV: its reviews (roles/eval_agent/review.py)
    ("verdicts", "insert"): {EV},
    ("preflights", "insert"): {EV},
    ("decisions", "insert"): {LA, EV},
    ("decisions", "status"): {H, CO, LA},
    ("decisions", "update"): {CO, LA},
    ("raw_notes", "insert"): {CU},
    ("raw_notes", "status"): {CU},
    ("raw_notes", "update"): {CU},
    ("curated_notes", "insert"): {CU},
    ("curated_notes", "update"): {CU},
    ("candidate_batches", "insert"): {CU},
    ("candidate_batches", "status"): {CU, H},
    ("candidate_batches", "update"): {CO, CU},
    ("skill_candidates", "insert"): {CU},
    ("skill_candidates", "status"): {H, CU},
    ("skill_candidates", "update"): {H, CU},
    ("skills", "insert"): {H, CU},
    ("skills", "status"): {H, CU},
    ("skills", "update"): {H, CU, LA},
    ("stop_history", "insert"): {H},
    ("workspace_locks", "insert"): {H, CO},
    ("workspace_locks", "delete"): {H, CO, LA, EV},
    ("attention", "insert"): {CO},
    ("attention", "update"): {CO},
    # standing orders: the human makes, pauses and removes them; the coordinator ticks them
    ("schedules", "insert"): {H},
    ("schedules", "status"): {H},
    ("schedules", "update"): {H, CO},
    # discovery: a scan run by the human (org discover) or by the coordinator (a discover trigger)
    ("proposals", "insert"): {H, CO},
    ("proposals", "update"): {H, CO},
    ("proposals", "status"): {H, CO},
    # skill replays: planned and submitted by the coordinator (or the human's 'org skills eval')
    ("replays", "insert"): {H, CO},
    ("replay_plans", "insert"): {H, CO},
    ("replay_plans", "update"): {H, CO},
    # each host's supervisor registers its own instances (org start on the coordinator host, org join)
    ("peers", "insert"): {SUP},
    ("peers", "update"): {SUP},
    ("peers", "delete"): {SUP, H},
}

# Status changes reserved to particular actors, whatever WRITERS says about the table.
# (table, new status, column, value) -> actors
RESERVED = {
    ("work_items", "stop_reason", "goal_met"): {EV},
    ("decisions", "status", D.APPROVED): {H, CO},
    ("decisions", "status", D.EDITED): {H, CO},
    ("decisions", "status", D.REJECTED): {H, CO},
    ("decisions", "status", D.RESPONDED): {H, CO},
    ("skill_candidates", "status", C.APPROVED): {H},
    ("skill_candidates", "status", C.REJECTED): {H},
    ("skill_candidates", "status", C.DEFERRED): {H},
    # only the coordinator starts work for a standing order (a human's submit is the human's)
    ("work_items", "origin", Origin.SCHEDULE): {CO},
    ("work_items", "origin", Origin.TRIGGER): {CO},
    ("proposals", "status", P.DISMISSED): {H},
}

# Who may reopen an ended work item (ended -> queued | waiting): a continuation is the human's.
CONTINUERS = {H}

# Tables that the raw ``execute`` path may write (bookkeeping with no domain meaning).
RAW_WRITABLE = {"delivery_ledger", "transport_counters", "events"}

# Retention may delete old bookkeeping rows of ended runs and fold usage into summaries;
# only the supervisor (automatic retention) and the human ('org gc') do it.
RETENTION_WRITERS = {SUP, H}


def allowed_transition(table: str, old: str | None, new: str) -> bool:
    table_rules = TRANSITIONS.get(table)
    if table_rules is None:
        return True
    if old is None:
        return True
    return new in table_rules.get(old, set())


def is_terminal(table: str, status: str) -> bool:
    rules = TRANSITIONS.get(table, {})
    return status not in rules
