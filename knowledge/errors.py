"""Errors of the knowledge pipeline. Each carries a machine-readable ``code`` and says what to do."""
from __future__ import annotations

from state_db.kernel.errors import StateError


class KnowledgeError(StateError):
    """Base of every knowledge-pipeline error; ``code`` is stable, ``hint`` says what to do."""

    code = "knowledge_error"


class NoteInvalid(KnowledgeError):
    """A note misses one of its four parts or breaks a size cap."""

    code = "note_invalid"

    def __init__(self, part: str, why: str):
        self.part = part
        super().__init__(f"note part {part!r} {why}", hint="give fact, judgment, rationale and applicability, "
                                                            "each non-empty and within the size cap")


class RunNotEnded(KnowledgeError):
    """A retro was asked for a run that has not ended (or does not exist)."""

    code = "run_not_ended"

    def __init__(self, run_id: str, status: str | None):
        self.run_id, self.status = run_id, status
        super().__init__(f"run {run_id} is {status or 'missing'}, not ended",
                         hint="retros are written for ended runs only")


class RetroExists(KnowledgeError):
    """The run's retro is in state.db already: it is written exactly once."""

    code = "retro_exists"

    def __init__(self, run_id: str):
        self.run_id = run_id
        super().__init__(f"run {run_id} has its retro already", hint="nothing to do; retros are written once")


class ConsolidationRaced(KnowledgeError):
    """Another writer consolidated some of the same pending notes first; nothing was written."""

    code = "consolidation_raced"

    def __init__(self, why: str):
        super().__init__(f"consolidation lost a race: {why}",
                         hint="nothing was written; the next pass consolidates what is still pending")
