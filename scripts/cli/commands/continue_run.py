"""``org continue ID``: reopen a run that ended on a cap or a budget, with raised caps."""
from __future__ import annotations

from roles.operations.continue_run import ContinueRequest, Continued, continue_run
from scripts.cli.output import add_json, emit_json, home_of
from state_db.kernel.config import load_config
from state_db.queries.work import Caps

NAME = "continue"
HELP = ("continue a run that ended on a cap, a budget, no_progress, repeated_failure, model_error or "
        "org_limit, as the same work item with raised caps")


def add_arguments(p) -> None:
    p.add_argument("id", help="work item id")
    p.add_argument("--max-iterations", type=int, help="new cap on iterations, counted from the run's start")
    p.add_argument("--budget-tokens", type=int,
                   help="new token budget for the whole run (input, cache writes and output)")
    p.add_argument("--budget-usd", type=float, help="new cost budget for the whole run, in USD")
    p.add_argument("--timeout", type=float, help="new cap on the run's working time, in seconds")
    p.add_argument("--idempotency-key", help="the same key twice continues once (default: a fresh key)")
    add_json(p)


def run(args) -> int:
    home = home_of(args).require()
    result = continue_run(home, load_config(home), ContinueRequest(
        args.id, Caps.given({"max_iterations": args.max_iterations, "budget_tokens": args.budget_tokens,
                             "budget_usd": args.budget_usd, "timeout_s": args.timeout}),
        idempotency_key=args.idempotency_key))
    if args.json:
        emit_json(result.as_data())
    else:
        print(text(result))
    return 0


def text(result: Continued) -> str:
    caps = ", ".join(f"{k}={v}" for k, v in result.caps.encode().items())
    lines = [f"{'already continued' if result.replayed else 'continued'} {result.id} ({result.status}) "
             f"after it stopped with {result.stopped} (ending {result.seq})", f"  caps: {caps}"]
    if result.waiting_for:
        lines.append(f"  waiting: the workspace is busy with {result.waiting_for}")
    if result.wake not in ("push", "outbox"):
        lines.append(f"  the coordinator was not reached ({result.wake}); it picks the item up when the org runs")
    lines.append(f"  follow it: org show {result.id}")
    return "\n".join(lines)
