"""The stop policy of a run: the top-level any-of the engine evaluates between iterations and,
for its budget caps, between model calls inside an act.

It also says which errors it knows (``recognises``): the tools' refusals of the doer's own
mistakes (a bad path, an edit that does not match, a failing command), which go back to the model
as tool errors, and the model service's failures, which its ``ModelError`` condition ends. An error
of any other class — the environment failing under a tool (``os_error``, the sandbox), a tool's own
bug, an exception out of an act — met for the first time in a run pauses it with a decision for a
human instead of spending more iterations on it (``roles.loop_agent.triage``).

``policy_from_caps`` builds it from a run's ``Caps`` (``state_db.queries.work``), the one type the
caps have from the command that set them to here. With a wrap-up reserve
(``policy_from_caps(caps, wrapup_reserve=…)``), each budget cap fires once the
run has used all but its reserve, and ``wrapup_allowance`` says what the wrap-up act may spend:
what is left of each budget, never more than its reserve."""
from __future__ import annotations

from typing import Any, Sequence

from roles.loop_agent.conditions import (
    Cancelled, CostBudget, GoalMet, HumanRejected, MaxIterations, ModelError, NoProgress, OrgLimit,
    RepeatedFailure, Timeout, TokenBudget, _Cap, decode_condition,
)
from roles.loop_agent.stop import AnyOf, RunProgress, StopCondition, StopConfigError, StopDecision, _pick
from state_db.queries.work import Caps
from state_db.vocab import StopReason

#: Tool error codes that are the doer's own mistakes, answered to the model as tool errors
#: (roles/loop_agent/tools.py); the model corrects itself, and no_progress / repeated_failure end
#: a run that cannot.
KNOWN_TOOL_ERRORS = frozenset({
    "bad_path", "path_absolute", "path_escape", "bad_tool_input", "bad_regex", "binary_file", "edit_no_match",
    "edit_not_unique", "is_directory", "not_found", "not_text", "too_large", "unknown_tool", "run_timeout",
    "command_failed", "command_timeout", "path_protected",
})
#: The stop reasons a budget trips with: the ones a wrap-up act follows.
BUDGET_REASONS = frozenset({StopReason.TOKEN_BUDGET, StopReason.COST_BUDGET, StopReason.TIMEOUT})


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

    def recognises(self, error_class: str) -> bool:
        """True for an error class the policy knows what to do with (see the module docstring)."""
        return error_class in KNOWN_TOOL_ERRORS

    def budgets(self) -> list[_Cap]:
        """The budget caps (tokens, cost, time) in the tree."""
        return [c for c in self.root.leaves() if isinstance(c, _Cap) and c.budget]

    def wraps_up(self, decision: StopDecision) -> bool:
        """True when ``decision`` is a budget's and the policy has a wrap-up reserve (even one too
        small to keep back: the hand-off note then comes from the record)."""
        return decision.reason in BUDGET_REASONS and any(c.reserve for c in self.budgets())

    def wrapup_allowance(self, progress: RunProgress) -> dict[str, float | None]:
        """What a wrap-up act may spend: per budget (``tokens``, ``cost_usd``, ``seconds``; None
        where the run has no such budget), what is left of it up to its limit, never more than
        the slice it keeps (a budget that keeps none bounds it by what is left), never below 0."""
        used = {"tokens": progress.tokens, "cost_usd": progress.cost_usd, "seconds": progress.elapsed_s}
        field_of = {"tokens": "tokens", "cost_usd": "cost_usd", "elapsed_s": "seconds"}
        out: dict[str, float | None] = {"tokens": None, "cost_usd": None, "seconds": None}
        for cap in self.budgets():
            name = field_of[cap.field]
            left = cap.limit - used[name]
            kept = cap.reserved_at(progress)
            left = max(0, min(left, kept) if kept else left)
            out[name] = left if out[name] is None else min(out[name], left)
        return out

    def encode(self) -> list[dict[str, Any]]:
        return [c.encode() for c in self.root.conditions]

    @classmethod
    def decode(cls, data: Sequence[dict[str, Any]]) -> StopPolicy:
        return cls([decode_condition(d) for d in data])

    def __repr__(self) -> str:
        return f"StopPolicy({list(self.root.conditions)!r})"


def policy_from_caps(caps: Caps, *, no_progress: tuple[int, int] | None = (3, 5),
                     wrapup_reserve: float = 0.0) -> StopPolicy:
    """The standard policy: goal_met, human_rejected (with needs_human: a human's answer to the
    run's own question says more than a cap met on the same iteration), the caps set in ``caps``,
    no_progress (``(repeat, window)``, None to leave out), repeated_failure, cancelled,
    model_error, org_limit — in that order of precedence. ``wrapup_reserve``: the fraction of each budget kept
    for the wrap-up act. Raises: StopConfigError (``no_hard_cap`` if no cap is given, ``bad_cap``)."""
    conds: list[StopCondition] = [GoalMet(), HumanRejected()]
    if caps.max_iterations is not None:
        conds.append(MaxIterations(caps.max_iterations))
    if caps.budget_tokens is not None:
        conds.append(TokenBudget(caps.budget_tokens, wrapup_reserve))
    if caps.budget_usd is not None:
        conds.append(CostBudget(caps.budget_usd, wrapup_reserve))
    if caps.timeout_s is not None:
        conds.append(Timeout(caps.timeout_s, wrapup_reserve))
    if no_progress is not None:
        conds.append(NoProgress(*no_progress))
    conds += [RepeatedFailure(), Cancelled(), ModelError(), OrgLimit()]
    return StopPolicy(conds)
