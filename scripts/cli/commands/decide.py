"""``org decide ID approve|reject|edit|respond [TEXT]``: answer a gated action."""
from __future__ import annotations

from roles.operations.decide import Decided, decide
from scripts.cli.output import add_json, emit_json, home_of, print_unsent
from state_db.kernel.config import load_config

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
    home = home_of(args).require()
    result = decide(home, load_config(home), args.id, args.verdict, args.text, stop=args.stop,
                    idempotency_key=args.idempotency_key)
    if args.json:
        emit_json(result.as_data())
    else:
        print(text(result))
    print_unsent(result.wake, "the decision is recorded and takes effect when the org runs", args.json)
    return 0


def text(result: Decided) -> str:
    return (f"{result.id}: {result.status}" + (" (already decided)" if result.replayed else "")
            + (f"; the run {result.work_id} ended {result.ended}" if result.ended else ""))
