"""``org export ID --patch``: the run's result as a patch file (or to stdout); ``--held``: the
changes a goal_met run held outside its change scope, as a patch against the delivered result;
``--transcript``: what the doer did, one JSON object a line (an attempt's header, then its entries)."""
from __future__ import annotations

import sys
from pathlib import Path

from scripts.cli.commands.diff import patch_of
from scripts.cli.output import home_of, read_conn
from scripts.cli.main import UsageError

NAME = "export"
HELP = "export what a work item changed since its baseline as a patch, or its transcript as JSONL"


def add_arguments(p) -> None:
    p.add_argument("id", help="work item id")
    p.add_argument("--patch", action="store_true", help="write a unified patch (git apply-able)")
    p.add_argument("--held", action="store_true",
                   help="the changes held outside the change scope at goal_met (apply them with 'org apply ID --held')")
    p.add_argument("--transcript", action="store_true",
                   help="write the run's transcript as JSON lines: per attempt one 'attempt' line (outcome, "
                        "usage, verdict, lesson), then one line per entry")
    p.add_argument("-o", "--output", help="file to write (default: stdout)")


def raw_output(args) -> bool:
    """A patch is data: written as it is to a file or a pipe, shown as text on a terminal."""
    return not sys.stdout.isatty()


def run(args) -> int:
    chosen = [k for k in ("patch", "held", "transcript") if getattr(args, k)]
    if len(chosen) != 1:
        raise UsageError("say what to export: one of --patch, --held or --transcript")
    args.iteration = None
    data = {"patch": patch_of, "held": held_of, "transcript": transcript_jsonl}[chosen[0]](args)
    if args.output:
        try:
            Path(args.output).write_bytes(data)
        except OSError as exc:
            from state_db.kernel.errors import StateError
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


def transcript_jsonl(args) -> bytes:
    """The transcript as JSON lines: ``{"type": "attempt", ...}`` then ``{"type": "entry", ...}``
    for each of its entries, in order."""
    import orjson

    from scripts.cli.output import read_conn
    from state_db import queries
    from state_db.kernel.errors import NotFound
    from state_db.queries.transcript import of_work
    conn = read_conn(args)
    try:
        if queries.work_item(conn, args.id) is None:
            raise NotFound(f"no work item {args.id}", hint="list them with 'org status'")
        attempts = of_work(conn, args.id)
    finally:
        conn.close()
    out = []
    for a in attempts:
        head = {k: v for k, v in a.items() if k != "entries"}
        out.append(orjson.dumps({"type": "attempt", "work_id": args.id, **head}, default=str))
        out += [orjson.dumps({"type": "entry", "work_id": args.id, **e}, default=str) for e in a["entries"]]
    return b"".join(line + b"\n" for line in out)
