"""Named migrations: applied in order, one transaction each, after a backup of state.db.

``PRAGMA user_version`` holds how many migrations are applied, and ``_migrations`` their names;
a database that knows more migrations than this code is refused (SchemaTooNew) rather than
written by code that does not understand it. A PostgreSQL store runs its own form of each migration
(``state_db/pg_migrations.py``; ``state_db/pg_schema.py``: its support objects first, its twin of each
Python step, CHECK constraints for the vocabulary); it keeps ``user_version`` in ``_store`` and
takes no file backup (pg_dump is PostgreSQL's).
"""
from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from state_db import pg_schema, store
from state_db.connection import connect
from state_db.kernel.errors import MigrationFailed, SchemaTooNew
from state_db.schema import MIGRATIONS

VOCABULARY_MIGRATION = "0006_vocabulary"     # installs the triggers vocab_guard keeps in step
# the names of the applied migrations (the layout sqlite-utils gave it, kept for existing databases)
_MIGRATIONS_TABLE = "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at FLOAT)"


def schema_version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


def check_version(conn: sqlite3.Connection, migrations=MIGRATIONS) -> int:
    """Return the database's version; raise SchemaTooNew if this code is older than it."""
    version = schema_version(conn)
    if version > len(migrations):
        raise SchemaTooNew(
            f"state.db is at schema version {version}, this code knows only {len(migrations)}",
            hint="upgrade loop-org to the version that wrote this database; nothing was changed")
    return version


def backup(conn: sqlite3.Connection, dest_dir: Path, version: int) -> Path:
    """Copy the live database with SQLite's online backup API (consistent under WAL)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / f"state.db.v{version}.{time.strftime('%Y%m%dT%H%M%S')}.{time.time_ns() % 10**6}.bak"
    target = sqlite3.connect(dest)
    try:
        conn.backup(target)
    finally:
        target.close()
    return dest


def migrate(db_path: str | Path, *, backups_dir: Path | None = None, migrations=MIGRATIONS) -> dict:
    """Bring state.db up to date, creating it if missing.

    A migration is SQL text (run statement by statement) or a callable given the connection; either
    runs inside the migration's own ``BEGIN IMMEDIATE`` transaction.

    Returns ``{"from": v0, "to": v1, "applied": [names], "backup": path|None}``.

    Raises:
        SchemaTooNew: the database is newer than this code (nothing changed).
        MigrationFailed: a migration failed (its transaction rolled back; the backup remains).
    """
    db_path = store.location(db_path)
    conn = connect(db_path, create=True)
    pg = store.is_postgres(conn)
    try:
        if pg:
            pg_schema.prepare(conn)
        version = check_version(conn, migrations)
        if version == len(migrations):
            return {"from": version, "to": version, "applied": [], "backup": None,
                    "vocabulary": _sync_vocabulary(conn, migrations[:version])}
        backup_path = None
        if version > 0 and not pg:
            backup_path = backup(conn, backups_dir or db_path.parent / "backups", version)
        applied = []
        for index in range(version, len(migrations)):
            name, sql = migrations[index]
            if pg:      # the PostgreSQL store runs its own form of each migration
                sql = pg_schema.migration(name, sql)
            try:
                conn.execute("BEGIN IMMEDIATE")
                # re-check under the write lock: another process may have migrated meanwhile
                if schema_version(conn) != index:
                    conn.execute("ROLLBACK")
                    return migrate(db_path, backups_dir=backups_dir, migrations=migrations)
                if callable(sql):
                    sql(conn)
                else:
                    for statement in _split(sql):
                        conn.execute(statement)
                conn.execute(_MIGRATIONS_TABLE)
                conn.execute("INSERT INTO _migrations (name, applied_at) VALUES (?, ?)", (name, time.time()))
                conn.execute(f"PRAGMA user_version={index + 1}")
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise MigrationFailed(f"migration {name} failed: {exc}",
                                      hint=f"state.db is unchanged at this step; backup: {backup_path}") from exc
            applied.append(name)
        return {"from": version, "to": len(migrations), "applied": applied,
                "backup": str(backup_path) if backup_path else None,
                "vocabulary": _sync_vocabulary(conn, migrations)}
    finally:
        conn.close()


def _sync_vocabulary(conn: sqlite3.Connection, applied) -> list[str]:
    """Recreate the vocabulary triggers that differ from what vocab.py generates today (a value
    added to a vocabulary needs no migration); only once the migration that installs them ran.
    Returns the names of the triggers recreated. Raises MigrationFailed."""
    from state_db.vocab_guard import sync
    if store.is_postgres(conn):
        sync = pg_schema.sync
    if VOCABULARY_MIGRATION not in {name for name, _ in applied}:
        return []
    try:
        return sync(conn)
    except sqlite3.Error as exc:
        raise MigrationFailed(f"the vocabulary triggers could not be brought up to date: {exc}",
                              hint="state.db is unchanged; run 'org doctor'") from exc


def _split(script: str) -> list[str]:
    """Split a migration script into statements (executescript would commit implicitly)."""
    statements, buf = [], ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                statements.append(buf.strip())
            buf = ""
    if buf.strip():
        statements.append(buf.strip())
    return statements
