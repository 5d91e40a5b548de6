"""StateWriter: the only write path into state.db.

Every write runs inside ``StateWriter.transaction()`` (``BEGIN IMMEDIATE``) and goes through the
checked helpers of ``Transaction``: status transitions against the allow-list (terminal states
are final), writer-role checks, one journal event per domain change in the same transaction.
After commit, post-commit hooks run (debounced snapshot rendering); a failing hook is logged and
never rolls back. ``run_once`` makes a command idempotent under a client key.
"""
from __future__ import annotations

import getpass
import re
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson

from state_db.connection import BUSY_TIMEOUT_MS, as_store_busy, connect
from state_db.gate import WriteGate, gate_path
from state_db.kernel.errors import Conflict, IllegalTransition, NotAllowed, NotFound, RunTaken, StateError, StoreBusy
from state_db.migrations import check_version
from state_db.queries.verdicts import latest_iteration_passed
from state_db.kernel.secrets import redact_text, secret_values
from state_db.store import location
from state_db.rules import CONTINUERS, KEYS, RAW_WRITABLE, RESERVED, WRITERS, allowed_transition
from state_db.vocab import Actor, StopReason, WorkStatus

# Fields whose change alone is bookkeeping, not a domain change: no journal event.
# ``next_step`` is the run's own note of where it goes on (roles/loop_agent/steps.py), written with
# or after the change it follows from, never a change of its own.
QUIET_FIELDS = {"heartbeat_at", "updated_at", "alive_at", "current_tool", "current_tool_at", "next_step"}
_RAW_WRITE = re.compile(r"^\s*(?:INSERT(?:\s+OR\s+\w+)?\s+INTO|UPDATE(?:\s+OR\s+\w+)?|DELETE\s+FROM|REPLACE\s+INTO)\s+[\"`]?(\w+)",
                        re.IGNORECASE)

Hook = Callable[["StateWriter", list[dict]], None]

#: While a thread that beats (``beat_while_waiting``) waits for SQLite's write lock, it beats
#: at least this often.
WAIT_SLICE_S = 1.0
_beat: tuple[int, Callable[[], None]] | None = None      # (thread id, its beat)


def beat_while_waiting(beat: Callable[[], None] | None) -> None:
    """Have the calling thread ``beat()`` while any ``StateWriter`` of this process, in this
    thread, waits for SQLite's write lock: the wait (as long as before: the store's busy timeout)
    is taken in slices of ``WAIT_SLICE_S`` with a beat between them. A role's main thread writes
    through more than one writer (its own, the transport's ledger), and a role that waits for a
    busy store is alive, not hung: its beat (``roles/base/beat.py``) must not depend on winning
    the lock. Bound to one thread, so a worker's wait never beats for a main loop that is stuck.
    ``None`` stops it. On a PostgreSQL store the slices are ``lock_timeout``'s."""
    global _beat
    _beat = None if beat is None else (threading.get_ident(), beat)


def dumps(value: Any, secrets: list[str] | None = None) -> str:
    """JSON text of ``value`` with secrets redacted (``secrets``: the values to hide, read from
    the environment when not given)."""
    return redact_text(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS, default=str).decode(), secrets)


