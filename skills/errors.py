"""Errors of the skills layer. Each carries a machine-readable ``code`` and says what to do."""
from __future__ import annotations

from state_db.kernel.errors import StateError


class SkillError(StateError):
    """Base of every skills-layer error; ``code`` is stable, ``hint`` says what to do."""

    code = "skill_error"


class CandidateNotFound(SkillError):
    code = "candidate_not_found"

    def __init__(self, ref: str):
        self.ref = ref
        super().__init__(f"no skill candidate {ref}",
                         hint="list them with 'org candidates list --all'; a reason goes after --reason")


class CandidateClosed(SkillError):
    """The candidate is in a terminal state: approved, rejected and merged are final."""

    code = "candidate_closed"

    def __init__(self, cid: str, status: str, action: str):
        self.cid, self.status, self.action = cid, status, action
        super().__init__(f"candidate {cid} is {status}; it cannot be {action}",
                         hint="terminal states are final; a new dated candidate comes when the pattern recurs")


class BadSkillName(SkillError):
    code = "bad_skill_name"

    def __init__(self, name: str, why: str):
        self.name = name
        super().__init__(f"skill name {name!r} {why}",
                         hint="use 1-64 lowercase letters, digits and single hyphens (e.g. fix-import-paths)")


class BadSkillText(SkillError):
    """A SKILL.md text that does not have the Agent Skills front matter; ``lineno`` is the line of
    the text (1 = the opening ``---``) where the problem is, when one line is to blame."""

    code = "bad_skill_text"

    def __init__(self, why: str, lineno: int | None = None):
        self.why, self.lineno = why, lineno
        where = f"SKILL.md text, line {lineno}," if lineno is not None else "SKILL.md text"
        super().__init__(f"{where} {why}",
                         hint="start with '---', then 'name: ...' and 'description: ...' (quote a value "
                              "that holds ': ' or starts with a quote), then '---' and the body")


class SkillNotFound(SkillError):
    code = "skill_not_found"

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"no skill {name}", hint="list them with 'org skills list'")
