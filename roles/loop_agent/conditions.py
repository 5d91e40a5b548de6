"""The built-in stop conditions, each with its reason code (``stop`` has the base classes and
the precedence rules): goal_met, the hard caps (iterations, tokens, cost, time), no_progress,
repeated_failure and the flags the engine raises (human_rejected, cancelled, model_error,
org_limit). ``decode_condition`` reads one back from its encoded form.

A budget cap (tokens, cost, time) may keep a ``reserve``: a fraction of its limit held back for
the run's one wrap-up act (``[loop] wrapup_reserve``). It then fires once the run has used the
rest (``limit × (1 − reserve)``), and the wrap-up may spend what is left up to the limit, so the
budget as given still bounds the whole run. A slice too small for a wrap-up (under
``min_reserve``: a prompt and a note, or a second of time) is not kept back: the cap fires at its
limit, as without a reserve.

A call's input is known only once it is answered (its output is bounded by the ``max_tokens`` the
request sends), so a token or cost budget also looks one call ahead: the token budget takes the
next call's input to be the largest input so far (``RunProgress.largest_input``), the cost
budget the next call to cost as much as the dearest so far (``largest_cost``). The cap fires
once such a call would reach where it trips, each request's ``max_tokens`` leaves room for that
input (roles/loop_agent/acting.py), and the wrap-up's slice is never smaller than such a call
with room for a note — so neither the iterations nor the wrap-up run past the budget on calls
the size of those already seen."""
from __future__ import annotations

import math
from collections import Counter
from typing import Any, ClassVar

from roles.loop_agent.stop import (
    AllOf, AnyOf, RunProgress, StopCondition, StopConfigError, StopDecision,
)
from state_db import ending
from state_db.vocab import StopReason
from state_db.words import counted

def _positive(name: str, value: float, *, integer: bool = False) -> None:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    # NaN and infinity would be accepted as caps that can never fire.
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value <= 0:
        kind = "a positive integer" if integer else "a positive number"
        raise StopConfigError(f"{name} must be {kind}, got {value!r}", code="bad_cap")


class GoalMet(StopCondition):
    """The latest committed iteration carries a passing verdict written by the eval-agent (the
    rule is ``state_db.ending.goal_met``, which the eval-agent's verdict asks too)."""

    kind = "goal_met"

    def check(self, p: RunProgress) -> StopDecision | None:
        v = p.verdicts[-1] if p.iterations and p.verdicts else None
        if v is None:
            return None
        return ending.goal_met(p.iterations, p.iterations, v.passed, v.by_eval_agent)


class _Cap(StopCondition):
    """Fires when a counter of the run reaches ``limit`` (iterations, tokens, US dollars or
    seconds), given as the one argument."""

    hard_cap = True
    field: ClassVar[str]        # the RunProgress attribute compared
    reason: ClassVar[StopReason]
    integer: ClassVar[bool] = False
    says: ClassVar[str]         # detail, formatted with ``value``, ``limit`` and ``s`` (plural ending)
    min_reserve: ClassVar[float] = 0.0      # a smaller wrap-up slice is not kept back
    ahead: ClassVar[str | None] = None      # the RunProgress attribute of the next call's expected size
    answer: ClassVar[float] = 0.0           # room a wrap-up needs beside a call's ``ahead`` part

    def __init__(self, limit: float, reserve: float = 0.0) -> None:
        _positive(self.kind, limit, integer=self.integer)
        if reserve and not self.budget:
            raise StopConfigError(f"{self.kind} keeps no reserve (only budgets do)", code="bad_cap")
        if isinstance(reserve, bool) or not isinstance(reserve, (int, float)) or not 0 <= reserve < 0.5:
            raise StopConfigError(f"{self.kind} reserve must be a fraction from 0 to below 0.5, got {reserve!r}",
                                  code="bad_cap")
        self.limit, self.reserve = limit, float(reserve)

    @property
    def reserved(self) -> float:
        """What the wrap-up act keeps of the limit (whole tokens for a token budget); 0 when
        that is less than a wrap-up needs."""
        kept = int(self.limit * self.reserve) if self.integer else self.limit * self.reserve
        return kept if kept and kept >= self.min_reserve else 0

    @property
    def trip(self) -> float:
        """Where the cap fires: the limit, less the wrap-up's reserve."""
        return self.limit - self.reserved

    def next_call(self, p: RunProgress) -> float:
        """What the next call is taken to need of this cap: the largest one so far (0: unknown)."""
        return getattr(p, self.ahead) if self.ahead else 0

    def reserved_at(self, p: RunProgress) -> float:
        """The wrap-up's slice for the run at ``p``: ``reserved``, and at least one call the size
        of the largest so far with room for its answer (0 when the cap keeps none)."""
        ahead = self.next_call(p)
        return max(self.reserved, ahead + self.answer if ahead else 0) if self.reserved else 0

    def trip_at(self, p: RunProgress) -> float:
        """Where the cap fires for the run at ``p``: the limit, less the wrap-up's slice."""
        return self.limit - self.reserved_at(p)

    def params(self) -> dict[str, Any]:
        return {"limit": self.limit, **({"reserve": self.reserve} if self.reserve else {})}

    def check(self, p: RunProgress) -> StopDecision | None:
        value, ahead, trip = getattr(p, self.field), self.next_call(p), self.trip_at(p)
        if value >= trip or (ahead and value + ahead >= trip):
            said = self.says.format(value=value, limit=self.limit, s="" if value == 1 else "s")
            if self.reserved_at(p):
                said += f" ({self._amount(self.reserved_at(p))} of it kept for the wrap-up)"
            if value < trip:
                said += f"; the next call would need about {self._amount(ahead)} before its answer"
            return StopDecision(self.reason, said)
        return None

    def _amount(self, value: float) -> str:
        return f"{value:g}"


