"""``org revert ID``: put back in the workspace what was there before the run (its baseline)."""
from __future__ import annotations

from roles.operations.restore import Restored, restore
from scripts.cli.output import add_json, emit_json, home_of

NAME = "revert"
HELP = "restore an ended run's workspace to its baseline (refuses to overwrite changes made since)"


def add_arguments(p) -> None:
    p.add_argument("id", help="work item id (ended)")
    add_json(p)


def run(args) -> int:
    result = restore(home_of(args).require(), args.id, baseline=True)
    if args.json:
        emit_json(result.as_data())
    else:
        print(text(result))
    return 0


def text(result: Restored) -> str:
    """The line ``org revert`` / ``org apply`` prints."""
    return (f"{result.workspace} now holds the {result.what} of {result.id} "
            f"({len(result.changed)} file(s) changed: {', '.join(result.changed[:8]) or 'none'})")
