"""``org cancel ID``: stop a run; a running act is cut and discarded, the reason is ``cancelled``."""
from __future__ import annotations

from roles.operations.cancel import Cancelled, cancel
from scripts.cli.output import add_json, emit_json, home_of, print_unsent
from state_db.kernel.config import load_config

NAME = "cancel"
HELP = "cancel a work item (recorded as stop reason 'cancelled')"


def add_arguments(p) -> None:
    p.add_argument("id", help="work item id")
    p.add_argument("--idempotency-key", help="the same key twice cancels once")
    add_json(p)


def run(args) -> int:
    home = home_of(args).require()
    result = cancel(home, load_config(home), args.id, idempotency_key=args.idempotency_key)
    if args.json:
        emit_json(result.as_data())
    else:
        print(text(result))
    if result.changed:
        print_unsent(result.wake, "the cancel is recorded and takes effect when the org runs", args.json)
    return 0


def text(result: Cancelled) -> str:
    if not result.changed:
        return f"{result.id} had already ended ({result.stop_reason})"
    return f"{result.id}: cancel recorded" + (f" — {result.note}" if result.note else " (ended)")
