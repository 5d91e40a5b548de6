"""Closed vocabularies shared by every layer: actors, statuses, stop reasons.

Defined once here (the lowest layer that needs them) and imported everywhere else.
"""
from __future__ import annotations

from enum import StrEnum


class Actor(StrEnum):
    """Who writes to state.db. Role instances are named ``<actor>-<n>`` (e.g. ``loop-agent-2``)."""

    HUMAN = "human"
    SUPERVISOR = "supervisor"
    COORDINATOR = "coordinator"
    LOOP_AGENT = "loop-agent"
    EVAL_AGENT = "eval-agent"
    CURATOR = "curator"


ROLE_ACTORS = (Actor.COORDINATOR, Actor.LOOP_AGENT, Actor.EVAL_AGENT, Actor.CURATOR)


class StopReason(StrEnum):
    """Why a run ended. Closed set: every ended run carries exactly one."""

    GOAL_MET = "goal_met"
    MAX_ITERATIONS = "max_iterations"
    TOKEN_BUDGET = "token_budget"
    COST_BUDGET = "cost_budget"
    TIMEOUT = "timeout"
    NO_PROGRESS = "no_progress"
    REPEATED_FAILURE = "repeated_failure"
    HUMAN_REJECTED = "human_rejected"
    CANCELLED = "cancelled"
    MODEL_ERROR = "model_error"
    ORG_LIMIT = "org_limit"
    VERIFY_UNRUNNABLE = "verify_unrunnable"   # a verify command cannot start: the machine's fault, not the doer's
    IMPOSSIBLE = "impossible"        # the goal cannot be met as stated: a review judged so and a human confirmed
    NEEDS_HUMAN = "needs_human"      # an error class the stop policy does not know: a human chose to end the run
    EVIDENCE_FORGED = "evidence_forged"   # the test report contradicts the eval-agent's canaries: the doer forged it


class WorkStatus(StrEnum):
    """Lifecycle of a work item (one run of the loop)."""

    QUEUED = "queued"          # submitted, not yet dispatched
    WAITING = "waiting"        # its workspace is busy with another item
    DISPATCHED = "dispatched"  # assigned to a loop-agent, not yet started
    RUNNING = "running"
    PAUSED = "paused"          # waiting for a human decision
    ENDED = "ended"            # terminal: stop_reason says why


class RoleStatus(StrEnum):
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    STOPPED = "stopped"
    CRASHED = "crashed"
    FAILED = "failed"          # crashed too often in a short window; not restarted


class SessionStatus(StrEnum):
    NEW = "new"
    RUNNING = "running"
    SUSPENDING = "suspending"
    SUSPENDED = "suspended"
    STOPPED = "stopped"


class DecisionStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    EDITED = "edited"          # approved with a changed action
    REJECTED = "rejected"
    RESPONDED = "responded"    # answered with text for the next gather
    EXECUTING = "executing"    # marker written before an approved action runs
    EXECUTED = "executed"


class CandidateStatus(StrEnum):
    PENDING = "pending"
    DEFERRED = "deferred"
    APPROVED = "approved"
    REJECTED = "rejected"
    MERGED = "merged"


class BatchStatus(StrEnum):
    """A batch of skill candidates offered to the human together."""

    OPEN = "open"
    CLOSED = "closed"


class SkillStatus(StrEnum):
    ACTIVE = "active"
    RETIRED = "retired"


