"""``org dismiss ID``: take an ended run out of "needs you" (its record stays)."""
from __future__ import annotations

from roles.operations.dismiss import dismiss
from scripts.cli.output import add_json, emit_json, home_of

NAME = "dismiss"
HELP = "take an ended run (e.g. verify_unrunnable) out of 'needs you'; the run and its record stay"


def add_arguments(p) -> None:
    p.add_argument("id", help="work item id (see 'org status')")
    p.add_argument("--idempotency-key", help="the same key twice dismisses once")
    add_json(p)


def run(args) -> int:
    result = dismiss(home_of(args).require(), args.id, idempotency_key=args.idempotency_key)
    if args.json:
        emit_json(result.as_data())
    else:
        print(f"{result.id} ({result.stop_reason}): dismissed" + ("" if result.changed else " already")
              + f" by {result.by}")
    return 0
