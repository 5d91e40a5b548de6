"""Where the truth is kept: the org home's SQLite file (the default) or a PostgreSQL database.

A location is a path or ``sqlite:///PATH`` (SQLite) or ``postgresql://…`` (PostgreSQL, through
psycopg 3). org.toml's ``[state] url`` (or ``ORG_STATE_URL``) makes ``OrgHome.db_path`` the URL,
and then every role, the CLI and the transport's delivery ledger open the PostgreSQL store and no
state.db is made (tests/test_pg_store.py runs the state_db tests on both stores,
tests/test_pg_org.py a whole org, bench/chaos_pg.py the chaos run).

The design, and why: one implementation per dialect behind one interface (as LangGraph's savers
share ``BaseCheckpointSaver``), not SQLAlchemy Core. The interface is the sqlite3 connection's
surface, which everything above this module uses: ``execute(sql, params)`` with ``?`` parameters,
rows readable by name and index (``Row``, like ``sqlite3.Row``), ``fetchone``/``fetchall``/
iteration, ``executemany``, ``in_transaction``, and errors as the ``sqlite3`` exception classes
callers catch (``sqlite3.IntegrityError`` for every constraint, a vocabulary CHECK worded as
SQLite's trigger words it). SQLite's implementation is the sqlite3 module itself, with nothing in
between on its hot path; PostgreSQL's is ``PgConnection`` here, over psycopg 3. What the dialects
do not share is written once per dialect: the schema (``state_db/schema.py`` for SQLite,
``state_db/pg_migrations.py`` and ``pg_schema.py`` for PostgreSQL), transaction control and the
PRAGMAs the code sends (answered here from an allow-list, below), the functions a statement may
call (``json_extract``/``json_each``, installed on PostgreSQL as SQLite defines them). The
statements of ``StateWriter``, ``state_db/queries`` and the rest are written once, in the SQL both
databases run as it is: ``IS [NOT] DISTINCT FROM`` (not ``IS ?``), ``ON CONFLICT … DO NOTHING`` or
``DO UPDATE SET c = table.c + excluded.c`` (not ``INSERT OR IGNORE``/``OR REPLACE``, not a bare
``c``), ``lower(x) LIKE 'prefix%'`` (SQLite's LIKE ignores case), ``queries.base.marks`` for an
``IN`` list that may be empty, a name on every subquery in ``FROM``, no ``rowid``, no
``group_concat``. Nothing rewrites a statement: the one change on the way to PostgreSQL is the
parameter style (``numbered``: ``?`` as ``$1``, by a scan that skips literals and comments), and a
statement PostgreSQL cannot run fails there, as a ``sqlite3.OperationalError``, in
tests/test_pg_dialect.py, which runs every statement of ``state_db/`` on both stores. SQLAlchemy
Core was not chosen: a new dependency, a compile step on every SQLite statement, and every
statement of ``state_db/`` rewritten as Python expressions, where the shared subset asks for a
handful of spellings and is enforced by that test.

Transactions: ``BEGIN IMMEDIATE`` becomes ``BEGIN`` (READ COMMITTED) followed, as the
transaction's first statement, by ``pg_advisory_xact_lock`` on one key per store (database and
schema). SQLite's ``BEGIN IMMEDIATE`` takes the database-wide write lock at BEGIN, so writers run
one at a time and every read inside sees the latest commit and nothing changes under it until
COMMIT. The transaction-scoped advisory lock is that lock: every write path (writer transactions,
migrations, and a write outside any transaction, which SQLite also runs under its write lock and
which is wrapped here in its own locked transaction) takes it first, so only one writes at a
time; under READ COMMITTED each statement sees every transaction committed before it started,
and since no other writer can commit while the lock is held, a read-then-write is as safe as in
SQLite. It is released by COMMIT or ROLLBACK, or when the session dies (a killed process never
leaves it held). SERIALIZABLE was not chosen: it would abort conflicting read-then-write
transactions with serialization failures, which needs every caller's transaction body (Python
with side effects) to be re-runnable under a retry loop; SQLite's writers never see such a
failure, they wait. A wait longer than ``lock_timeout`` (SQLite's busy_timeout, 10 s) raises
``StoreBusy`` (code ``store_busy``, a ``sqlite3.OperationalError``), as SQLite's "database is
locked" does once ``StateWriter`` has translated it. A plain ``BEGIN`` (SQLite's
deferred snapshot) becomes REPEATABLE READ. Readers never take the lock: a read outside a
transaction sees the latest commit, as in SQLite's WAL mode.

One difference remains visible to SQL: a statement that fails inside a PostgreSQL transaction
aborts the transaction, where SQLite undoes only the statement; every caller here lets the error
end its transaction (``Transaction.insert`` turns it into ``Conflict``, which rolls back).

psycopg is imported only when a PostgreSQL store is opened: measured 168 ms (cumulative,
``python -X importtime -c "import psycopg"``), paid by no SQLite org.
"""
from __future__ import annotations

