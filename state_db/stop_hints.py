"""What to do after a run ended, per stop reason: the hint every run page shows whole beside the
reason (``org show``, ``org watch``, the dashboard), so a person never has to guess the next step.

A reason without its own hint (one added to the vocabulary later) gets the general one: read the
transcript. ``ID`` in a hint stands for the run's id.
"""
from __future__ import annotations

from state_db.vocab import StopReason as R

GENERAL = "read what the doer did and what failed: 'org show ID --transcript'"

HINTS: dict[str, str] = {
    R.GOAL_MET: "the verified change is in the workspace: 'org diff ID', or 'org export ID --patch'",
    R.MAX_ITERATIONS: "go on with more iterations: 'org continue ID --max-iterations N'",
    R.TOKEN_BUDGET: "read the hand-off note ('org show ID'), then 'org continue ID --budget-tokens N' to go on",
    R.COST_BUDGET: "read the hand-off note ('org show ID'), then 'org continue ID --budget-usd X' to go on",
    R.TIMEOUT: "read the hand-off note ('org show ID'), then 'org continue ID --timeout S' to go on",
    R.NO_PROGRESS: "the same tree came back again and again: read the transcript ('org show ID --transcript'), "
                   "then refine the goal and submit again",
    R.REPEATED_FAILURE: "the same check failed the same way twice: its output is below; read the transcript "
                        "('org show ID --transcript') and submit a narrower goal or better verify commands",
    R.HUMAN_REJECTED: "a person rejected an action the run needed: 'org decisions --all' shows which",
    R.CANCELLED: "cancelled by a person; 'org continue ID' takes it up again",
    R.MODEL_ERROR: "the model service failed (key, endpoint, model name or price): 'org doctor', then "
                   "'org continue ID'",
    R.ORG_LIMIT: "the org-wide spend cap was reached: raise total_spend_usd in [limits] of org.toml",
    R.VERIFY_UNRUNNABLE: "a verify command cannot start (not the doer's fault): fix the command or its toolchain, "
                         "then submit again",
    R.IMPOSSIBLE: "a person confirmed the goal cannot be met as stated: change the goal and submit again",
    R.NEEDS_HUMAN: "an error the stop policy does not know ended it: read the transcript "
                   "('org show ID --transcript') and 'org decisions --all'",
}


def hint(reason: str | None, work_id: str) -> str | None:
    """The next step after a run ended with ``reason`` (None while it runs)."""
    if not reason:
        return None
    return HINTS.get(reason, GENERAL).replace("ID", work_id)
