"""Errors of the state layer, and ``OrgError``, the root of every expected error in the org.

Every package's errors subclass ``OrgError`` (here, the lowest layer): the state layer's
(``StateError``), the transport's, the sandbox's, the workspace history's, the backends',
knowledge's, skills', the CLI's. Each carries a stable, machine-readable ``code`` and a ``hint``
that says what to do; the CLI prints any of them as one line, ``error[code]: what — what to do``,
and everything else is a bug.
"""
from __future__ import annotations

import sqlite3


class OrgError(Exception):
    """The root of every expected error.

    ``code`` is stable and machine-readable; ``hint`` says what the user can do about it.
    """

    code = "error"
    hint = ""

    def __init__(self, message: str, *, hint: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        if hint is not None:
            self.hint = hint
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.message} — {self.hint}" if self.hint else self.message

    def line(self) -> str:
        """The one line the CLI prints: ``error[code]: what — what to do``."""
        return f"error[{self.code}]: {self}"


class StateError(OrgError):
    """Base of every state-layer error."""

    code = "state_error"


class HomeNotFound(StateError):
    code = "no_org_home"


class UnsupportedPlatform(StateError):
    code = "unsupported_platform"


class SchemaTooNew(StateError):
    code = "schema_too_new"


class MigrationFailed(StateError):
    code = "migration_failed"


class IllegalTransition(StateError):
    code = "illegal_transition"

    def __init__(self, table: str, key: str, old: str | None, new: str):
        self.table, self.key, self.old, self.new = table, key, old, new
        super().__init__(
            f"{table} {key}: {old!s} → {new} is not an allowed transition",
            hint="terminal states are final; check the current status with 'org status'",
        )


class NotAllowed(StateError):
    """The writing actor may not make this change (DESIGN.md, "Actors")."""

    code = "not_allowed"

    def __init__(self, actor: str, what: str, why: str = ""):
        self.actor, self.what = actor, what
        super().__init__(f"{actor} may not {what}" + (f": {why}" if why else ""),
                         hint="this change belongs to another role")


class RunTaken(NotAllowed):
    """A loop-agent's commit of an iteration was refused because the run is assigned to another
    loop-agent now: the coordinator handed it over (it took this one for gone) while this one
    acted. Not the doer's failure and not a question for a human: the act is discarded and the
    run's new holder goes on from the last committed iteration."""

    code = "run_taken"

    def __init__(self, actor: str, work_id: str, holder: str | None):
        self.work_id, self.holder = work_id, holder
        super().__init__(actor, f"commit an iteration of {work_id}", f"it is assigned to {holder}")
        self.hint = "this act is discarded; the run's holder goes on from its last committed iteration"


class StoreBusy(StateError, sqlite3.OperationalError):
    """The store stayed busy past its wait: SQLite's write lock held by others longer than its
    busy timeout (``database is locked``/``busy``), or on PostgreSQL a lock wait past
    ``lock_timeout``, a serialization failure or a deadlock. The machine's failure, passing: the
    transaction was rolled back and may be tried again. It is also a ``sqlite3.OperationalError``,
    the class every caller written for SQLite already catches."""

    code = "store_busy"

    def __init__(self, message: str):
        super().__init__(f"the store stayed busy past its wait: {message}",
                         hint="another writer held it; the write was rolled back and is tried again later")


class NotFound(StateError):
    code = "not_found"


class Conflict(StateError):
    code = "conflict"


class ConfigError(StateError):
    """org.toml is unreadable or a value breaks the schema; names the key and what is expected."""

    code = "config_invalid"

    def __init__(self, message: str, *, key: str | None = None, hint: str | None = None):
        self.key = key
        super().__init__(message, hint=hint or "fix org.toml, then run 'org config check'")


class JoinError(StateError):
    """A host cannot join the org it was told of (``org join``), or its own record says it did not."""

    code = "join_refused"