class MaxIterations(_Cap):
    kind = "max_iterations"
    field, reason, integer = "iterations", StopReason.MAX_ITERATIONS, True
    says = "{value} iteration{s} committed, cap {limit}"


MIN_WRAPUP_TOKENS = 300        # a wrap-up's prompt and note (roles/loop_agent/wrapup.py)
MIN_WRAPUP_SECONDS = 1.0


class TokenBudget(_Cap):
    budget = True
    min_reserve = MIN_WRAPUP_TOKENS
    kind = "token_budget"
    field, reason, integer = "tokens", StopReason.TOKEN_BUDGET, True
    ahead, answer = "largest_input", MIN_WRAPUP_TOKENS
    says = "{value} tokens used, budget {limit}"


class CostBudget(_Cap):
    budget = True
    kind = "cost_budget"
    field, reason = "cost_usd", StopReason.COST_BUDGET
    says = "${value:.4f} spent, budget ${limit:.4f}"
    ahead = "largest_cost"

    def _amount(self, value: float) -> str:
        return f"${value:.4f}"


class Timeout(_Cap):
    budget = True
    min_reserve = MIN_WRAPUP_SECONDS
    kind = "timeout"
    field, reason = "elapsed_s", StopReason.TIMEOUT
    says = "{value:.1f} s elapsed, limit {limit} s"

    def _amount(self, value: float) -> str:
        return f"{value:.1f} s"


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
                                f"fingerprint {fp[:12]} seen {counted(count, 'time')} in the last "
                                f"{counted(len(recent), 'iteration')}")
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
    """Fires on its ``RunProgress`` flag; a flag given as a sentence is the decision's detail."""

    flag: ClassVar[str]
    reason: ClassVar[StopReason]
    says: ClassVar[str]

    def check(self, p: RunProgress) -> StopDecision | None:
        value = getattr(p, self.flag)
        if not value:
            return None
        return StopDecision(self.reason, value if isinstance(value, str) else self.says)


class HumanRejected(_Flag):
    """A human stopped the run from a decision: rejected its gated action with a stop
    (``human_rejected``), or confirmed the stop a run asked about when it met an error the
    policy does not know (``needs_human``, which wins: the human answered that question)."""

    kind = flag = "human_rejected"
    reason, says = StopReason.HUMAN_REJECTED, "a human rejected the run's gated action"

    def check(self, p: RunProgress) -> StopDecision | None:
        if p.needs_human:
            return StopDecision(StopReason.NEEDS_HUMAN, p.needs_human if isinstance(p.needs_human, str)
                                else "a human confirmed the stop after an error the stop policy does not know")
        return super().check(p)


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
            return cls(arg["limit"], arg.get("reserve", 0.0))
        return cls(**(arg or {}))
    except (TypeError, KeyError) as exc:
        raise StopConfigError(f"bad parameters for {kind!r}: {arg!r} ({exc})",
                              code="bad_cap") from exc
