"""org.toml parsed once per process: ``tomllib`` is pure Python, and the documented file is long.

A role reads org.toml twice as it starts: its configuration (``config.load``) and, before that
is validated, where its store is (``OrgHome.store_url``). Each parse is 1-2 ms of the role's
start, in every role and in the supervisor. The text is compared, not its file's time or size,
so a file changed in any way is parsed again; each caller gets its own copy of the tables
(``config.load`` adds the environment's overrides to its copy).
"""
from __future__ import annotations

import tomllib
from typing import Any

_last: tuple[str, dict] | None = None


def loads(text: str) -> dict:
    """``tomllib.loads(text)``: a fresh copy of the tables, parsed once for the same text.
    Raises ``tomllib.TOMLDecodeError`` as it does."""
    global _last
    if _last is None or _last[0] != text:
        _last = (text, tomllib.loads(text))
    return _copy(_last[1])


def _copy(value: Any) -> Any:
    """TOML's values are tables, arrays and immutable scalars: only the first two are copied."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