class Transaction:
    """One open ``BEGIN IMMEDIATE`` transaction; collects the domain changes it journals."""

    def __init__(self, writer: "StateWriter", conn: sqlite3.Connection, now: float):
        self._w = writer
        self.conn = conn
        self.now = now
        self.changes: list[dict] = []
        self.secrets = secret_values()  # read once: every value written is redacted with them

    # -- raw access -------------------------------------------------------------------------
    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        """Run SQL. Writes are allowed only to bookkeeping tables (ledger, counters, events);
        domain tables change through insert/update/set_status so their rules always apply."""
        match = _RAW_WRITE.match(sql)
        if match and match.group(1).lower() not in RAW_WRITABLE:
            raise NotAllowed(self._w.actor, f"write {match.group(1)} with raw SQL",
                             "use Transaction.insert/update/set_status")
        return self.conn.execute(sql, params)

    def executemany(self, sql: str, seq) -> sqlite3.Cursor:
        match = _RAW_WRITE.match(sql)
        if not match or match.group(1).lower() not in RAW_WRITABLE:
            raise NotAllowed(self._w.actor, "executemany outside bookkeeping tables")
        return self.conn.executemany(sql, seq)

    def one(self, sql: str, params: Any = ()) -> sqlite3.Row | None:
        return self.conn.execute(sql, params).fetchone()

    # -- journal ----------------------------------------------------------------------------
    def journal(self, kind: str, subject: str | None = None, data: dict | None = None) -> None:
        """Append an event to the journal, in this transaction."""
        self.conn.execute(
            "INSERT INTO events(at, actor, instance, os_user, kind, subject, data) VALUES (?,?,?,?,?,?,?)",
            (self.now, self._w.actor, self._w.instance, self._w.os_user, kind, subject,
             dumps(data or {}, self.secrets)))
        self.changes.append({"kind": kind, "subject": subject})

    # -- checked domain writes --------------------------------------------------------------
    def insert(self, table: str, row: dict, *, journal: bool = True) -> None:
        """Insert a domain row after the writer check; journals ``<table>.created``."""
        self._check_writer(table, "insert")
        if "status" in row:
            self._check_reserved(table, row)
        self._special_insert(table, row)
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        values = [_sql_value(v, self.secrets) for v in row.values()]
        try:
            self.conn.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})", values)
        except sqlite3.IntegrityError as exc:
            raise Conflict(f"{table}: {exc}", hint="the row exists already or breaks a constraint") from exc
        if journal:
            self.journal(f"{table}.created", _subject(table, row), _public(row, self.secrets, values))

    def update(self, table: str, key: Any, **fields: Any) -> None:
        """Change non-status fields of one row; journals ``<table>.updated`` unless the change
        is bookkeeping only (heartbeats)."""
        if "status" in fields:
            raise StateError("status changes go through set_status", code="use_set_status")
        self._check_writer(table, "update")
        self._check_reserved(table, fields)
        self._apply(table, key, fields)
        if set(fields) - QUIET_FIELDS:
            self.journal(f"{table}.updated", _key_text(key), _public(fields, self.secrets))

    def set_status(self, table: str, key: Any, new: str, **fields: Any) -> str | None:
        """Move a row to ``new`` status if the transition is allowed; returns the old status.

        Raises IllegalTransition (nothing written) or NotAllowed.
        """
        self._check_writer(table, "status")
        self._check_reserved(table, {"status": new, **fields})
        row = self.get(table, key)
        if row is None:
            raise NotFound(f"{table} {_key_text(key)} does not exist")
        old = row["status"]
        if not allowed_transition(table, old, new) or (
                table == "work_items" and old == WorkStatus.ENDED and self._w.actor not in CONTINUERS):
            raise IllegalTransition(table, _key_text(key), old, str(new))
        self._special_status(table, key, row, new, fields)
        self._apply(table, key, {"status": new, **fields})
        self.journal(f"{table}.{new}", _key_text(key), {"from": old, "to": str(new), **_public(fields, self.secrets)})
        return old

    def delete(self, table: str, key: Any) -> None:
        self._check_writer(table, "delete")
        where, params = _where(table, key)
        self.conn.execute(f"DELETE FROM {table} WHERE {where}", params)
        self.journal(f"{table}.deleted", _key_text(key))

    def get(self, table: str, key: Any) -> sqlite3.Row | None:
        where, params = _where(table, key)
        return self.conn.execute(f"SELECT * FROM {table} WHERE {where}", params).fetchone()

    # -- checks -----------------------------------------------------------------------------
    def _check_writer(self, table: str, op: str) -> None:
        allowed = WRITERS.get((table, op))
        if allowed is None or self._w.actor not in allowed:
            raise NotAllowed(self._w.actor, f"{op} {table}")

    def _check_reserved(self, table: str, fields: dict) -> None:
        for column, value in fields.items():
            allowed = RESERVED.get((table, column, str(value)))
            if allowed is not None and self._w.actor not in allowed:
                raise NotAllowed(self._w.actor, f"set {table}.{column} = {value}")

    def _special_insert(self, table: str, row: dict) -> None:
        actor, instance = self._w.actor, self._w.instance
        if table == "org_session" and self.one("SELECT 1 FROM org_session") is not None:
            raise Conflict("the org session exists already (it is a singleton)",
                           hint="resume it instead of creating another")
        if table == "verdicts" and row.get("written_by") != instance:
            raise NotAllowed(actor, "write a verdict in another instance's name")
        if table == "iterations":
            work = self.get("work_items", row["work_id"])
            if work is None:
                raise NotFound(f"work item {row['work_id']} does not exist")
            if work["assigned_to"] != instance:
                raise RunTaken(actor, row["work_id"], work["assigned_to"])
            if work["status"] == WorkStatus.ENDED:
                raise IllegalTransition("work_items", row["work_id"], work["status"], "iteration")
            last = self.one("SELECT MAX(n) FROM iterations WHERE work_id=?", (row["work_id"],))[0] or 0
            if row["n"] != last + 1:
                raise Conflict(f"iteration {row['n']} of {row['work_id']} out of order (last committed {last})",
                               hint="resume from the last committed iteration")

    def _special_status(self, table: str, key: Any, row: sqlite3.Row, new: str, fields: dict) -> None:
        if table != "work_items":
            return
        if new == WorkStatus.ENDED:
            reason = fields.get("stop_reason")
            if reason is None or reason not in StopReason._value2member_map_:
                raise StateError(f"ending {key} needs a stop_reason from the closed set (got {reason!r})",
                                 code="bad_stop_reason")
            fields.setdefault("ended_at", self.now)
            if reason == StopReason.GOAL_MET and not self._latest_passing(key):
                raise NotAllowed(self._w.actor, f"mark {key} goal_met",
                                 "its latest committed iteration has no passing eval-agent verdict")
        fields.setdefault("updated_at", self.now)

    def _latest_passing(self, work_id: str) -> bool:
        return latest_iteration_passed(self.conn, work_id)

    def _apply(self, table: str, key: Any, fields: dict) -> None:
        where, params = _where(table, key)
        sets = ", ".join(f"{c} = ?" for c in fields)
        cur = self.conn.execute(f"UPDATE {table} SET {sets} WHERE {where}",
                                [_sql_value(v, self.secrets) for v in fields.values()] + params)
        if cur.rowcount == 0:
            raise NotFound(f"{table} {_key_text(key)} does not exist")


