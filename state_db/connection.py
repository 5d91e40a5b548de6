"""Opening state.db with the pragmas every connection needs."""
from __future__ import annotations

import sqlite3
from pathlib import Path

from state_db import store
from state_db.kernel.errors import HomeNotFound, StateError, StoreBusy

BUSY_TIMEOUT_MS = 10_000


def connect(db_path: str | Path, *, readonly: bool = False,
            create: bool = False) -> sqlite3.Connection | store.PgConnection:
    """Open state.db: WAL, busy_timeout, foreign_keys=ON, synchronous=NORMAL.

    A ``postgresql://`` URL opens that store instead (``state_db/store.py``), a connection that
    answers as this one does.

    Transactions are managed explicitly (``isolation_level=None``): writers issue
    ``BEGIN IMMEDIATE`` so a read-then-write never fails with SQLITE_BUSY_SNAPSHOT.

    Args:
        db_path: the database file.
        readonly: open with ``mode=ro`` (for queries; cannot create or write).
        create: allow creating a missing file; otherwise a missing file raises HomeNotFound,
            so no command ever leaves a stray empty database behind.
    """
    if store.is_postgres(db_path):
        return store.connect(str(db_path), readonly=readonly)
    path = Path(db_path)
    if not create and not path.is_file():
        raise HomeNotFound(f"no state.db at {path}",
                           hint="start the org with 'scripts/start-org' or point ORG_HOME at it")
    mode = "ro" if readonly else ("rwc" if create else "rw")
    conn = sqlite3.connect(f"file:{path}?mode={mode}", uri=True, isolation_level=None,
                           timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    try:
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA schema_version").fetchone()  # fails fast on a file that is not SQLite
        if not readonly:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StateError(f"{path} is not a usable SQLite database: {exc}", code="db_unreadable",
                         hint="restore it from backups/ in the org home, or move it aside") from exc
    return conn


#: SQLite's primary result codes of a lock it could not get within its busy timeout.
_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


def as_store_busy(exc: BaseException) -> StoreBusy | None:
    """``exc`` as the store's coded ``StoreBusy`` when it says the store stayed busy past its
    wait, else None. Judged by SQLite's result code (the primary code of an extended one such as
    ``SQLITE_BUSY_SNAPSHOT``), never by the message; a PostgreSQL store raises ``StoreBusy``
    itself (``state_db/store.py``)."""
    if isinstance(exc, StoreBusy):
        return exc
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(exc, sqlite3.OperationalError) and code is not None and code & 0xFF in _BUSY_CODES:
        busy = StoreBusy(str(exc))
        busy.sqlite_errorcode, busy.sqlite_errorname = code, getattr(exc, "sqlite_errorname", "")
        return busy
    return None


def read_rows(db_path: str | Path, sql: str, params=()) -> list[dict]:
    """Run one read-only query on its own short-lived connection and return plain dicts (for
    watchers outside the org: tests, benchmarks, audits)."""
    if store.is_postgres(db_path):
        pg = store.connect(str(db_path), readonly=True)
        try:
            return [dict(r) for r in pg.execute(sql, params)]
        finally:
            pg.close()
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, params)]
    finally:
        conn.close()
