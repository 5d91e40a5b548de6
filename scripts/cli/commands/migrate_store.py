"""``org migrate-store --to postgresql://…``: copy the org's state.db into PostgreSQL, verified."""
from __future__ import annotations

import sys

from scripts.cli.main import UsageError
from scripts.cli.output import add_json, emit_json, home_of
from state_db import pg_schema, store

NAME = "migrate-store"
HELP = ("copy the org's state.db into a PostgreSQL store (migrated there first, which must be empty) and "
        "verify it row by row: a count and a checksum per table; stop the org first")


def add_arguments(p) -> None:
    p.add_argument("--to", required=True, metavar="URL", help="postgresql://USER@HOST/DB (libpq URL), no password")
    p.add_argument("--store-password-file", metavar="FILE",
                   help="a file whose first line is the store's password ('-': type it); default: "
                        "$ORG_STATE_PASSWORD. It is kept in the home's store.pgpass (0600), never on a command line")
    p.add_argument("--from", dest="source", metavar="PATH", help="the state.db to copy (default: the org home's)")
    add_json(p)


def run(args) -> int:
    from state_db.kernel import credentials
    if not store.is_postgres(args.to):
        raise UsageError(f"--to must be a postgresql:// URL (got {store.describe(args.to)!r})")
    credentials.refuse_on_command_line(args.to, "--to")
    password = credentials.password_from(args.store_password_file)
    if password is not None:             # the URL printed and kept names the owner-only passfile
        args.to = credentials.store_password(home_of(args).require().root, args.to, password)
    source = args.source or home_of(args).require().db_path
    result = pg_schema.copy_from_sqlite(source, args.to)
    if args.json:
        emit_json({**result, "from": str(source), "to": store.describe(args.to)})
        return 0
    width = max((len(t) for t in result["tables"]), default=0)
    for table, info in result["tables"].items():
        print(f"{table:<{width}}  {info['rows']:>8} rows  {info['checksum'][:16]}")
    print(f"copied {result['rows']} rows of {len(result['tables'])} tables from {source} to "
          f"{store.describe(args.to)}; every table verified (count and checksum)")
    print(f"to run the org on it: stop the org, set [state] url = \"{args.to}\" in org.toml, start it again",
          file=sys.stderr)
    return 0
