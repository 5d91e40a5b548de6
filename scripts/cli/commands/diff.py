"""``org diff ID [--iteration N]``: what a run changed, from its shadow history."""
from __future__ import annotations

import sys

from roles.operations import diff
from scripts.cli.output import home_of

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
    """The patch ``org diff`` prints (``roles.operations.diff.patch``)."""
    return diff.patch(home_of(args), args.id, getattr(args, "iteration", None))


def run(args) -> int:
    sys.stdout.buffer.write(patch_of(args))
    return 0
