"""The stop policy of a run: the top-level any-of the engine evaluates between iterations and,
for its budget caps, between model calls inside an act."""
from __future__ import annotations

from typing import Any, Sequence

from roles.loop_agent.conditions import (
    Cancelled, CostBudget, GoalMet, HumanRejected, MaxIterations, ModelError, NoProgress, OrgLimit,
    RepeatedFailure, Timeout, TokenBudget, decode_condition,
)
from roles.loop_agent.stop import AnyOf, RunProgress, StopCondition, StopConfigError, StopDecision, _pick
from state_db.vocab import StopReason

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
