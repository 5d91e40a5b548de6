"""``org decide ID approve|reject|edit|respond [TEXT]``: answer a gated action."""
from __future__ import annotations

from scripts.cli.output import add_json, emit_json, home_of, print_unsent

NAME = "decide"
HELP = "decide a waiting action: approve (runs it once), edit NEW_COMMAND, reject [--stop], respond TEXT"


def add_arguments(p) -> None:
    p.add_argument("id", help="decision id (see 'org decisions')")
    p.add_argument("verdict", choices=["approve", "reject", "edit", "respond"], help="what you decide")
    p.add_argument("text", nargs="?", default=None, help="edit: the command to run instead; respond: your answer; "
                                                         "reject: an optional reason")
    p.add_argument("--stop", action="store_true", help="with reject: end the run (stop reason human_rejected)")
    p.add_argument("--idempotency-key", help="the same key twice decides once")
    add_json(p)


def run(args) -> int:
    from roles.operations.decide import decide
    from state_db import config as config_mod

    home = home_of(args).require()
    cfg = config_mod.load_config(home)
    result = decide(home, cfg, args.id, args.verdict, args.text, stop=args.stop, idempotency_key=args.idempotency_key)
    if args.json:
        emit_json(result)
    else:
        print(f"{args.id}: {result['status']}" + (" (already decided)" if result["replayed"] else "")
              + (f"; the run {result['work_id']} ended {result['ended']}" if result.get("ended") else ""))
    print_unsent(result["wake"], "the decision is recorded and takes effect when the org runs", args.json)
    return 0
