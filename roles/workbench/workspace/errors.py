"""Errors of the workspace history; each carries a machine-readable ``code``."""
from __future__ import annotations

from state_db.kernel.errors import StateError


class HistoryError(StateError):
    """Base error of the workspace history; ``code`` is machine-readable."""

    code = "history_error"


class WorkspaceMissing(HistoryError):
    code = "workspace_missing"


class UnknownCommit(HistoryError):
    code = "unknown_commit"


class NoBaseline(HistoryError):
    code = "no_baseline"


class RefLocked(HistoryError):
    """A ref's lock file exists: another writer holds it, or a killed one left it."""

    code = "ref_locked"

    def __init__(self, lock: str) -> None:
        self.lock = lock
        super().__init__(
            f"{lock} exists: a writer holds this ref or was killed while holding it; "
            "restart the run (baseline() and reset_to() clear locks a killed writer left)"
        )


class RefConflict(HistoryError):
    """A ref did not hold the value the update expected (someone else moved it)."""

    code = "ref_conflict"


class RepositoryError(HistoryError):
    """A user's repository could not be read or extended (``safegit``); ``code`` says why."""

    code = "repository_error"
