"""Shared output helpers for CLI commands: JSON or aligned text, and home resolution."""
from __future__ import annotations

import sys
from typing import Any

import orjson

from state_db.connection import connect
from state_db.home import OrgHome, resolve_home


def home_of(args) -> OrgHome:
    return resolve_home(getattr(args, "home", None))


def read_conn(args):
    """A read-only connection to an existing state.db (never creates one)."""
    home = home_of(args).require()
    return connect(home.db_path, readonly=True)


def emit_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS,
                                  default=str).decode() + "\n")


def table(rows: list[list[Any]], headers: list[str]) -> str:
    cells = [headers] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def add_json(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def print_unsent(wake: str, then: str, as_json: bool = False) -> None:
    """One line when a command's wake to the coordinator was not sent (stderr beside JSON)."""
    from roles.operations.wake import unsent_note

    note = unsent_note(wake, then)
    if note:
        print(f"  {note}", file=sys.stderr if as_json else sys.stdout)
