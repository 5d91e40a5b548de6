"""Stop conditions: the machine, not the agent, decides when a loop ends.

Conditions are small objects over a frozen ``RunProgress`` and compose with ``AnyOf`` / ``AllOf``
(``a | b``, ``a & b``). The built-in conditions are in ``conditions``; ``StopPolicy``
(``policy``) is the top-level composite the engine holds; it refuses a configuration that could
run forever (no hard cap: iterations, tokens, cost or time).

Precedence when several conditions fire on the same evaluation: ``goal_met`` wins; otherwise the
first *declared* one. Declaration order is the depth-first, left-to-right order of the tree as
written: ``StopPolicy([A, AnyOf(B, C), D])`` orders A, B, C, D. A fired ``AllOf`` counts as one
decision at its own position; its reason is chosen among its members by the same rule (so
``AllOf(MaxIterations(9), Timeout(60))`` reports ``max_iterations``) and its detail lists all.

A tree bounds a run if a hard cap can end it alone: an any-of needs one member that bounds the
run, an all-of needs every member to (``AllOf(MaxIterations(5), GoalMet())`` may never fire).
``StopPolicy.budget_check`` evaluates the same tree over the budget caps only (tokens, cost,
time), between model calls inside an act.

``StopDecision`` is the state layer's (``state_db.ending``): the eval-agent, the coordinator and
the operations end runs with it too, through the same ``end_run``.
"""
from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Sequence

from state_db.ending import StopDecision
from state_db.kernel.errors import StateError
from state_db.vocab import StopReason

__all__ = ["AllOf", "AnyOf", "RunProgress", "StopCondition", "StopConfigError", "StopDecision", "VerdictSummary",
           "fingerprint"]


class StopConfigError(StateError):
    """A stop policy that cannot be used as configured; ``code`` is machine-readable."""

    code = "stop_config"


@dataclass(frozen=True)
class VerdictSummary:
    """What the stop conditions need from one iteration's verdict.

    ``failing`` holds ``(check name, failure signature)`` pairs.
    """

    passed: bool
    by_eval_agent: bool
    failing: tuple[tuple[str, str], ...] = ()

    def encode(self) -> dict[str, Any]:
        return {"passed": self.passed, "by_eval_agent": self.by_eval_agent,
                "failing": [list(f) for f in self.failing]}

    @classmethod
    def decode(cls, data: dict[str, Any]) -> VerdictSummary:
        return cls(bool(data["passed"]), bool(data["by_eval_agent"]),
                   tuple((str(c), str(s)) for c, s in data.get("failing", ())))


@dataclass(frozen=True)
class RunProgress:
    """A run's state as the stop conditions see it.

    ``fingerprints`` and ``verdicts`` are per committed iteration, oldest first, aligned on the
    latest: their last element belongs to iteration ``iterations``. They may omit the oldest
    iterations (a window is enough). A ``None`` verdict means "not verified (yet)".

    The flags (``cancelled`` … ``needs_human``) are False, True, or a sentence saying what
    raised them (the detail of the decision their condition makes). ``needs_human``: a human
    confirmed the stop of a run that met an error the policy does not know.
    """

    iterations: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    elapsed_s: float = 0.0
    fingerprints: tuple[str, ...] = ()
    verdicts: tuple[VerdictSummary | None, ...] = ()
    cancelled: bool | str = False
    human_rejected: bool | str = False
    model_error: bool | str = False
    org_limit: bool | str = False
    needs_human: bool | str = False
    largest_input: int = 0         # the largest input (input and cache-write tokens) of a call so far and
    largest_cost: float = 0.0      # the dearest call: what the budgets take the next call to need
                                   # (roles/loop_agent/conditions.py)

    def __post_init__(self) -> None:
        if len(self.fingerprints) > self.iterations or len(self.verdicts) > self.iterations:
            raise ValueError("more fingerprints or verdicts than committed iterations")


