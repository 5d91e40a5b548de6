"""What every query module shares: turning a stored row into typed data.

JSON columns arrive as text; ``loads`` decodes them once, where the row becomes a dataclass, so no
caller ever parses a column. ``columns`` lets a dataclass be built from a row that may lack
columns added by later migrations (their defaults apply).
"""
from __future__ import annotations

import functools
import sqlite3
from dataclasses import fields, is_dataclass
from typing import Any

import orjson


def loads(value: Any, default: Any = None) -> Any:
    """JSON text from a column as data; empty or NULL gives ``default``; decoded values pass."""
    if isinstance(value, (str, bytes)):
        return orjson.loads(value) if value else default
    return default if value is None else value


@functools.cache
def _names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def columns(cls, row: sqlite3.Row | dict) -> dict[str, Any]:
    """The row's values for the dataclass ``cls``'s fields (missing columns left to defaults)."""
    keys = set(row.keys())
    return {name: row[name] for name in _names(cls) if name in keys}


# an empty IN list as both stores take it: SQLite reads ``IN ()`` as nothing, PostgreSQL refuses it
NOTHING = "SELECT NULL WHERE FALSE"


def marks(values: Any) -> str:
    """The parameter markers of ``IN (…)`` for ``values``: ``?,?,?``, or a subquery with no row
    when there are none (nothing is in it, and ``NOT IN`` holds for every row, on both stores)."""
    return ",".join("?" * len(values)) or NOTHING


def scalar(conn: sqlite3.Connection, sql: str, params: Any = (), default: Any = None) -> Any:
    """The first column of the first row, or ``default`` (no row, or NULL)."""
    row = conn.execute(sql, params).fetchone()
    return default if row is None or row[0] is None else row[0]


def exists(conn: sqlite3.Connection, sql: str, params: Any = ()) -> bool:
    """True if ``sql`` returns a row."""
    return conn.execute(sql, params).fetchone() is not None


def plain(value: Any) -> Any:
    """Typed query results as plain data for JSON (``--json``, the dashboard, MCP): dataclasses
    become dicts, tuples lists; a value with its own stored form (``Caps.encode``) takes it."""
    if is_dataclass(value) and not isinstance(value, type):
        encode = getattr(value, "encode", None)
        if callable(encode):
            return encode()
        return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value