import functools
import sqlite3
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterable, Iterator
from urllib.parse import unquote, urlsplit

from state_db.kernel.errors import StateError, StoreBusy
from state_db.vocab_guard import GUARDED, PREFIX, allowed

SCHEMES = ("postgresql://", "postgres://")
LOCK_TIMEOUT_MS = 10_000            # as SQLite's busy_timeout (state_db/connection.py)
LOCK_CLASS = 0x6C6F6F70             # 'loop': the advisory-lock class of every org's write lock
# the per-store key: one lock per database and schema (an org's truth)
_LOCK = f"SELECT pg_advisory_xact_lock({LOCK_CLASS}, hashtext(current_database() || '.' || current_schema()))"
_NOOP_PRAGMAS = {"foreign_keys", "busy_timeout", "journal_mode", "synchronous", "wal_autocheckpoint",
                 "wal_checkpoint", "optimize"}
_VOCAB = {f"{PREFIX}{t}_{c}": (t, c) for t, c in GUARDED}


# ------------------------------------------------------------------------------------ locating

def is_postgres(target: Any) -> bool:
    """True for a ``postgresql://`` URL or an open PostgreSQL connection."""
    if isinstance(target, PgConnection):
        return True
    return isinstance(target, str) and target.startswith(SCHEMES)


def location(target: str | Path) -> str | Path:
    """A store given as a path, a ``sqlite:///PATH`` URL or a ``postgresql://`` URL, as what
    ``connect`` opens: a Path for SQLite, the URL text for PostgreSQL."""
    if is_postgres(target):
        return str(target)
    text = str(target)
    if text.startswith("sqlite:///"):
        return Path("/" + unquote(text[len("sqlite://"):]).lstrip("/"))     # sqlite:///p and sqlite:////p
    if "://" in text:
        raise StateError(f"{text} is not a store this org can use", code="bad_store_url",
                         hint="give sqlite:///PATH or postgresql://USER@HOST/DB")
    return Path(text)


