"""Stop conditions: the machine, not the agent, decides when a loop ends.

Conditions are small objects over a frozen ``RunProgress`` and compose with ``AnyOf`` / ``AllOf``
(``a | b``, ``a & b``). ``StopPolicy`` is the top-level composite the engine holds; it refuses a
configuration that could run forever (no hard cap: iterations, tokens, cost or time).

Precedence when several conditions fire on the same evaluation: ``goal_met`` wins; otherwise the
first *declared* one. Declaration order is the depth-first, left-to-right order of the tree as
written: ``StopPolicy([A, AnyOf(B, C), D])`` orders A, B, C, D. A fired ``AllOf`` counts as one
decision at its own position; its reason is chosen among its members by the same rule (so
``AllOf(MaxIterations(9), Timeout(60))`` reports ``max_iterations``) and its detail lists all.

A tree bounds a run if a hard cap can end it alone: an any-of needs one member that bounds the
run, an all-of needs every member to (``AllOf(MaxIterations(5), GoalMet())`` may never fire).
``StopPolicy.budget_check`` evaluates the same tree over the budget caps only (tokens, cost,
time), between model calls inside an act.
"""
from __future__ import annotations

import hashlib
import math
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Sequence

from state_db.errors import StateError
from state_db.vocab import StopReason


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
    """

    iterations: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    elapsed_s: float = 0.0
    fingerprints: tuple[str, ...] = ()
    verdicts: tuple[VerdictSummary | None, ...] = ()
    cancelled: bool = False
    human_rejected: bool = False
    model_error: bool = False
    org_limit: bool = False

    def __post_init__(self) -> None:
        if len(self.fingerprints) > self.iterations or len(self.verdicts) > self.iterations:
            raise ValueError("more fingerprints or verdicts than committed iterations")


@dataclass(frozen=True)
class StopDecision:
    reason: StopReason
    detail: str

    def encode(self) -> dict[str, str]:
        return {"reason": str(self.reason), "detail": self.detail}

    @classmethod
    def decode(cls, data: dict[str, Any]) -> StopDecision:
        return cls(StopReason(data["reason"]), str(data["detail"]))


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


# -- built-ins -------------------------------------------------------------------------------


def _positive(name: str, value: float, *, integer: bool = False) -> None:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    # NaN and infinity would be accepted as caps that can never fire.
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value <= 0:
        kind = "a positive integer" if integer else "a positive number"
        raise StopConfigError(f"{name} must be {kind}, got {value!r}", code="bad_cap")


class GoalMet(StopCondition):
    """The latest committed iteration carries a passing verdict written by the eval-agent."""

    kind = "goal_met"

    def check(self, p: RunProgress) -> StopDecision | None:
        v = p.verdicts[-1] if p.iterations and p.verdicts else None
        if v is not None and v.passed and v.by_eval_agent:
            return StopDecision(StopReason.GOAL_MET,
                                f"iteration {p.iterations} passed verification by the eval-agent")
        return None


class _Cap(StopCondition):
    """Fires when a counter of the run reaches ``limit``."""

    hard_cap = True
    field: ClassVar[str]        # the RunProgress attribute compared
    reason: ClassVar[StopReason]
    integer: ClassVar[bool] = False
    says: ClassVar[str]         # detail, formatted with ``value`` and ``limit``

    def __init__(self, limit: float) -> None:
        _positive(self.kind, limit, integer=self.integer)
        self.limit = limit

    def params(self) -> dict[str, Any]:
        return {"limit": self.limit}

    def check(self, p: RunProgress) -> StopDecision | None:
        value = getattr(p, self.field)
        if value >= self.limit:
            return StopDecision(self.reason, self.says.format(value=value, limit=self.limit))
        return None


class MaxIterations(_Cap):
    kind = "max_iterations"
    field, reason, integer = "iterations", StopReason.MAX_ITERATIONS, True
    says = "{value} iterations committed, cap {limit}"

    def __init__(self, n: int) -> None:
        super().__init__(n)


class TokenBudget(_Cap):
    budget = True
    kind = "token_budget"
    field, reason, integer = "tokens", StopReason.TOKEN_BUDGET, True
    says = "{value} tokens used, budget {limit}"

    def __init__(self, n: int) -> None:
        super().__init__(n)


class CostBudget(_Cap):
    budget = True
    kind = "cost_budget"
    field, reason = "cost_usd", StopReason.COST_BUDGET
    says = "${value:.4f} spent, budget ${limit:.4f}"

    def __init__(self, usd: float) -> None:
        super().__init__(usd)


class Timeout(_Cap):
    budget = True
    kind = "timeout"
    field, reason = "elapsed_s", StopReason.TIMEOUT
    says = "{value:.1f} s elapsed, limit {limit} s"

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)


class NoProgress(StopCondition):
    """The same fingerprint ``repeat`` times within the last ``window`` iterations (adjacency
    not required: A B A C A is no progress for repeat=3, window=5)."""

    kind = "no_progress"

    def __init__(self, repeat: int = 3, window: int = 5) -> None:
        _positive("no_progress repeat", repeat, integer=True)
        _positive("no_progress window", window, integer=True)
        if repeat < 2 or window < repeat:
            raise StopConfigError(
                f"no_progress needs 2 <= repeat <= window, got repeat={repeat} window={window}",
                code="bad_cap")
        self.repeat, self.window = repeat, window

    def params(self) -> dict[str, Any]:
        return {"repeat": self.repeat, "window": self.window}

    def check(self, p: RunProgress) -> StopDecision | None:
        recent = p.fingerprints[-self.window:]
        if not recent:
            return None
        fp, count = Counter(recent).most_common(1)[0]
        if count >= self.repeat:
            return StopDecision(StopReason.NO_PROGRESS,
                                f"fingerprint {fp[:12]} seen {count} times in the last "
                                f"{len(recent)} iterations")
        return None


class RepeatedFailure(StopCondition):
    """The same failing check with the same signature on the last two committed iterations."""

    kind = "repeated_failure"

    def check(self, p: RunProgress) -> StopDecision | None:
        if p.iterations < 2 or len(p.verdicts) < 2:
            return None
        before, latest = p.verdicts[-2], p.verdicts[-1]
        if before is None or latest is None or before.passed or latest.passed:
            return None
        same = [f for f in latest.failing if f in set(before.failing)]
        if same:
            check, signature = same[0]
            return StopDecision(StopReason.REPEATED_FAILURE,
                                f"check {check!r} failed with the same signature {signature!r} "
                                f"on iterations {p.iterations - 1} and {p.iterations}")
        return None


class _Flag(StopCondition):
    flag: ClassVar[str]
    reason: ClassVar[StopReason]
    says: ClassVar[str]

    def check(self, p: RunProgress) -> StopDecision | None:
        return StopDecision(self.reason, self.says) if getattr(p, self.flag) else None


class HumanRejected(_Flag):
    kind = flag = "human_rejected"
    reason, says = StopReason.HUMAN_REJECTED, "a human rejected the run's gated action"


class Cancelled(_Flag):
    kind = flag = "cancelled"
    reason, says = StopReason.CANCELLED, "the work item was cancelled"


class ModelError(_Flag):
    kind = flag = "model_error"
    reason, says = StopReason.MODEL_ERROR, "the model service could not give a usable answer"


class OrgLimit(_Flag):
    kind = flag = "org_limit"
    reason, says = StopReason.ORG_LIMIT, "an org-wide limit was reached"


_LEAVES: dict[str, type[StopCondition]] = {
    c.kind: c for c in (GoalMet, MaxIterations, TokenBudget, CostBudget, Timeout, NoProgress,
                        RepeatedFailure, HumanRejected, Cancelled, ModelError, OrgLimit)
}


def decode_condition(data: dict[str, Any]) -> StopCondition:
    """Inverse of ``StopCondition.encode``. Raises: StopConfigError(code="unknown_condition")."""
    if not isinstance(data, dict) or len(data) != 1:
        raise StopConfigError(f"a condition is a one-key object, got {data!r}",
                              code="unknown_condition")
    (kind, arg), = data.items()
    if kind in ("any", "all"):
        members = [decode_condition(d) for d in arg]
        return AnyOf(*members) if kind == "any" else AllOf(*members)
    if kind not in _LEAVES:
        raise StopConfigError(f"unknown stop condition {kind!r}; known: {sorted(_LEAVES)}",
                              code="unknown_condition")
    try:
        cls = _LEAVES[kind]
        if issubclass(cls, _Cap):
            return cls(arg["limit"])
        return cls(**(arg or {}))
    except (TypeError, KeyError) as exc:
        raise StopConfigError(f"bad parameters for {kind!r}: {arg!r} ({exc})",
                              code="bad_cap") from exc


# -- the policy ------------------------------------------------------------------------------


class StopPolicy:
    """The top-level stop composite of a run: any of ``conditions``, in declared order.

    Args:
        conditions: a condition or a sequence of them (combined with any-of).
    Raises:
        StopConfigError(code="no_hard_cap"): nothing in the tree alone bounds the run.
    """

    def __init__(self, conditions: StopCondition | Sequence[StopCondition]) -> None:
        if isinstance(conditions, StopCondition):
            conditions = [conditions]
        self.root = AnyOf(*conditions)
        if not self.root.bounds_run():
            raise StopConfigError(
                "stop policy has no hard cap; add max_iterations, a token or cost budget, or a "
                "timeout (inside an all-of, every member must be one)", code="no_hard_cap")

    def evaluate(self, progress: RunProgress) -> StopDecision | None:
        """The decision to stop now, or None to continue."""
        return self.root.evaluate(progress)

    def budget_check(self, progress: RunProgress) -> StopReason | None:
        """Only the budget caps (tokens, cost, time): called between model calls in an act.

        An all-of that also needs a non-budget condition never fires here.
        """
        d = _pick(self.root.fired(progress, budget_only=True))
        return d.reason if d else None

    def encode(self) -> list[dict[str, Any]]:
        return [c.encode() for c in self.root.conditions]

    @classmethod
    def decode(cls, data: Sequence[dict[str, Any]]) -> StopPolicy:
        return cls([decode_condition(d) for d in data])

    def __repr__(self) -> str:
        return f"StopPolicy({list(self.root.conditions)!r})"


def policy_from_caps(
    max_iterations: int | None = None,
    budget_tokens: int | None = None,
    budget_usd: float | None = None,
    timeout_s: float | None = None,
    no_progress: tuple[int, int] | None = (3, 5),
) -> StopPolicy:
    """The standard policy: goal_met, the caps given, no_progress (``(repeat, window)``, None to
    leave out), repeated_failure, cancelled, human_rejected, model_error, org_limit — in that
    order of precedence. Raises: StopConfigError (``no_hard_cap`` if no cap is given)."""
    conds: list[StopCondition] = [GoalMet()]
    if max_iterations is not None:
        conds.append(MaxIterations(max_iterations))
    if budget_tokens is not None:
        conds.append(TokenBudget(budget_tokens))
    if budget_usd is not None:
        conds.append(CostBudget(budget_usd))
    if timeout_s is not None:
        conds.append(Timeout(timeout_s))
    if no_progress is not None:
        conds.append(NoProgress(*no_progress))
    conds += [RepeatedFailure(), Cancelled(), HumanRejected(), ModelError(), OrgLimit()]
    return StopPolicy(conds)


def fingerprint(workspace_tree_id: str, outcome_summary: str) -> str:
    """Identity of an iteration's result: the workspace tree and the outcome (whitespace-
    normalised). Equal fingerprints mean the iteration changed nothing that matters."""
    outcome = " ".join(outcome_summary.split())
    return hashlib.sha256(f"{workspace_tree_id}\0{outcome}".encode()).hexdigest()
