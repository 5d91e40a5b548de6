"""Stopping, suspending and resuming the org as the human: the durable half, and the results.

``org stop`` and ``org suspend`` first record the human's intent (stop or suspend, forced or
not) in ``org_session`` as actor ``human`` (``record_intent``); the signal to the supervisor only
makes it act now, and a supervisor that starts later still reads the intent. Signalling and
waiting for processes belong to the supervisor's control module (scripts/control.py),
which calls ``record_intent`` first; operations do not reach into a role, so the CLI, which may,
joins the two and returns these results (scripts/cli/commands/stop.py, suspend.py, resume.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import orjson

from roles.operations import Result, human_writer
from state_db.bootstrap import init_home
from state_db.kernel.errors import StateError
from state_db.kernel.home import OrgHome
from state_db.queries.processes import session as org_session
from state_db.vocab import SessionStatus

INTENTS = ("stop", "suspend")


class LifecycleError(StateError):
    code = "control_failed"


@dataclass(frozen=True)
class Intent(Result):
    """The intent recorded in ``org_session.detail``."""

    intent: str
    force: bool
    requested_at: float


@dataclass(frozen=True)
class OrgStopped(Result):
    """The org after ``org stop`` / ``org suspend``: the session's ``status`` (``stopped`` or
    ``suspended``), how long it took, and whether a supervisor was ``signalled`` or ``absent``
    (then the role processes it left were stopped directly)."""

    status: str
    stopped_ms: float
    supervisor: str


@dataclass(frozen=True)
class OrgResumed(Result):
    """``org resume``: whether the org was running already (its supervisor's pid, for the text),
    else the new supervisor's ``pid``, how long it took to be ready and its roles."""

    OPTIONAL = frozenset({"pid", "ready_ms", "roles"})
    already_running: bool
    pid: int | None = None
    ready_ms: float | None = None
    roles: tuple[dict, ...] | None = None
    running_pid: int | None = field(default=None, metadata={"json": False})


def record_intent(home: OrgHome, intent: str, *, force: bool = False, supervisor_running: bool = False,
                  via: str | None = None) -> Intent:
    """Record the human's ``stop`` or ``suspend`` durably, before any signal.

    ``supervisor_running``: whether a supervisor process is alive (the caller, which may look at
    processes, says). Raises LifecycleError: never started (``control_failed``), or a suspend of
    a stopped org (``org_stopped``: the session records how the org ended; a stop is not
    rewritten into a suspend)."""
    if intent not in INTENTS:
        raise LifecycleError(f"unknown intent {intent!r}", code="bad_arguments", hint="use stop or suspend")
    done = Intent(intent, bool(force), time.time())
    writer = human_writer(home.require().db_path, via)
    try:
        with writer.transaction() as tx:
            session = org_session(tx.conn)
            if session is None:
                raise LifecycleError("this org was never started", hint="start it with scripts/start-org")
            if intent == "suspend" and session.status == SessionStatus.STOPPED and not supervisor_running:
                raise LifecycleError("the org is stopped; there is nothing to suspend", code="org_stopped",
                                     hint="start it with 'org resume' or scripts/start-org")
            tx.update("org_session", 1, detail=orjson.dumps(done.as_dict()).decode(), updated_at=time.time())
    finally:
        writer.close()
    return done


def prepare_resume(home: OrgHome) -> None:
    """What ``org resume`` does durably before a supervisor starts: the org home and its state.db
    exist and are migrated (``init_home``)."""
    init_home(home.require())