def _pick(decisions: Sequence[StopDecision]) -> StopDecision | None:
    """goal_met wins, then the first declared."""
    for d in decisions:
        if d.reason is StopReason.GOAL_MET:
            return d
    return decisions[0] if decisions else None


class StopCondition(ABC):
    """A stop condition. Subclasses implement ``check``; ``|`` and ``&`` compose."""

    #: A cap that alone bounds a run (iterations, tokens, cost, time).
    hard_cap: ClassVar[bool] = False
    #: Checked between model calls inside an act (``StopPolicy.budget_check``).
    budget: ClassVar[bool] = False
    #: Name in ``encode()`` output.
    kind: ClassVar[str]

    @abstractmethod
    def check(self, p: RunProgress) -> StopDecision | None:
        """Return a decision if this condition fires on ``p``, else None."""

    def fired(self, p: RunProgress, *, budget_only: bool = False) -> list[StopDecision]:
        """Decisions of the fired leaves, in declaration order (composites override)."""
        if budget_only and not self.budget:
            return []
        d = self.check(p)
        return [d] if d else []

    def evaluate(self, p: RunProgress) -> StopDecision | None:
        return _pick(self.fired(p))

    def bounds_run(self) -> bool:
        """True if this (sub)tree alone guarantees that a run ends."""
        return self.hard_cap

    def leaves(self) -> Iterator[StopCondition]:
        yield self

    def params(self) -> dict[str, Any]:
        return {}

    def encode(self) -> dict[str, Any]:
        return {self.kind: self.params()}

    def __or__(self, other: StopCondition) -> AnyOf:
        return AnyOf(self, other)

    def __and__(self, other: StopCondition) -> AllOf:
        return AllOf(self, other)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"


class _Composite(StopCondition):
    def __init__(self, *conditions: StopCondition) -> None:
        if not conditions:
            raise StopConfigError(f"{type(self).__name__} needs at least one condition",
                                  code="empty_composite")
        for c in conditions:
            if not isinstance(c, StopCondition):
                raise StopConfigError(f"{c!r} is not a stop condition", code="not_a_condition")
        self.conditions: tuple[StopCondition, ...] = tuple(conditions)

    def check(self, p: RunProgress) -> StopDecision | None:
        return self.evaluate(p)

    def leaves(self) -> Iterator[StopCondition]:
        for c in self.conditions:
            yield from c.leaves()

    def encode(self) -> dict[str, Any]:
        return {self.kind: [c.encode() for c in self.conditions]}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self.conditions))})"


class AnyOf(_Composite):
    """Fires when any member fires."""

    kind = "any"

    def fired(self, p: RunProgress, *, budget_only: bool = False) -> list[StopDecision]:
        return [d for c in self.conditions for d in c.fired(p, budget_only=budget_only)]

    def bounds_run(self) -> bool:
        return any(c.bounds_run() for c in self.conditions)


class AllOf(_Composite):
    """Fires when every member fires (one decision, detail lists each)."""

    kind = "all"

    def fired(self, p: RunProgress, *, budget_only: bool = False) -> list[StopDecision]:
        parts = []
        for c in self.conditions:
            got = c.fired(p, budget_only=budget_only)
            if not got:
                return []
            parts.extend(got)
        chosen = _pick(parts)
        return [StopDecision(chosen.reason, "all of: " + "; ".join(d.detail for d in parts))]

    def bounds_run(self) -> bool:
        # Only if every member does: AllOf(MaxIterations(5), GoalMet()) may never fire.
        return all(c.bounds_run() for c in self.conditions)


def fingerprint(workspace_tree_id: str, outcome_summary: str) -> str:
    """Identity of an iteration's result: the workspace tree and the outcome (whitespace-
    normalised). Equal fingerprints mean the iteration changed nothing that matters."""
    outcome = " ".join(outcome_summary.split())
    return hashlib.sha256(f"{workspace_tree_id}\0{outcome}".encode()).hexdigest()
