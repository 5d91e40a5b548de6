"""What a human can do to the org, as functions: the one command API.

Each command (submit, cancel, decide, continue, candidates, skills, and the durable half of
suspend / stop / resume) is a function here returning a typed result: a frozen dataclass whose
``as_data()`` is the JSON the CLI prints with ``--json``. The CLI prints it, and ``org chat``'s
tools, the MCP tools and the dashboard call the same functions and get the same result as data.

Each write is one durable StateWriter write as actor ``human`` under an idempotency key,
followed by a wake to the coordinator: a lost wake delays, never loses.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from state_db.queries.base import plain
from state_db.vocab import Actor
from state_db.writer import StateWriter


class Result:
    """The base of every operation's result (each a frozen dataclass).

    ``as_dict()`` gives its fields by their JSON names; fields named in ``OPTIONAL`` are left out
    while they are None (a key that only some outcomes have), and a field declared with
    ``metadata={"json": False}`` is never in it. ``result["id"]`` reads a field by
    that name, for callers that take the result as data."""

    OPTIONAL: frozenset[str] = frozenset()

    def as_dict(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):
            if f.metadata.get("json") is False:      # for the text, not part of the data
                continue
            value = getattr(self, f.name)
            if f.name in self.OPTIONAL and value is None:
                continue
            out[f.name] = _plain(value)
        return out

    def as_data(self) -> Any:
        """What ``--json`` prints (a dict; a listing's result overrides it with its list)."""
        return self.as_dict()

    def __getitem__(self, key: str) -> Any:
        data = self.as_dict()
        if key not in data:
            raise KeyError(key)
        return data[key]

    def __contains__(self, key: str) -> bool:
        return key in self.as_dict()

    def get(self, key: str, default: Any = None) -> Any:
        return self.as_dict().get(key, default)


def _plain(value: Any) -> Any:
    if isinstance(value, Result):
        return value.as_data()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(value)                # a typed value (``Caps``, a stored record) as its plain data
    return value


def human_writer(db_path, via: str | None = None):
    """A StateWriter as actor ``human``. ``via`` names the client the write came through
    (``mcp:claude-code``): it becomes the journal events' instance and follows the OS user in the
    rows that say who did it (``signed``)."""
    return StateWriter(db_path, Actor.HUMAN, via)


def signed(writer) -> str:
    """Who made a human write: the OS user, plus ``via <client>`` when it came through one."""
    return writer.os_user if writer.instance == writer.actor else f"{writer.os_user} via {writer.instance}"