class VerdictOutcome(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"


class ReviewVerdict(StrEnum):
    """The eval-agent's review of an iteration (roles/eval_agent/review.py): it can only veto."""

    APPROVE = "approve"              # nothing found against the goal or the criteria
    REJECT = "reject"                # the change is wrong: a pass becomes a fail (review_rejected)
    IMPOSSIBLE = "impossible"        # the goal cannot be met as stated: a human decides


class PreflightOutcome(StrEnum):
    """What running the verify commands on the baseline showed, before the first act."""

    READY = "ready"                  # every command ran, and the baseline does not pass yet
    ALREADY_PASSES = "already_passes"  # the goal looks met before any work: a human decides
    UNRUNNABLE = "unrunnable"        # a command cannot start: the run ends verify_unrunnable


class NoteStatus(StrEnum):
    PENDING = "pending"
    ARCHIVED = "archived"


class ProposalStatus(StrEnum):
    """A work candidate found by a discovery scan (``org discover``); nothing starts unless accepted."""

    PROPOSED = "proposed"      # open: waiting for a human (or a standing policy) to accept it
    ACCEPTED = "accepted"      # submitted as a work item (its id is on the proposal)
    DISMISSED = "dismissed"    # a human said no: the same evidence is not proposed again
    EXPIRED = "expired"        # its evidence is gone from a newer scan, or nobody acted on it in time


class ProposalKind(StrEnum):
    """What a discovery scan found, in the order it ranks them (first: recommended first)."""

    FAILING_TEST = "failing_test"   # a verify command fails on the current tree
    BUG = "bug"                     # an issue labelled as a bug
    FIXME = "fixme"                 # a FIXME marker in a tracked file
    TODO = "todo"                   # a TODO marker in a tracked file
    ISSUE = "issue"                 # any other issue


class Origin(StrEnum):
    """What started a work item (DESIGN.md, "Kinds of loop"); the row is the same whatever it is."""

    HUMAN = "human"            # submitted by a human (goal-based)
    SCHEDULE = "schedule"      # a standing order's tick (time-based)
    TRIGGER = "trigger"        # an event on the workspace: a commit, a file change, checks failing
    DISCOVERY = "discovery"    # a discovery scan's proposal, accepted (proactive)
    REPLAY = "replay"          # a skill's replay: an ended item rerun with and without it (skills/replay.py)


class ReplayPlanStatus(StrEnum):
    """What the coordinator made of a subject's replays (skills/replay.py)."""

    PLANNED = "planned"        # items chosen; runs submitted as concurrency allows
    SKIPPED = "skipped"        # no ended item could be replayed: the reason says why


class ReplaySubjectKind(StrEnum):
    """What a replay measures: a pending candidate, or a skill on demand (org skills eval)."""

    CANDIDATE = "candidate"
    SKILL = "skill"


class ReplayArm(StrEnum):
    """Which half of a replay pair a run is."""

    WITH = "with"              # the subject is the only skill in context
    WITHOUT = "without"        # no skill in context


class ReplayRelation(StrEnum):
    """How a replayed item relates to the subject."""

    SOURCE = "source"          # one of the runs its notes came from
    SIMILAR = "similar"        # an ended item like them that it did not come from


class ScheduleKind(StrEnum):
    """The rule of a standing order: two kinds of timer (``org schedule``) and four kinds of
    event on a workspace (``org trigger``)."""

    EVERY = "every"                  # every N seconds, on a grid from its creation
    CRON = "cron"                    # a cron expression, in local time
    GIT_COMMIT = "git-commit"        # a new commit on a branch
    FILE_CHANGE = "file-change"      # files matching a glob changed (debounced)
    VERIFY_FAILS = "verify-fails"    # the verify commands fail on the current tree (run every N seconds)
    DISCOVER = "discover"            # a discovery scan every N seconds: proposals, auto-started by policy only


TIMER_KINDS = (ScheduleKind.EVERY, ScheduleKind.CRON)
EVENT_KINDS = (ScheduleKind.GIT_COMMIT, ScheduleKind.FILE_CHANGE, ScheduleKind.VERIFY_FAILS, ScheduleKind.DISCOVER)


class ScheduleStatus(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    REMOVED = "removed"        # terminal: kept for its history; the name can be used again


class ActStatus(StrEnum):
    """How an act ended (``iterations.act_status``; roles/loop_agent/backends/base.py says what
    each means)."""

    OK = "ok"                              # the model ended its turn
    BUDGET_EXHAUSTED = "budget_exhausted"  # a budget fired before a model call
    MODEL_ERROR = "model_error"            # the model service failed past its retries
    FAILED = "failed"                      # the act could not go on (a tool's or the backend's own failure)


class AttemptOutcome(StrEnum):
    """How one attempt at an iteration (or the wrap-up act) closed (``attempts.outcome``); its
    code, when there is one, is in ``attempts.detail``."""

    COMMITTED = "committed"                # its iteration was committed
    DISCARDED = "discarded"                # cut by a crash: reset to the last checkpoint
    INTERRUPTED = "interrupted"            # cut by a suspend, a stop, a cancel or the org's limit (detail: which)
    BUDGET_EXHAUSTED = "budget_exhausted"  # a budget fired inside it (detail: the stop reason)
    MODEL_ERROR = "model_error"            # the model service failed (detail: the error code)
    WRAPPED_UP = "wrapped_up"              # the wrap-up act ended its turn
    WRAPUP_FAILED = "wrapup_failed"        # the wrap-up act did not (detail: its act status or error)


class DecisionKind(StrEnum):
    """What a decision asks a human (``decisions.kind``)."""

    NETWORK = "network"                    # a gated action that needs the network
    OUTSIDE_WORKSPACE = "outside_workspace"  # a gated action that writes outside the workspace
    OTHER = "other"                        # any other gated action the doer asked for
    SCOPE = "scope"                        # widen the run's change scope by a glob (nothing runs)
    BASELINE_PASSES = "baseline_passes"    # the verify commands pass before any work: go on or stop
    UNKNOWN_ERROR = "unknown_error"        # an error the stop policy does not know: go on or stop
    IMPOSSIBLE = "impossible"              # the goal is judged unreachable: confirm or go on
    NEEDS_HUMAN = "needs_human"            # the doer asks a human: respond and it goes on; reject --stop ends it


#: The kinds a doer may ask for with request_action (the others are asked by the org itself).
GATE_KINDS = (DecisionKind.NETWORK, DecisionKind.OUTSIDE_WORKSPACE, DecisionKind.SCOPE, DecisionKind.OTHER)


class AttentionKind(StrEnum):
    """What needs a human (``attention.kind``; roles/coordinator/attention.py)."""

    DECISION_WAITING = "decision_waiting"
    BATCH_OPEN = "batch_open"
    VERIFY_UNRUNNABLE = "verify_unrunnable"
    ROLE_FAILED = "role_failed"
    ORG_LIMIT = "org_limit"
    EVIDENCE_FORGED = "evidence_forged"


class NoteKind(StrEnum):
    """What a knowledge note is about (``curated_notes.kind``; knowledge/notes.py)."""

    OUTCOME = "outcome"
    FAILURE = "failure"
    FIX = "fix"
    CONTEXT = "context"


class NoteTier(StrEnum):
    """Where a scored pattern stands (``curated_notes.tier``; knowledge/signals.py)."""

    RECOMMENDED = "recommended"            # 3 or more signals: a skill candidate, recommended
    QUEUED = "queued"                      # 2 signals: a candidate, queued
    CURATED = "curated"                    # 1 or fewer: stays a curated note


class HandoffSource(StrEnum):
    """Who wrote a run's hand-off note (``handoffs.source``)."""

    WRAPUP = "wrapup"                      # the wrap-up act
    RECORD = "record"                      # derived from the record alone
class TranscriptKind(StrEnum):
    """One entry of an act's transcript (``state_db/queries/transcript.py``), in the order an act
    makes them. The verdict, decisions and lessons are read from their own rows beside them."""

    PROMPT = "prompt"              # what the act was asked (the variable prompt, bounded)
    TEXT = "text"                  # the model's words in one turn
    TOOL_CALL = "tool_call"        # a tool the model called, with its input
    TOOL_RESULT = "tool_result"    # what the tool answered (output bounded, secrets redacted)
    TURN = "turn"                  # one model response: its request id, model and stop reason
    OUTCOME = "outcome"            # how the act ended (status, code, error)
    CUT = "cut"                    # the run's transcript bound was reached: later entries are not kept