def describe(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(":" + parts.password + "@", ":***@")
    return parts._replace(netloc=netloc).geturl()


# ------------------------------------------------------------------------------------ parameters

# SQLite's transaction statements, by their exact words (an allow-list: any other form reaches the
# server as written)
_TX = {"BEGIN IMMEDIATE": "lock", "BEGIN EXCLUSIVE": "lock", "BEGIN IMMEDIATE TRANSACTION": "lock",
       "BEGIN": "snapshot", "BEGIN DEFERRED": "snapshot", "BEGIN TRANSACTION": "snapshot",
       "COMMIT": "end", "END": "end", "COMMIT TRANSACTION": "end", "ROLLBACK": "end",
       "ROLLBACK TRANSACTION": "end"}


@functools.lru_cache(maxsize=2048)
def numbered(sql: str) -> str:
    """``sql`` with each ``?`` parameter marker as PostgreSQL's ``$1``, ``$2``, …: the qmark
    paramstyle of the sqlite3 module in the numeric one of PostgreSQL's protocol, and nothing
    else changed. A character scan, not a pattern: a ``?`` inside a string literal, a quoted
    identifier or a comment is text and stays as it is.

    Raises sqlite3.ProgrammingError for ``?NNN`` (numbered qmarks: the code uses plain ``?``)."""
    out: list[str] = []
    i, n, count = 0, len(sql), 0
    while i < n:
        ch = sql[i]
        if ch in "'\"":                                    # '…' or "…": a doubled quote does not end it
            j = sql.find(ch, i + 1)
            while j >= 0 and sql.startswith(ch, j + 1):
                j = sql.find(ch, j + 2)
            j = n - 1 if j < 0 else j
            out.append(sql[i:j + 1])
            i = j + 1
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            j = n if j < 0 else j
            out.append(sql[i:j])
            i = j
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(sql[i:j])
            i = j
        elif ch == "?":
            if i + 1 < n and sql[i + 1].isdigit():
                raise sqlite3.ProgrammingError("numbered ?NNN parameters are not supported on a PostgreSQL store; use ?")
            count += 1
            out.append(f"${count}")
            i += 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


# ------------------------------------------------------------------------------------ rows

class Row(tuple):
    """One result row, readable by index and by (case-insensitive) column name, as ``sqlite3.Row``."""

    _names: tuple[str, ...] = ()
    _index: dict[str, int] = {}

    def __getitem__(self, key):
        if isinstance(key, str):
            try:
                return tuple.__getitem__(self, self._index[key.lower()])
            except KeyError:
                raise IndexError(f"No item with that key: {key}") from None
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


@functools.lru_cache(maxsize=1024)
def _row_class(names: tuple[str, ...]) -> type[Row]:
    return type("Row", (Row,), {"_names": names, "_index": {n.lower(): i for i, n in enumerate(names)}})


def _row_factory(cursor):
    desc = cursor.description
    cls = _row_class(tuple(d.name for d in desc) if desc else ())
    return cls


class Cursor:
    """What ``execute`` returns: fetch and iterate rows; ``rowcount``. A statement without rows
    fetches none (sqlite3's behaviour), where psycopg would raise."""

    def __init__(self, cur=None, rows: list | None = None):
        self._cur, self._rows = cur, rows

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount if self._cur is not None else -1

    @property
    def description(self):
        if self._cur is None or self._cur.description is None:
            return None
        return tuple((d.name, None, None, None, None, None, None) for d in self._cur.description)

    lastrowid = None

    def _has_rows(self) -> bool:
        return self._cur is not None and self._cur.description is not None

    def fetchone(self):
        if self._rows is not None:
            return self._rows.pop(0) if self._rows else None
        return self._cur.fetchone() if self._has_rows() else None

    def fetchall(self) -> list:
        if self._rows is not None:
            rows, self._rows = self._rows, []
            return rows
        return self._cur.fetchall() if self._has_rows() else []

    def fetchmany(self, size: int = 1) -> list:
        if self._rows is not None:
            rows, self._rows = self._rows[:size], self._rows[size:]
            return rows
        return self._cur.fetchmany(size) if self._has_rows() else []

    def __iter__(self) -> Iterator:
        return iter(self.fetchall())

    def close(self) -> None:
        if self._cur is not None:
            self._cur.close()


# ------------------------------------------------------------------------------------ the connection

class PgConnection:
    """A psycopg 3 connection that answers as a ``sqlite3.Connection`` in autocommit mode
    (``isolation_level=None``): transactions are the caller's explicit BEGIN/COMMIT."""

    row_factory = None          # assigned by code written for sqlite3; rows are always ``Row``

    def __init__(self, raw, url: str, readonly: bool):
        self.raw, self.url, self.readonly = raw, url, readonly

    # -- what sqlite3 callers use ------------------------------------------------------------
    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus
        return self.raw.info.transaction_status != TransactionStatus.IDLE

    def execute(self, sql: str, params: Any = ()) -> Cursor:
        head = " ".join(sql.split()).rstrip(";").upper()
        tx = _TX.get(head)
        if tx == "lock":
            self.run("BEGIN")
            self.run(_LOCK)
            return Cursor()
        if tx == "snapshot":
            return Cursor(self.run("BEGIN ISOLATION LEVEL REPEATABLE READ"))
        if tx == "end":
            return Cursor(self.run(head.split()[0]))
        if head.startswith("PRAGMA"):
            return self._pragma(head)
        return self._statement(sql, params)

    def executemany(self, sql: str, seq: Iterable) -> Cursor:
        cur = Cursor()
        for params in seq:
            cur = self.execute(sql, params)
        return cur

    def commit(self) -> None:
        if self.in_transaction:
            self.run("COMMIT")

    def rollback(self) -> None:
        if self.in_transaction:
            self.run("ROLLBACK")

    def close(self) -> None:
        self.raw.close()

    def backup(self, *_a, **_k) -> None:
        raise sqlite3.NotSupportedError("a PostgreSQL store is backed up with pg_dump, not SQLite's backup API")

    def __enter__(self):
        return self

    def __exit__(self, kind, *_):
        (self.rollback if kind else self.commit)()

    # -- inside -----------------------------------------------------------------------------
    def _statement(self, sql: str, params: Any) -> Cursor:
        text, params = numbered(sql), _params(params)
        if not self.readonly and not self.in_transaction and _first_word(sql) in _WRITES:
            # SQLite runs a lone write under its write lock: so does this, in its own transaction
            self.run("BEGIN")
            try:
                self.run(_LOCK)
                cur = self.run(text, params)
            except BaseException:
                self.run("ROLLBACK")
                raise
            self.run("COMMIT")
            return Cursor(cur)
        return Cursor(self.run(text, params))

    def run(self, text: str, params: Any = None):
        """PostgreSQL SQL as it is (no translation); errors as sqlite3 classes."""
        import psycopg
        try:
            return self.raw.execute(text, params)
        except psycopg.Error as exc:
            raise _as_sqlite(exc) from exc

    def copy_rows(self, table: str, columns: list[str], rows: Iterable) -> int:
        """Load ``rows`` into ``table`` with COPY (one round trip for all of them), in the caller's
        transaction. Returns the number of rows."""
        import psycopg
        n = 0
        try:
            with self.raw.cursor() as cur:
                with cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(tuple(row))
                        n += 1
        except psycopg.Error as exc:
            raise _as_sqlite(exc) from exc
        return n

    def _pragma(self, head: str) -> Cursor:
        """The few PRAGMAs callers written for SQLite send, answered here (none reaches the server)."""
        words = head.removeprefix("PRAGMA").replace("=", " = ").replace("(", " ( ").replace(")", " ").split()
        name = words[0].lower() if words else ""
        value = words[-1] if len(words) > 2 else None      # PRAGMA name = v, PRAGMA name(v)
        if name == "user_version":
            if value is None:
                return Cursor(rows=[_row_class(("user_version",))((schema_version(self),))])
            self.run("INSERT INTO _store (name, value) VALUES ('user_version', $1) "
                     "ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value", (int(value),))
            return Cursor(rows=[])
        if name in _NOOP_PRAGMAS:      # SQLite's file and lock settings: nothing to set on PostgreSQL
            return Cursor(rows=[])
        if name == "database_list":    # which store this is (callers key caches by it): its URL
            return Cursor(rows=[_row_class(("seq", "name", "file"))((0, "main", describe(self.url)))])
        raise sqlite3.OperationalError(f"PRAGMA {name} is SQLite's; a PostgreSQL store has no such setting")


def schema_version(conn: PgConnection) -> int:
    """``PRAGMA user_version`` of a PostgreSQL store: kept in its ``_store`` table (0 before it)."""
    if conn.run("SELECT to_regclass('_store')").fetchone()[0] is None:
        return 0
    row = conn.run("SELECT value FROM _store WHERE name = 'user_version'").fetchone()
    return int(row[0]) if row else 0


def connect(url: str, *, readonly: bool = False) -> PgConnection:
    """Open the PostgreSQL store at ``url`` as a sqlite3-shaped connection (autocommit; every
    parameter sent untyped so the server types it from its column, as SQLite's affinity does;
    ``numeric`` results — ``SUM`` of integers — as int or float).

    Raises: StateError ``db_unreachable`` when the server cannot be reached."""
    import psycopg
    from psycopg.adapt import Dumper, Loader
    from psycopg.conninfo import conninfo_to_dict
    try:
        given = conninfo_to_dict(url).get("options") or ""      # the URL's own (a search_path) are kept
        raw = psycopg.connect(url, autocommit=True, row_factory=_row_factory, cursor_factory=psycopg.RawCursor,
                              options=f"{given} -c lock_timeout={LOCK_TIMEOUT_MS} -c TimeZone=UTC".strip())
    except psycopg.Error as exc:
        said = " ".join(str(exc).split())                       # libpq's lines, as one
        raise StateError(f"cannot reach the PostgreSQL store {describe(url)}: {said}",
                         code="db_unreachable", hint="check the URL and that the server runs") from None

    class Untyped(Dumper):
        oid = 0     # unknown: the server infers the type from the column or operator

        def dump(self, obj):
            return str(obj).encode()

    class UntypedBool(Untyped):
        def dump(self, obj):
            return b"1" if obj else b"0"    # SQLite keeps booleans as 0/1 in INTEGER columns

    class UntypedFloat(Untyped):
        def dump(self, obj):
            return repr(float(obj)).replace("inf", "Infinity").encode()

    class Number(Loader):
        def load(self, data):
            d = Decimal(bytes(data).decode())
            return int(d) if d == d.to_integral_value() else float(d)

    for kind in (int, str):
        raw.adapters.register_dumper(kind, Untyped)
    raw.adapters.register_dumper(bool, UntypedBool)
    raw.adapters.register_dumper(float, UntypedFloat)
    raw.adapters.register_loader("numeric", Number)
    if readonly:
        raw.execute("SET default_transaction_read_only = on")
    return PgConnection(raw, url, readonly)


_WRITES = {"INSERT", "UPDATE", "DELETE"}


def _first_word(sql: str) -> str:
    words = sql.split(None, 1)
    return words[0].upper() if words else ""


def _params(params: Any) -> Any:
    if params is None:
        return None
    if isinstance(params, dict):
        raise sqlite3.ProgrammingError("named parameters are not supported on a PostgreSQL store; use ?")
    return tuple(params)


def _as_sqlite(exc) -> sqlite3.Error:
    """A psycopg error as the sqlite3 class a caller written for SQLite catches."""
    import psycopg
    from psycopg import errors as E
    message = (exc.diag.message_primary or str(exc)).strip()
    constraint = getattr(exc.diag, "constraint_name", None)
    if constraint in _VOCAB:
        table, column = _VOCAB[constraint]
        message = f"{table}.{column}: value is not one of {', '.join(allowed(table, column))}"
    if isinstance(exc, (psycopg.IntegrityError, psycopg.DataError)):
        err: sqlite3.Error = sqlite3.IntegrityError(message)
    elif isinstance(exc, (E.LockNotAvailable, E.QueryCanceled, E.SerializationFailure, E.DeadlockDetected)):
        # the store stayed busy past its wait (lock_timeout), or PostgreSQL gave up a transaction
        # that waited on another: one coded error, as SQLite's busy timeout (connection.as_store_busy)
        err = StoreBusy(f"database is locked ({message})")
    elif isinstance(exc, (psycopg.OperationalError, psycopg.ProgrammingError, psycopg.InternalError)):
        err = sqlite3.OperationalError(message)
    else:
        err = sqlite3.DatabaseError(message)
    err.sqlstate = exc.sqlstate  # type: ignore[attr-defined]
    return err
