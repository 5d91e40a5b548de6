"""Stop conditions: built-ins, composites, precedence, hard-cap validation, budget checks."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roles.loop_agent.conditions import (
    Cancelled, CostBudget, GoalMet, HumanRejected, MaxIterations, ModelError, NoProgress, OrgLimit,
    RepeatedFailure, Timeout, TokenBudget, decode_condition,
)
from roles.loop_agent.policy import StopPolicy, policy_from_caps
from state_db.queries.work import Caps
from roles.loop_agent.stop import (
    AllOf, AnyOf, RunProgress, StopConfigError, StopDecision, VerdictSummary, fingerprint,
)
from state_db.vocab import StopReason

PASS = VerdictSummary(passed=True, by_eval_agent=True)
PASS_NOT_EVAL = VerdictSummary(passed=True, by_eval_agent=False)


def fail(*failing: tuple[str, str]) -> VerdictSummary:
    return VerdictSummary(passed=False, by_eval_agent=True, failing=tuple(failing))


def progress(n: int = 1, **kw) -> RunProgress:
    return RunProgress(iterations=n, **kw)


def reason(cond, p: RunProgress) -> StopReason | None:
    d = cond.evaluate(p)
    return d.reason if d else None


def test_goal_met_fires_only_on_a_passing_eval_agent_verdict_of_the_latest_iteration():
    assert reason(GoalMet(), progress(2, verdicts=(fail(), PASS))) is StopReason.GOAL_MET
    assert reason(GoalMet(), progress(2, verdicts=(PASS, fail(("t", "s"))))) is None
    assert reason(GoalMet(), progress(2, verdicts=(fail(), PASS_NOT_EVAL))) is None
    assert reason(GoalMet(), progress(2, verdicts=(PASS, None))) is None  # latest unverified
    assert reason(GoalMet(), RunProgress()) is None


@pytest.mark.parametrize("cond, below, at, code", [
    (MaxIterations(3), progress(2), progress(3), StopReason.MAX_ITERATIONS),
    (TokenBudget(1000), progress(tokens=999), progress(tokens=1000), StopReason.TOKEN_BUDGET),
    (CostBudget(0.5), progress(cost_usd=0.49), progress(cost_usd=0.5), StopReason.COST_BUDGET),
    (Timeout(60), progress(elapsed_s=59.9), progress(elapsed_s=60), StopReason.TIMEOUT),
])
def test_caps_fire_when_reached_and_not_before(cond, below, at, code):
    assert cond.evaluate(below) is None
    decision = cond.evaluate(at)
    assert decision.reason is code and decision.detail


@pytest.mark.parametrize("cond, flag, code", [
    (Cancelled(), "cancelled", StopReason.CANCELLED),
    (HumanRejected(), "human_rejected", StopReason.HUMAN_REJECTED),
    (ModelError(), "model_error", StopReason.MODEL_ERROR),
    (OrgLimit(), "org_limit", StopReason.ORG_LIMIT),
])
def test_flag_conditions_fire_on_their_flag_only(cond, flag, code):
    assert cond.evaluate(progress()) is None
    assert reason(cond, progress(**{flag: True})) is code


def test_no_progress_counts_repeats_within_the_window_without_adjacency():
    cond = NoProgress(repeat=3, window=5)
    assert reason(cond, progress(5, fingerprints=("A", "B", "A", "C", "A"))) is StopReason.NO_PROGRESS
    assert reason(cond, progress(5, fingerprints=("A", "B", "C", "A", "D"))) is None
    # the first A has left the window of the last five
    assert reason(cond, progress(6, fingerprints=("A", "B", "A", "C", "D", "A"))) is None
    assert reason(cond, progress(3, fingerprints=("A", "A", "A"))) is StopReason.NO_PROGRESS


def test_repeated_failure_needs_the_same_check_and_signature_on_consecutive_iterations():
    cond = RepeatedFailure()
    same = progress(2, verdicts=(fail(("pytest", "E1")), fail(("lint", "x"), ("pytest", "E1"))))
    assert reason(cond, same) is StopReason.REPEATED_FAILURE
    assert "pytest" in cond.evaluate(same).detail
    other_sig = progress(2, verdicts=(fail(("pytest", "E1")), fail(("pytest", "E2"))))
    assert reason(cond, other_sig) is None
    not_consecutive = progress(3, verdicts=(fail(("pytest", "E1")), fail(("lint", "x")),
                                            fail(("pytest", "E1"))))
    assert reason(cond, not_consecutive) is None
    gap = progress(2, verdicts=(fail(("pytest", "E1")), None))
    assert reason(cond, gap) is None
    assert reason(cond, progress(1, verdicts=(fail(("pytest", "E1")),))) is None


def test_any_of_and_all_of_compose_with_operators():
    either = MaxIterations(5) | Timeout(10)
    both = MaxIterations(5) & Timeout(10)
    assert isinstance(either, AnyOf) and isinstance(both, AllOf)
    only_iters = progress(5, elapsed_s=1)
    all_caps = progress(5, elapsed_s=10)
    assert reason(either, only_iters) is StopReason.MAX_ITERATIONS
    assert reason(both, only_iters) is None
    decision = both.evaluate(all_caps)
    assert decision.reason is StopReason.MAX_ITERATIONS and decision.detail.startswith("all of:")
    assert reason(both & Cancelled(), all_caps) is None
    assert reason(both | Cancelled(), progress(1, cancelled=True)) is StopReason.CANCELLED


def test_goal_met_wins_over_everything_else_firing_together():
    policy = StopPolicy([MaxIterations(2), Cancelled(), GoalMet()])
    p = progress(2, verdicts=(fail(), PASS), cancelled=True)
    assert policy.evaluate(p).reason is StopReason.GOAL_MET
    nested = StopPolicy([MaxIterations(2), AnyOf(Cancelled(), AllOf(GoalMet(), Timeout(1)))])
    assert nested.evaluate(progress(2, verdicts=(fail(), PASS), elapsed_s=2,
                                    cancelled=True)).reason is StopReason.GOAL_MET


def test_otherwise_the_first_declared_wins_depth_first():
    p = progress(9, tokens=500, cancelled=True, model_error=True)
    assert StopPolicy([Cancelled(), MaxIterations(9)]).evaluate(p).reason is StopReason.CANCELLED
    assert StopPolicy([MaxIterations(9), Cancelled()]).evaluate(p).reason is StopReason.MAX_ITERATIONS
    nested = StopPolicy([AnyOf(ModelError(), TokenBudget(100)), MaxIterations(9)])
    assert nested.evaluate(p).reason is StopReason.MODEL_ERROR
    assert StopPolicy([OrgLimit(), AnyOf(TokenBudget(100), Cancelled())]).evaluate(
        p).reason is StopReason.TOKEN_BUDGET


def test_a_policy_without_a_hard_cap_is_a_configuration_error():
    for conds in ([GoalMet()], [GoalMet(), NoProgress(), RepeatedFailure(), Cancelled()],
                  [AllOf(MaxIterations(5), GoalMet())]):
        with pytest.raises(StopConfigError) as err:
            StopPolicy(conds)
        assert err.value.code == "no_hard_cap"
    with pytest.raises(StopConfigError):
        policy_from_caps(Caps())
    StopPolicy([AllOf(MaxIterations(5), Timeout(60))])
    StopPolicy(GoalMet() | CostBudget(1.0))


@pytest.mark.parametrize("build", [lambda: MaxIterations(0), lambda: TokenBudget(-1),
                                   lambda: CostBudget(0), lambda: Timeout(True),
                                   lambda: CostBudget(float("nan")),
                                   lambda: Timeout(float("inf")),
                                   lambda: MaxIterations(2.5), lambda: NoProgress(1, 5),
                                   lambda: NoProgress(4, 3), lambda: AnyOf()])
def test_bad_parameters_are_coded_configuration_errors(build):
    with pytest.raises(StopConfigError) as err:
        build()
    assert err.value.code in ("bad_cap", "empty_composite")


def test_budget_check_sees_only_tokens_cost_and_time():
    policy = policy_from_caps(Caps(max_iterations=3, budget_tokens=1000, budget_usd=1.0, timeout_s=60))
    assert policy.budget_check(progress(3, cancelled=True, verdicts=(None, None, PASS))) is None
    assert policy.budget_check(progress(1, tokens=1000)) is StopReason.TOKEN_BUDGET
    assert policy.budget_check(progress(1, cost_usd=2.0)) is StopReason.COST_BUDGET
    assert policy.budget_check(progress(1, elapsed_s=61)) is StopReason.TIMEOUT
    assert policy.budget_check(progress(1, tokens=10**6, elapsed_s=61)) is StopReason.TOKEN_BUDGET
    mixed = StopPolicy([AllOf(TokenBudget(10), Cancelled()), MaxIterations(5)])
    assert mixed.budget_check(progress(1, tokens=99, cancelled=True)) is None


def test_standard_policy_order_and_no_progress_option():
    policy = policy_from_caps(Caps(max_iterations=10, timeout_s=5))
    kinds = [list(c)[0] for c in policy.encode()]
    # a human's answer to the run's own question (human_rejected, needs_human) wins over a cap met on
    # the same iteration
    assert kinds == ["goal_met", "human_rejected", "max_iterations", "timeout", "no_progress", "repeated_failure",
                     "cancelled", "model_error", "org_limit"]
    assert policy.evaluate(progress(10, human_rejected="stopped by a human")).reason is StopReason.HUMAN_REJECTED
    assert "no_progress" not in [list(c)[0] for c in
                                 policy_from_caps(Caps(max_iterations=3), no_progress=None).encode()]
    assert policy_from_caps(Caps(max_iterations=10), no_progress=(2, 2)).evaluate(
        progress(2, fingerprints=("F", "F"))).reason is StopReason.NO_PROGRESS


def test_policy_encodes_and_decodes_to_an_equivalent_policy():
    policy = StopPolicy([GoalMet(), AllOf(MaxIterations(4), Timeout(9.5)), NoProgress(2, 4),
                         AnyOf(CostBudget(0.25), OrgLimit())])
    again = StopPolicy.decode(policy.encode())
    assert again.encode() == policy.encode()
    p = progress(4, elapsed_s=10)
    assert again.evaluate(p) == policy.evaluate(p)
    with pytest.raises(StopConfigError) as err:
        decode_condition({"sleep_forever": {}})
    assert err.value.code == "unknown_condition"


def test_stop_decision_and_verdict_summary_round_trip():
    d = StopDecision(StopReason.NO_PROGRESS, "same tree")
    assert StopDecision.decode(d.encode()) == d
    v = fail(("pytest", "sig"), ("lint", ""))
    assert VerdictSummary.decode(v.encode()) == v


def test_run_progress_refuses_more_verdicts_than_iterations():
    with pytest.raises(ValueError):
        RunProgress(iterations=1, verdicts=(PASS, PASS))


def test_fingerprint_depends_on_tree_and_normalised_outcome():
    a = fingerprint("tree1", "fail: pytest  E1\n")
    assert a == fingerprint("tree1", "fail: pytest E1")
    assert a != fingerprint("tree2", "fail: pytest E1")
    assert a != fingerprint("tree1", "fail: pytest E2")


caps = st.one_of(st.integers(1, 20).map(MaxIterations), st.integers(1, 10**6).map(TokenBudget),
                 st.floats(0.01, 100).map(CostBudget), st.floats(1, 3600).map(Timeout))
soft = st.sampled_from([GoalMet(), NoProgress(), RepeatedFailure(), Cancelled(), HumanRejected(),
                        ModelError(), OrgLimit()])
trees = st.recursive(st.one_of(caps, soft),
                     lambda kids: st.one_of(st.lists(kids, min_size=1, max_size=3).map(
                         lambda xs: AnyOf(*xs)), st.lists(kids, min_size=1, max_size=3).map(
                         lambda xs: AllOf(*xs))), max_leaves=8)


@given(trees)
def test_any_accepted_policy_stops_once_every_hard_cap_is_exceeded(tree):
    """bounds_run is sound: a policy StopPolicy accepts always stops far enough out."""
    try:
        policy = StopPolicy([tree])
    except StopConfigError:
        return
    huge = RunProgress(iterations=10**6, tokens=10**9, cost_usd=10**6, elapsed_s=10**7)
    assert policy.evaluate(huge) is not None


def test_a_budget_keeps_its_wrap_up_reserve_only_when_a_wrap_up_fits_in_it():
    """The reserve moves where a budget fires (its limit less the slice) and is encoded with it;
    a slice too small for a wrap-up (under a prompt and a note, under a second) is not kept back."""
    tokens, small = TokenBudget(10_000, 0.05), TokenBudget(1000, 0.05)
    assert (tokens.reserved, tokens.trip, small.reserved, small.trip) == (500, 9500, 0, 1000)
    assert reason(tokens, progress(tokens=9499)) is None and reason(tokens, progress(tokens=9500)) is StopReason.TOKEN_BUDGET
    assert "kept for the wrap-up" in tokens.evaluate(progress(tokens=9500)).detail
    assert (Timeout(60, 0.05).trip, Timeout(3, 0.05).trip, CostBudget(2.0, 0.1).trip) == (57.0, 3, 1.8)
    again = decode_condition(tokens.encode())
    assert (again.limit, again.reserve) == (10_000, 0.05) and TokenBudget(5).encode() == {"token_budget": {"limit": 5}}
    for bad in (lambda: MaxIterations(5, 0.1), lambda: TokenBudget(100, 0.5), lambda: Timeout(9, -0.1)):
        with pytest.raises(StopConfigError):
            bad()
    policy = policy_from_caps(Caps(budget_tokens=10_000, timeout_s=60), wrapup_reserve=0.05)
    allowance = policy.wrapup_allowance(progress(tokens=9_800, elapsed_s=58.0))
    assert allowance == {"tokens": 200, "cost_usd": None, "seconds": 2.0}
    # a timeout too short to keep a slice bounds the wrap-up by what is left of it, not by nothing
    short = policy_from_caps(Caps(budget_tokens=10_000, timeout_s=10), wrapup_reserve=0.05)
    assert short.wrapup_allowance(progress(tokens=9_600, elapsed_s=4.0)) == {"tokens": 400, "cost_usd": None,
                                                                              "seconds": 6.0}
    assert policy.wraps_up(StopDecision(StopReason.TIMEOUT, "t")) and not policy.wraps_up(
        StopDecision(StopReason.MAX_ITERATIONS, "m"))
    assert not policy_from_caps(Caps(budget_tokens=10_000)).wraps_up(StopDecision(StopReason.TOKEN_BUDGET, "t"))


def test_needs_human_is_the_human_stop_that_wins_and_flags_carry_their_detail():
    assert HumanRejected().evaluate(progress(needs_human=True)).reason is StopReason.NEEDS_HUMAN
    assert reason(HumanRejected(), progress(human_rejected=True, needs_human="why")) is StopReason.NEEDS_HUMAN
    assert ModelError().evaluate(progress(model_error="overloaded: busy")).detail == "overloaded: busy"
    assert policy_from_caps(Caps(max_iterations=3)).recognises("edit_no_match")
    assert not policy_from_caps(Caps(max_iterations=3)).recognises("os_error: Input/output error")
