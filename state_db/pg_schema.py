"""The schema on PostgreSQL: its own form of each migration, the vocabulary as CHECK constraints.

The migrations of ``state_db/schema.py`` are SQLite's; PostgreSQL runs its own form of each, by
name (``migration``: the SQL text in ``state_db/pg_migrations.py``, the Python steps in ``STEPS``);
a migration without one is refused rather than run in the other dialect. ``prepare`` installs
what statements written once for both stores may call, before the first migration: the
``_store`` table (``PRAGMA user_version``), SQLite's ``json_extract(doc, '$.a.b')`` and
``json_each(doc, '$.a')`` as immutable SQL functions (an index may use them, as
``decisions_one_pending`` does), and ``=``/``<>`` between text and bigint (SQLite compares a JSON
number with a count; PostgreSQL has no such operator). These are definitions the server holds,
not changes to any statement (``state_db/store.py`` says why nothing is rewritten).

The vocabulary: where SQLite gets triggers (``state_db/vocab_guard.py``: it cannot add a CHECK to
an existing table), PostgreSQL gets one ``CHECK (column IN (...))`` constraint per guarded column,
generated from the same ``GUARDED`` map and named as the trigger pair's stem
(``vocab_work_items_status``), so a refused value is a ``sqlite3.IntegrityError`` with the same
words (``work_items.status: value is not one of …``; the store rewords the check violation).
NULL passes, as with the triggers. Each constraint's comment holds the values it allows; ``sync``
compares them with vocab.py at every migrate and re-creates those that differ in one locked
transaction, so a value added to a vocabulary needs no migration here either. Unlike a trigger, a
re-created CHECK validates the rows already there: a value removed from a vocabulary while rows
still hold it makes ``migrate`` fail (MigrationFailed) until those rows are dealt with.
"""
from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Callable

import orjson

from state_db import pg_migrations
from state_db.connection import connect as connect_any
from state_db.kernel.errors import StateError
from state_db.schema import MIGRATIONS
from state_db.store import PgConnection
from state_db.store import connect as store_connect
from state_db.vocab_guard import GUARDED, PREFIX, allowed

SUPPORT_VERSION = 1      # bump when SUPPORT changes: prepare() re-runs it once

_PATH = "(CASE WHEN $2 = '$' THEN '{}'::text[] ELSE string_to_array(substr($2, 3), '.') END)"
SUPPORT = [
    "CREATE TABLE IF NOT EXISTS _store (name TEXT PRIMARY KEY, value BIGINT NOT NULL)",
    f"""CREATE OR REPLACE FUNCTION json_extract(doc text, path text) RETURNS text
        LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $f$ SELECT ($1::jsonb) #>> {_PATH} $f$""",
    f"""CREATE OR REPLACE FUNCTION json_each(doc text, path text) RETURNS TABLE (key text, value text)
        LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $f$
          WITH v(j) AS (SELECT ($1::jsonb) #> {_PATH})
          SELECT (e.n - 1)::text, e.v FROM v,
                 jsonb_array_elements_text(CASE WHEN jsonb_typeof(v.j) = 'array' THEN v.j END) WITH ORDINALITY AS e(v, n)
          UNION ALL
          SELECT o.key, o.value FROM v, jsonb_each_text(CASE WHEN jsonb_typeof(v.j) = 'object' THEN v.j END) AS o
        $f$""",
    """CREATE OR REPLACE FUNCTION _text_eq_bigint(text, bigint) RETURNS boolean
        LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $f$ SELECT $1 = $2::text $f$""",
    """CREATE OR REPLACE FUNCTION _bigint_eq_text(bigint, text) RETURNS boolean
        LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $f$ SELECT $1::text = $2 $f$""",
    """CREATE OR REPLACE FUNCTION _text_ne_bigint(text, bigint) RETURNS boolean
        LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $f$ SELECT $1 <> $2::text $f$""",
    """CREATE OR REPLACE FUNCTION _bigint_ne_text(bigint, text) RETURNS boolean
        LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $f$ SELECT $1::text <> $2 $f$""",
]
_OPERATORS = [("=", "text", "bigint", "_text_eq_bigint", "=", "<>"),
              ("=", "bigint", "text", "_bigint_eq_text", "=", "<>"),
              ("<>", "text", "bigint", "_text_ne_bigint", "<>", "="),
              ("<>", "bigint", "text", "_bigint_ne_text", "<>", "=")]

