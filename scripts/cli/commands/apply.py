"""``org apply ID [--iteration N]``: put one of an ended run's checkpoints in its workspace."""
from __future__ import annotations

from roles.operations.restore import restore
from scripts.cli.commands.revert import text
from scripts.cli.output import add_json, emit_json, home_of

NAME = "apply"
HELP = "restore an ended run's checkpoint (default: its last) in its workspace (refuses to overwrite changes made since)"


def add_arguments(p) -> None:
    p.add_argument("id", help="work item id (ended)")
    p.add_argument("--iteration", type=int, help="the iteration whose checkpoint to restore (default: the last)")
    add_json(p)


def run(args) -> int:
    result = restore(home_of(args).require(), args.id, iteration=args.iteration)
    if args.json:
        emit_json(result.as_data())
    else:
        print(text(result))
    return 0
