"""One look at what a trigger watches, the same shape for every kind."""
from __future__ import annotations

from dataclasses import dataclass

PASSING = "pass"


@dataclass(frozen=True)
class Seen:
    """One look at what a trigger watches: its fingerprint (None: nothing to compare — the
    workspace or branch is gone, or a check could not start: ``why``) and the event's details."""

    fingerprint: str | None
    detail: str = ""
    why: str = ""
    tree: str | None = None         # verify-fails: the tree's fingerprint (to tell the org's trees)