_SUPPORTED = "SELECT value FROM _store WHERE name = 'support'"


def prepare(conn: PgConnection) -> bool:
    """Install the support objects (idempotent, under the store's write lock). Returns True if
    anything was (re)installed."""
    if conn.run("SELECT to_regclass('_store')").fetchone()[0] is not None:
        row = conn.run(_SUPPORTED).fetchone()
        if row is not None and row[0] >= SUPPORT_VERSION:
            return False
    conn.execute("BEGIN IMMEDIATE")
    try:
        for sql in SUPPORT:
            conn.run(sql)
        for op, left, right, fn, commutator, negator in _OPERATORS:
            exists = conn.run("""SELECT 1 FROM pg_operator o JOIN pg_namespace n ON n.oid = o.oprnamespace
                                 WHERE n.nspname = current_schema() AND o.oprname = $1
                                   AND o.oprleft = $2::regtype AND o.oprright = $3::regtype""",
                              (op, left, right)).fetchone()
            if exists is None:
                conn.run(f"CREATE OPERATOR {op} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = {fn}, "
                         f"COMMUTATOR = OPERATOR({commutator}), NEGATOR = OPERATOR({negator}))")
        conn.run("INSERT INTO _store (name, value) VALUES ('support', $1) "
                 "ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value", (SUPPORT_VERSION,))
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return True


# ------------------------------------------------------------------------------------ vocabulary

def _name(table: str, column: str) -> str:
    return f"{PREFIX}{table}_{column}"


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def columns(conn: PgConnection) -> set[tuple[str, str]]:
    """(table, column) of every column in the store's schema."""
    return {(r[0], r[1]) for r in conn.run(
        "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema()")}


def generated(present: set[tuple[str, str]] | None = None) -> dict[str, tuple[str, str, str]]:
    """Constraint name -> (table, column, comment: the allowed values, comma-separated), for every
    guarded column (of the ``present`` columns only, when given: a column a later migration adds
    is guarded from the ``sync`` after it)."""
    return {_name(t, c): (t, c, ",".join(allowed(t, c))) for t, c in GUARDED
            if present is None or (t, c) in present}


def installed(conn: PgConnection) -> dict[str, tuple[str, str]]:
    """Constraint name -> (table, comment) of the vocabulary constraints in the store."""
    return {r[0]: (r[1], r[2] or "") for r in conn.run(
        """SELECT c.conname, r.relname, obj_description(c.oid, 'pg_constraint') FROM pg_constraint c
           JOIN pg_class r ON r.oid = c.conrelid JOIN pg_namespace n ON n.oid = r.relnamespace
           WHERE n.nspname = current_schema() AND c.contype = 'c' AND starts_with(c.conname, $1)""", (PREFIX,))}


def stale(conn: PgConnection) -> tuple[dict[str, tuple[str, str, str]], dict[str, str]]:
    """(constraints to create, constraints to drop: name -> table)."""
    want, have = generated(columns(conn)), installed(conn)
    create = {n: spec for n, spec in want.items() if have.get(n) != (spec[0], spec[2])}
    drop = {n: have[n][0] for n in have if n not in want or n in create}
    return create, drop