class StateWriter:
    """Writes to state.db as one actor (and role instance).

    Args:
        db_path: path of an existing, migrated state.db (never created here), or the
            ``postgresql://`` URL of a migrated PostgreSQL store (``state_db/store.py``).
        actor: a ``vocab.Actor`` value; decides what this writer may change.
        instance: role instance name (``loop-agent-2``); defaults to the actor.
        clock: wall clock (injectable for tests).
        hooks: post-commit hooks ``hook(writer, changes)``; failures are logged, never raised.
    """

    def __init__(self, db_path: str | Path, actor: str, instance: str | None = None, *,
                 clock: Callable[[], float] = time.time, hooks: list[Hook] | None = None):
        if actor not in Actor._value2member_map_:
            raise StateError(f"unknown actor {actor!r}", code="unknown_actor")
        self.db_path = location(db_path)
        self.actor = str(actor)
        self.instance = instance or str(actor)
        self.os_user = _os_user()
        self.clock = clock
        self.hooks: list[Hook] = list(hooks or [])
        self._conn: sqlite3.Connection | None = None
        self._busy_ms = BUSY_TIMEOUT_MS     # the connection's busy timeout as last set
        self._gate: WriteGate | None = None     # a SQLite store's, once opened (state_db/gate.py)

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = connect(self.db_path)
            check_version(conn)
            self._conn = conn
            self._busy_ms = BUSY_TIMEOUT_MS
            if isinstance(conn, sqlite3.Connection):
                self._gate = WriteGate(gate_path(self.db_path))
        return self._conn

    @contextmanager
    def transaction(self, *, render: bool = True, wait_s: float | None = None) -> Iterator[Transaction]:
        """Open ``BEGIN IMMEDIATE``; commit on normal exit, roll back on any exception. On a
        PostgreSQL store it is ``BEGIN`` and the store's advisory write lock (``state_db/store.py``).

        ``render=False`` skips post-commit hooks (ledger and heartbeat writes). ``wait_s``: wait
        at most this long for the write lock. By default a write waits its turn for as long as
        the writers ahead of it keep passing the lock on, and gives up once one has held it for
        the busy timeout: on a SQLite store the writers take it in the order they asked, through
        the store's gate (``state_db/gate.py``), held from before ``BEGIN`` to right after
        ``COMMIT``/``ROLLBACK`` (never while hooks run); on PostgreSQL the wait is its
        ``lock_timeout``, in its lock manager's order.

        Raises:
            StoreBusy: the store stayed busy past the wait (nothing was written); any other
                error of the body, after the rollback."""
        conn = self.conn
        self._begin(conn, wait_s)
        tx = Transaction(self, conn, self.clock())
        try:
            yield tx
        except BaseException as exc:
            try:
                conn.execute("ROLLBACK")
            finally:
                self._leave_gate()
            busy = as_store_busy(exc)
            if busy is not None and busy is not exc:
                raise busy from exc
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            if (busy := as_store_busy(exc)) is None:
                raise
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise busy from exc
        finally:
            self._leave_gate()
        if render and tx.changes:
            self._after_commit(tx.changes)

    def _begin(self, conn, wait_s: float | None) -> None:
        """``BEGIN IMMEDIATE`` through the store's gate when it has one (``state_db/gate.py``):
        given ``wait_s``, within it; by default for as long as the writers ahead keep passing the
        lock on, until one has held it for the busy timeout. In slices with a beat between them
        in the thread that beats (``beat_while_waiting``). Raises StoreBusy."""
        beat = _beat[1] if _beat is not None and _beat[0] == threading.get_ident() else None
        deadline = None if wait_s is None else time.monotonic() + wait_s
        if self._gate is not None:
            try:
                entered = self._gate.enter(deadline, stall_s=BUSY_TIMEOUT_MS / 1000 if deadline is None else None,
                                           slice_s=WAIT_SLICE_S if beat else None, between=beat)
            except OSError as exc:          # the gate orders writers, it guards nothing: go on without
                self._gate.close()
                self._gate = None
                import structlog
                structlog.get_logger().warning("store_gate_unusable", path=str(gate_path(self.db_path)),
                                               error=str(exc), instance=self.instance)
                entered = True
            if not entered:
                raise StoreBusy("another writer held the store's write lock for the whole wait"
                                if deadline is None else "other writers held the store's write lock past the wait")
        try:
            self._begin_locked(conn, wait_s, beat, deadline or time.monotonic() + BUSY_TIMEOUT_MS / 1000)
        except BaseException:
            self._leave_gate()
            raise

    def _leave_gate(self) -> None:
        if self._gate is not None:
            self._gate.leave()

    def _begin_locked(self, conn, wait_s: float | None, beat, deadline: float) -> None:
        """``BEGIN IMMEDIATE`` by ``deadline``: SQLite's lock (or PostgreSQL's advisory lock),
        past the gate (which another kind of writer does not take)."""
        while True:
            if beat is None and wait_s is None:
                ms = BUSY_TIMEOUT_MS            # the common case: the connection's own, set once
            else:
                left = deadline - time.monotonic()
                ms = max(0, int(1000 * (min(left, WAIT_SLICE_S) if beat else left)))
            self._set_busy_ms(conn, ms)
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if conn.in_transaction:        # PostgreSQL: BEGIN ran, its lock did not come
                    conn.execute("ROLLBACK")
                if (busy := as_store_busy(exc)) is None:
                    raise
                if beat is None or time.monotonic() >= deadline:
                    raise busy from exc
            beat()

    def _set_busy_ms(self, conn, ms: int) -> None:
        """The longest the next lock wait may take: SQLite's busy timeout, PostgreSQL's
        ``lock_timeout`` (where 0 would mean no limit: at least 1 ms)."""
        if ms == self._busy_ms:
            return
        if isinstance(conn, sqlite3.Connection):
            conn.execute(f"PRAGMA busy_timeout={ms}")
        else:
            conn.run(f"SET lock_timeout = {max(1, ms)}")
        self._busy_ms = ms

    def run_once(self, key: str, command: str, fn: Callable[[Transaction], dict], *,
                 args: Any) -> tuple[dict, bool]:
        """Run ``fn`` at most once for ``key``; returns (result, replayed).

        ``args`` are the command's arguments (any JSON value): the key is bound to the command
        and to them, so the same key with other arguments (another decision, another verdict) is
        refused as a conflict instead of answering with the first command's result. The key, the
        arguments' digest and the result are stored in the same transaction as fn's writes, so a
        retry after any failure either does everything once or finds the stored result.

        Raises: Conflict(code="idempotency_conflict") for a key used for another command or
        other arguments."""
        digest = args_digest(command, args)
        with self.transaction() as tx:
            row = tx.one("SELECT command, args, result FROM idempotency WHERE key = ?", (key,))
            if row is not None:
                if row["command"] != command or (row["args"] is not None and row["args"] != digest):
                    what = row["command"] if row["command"] != command else f"{command} with other arguments"
                    raise Conflict(f"idempotency key {key} was used for {what}", code="idempotency_conflict",
                                   hint="use a fresh key for a different command or different arguments")
                return orjson.loads(row["result"]), True
            result = fn(tx)
            tx.conn.execute("INSERT INTO idempotency(key, actor, os_user, command, args, result, at) "
                            "VALUES (?,?,?,?,?,?,?)",
                            (key, self.actor, self.os_user, command, digest, dumps(result, tx.secrets), tx.now))
            return result, False

    def _after_commit(self, changes: list[dict]) -> None:
        for hook in self.hooks:
            try:
                hook(self, changes)
            except Exception as exc:  # a hook never undoes a commit
                import structlog
                structlog.get_logger().warning("post_commit_hook_failed", hook=getattr(hook, "__name__", repr(hook)),
                                               error=str(exc), actor=self.actor, instance=self.instance)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._gate is not None:
            self._gate.close()
            self._gate = None


