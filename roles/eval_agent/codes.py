"""Why a check could not run, as the verdicts record it."""
from __future__ import annotations

# the machine's reasons (the sandbox, the coordinator host's git), never the doer's
MACHINE_CODES = ("sandbox_failed", "sandbox_unavailable", "sandbox_error", "git_remote_failed", "git_remote_missing",
                 "no_git_server", "verify_stuck")
UNRUNNABLE_CODES = ("verify_unrunnable", "verifier_error", *MACHINE_CODES)
# a bound on the verification path was exceeded: "could not verify", never a pass, never the doer's
# failure (the human raises the bound or judges the change)
LIMIT_CODES = ("verify_limit", "review_too_large")
