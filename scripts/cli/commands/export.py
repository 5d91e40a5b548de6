"""``org export ID --patch``: the run's result as a patch file (or to stdout); ``--held``: the
changes a goal_met run held outside its change scope, as a patch against the delivered result."""
from __future__ import annotations

import sys
from pathlib import Path

from scripts.cli.commands.diff import patch_of
from scripts.cli.output import home_of, read_conn
from scripts.cli.main import UsageError

NAME = "export"
HELP = "export what a work item changed since its baseline as a patch"


def add_arguments(p) -> None:
    p.add_argument("id", help="work item id")
    p.add_argument("--patch", action="store_true", help="write a unified patch (git apply-able)")
    p.add_argument("--held", action="store_true",
                   help="the changes held outside the change scope at goal_met (apply them with 'org apply ID --held')")
    p.add_argument("-o", "--output", help="file to write (default: stdout)")


def raw_output(args) -> bool:
    """A patch is data: written as it is to a file or a pipe, shown as text on a terminal."""
    return not sys.stdout.isatty()


def run(args) -> int:
    if not args.patch and not args.held:
        raise UsageError("say what to export: --patch or --held")
    if args.patch and args.held:
        raise UsageError("export --patch or --held, not both")
    args.iteration = None
    data = patch_of(args) if args.patch else held_of(args)
    if args.output:
        try:
            Path(args.output).write_bytes(data)
        except OSError as exc:
            from state_db.errors import StateError
            raise StateError(f"cannot write {args.output}: {exc.strerror or exc}", code="cannot_write",
                             hint="choose a writable file path with -o") from None
        print(f"wrote {len(data)} bytes to {args.output}", file=sys.stderr)
    else:
        sys.stdout.buffer.write(data)
    return 0


def held_of(args) -> bytes:
    from roles.operations.held import held_patch

    conn = read_conn(args)
    try:
        return held_patch(home_of(args).require(), conn, args.id)
    finally:
        conn.close()