def args_digest(command: str, args: Any) -> str:
    """sha256 of a command and its arguments in one canonical JSON form (keys sorted)."""
    import hashlib
    return hashlib.sha256(orjson.dumps({"command": command, "args": args}, option=orjson.OPT_SORT_KEYS,
                                       default=str)).hexdigest()


def _os_user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


def _where(table: str, key: Any) -> tuple[str, list]:
    cols = KEYS.get(table, "id")
    if isinstance(cols, tuple):
        return " AND ".join(f"{c} = ?" for c in cols), list(key)
    return f"{cols} = ?", [key]


def _key_text(key: Any) -> str:
    return "/".join(map(str, key)) if isinstance(key, (tuple, list)) else str(key)


def _subject(table: str, row: dict) -> str | None:
    cols = KEYS.get(table, "id")
    if isinstance(cols, tuple):
        return "/".join(str(row.get(c)) for c in cols)
    value = row.get(cols)
    return None if value is None else str(value)


def _sql_value(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, (dict, list, tuple)):
        return dumps(value, secrets)
    if isinstance(value, str):
        return redact_text(value, secrets)
    return value


_BULKY = 400


def _public(fields: dict, secrets: list[str], encoded: list | None = None) -> dict:
    """What a journal event keeps of a row: scalars, with long text cut. ``encoded``: the
    values as ``_sql_value`` already wrote them (JSON text is not made twice)."""
    out = {}
    for i, (k, v) in enumerate(fields.items()):
        if isinstance(v, str) and len(v) > _BULKY:
            v = v[:_BULKY] + "…"
        elif isinstance(v, (dict, list, tuple)):
            text = encoded[i] if encoded is not None else dumps(v, secrets)
            v = orjson.loads(text) if len(text) <= _BULKY else text[:_BULKY] + "…"
        out[k] = v
    return out
