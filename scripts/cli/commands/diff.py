"""``org diff ID [--iteration N]``: what a run changed, from its shadow history."""
from __future__ import annotations

import sys

from pathlib import Path

from scripts.cli.output import read_conn, home_of
from state_db.kernel.errors import NotFound
from state_db.queries import work
from state_db.queries.iterations import checkpoints

NAME = "diff"
HELP = "show the changes of a work item since its baseline (or of one iteration with --iteration)"


def add_arguments(p) -> None:
    p.add_argument("id", help="work item id")
    p.add_argument("--iteration", type=int, help="only what this iteration changed")
    p.add_argument("--raw", action="store_true",
                   help="the patch's bytes exactly, control characters included (for a pipe or a file, e.g. "
                        "'| git apply'); without it the workspace's text is shown with its controls made visible")


def raw_output(args) -> bool:
    """The bytes as they are only when asked: a file the doer wrote is shown, never obeyed."""
    return bool(args.raw)


def patch_of(args) -> bytes:
    from roles.workbench.workspace.history import WorkspaceHistory

    conn = read_conn(args)
    try:
        item = work.item(conn, args.id)
        if item is None:
            raise NotFound(f"no work item {args.id}", hint="list them with 'org status'")
        its = checkpoints(conn, args.id)
    finally:
        conn.close()
    history = WorkspaceHistory(home_of(args).history_dir / f"{args.id}.git", Path(item.workspace))
    n = getattr(args, "iteration", None)
    if n is not None:
        if n not in its:
            raise NotFound(f"{args.id} has no committed iteration {n}", hint=f"committed: {sorted(its) or 'none'}")
        return history.diff_bytes(its.get(n - 1) or history.baseline_commit(), its[n])
    if not its:
        return b""
    delivered = (item.delivered or {}).get("verified")     # at goal_met: what the workspace was made to hold
    return history.diff_bytes(history.baseline_commit(), delivered or its[max(its)])


def run(args) -> int:
    sys.stdout.buffer.write(patch_of(args))
    return 0
