"""The delivery ledger (at-most-once) and the transport counters, both in state.db.

A receiver records each batch of received ids in ONE ``BEGIN IMMEDIATE`` transaction
(``ON CONFLICT DO NOTHING``: a row that already exists is a duplicate) and then handles only the new
ones. The same transaction journals the batch's rejections and flushes the counter deltas that
accumulated in memory (the sender's too, when it shares the :class:`Counters`), so counting
costs no transaction of its own. Ledger writes never trigger snapshot rendering.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from transport.envelope import DEFAULT_LIMITS, Envelope, Limits
from transport.kinds import role_of

PUSHED = "pushed"
FELL_BACK = "fell_back"
DELIVERED = "delivered"
DUPLICATES = "duplicates"
HANDLER_ERRORS = "handler_errors"
REJECTED_PREFIX = "rejected:"

_INSERT_ID = ("INSERT INTO delivery_ledger(msg_id, recipient, sender, kind, created_at, recorded_at) "
              "VALUES (?,?,?,?,?,?) ON CONFLICT DO NOTHING")
_ADD_COUNTER = ("INSERT INTO transport_counters(instance, name, value) VALUES (?,?,?) "
                "ON CONFLICT(instance, name) DO UPDATE SET value = transport_counters.value + excluded.value")


class Counters:
    """In-memory counter deltas of one instance, flushed by :class:`Ledger` transactions.

    Names: ``pushed``, ``fell_back``, ``delivered``, ``duplicates``, ``handler_errors``,
    ``rejected:<code>``. Thread-safe.
    """

    def __init__(self, instance: str) -> None:
        self.instance = instance
        self._pending: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, name: str, n: int = 1) -> None:
        if n:
            with self._lock:
                self._pending[name] = self._pending.get(name, 0) + n

    def take(self) -> dict[str, int]:
        """Return the pending deltas and reset them."""
        with self._lock:
            pending, self._pending = self._pending, {}
        return pending

    def restore(self, deltas: dict[str, int]) -> None:
        """Put back deltas whose flush failed."""
        for name, n in deltas.items():
            self.add(name, n)

    def peek(self) -> dict[str, int]:
        with self._lock:
            return dict(self._pending)


@dataclass(frozen=True)
class Rejection:
    """A received message that was not handled, as journaled (``message_rejected``).

    Attributes:
        code: a rejection code (:data:`transport.errors.REJECTION_CODES`).
        source: ``"socket"`` or ``"file"``.
        sender, msg_id, kind: what the message claimed, if readable (unauthenticated).
        detail: the error message.
    """

    code: str
    source: str
    sender: str | None = None
    msg_id: str | None = None
    kind: str | None = None
    detail: str = ""

    def encode(self) -> dict:
        return {"code": self.code, "source": self.source, "sender": self.sender,
                "kind": self.kind, "detail": self.detail[:300]}


class _Checkpointer:
    """Runs WAL checkpoints on its own connection, in its own thread.

    A checkpoint fsyncs; done inside a commit (SQLite's auto-checkpoint) it adds milliseconds
    to whichever message happens to cross the threshold. Here it runs beside the receiver: the
    sqlite3 module releases the GIL while SQLite works, and PASSIVE never blocks writers.

    It checkpoints when poked (every ``Ledger.checkpoint_every`` commits of its ledger), never on
    a timer: every role runs one, and checkpointing every second made an org of N roles
    checkpoint N times a second whatever it did. Each time the WAL was all copied back, the next
    writer started it over with an fsync inside its write lock: an idle org of 128 loop-agents
    synced state.db's WAL 130 times a second. Checkpoints now follow the writes; the other
    connections' own auto-checkpoint (1,000 pages) bounds the WAL of an org whose ledgers are
    quiet. The connection is opened at the first checkpoint (a quiet role holds none).
    """

    def __init__(self, db_path: Path | str) -> None:
        self.db_path = db_path
        self._due = threading.Event()
        self._closed = False
        self.checkpoints = 0
        self._thread = threading.Thread(target=self._run, name="wal-checkpoint", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        self._due.set()

    def close(self) -> None:
        self._closed = True
        self._due.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        from state_db.connection import connect

        conn = None
        try:
            while True:
                self._due.wait()
                self._due.clear()
                if self._closed:
                    return
                try:
                    conn = conn or connect(self.db_path)
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.checkpoints += 1
                except Exception:  # noqa: BLE001 - busy or locked: the next round retries
                    pass
        finally:
            if conn is not None:
                conn.close()


class Ledger:
    """Delivery ledger and counters of one receiving instance.

    Args:
        db_path: a migrated state.db.
        instance: the receiving instance (its role is the writer's actor).
        counters: deltas to flush; shared with a Sender of the same instance. Default: new.
        limits: message limits; ``limits.ledger_keep_s`` is how long :meth:`prune` keeps ids.
        writer: an existing ``StateWriter`` to use instead of opening one.
        clock: wall clock, for pruning.
        journal_per_minute: at most this many ``message_rejected`` events per minute (a flood
            of bad messages must not flood the journal); the rest are counted and summarised
            in one ``message_rejected_suppressed`` event.
        background_checkpoint: turn SQLite's auto-checkpoint off on this writer's connection
            and checkpoint from a background thread instead (every ``checkpoint_every``
            transactions), so no message waits for a checkpoint's fsync.
    """

    checkpoint_every = 64
    counters_every_s = 1.0

    def __init__(self, db_path: Path | str, instance: str, *, counters: Counters | None = None,
                 limits: Limits = DEFAULT_LIMITS, writer=None,
                 clock: Callable[[], float] = time.time, journal_per_minute: int = 120,
                 background_checkpoint: bool = True) -> None:
        if writer is None:
            from state_db.writer import StateWriter

            writer = StateWriter(db_path, actor=str(role_of(instance)), instance=instance,
                                 clock=clock)
        self.writer = writer
        self.instance = instance
        self.counters = counters or Counters(instance)
        self.limits = limits
        self.clock = clock
        self._journal_cap = journal_per_minute
        self._window_start = 0.0
        self._journaled = 0
        self._suppressed = 0
        self._commits = 0
        self._flushed_at = -1e9
        self._checkpointer: _Checkpointer | None = None
        from state_db.store import is_postgres
        if background_checkpoint and not is_postgres(self.writer.db_path):    # SQLite's WAL only
            self.writer.conn.execute("PRAGMA wal_autocheckpoint=0")
            self._checkpointer = _Checkpointer(self.writer.db_path)

    def record(self, accepted: Sequence[Envelope], rejected: Sequence[Rejection] = (), *,
               flush_counters: bool | None = None) -> list[Envelope]:
        """Record a batch in one transaction and return the envelopes seen for the first time.

        A second copy of an id (earlier batch, or twice in this batch) is dropped and counted
        as a duplicate. Rejections are journaled and counted.

        Args:
            flush_counters: write the pending counter deltas in this transaction. Default: when
                ``counters_every_s`` has passed since the last flush (an extra row per commit
                is a page write; once a second is enough for ``org status``).

        Raises:
            sqlite3.Error / StateError: the transaction failed; nothing was recorded and no
                counter was lost. Handle none of the batch.
        """
        mono = time.monotonic()
        flush = (mono - self._flushed_at >= self.counters_every_s if flush_counters is None
                 else flush_counters)
        deltas = self.counters.take() if flush else {}
        batch: dict[str, int] = {}
        try:
            with self.writer.transaction(render=False) as tx:
                new: list[Envelope] = []
                now = tx.now
                # The statement is fixed and targets a bookkeeping table, so it skips
                # Transaction.execute's per-call raw-write check (a regex on the hot path).
                execute = tx.conn.execute
                for env in accepted:
                    if execute(_INSERT_ID, (env.id, self.instance, env.sender, env.kind,
                                            env.created_at, now)).rowcount == 1:
                        new.append(env)
                _bump(batch, DELIVERED, len(new))
                _bump(batch, DUPLICATES, len(accepted) - len(new))
                for r in rejected:
                    _bump(batch, REJECTED_PREFIX + r.code, 1)
                if rejected:
                    self._journal(tx, rejected, now)
                if flush:
                    for name, n in batch.items():
                        _bump(deltas, name, n)
                    self._flush_into(tx, deltas)
        except BaseException:
            self.counters.restore(deltas)
            raise
        if flush:
            self._flushed_at = mono
        else:
            for name, n in batch.items():
                self.counters.add(name, n)
        self._commits += 1
        if self._checkpointer is not None and self._commits % self.checkpoint_every == 0:
            self._checkpointer.poke()
        return new

    def flush(self) -> None:
        """Write pending counter deltas now (one transaction; none if nothing is pending)."""
        if self.counters.peek():
            self.record((), flush_counters=True)

    def prune(self, keep_s: float | None = None) -> int:
        """Delete this instance's ledger ids recorded more than ``keep_s`` ago.

        Args:
            keep_s: default ``limits.ledger_keep_s`` (max age + twice the skew): any copy of
                an older id would be rejected as expired anyway, so forgetting it is safe.

        Returns:
            The number of ids deleted.
        """
        keep = self.limits.ledger_keep_s if keep_s is None else keep_s
        keep = max(keep, self.limits.ledger_keep_s)  # never forget an id a copy could still use
        with self.writer.transaction(render=False) as tx:
            cur = tx.execute("DELETE FROM delivery_ledger WHERE recipient = ? AND recorded_at < ?",
                             (self.instance, self.clock() - keep))
            return cur.rowcount

    def close(self) -> None:
        """Flush pending counters and close the writer's connection."""
        try:
            self.flush()
        finally:
            if self._checkpointer is not None:
                self._checkpointer.close()
                self._checkpointer = None
            self.writer.close()

    def _journal(self, tx, rejected: Iterable[Rejection], now: float) -> None:
        if now - self._window_start >= 60.0:
            if self._suppressed:
                tx.journal("message_rejected_suppressed", None,
                           {"recipient": self.instance, "count": self._suppressed,
                            "since": self._window_start})
            self._window_start, self._journaled, self._suppressed = now, 0, 0
        for r in rejected:
            if self._journaled >= self._journal_cap:
                self._suppressed += 1
                continue
            self._journaled += 1
            tx.journal("message_rejected", r.msg_id, {"recipient": self.instance, **r.encode()})

    def _flush_into(self, tx, deltas: dict[str, int]) -> None:
        if deltas:
            tx.executemany(_ADD_COUNTER, [(self.instance, k, v) for k, v in deltas.items() if v])


def _bump(deltas: dict[str, int], name: str, n: int) -> None:
    if n:
        deltas[name] = deltas.get(name, 0) + n


def read_counters(db_path: Path | str, instance: str | None = None) -> dict[str, dict[str, int]]:
    """Stored counters by instance (for ``org status``): ``{instance: {name: value}}``."""
    from state_db.connection import connect
    from state_db.queries.processes import transport_counters

    conn = connect(db_path, readonly=True)
    try:
        return transport_counters(conn, instance or None)
    finally:
        conn.close()
