"""``org cancel ID``: stop a run; a running act is cut and discarded, the reason is ``cancelled``."""
from __future__ import annotations

from scripts.cli.output import add_json, emit_json, home_of, print_unsent

NAME = "cancel"
HELP = "cancel a work item (recorded as stop reason 'cancelled')"


def add_arguments(p) -> None:
    p.add_argument("id", help="work item id")
    p.add_argument("--idempotency-key", help="the same key twice cancels once")
    add_json(p)


def run(args) -> int:
    from roles.operations.cancel import cancel
    from state_db import config as config_mod

    home = home_of(args).require()
    cfg = config_mod.load_config(home)
    result = cancel(home, cfg, args.id, idempotency_key=args.idempotency_key)
    if args.json:
        emit_json(result)
    elif not result["changed"]:
        print(f"{args.id} had already ended ({result['stop_reason']})")
    else:
        print(f"{args.id}: cancel recorded" + (f" — {result['note']}" if result.get("note") else " (ended)"))
    if result["changed"]:
        print_unsent(result["wake"], "the cancel is recorded and takes effect when the org runs", args.json)
    return 0
