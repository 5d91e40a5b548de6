"""Model usage as typed data: tokens and cost per run, per attempt and for the whole org.

Every sum counts what retention folded into ``usage_summaries`` along with the per-call rows
that remain (``state_db/retention.py`` prunes calls of ended runs into one summary row each), so
no total — the org-wide spend cap least of all — forgets old spend. The org's totals are one row,
``usage_total``, that the store's own triggers keep equal to the sums of both tables as each row is
written, moved or removed (migration ``0023_history``): the spend cap is read before every model
call, and summing the whole history there made each call cost more the longer the org had run.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from state_db.queries.base import columns
from state_db.queries.review import DOER_CALLS

_SUMS = """COALESCE(SUM(input_tokens),0) AS input_tokens, COALESCE(SUM(output_tokens),0) AS output_tokens,
           COALESCE(SUM(cache_write_tokens),0) AS cache_write_tokens,
           COALESCE(SUM(cache_read_tokens),0) AS cache_read_tokens, COALESCE(SUM(cost_usd),0) AS cost_usd"""
_CALLS = f"SELECT COUNT(*) AS calls, {_SUMS} FROM model_calls"
_SUMMARIES = f"SELECT COALESCE(SUM(calls),0) AS calls, {_SUMS} FROM usage_summaries"
_TOTALS = "calls, input_tokens, output_tokens, cache_write_tokens, cache_read_tokens, cost_usd"


@dataclass(frozen=True)
class Usage:
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0
    cost_usd: float = 0.0

    @classmethod
    def from_row(cls, row) -> "Usage":
        return cls(**columns(cls, row))

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(*(getattr(self, k) + getattr(other, k) for k in self.__dataclass_fields__))

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_write_tokens + self.cache_read_tokens

    @property
    def budget_tokens(self) -> int:
        """What the token budget counts: cache reads are left out (roles/loop_agent/backends/base.py)."""
        return self.input_tokens + self.cache_write_tokens + self.output_tokens

    def as_dict(self) -> dict:
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__}, "tokens": self.tokens,
                "budget_tokens": self.budget_tokens}


@dataclass(frozen=True)
class ModelCall:
    at: float
    iteration: int | None
    input_tokens: int
    output_tokens: int
    cache_write_tokens: int
    cache_read_tokens: int
    cost_usd: float

    @classmethod
    def from_row(cls, row) -> "ModelCall":
        return cls(**columns(cls, row))

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_write_tokens + self.cache_read_tokens


def org_spend(conn: sqlite3.Connection) -> float:
    """Everything the org has spent, in USD: per-call usage plus what retention folded into
    summaries (the org-wide spend cap must not forget old spend)."""
    return conn.execute("SELECT cost_usd FROM usage_total WHERE id = 1").fetchone()[0]


def of_work(conn: sqlite3.Connection, work_id: str | None = None) -> Usage:
    """Tokens and cost of ``work_id`` (None: the whole org), calls and summaries together."""
    if work_id is None:
        return Usage.from_row(conn.execute(f"SELECT {_TOTALS} FROM usage_total WHERE id = 1").fetchone())
    return (Usage.from_row(conn.execute(_CALLS + " WHERE work_id = ?", (work_id,)).fetchone())
            + Usage.from_row(conn.execute(_SUMMARIES + " WHERE work_id = ?", (work_id,)).fetchone()))


def of_attempt(conn: sqlite3.Connection, work_id: str, iteration: int, attempt: int) -> Usage:
    """What the calls of one attempt at ``iteration`` used (never summarised: the run is live)."""
    return Usage.from_row(conn.execute(_CALLS + " WHERE work_id = ? AND iteration = ? AND attempt = ?",
                                       (work_id, iteration, attempt)).fetchone())


def of_doer(conn: sqlite3.Connection, work_id: str) -> Usage:
    """What the doer's calls of ``work_id`` used: the eval-agent's review calls are left out (they
    have a budget of their own, roles/eval_agent/review.py). Never summarised: a live run's."""
    return Usage.from_row(conn.execute(_CALLS + f" WHERE work_id = ? AND {DOER_CALLS}", (work_id,)).fetchone())


def largest_doer_call(conn: sqlite3.Connection, work_id: str) -> tuple[int, float]:
    """The largest call of the doer's for ``work_id`` so far: ``(input and cache-write tokens,
    cost in USD)``, each the largest of any call (0 before the first). What a run's budgets take
    its next call to need (roles/loop_agent/conditions.py)."""
    row = conn.execute("SELECT COALESCE(MAX(input_tokens + cache_write_tokens), 0), "
                       f"COALESCE(MAX(cost_usd), 0) FROM model_calls WHERE work_id = ? AND {DOER_CALLS}",
                       (work_id,)).fetchone()
    return int(row[0]), float(row[1])


def call_recorded(conn: sqlite3.Connection, request_id: str) -> bool:
    """True once the model call ``request_id`` is counted (each call counts once)."""
    return conn.execute("SELECT 1 FROM model_calls WHERE request_id = ?", (request_id,)).fetchone() is not None


def summarised(conn: sqlite3.Connection, work_id: str) -> bool:
    """True once retention folded some of ``work_id``'s calls into a summary."""
    return conn.execute("SELECT 1 FROM usage_summaries WHERE work_id = ?", (work_id,)).fetchone() is not None


def calls(conn: sqlite3.Connection, work_id: str | None = None) -> list[ModelCall]:
    """The model calls still stored (of ``work_id``, or all), in time order."""
    where, params = ("", ()) if work_id is None else (" WHERE work_id = ?", (work_id,))
    return [ModelCall.from_row(r) for r in conn.execute(
        "SELECT at, iteration, input_tokens, output_tokens, cache_write_tokens, cache_read_tokens, cost_usd "
        f"FROM model_calls{where} ORDER BY at", params)]
