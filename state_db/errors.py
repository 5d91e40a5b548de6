"""Errors of the state layer. Each carries a machine-readable ``code`` and says what to do."""
from __future__ import annotations


class StateError(Exception):
    """Base of every state-layer error.

    ``code`` is stable and machine-readable; ``hint`` says what the user can do about it.
    """

    code = "state_error"
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