def install(conn: PgConnection) -> list[str]:
    """Create or re-create the constraints that differ, in the caller's transaction."""
    create, drop = stale(conn)
    for name, table in drop.items():
        conn.run(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {name}")
    for name, (table, column, values) in create.items():
        listed = ", ".join(_quote(v) for v in values.split(","))
        conn.run(f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({column} IN ({listed}))")
        conn.run(f"COMMENT ON CONSTRAINT {name} ON {table} IS {_quote(values)}")
    return sorted(create)


def sync(conn: PgConnection) -> list[str]:
    """``install`` in its own locked transaction, only when something differs."""
    if stale(conn) == ({}, {}):
        return []
    conn.execute("BEGIN IMMEDIATE")
    try:
        names = install(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return names


# ------------------------------------------------------------------------------------ Python steps

def _vocabulary(conn: PgConnection) -> None:
    conn.execute(pg_migrations.STOP_HISTORY)
    install(conn)


STEPS: dict[str, Callable[[PgConnection], None]] = {"0006_vocabulary": _vocabulary}


def migration(name: str, sqlite_form: str | Callable) -> str | Callable:
    """The PostgreSQL form of the migration ``name`` (SQL text from ``state_db/pg_migrations.py``,
    or a Python step from ``STEPS``); the SQLite form never runs here.

    Raises MigrationFailed when the migration has no PostgreSQL form."""
    form = STEPS.get(name) if callable(sqlite_form) else pg_migrations.FORMS.get(name)
    if form is None:
        from state_db.kernel.errors import MigrationFailed
        raise MigrationFailed(f"migration {name} has no PostgreSQL form; nothing was changed",
                              hint="write it in state_db/pg_migrations.py (FORMS) or pg_schema.STEPS")
    return form


# ------------------------------------------------------------------------------------ copying an org's state.db

SKIP_TABLES = {"_migrations", "_store"}    # each store's own record of its migrations


def _source_tables(src: sqlite3.Connection) -> list[str]:
    """The SQLite store's tables, each after those its foreign keys name (so a plain copy in this
    order satisfies every reference as it goes)."""
    names = [r[0] for r in src.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                       "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    names = [n for n in names if n not in SKIP_TABLES]
    refs = {n: {r[2] for r in src.execute(f"PRAGMA foreign_key_list({n})")} - {n} for n in names}
    ordered: list[str] = []
    while len(ordered) < len(names):
        ready = [n for n in names if n not in ordered and refs[n] <= set(ordered)]
        ordered += ready or [n for n in names if n not in ordered]    # a cycle: deferred references
    return ordered


def _columns_of(src: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in src.execute(f"PRAGMA table_info({table})")]


def _digest(row) -> bytes:
    """A row's values as a digest both stores agree on (the same Python values come out of both:
    text, int, float, None)."""
    return hashlib.sha256(orjson.dumps([float(v) if isinstance(v, float) else v for v in row])).digest()


def table_digest(conn, table: str, columns: list[str]) -> tuple[int, str, set[bytes]]:
    """(row count, checksum, row digests) of ``table``: the checksum is over the sorted row digests,
    so it does not depend on either store's row order or collation."""
    digests = [_digest(tuple(r)) for r in conn.execute(f"SELECT {', '.join(columns)} FROM {table}")]
    digests.sort()
    return len(digests), hashlib.sha256(b"".join(digests)).hexdigest(), set(digests)


# tables whose rows the store's triggers derive from others (migration 0023_history): the
# migration writes them, the copy does not, and their value is set to the source's at its end
_TOTALS = ("calls", "input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens", "cost_usd")
DERIVED = {"usage_total": ("SELECT calls, input_tokens, output_tokens, cache_write_tokens, cache_read_tokens, cost_usd, id "
                           "FROM usage_total",
                           f"UPDATE usage_total SET {', '.join(f'{c} = ?' for c in _TOTALS)} WHERE id = ?")}


def copy_from_sqlite(db_path: str | Path, url: str) -> dict:
    """Copy the org's state.db at ``db_path`` into the PostgreSQL store at ``url`` (migrated
    here first; it must hold no rows), in one locked transaction, then verify every table row by
    row: the same count and the same checksum of its rows in both stores.

    Returns ``{"tables": {name: {"rows": n, "checksum": hex}}, "rows": total, "verified": True}``.
    Raises StateError: ``store_outdated`` (state.db is behind this code), ``org_running``,
    ``store_not_empty``, ``copy_failed`` (a row PostgreSQL's constraints refuse; nothing copied),
    ``copy_mismatch`` (verification failed; the store is left as copied, for a look).
    """
    from state_db.migrations import migrate, schema_version    # migrations imports this module

    src = connect_any(db_path, readonly=True)
    try:
        version = schema_version(src)
        if version != len(MIGRATIONS):
            raise StateError(f"{db_path} is at schema version {version}, this code's is {len(MIGRATIONS)}",
                             code="store_outdated",
                             hint="start the org once with this version (it migrates state.db), stop it, then copy")
        session = src.execute("SELECT status FROM org_session").fetchone()
        if session is not None and session[0] in ("running", "suspending"):
            raise StateError(f"the org is {session[0]}: rows written during the copy would be lost",
                             code="org_running", hint="stop it first ('org stop'), then copy")
        migrate(url)
        dest = store_connect(url)
        try:
            src.execute("BEGIN")                 # one read snapshot of state.db for the whole copy
            tables = _source_tables(src)
            dest.execute("BEGIN IMMEDIATE")
            try:
                present = {t for t, _ in columns(dest)}
                for table in tables:
                    if table not in present:
                        raise StateError(f"table {table} of state.db has no twin in the PostgreSQL store",
                                         code="copy_failed", hint="both stores must be at the same schema version")
                    if table not in DERIVED and dest.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone() is not None:
                        raise StateError(f"the PostgreSQL store already holds rows ({table})", code="store_not_empty",
                                         hint="copy into an empty database or schema")
                for table in tables:
                    if table in DERIVED:
                        continue
                    cols = _columns_of(src, table)
                    try:
                        dest.copy_rows(table, cols, src.execute(f"SELECT {', '.join(cols)} FROM {table}"))
                    except sqlite3.Error as exc:
                        raise StateError(f"PostgreSQL refused a row of {table}: {exc}", code="copy_failed",
                                         hint="nothing was copied; fix the row in state.db ('org doctor') and retry") from None
                # the running total the triggers kept while the rows came in, set to state.db's
                # own (the same sum, added in another order)
                for read, write in DERIVED.values():
                    for row in src.execute(read):
                        dest.execute(write, tuple(row))
                for table, column in _identities(dest):
                    dest.run(f"SELECT setval(pg_get_serial_sequence('{table}', '{column}'), "
                             f"GREATEST((SELECT MAX({column}) FROM {table}), 1))")
            except BaseException:
                dest.execute("ROLLBACK")
                raise
            dest.execute("COMMIT")
            report, total = {}, 0
            for table in tables:
                cols = _columns_of(src, table)
                n_src, sum_src, rows_src = table_digest(src, table, cols)
                n_dst, sum_dst, rows_dst = table_digest(dest, table, cols)
                if (n_src, sum_src) != (n_dst, sum_dst):
                    raise StateError(f"{table}: {n_src} rows (checksum {sum_src[:12]}) in state.db, {n_dst} "
                                     f"(checksum {sum_dst[:12]}) in PostgreSQL; {len(rows_src ^ rows_dst)} rows differ",
                                     code="copy_mismatch", hint="the PostgreSQL store is left as copied for a look; "
                                     "empty it before another try")
                report[table] = {"rows": n_src, "checksum": sum_src}
                total += n_src
            src.execute("COMMIT")
            return {"tables": report, "rows": total, "verified": True}
        finally:
            dest.close()
    finally:
        src.close()


def _identities(conn: PgConnection) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in conn.run(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND is_identity = 'YES'")]
