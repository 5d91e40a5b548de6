"""``org apply ID [--iteration N]``: put one of an ended run's checkpoints in its workspace;
``org apply ID --held``: write the changes a goal_met run held outside its change scope."""
from __future__ import annotations

from roles.operations.restore import restore
from scripts.cli.commands.revert import text
from scripts.cli.main import UsageError
from scripts.cli.output import add_json, emit_json, home_of, read_conn

NAME = "apply"
HELP = ("restore an ended run's checkpoint (default: its last) in its workspace, refusing to overwrite changes made "
        "since; --held: apply the changes a goal_met run held outside its change scope")


def add_arguments(p) -> None:
    p.add_argument("id", help="work item id (ended)")
    p.add_argument("--iteration", type=int, help="the iteration whose checkpoint to restore (default: the last)")
    p.add_argument("--held", action="store_true",
                   help="the changes held outside the scope (see them first with 'org export ID --held')")
    add_json(p)


def run(args) -> int:
    if args.held:
        if args.iteration is not None:
            raise UsageError("--held and --iteration ask for different things: give one")
        return _held(args)
    result = restore(home_of(args).require(), args.id, iteration=args.iteration)
    if args.json:
        emit_json(result.as_data())
    else:
        print(text(result))
    return 0


def _held(args) -> int:
    from roles.operations.held import apply_held     # the change scope's held changes
    conn = read_conn(args)
    try:
        paths = apply_held(home_of(args).require(), conn, args.id)
    finally:
        conn.close()
    if args.json:
        emit_json({"id": args.id, "applied": paths})
    else:
        print(f"applied {len(paths)} held change(s): " + ", ".join(paths[:20]) + (" …" if len(paths) > 20 else ""))
    return 0
