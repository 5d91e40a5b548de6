"""``org apply ID --held``: write the changes held outside the change scope into the workspace."""
from __future__ import annotations

from roles.operations.held import apply_held
from scripts.cli.main import UsageError
from scripts.cli.output import home_of, read_conn

NAME = "apply"
HELP = "apply the changes a goal_met run held outside its change scope to the workspace (--held)"


def add_arguments(p) -> None:
    p.add_argument("id", help="work item id")
    p.add_argument("--held", action="store_true",
                   help="the changes held outside the scope (see them first with 'org export ID --held')")


def run(args) -> int:
    if not args.held:
        raise UsageError("say what to apply: --held")
    conn = read_conn(args)
    try:
        paths = apply_held(home_of(args).require(), conn, args.id)
    finally:
        conn.close()
    print(f"applied {len(paths)} held change(s): " + ", ".join(paths[:20]) + (" …" if len(paths) > 20 else ""))
    return 0
