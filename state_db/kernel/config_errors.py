"""What is wrong in org.toml, in words: a pydantic error as a ``ConfigKeyError`` that names the
key, says what is expected, finds the line that wrote it and, for an unknown key, the key
probably meant.

pydantic says where an error is (``("org", "loop_agents")``) and what broke
(``greater_than_equal``); this module turns that into ``org.loop_agents must be an integer from
1 to 64 (got 0) (org.toml:2)``. TOML parsers keep no positions, so ``line_of`` scans the text for
the table header or key line (exact for files written as tables and keys, one per line). The
models themselves live in ``state_db.kernel.config``; everything here works from the root model it is
given, so a section or a list of tables added there needs nothing here.
"""
from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from typing_extensions import is_typeddict

from state_db.kernel.errors import ConfigError


class ConfigKeyError(ConfigError):
    """A key of org.toml breaks the schema: which key (``key``, ``parts``), where it was written
    (``path``, ``lineno``), what was probably meant (``suggestion``)."""

    def __init__(self, message: str, *, key: str, parts: tuple = (), hint: str | None = None,
                 lineno: int | None = None, path: Path | None = None, suggestion: str | None = None):
        self.parts = parts or tuple(key.split("."))
        self.lineno, self.path, self.suggestion = lineno, path, suggestion
        self.what = message
        where = f" ({path}:{lineno})" if path is not None and lineno is not None else ""
        super().__init__(message + where, key=key, hint=hint)

    def at(self, path: Path | None, text: str | None) -> ConfigKeyError:
        """The same error with the line of ``text`` (the file at ``path``) that wrote the key."""
        lineno = line_of(text, self.parts) if text is not None else None
        return ConfigKeyError(self.what, key=self.key, parts=self.parts, hint=self.hint, lineno=lineno,
                              path=path, suggestion=self.suggestion)


class Expect(str):
    """What a value must be, in words, for a type whose constraints do not say it themselves."""


def expect(field: FieldInfo) -> str:
    """What a value of ``field`` must be, in words ("an integer from 1 to 64")."""
    words = [m for m in field.metadata if isinstance(m, Expect)]
    if words:
        return str(words[-1])
    kind = field.annotation
    if kind is bool:
        return "true or false"
    if get_origin(kind) is Literal:
        return _choices(get_args(kind))
    if get_origin(kind) is dict:
        return "a table of tables ([name.ID])"
    if get_origin(kind) is list:
        (item,) = get_args(kind)
        if fields_of(item) is not None:
            return "a list of tables ([[...]])"
        return "a list of " + (_choices(get_args(item)) if get_origin(item) is Literal else "strings")
    bounds = {type(m).__name__.lower(): getattr(m, _BOUNDS[type(m).__name__]) for m in field.metadata
              if type(m).__name__ in _BOUNDS}
    if kind is str:
        return "a non-empty string" if bounds.get("minlen") else "a string"
    noun = "an integer" if kind is int else "a number"
    if "ge" in bounds and "le" in bounds:
        return f"{noun} from {bounds['ge']} to {bounds['le']}"
    for op, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
        if op in bounds:
            return f"{noun} {sign} {bounds[op]}"
    return noun


# annotated_types' constraint classes, and the attribute each keeps its bound in
_BOUNDS = {"Ge": "ge", "Gt": "gt", "Le": "le", "Lt": "lt", "MinLen": "min_length"}


def _choices(values: tuple) -> str:
    names = [str(v) for v in values]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def fields_of(kind: Any) -> dict[str, FieldInfo] | None:
    """The keys of a table type (a model or a TypedDict); None for anything else."""
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return dict(kind.model_fields)
    if is_typeddict(kind):
        return {k: FieldInfo.from_annotation(t) for k, t in get_type_hints(kind, include_extras=True).items()}
    return None


def explain(error: dict, root: type[BaseModel]) -> ConfigKeyError:
    """One pydantic error of validating ``root`` as a coded error naming the key."""
    loc = tuple(str(p) for p in error["loc"])
    kind, got = error["type"], error.get("input")
    if kind == "extra_forbidden":
        return _unknown(loc, root)
    parts, field, _ = resolve(loc, root)
    dotted = ".".join(parts)
    if field is None:                        # a table is something else
        return ConfigKeyError(f"[{dotted}] must be a table (got {got!r})", key=dotted, parts=parts)
    if kind == "missing":
        return ConfigKeyError(f"{dotted} is missing: it must be {expect(field)}", key=dotted, parts=parts)
    return ConfigKeyError(f"{dotted} must be {expect(field)} (got {got!r})", key=dotted, parts=parts)


def resolve(loc: tuple[str, ...], root: type[BaseModel]) -> tuple[tuple[str, ...], FieldInfo | None, Any]:
    """The key a pydantic location names, its field (None: a table) and the table type that holds
    the last part. Tables nest as sections, ``[[name]]`` lists (``name.0.key``) and ``[name.ID]``
    maps (``prices.ID.input``); an index into a list of values is dropped (``gate.ask_for.1`` is
    ``gate.ask_for``)."""
    owner: Any = root
    parts: list[str] = []
    rest = list(loc)
    while rest and rest[0] in (fields := fields_of(owner) or {}):
        part = rest.pop(0)
        parts.append(part)
        field = fields[part]
        kind = field.annotation
        if get_origin(kind) in (list, dict) and fields_of(get_args(kind)[-1]) is not None:
            if not rest:
                return tuple(parts), field, owner
            parts.append(rest.pop(0))                     # the index or id of one table
            owner = get_args(kind)[-1]
        elif fields_of(kind) is not None:
            owner = kind
        else:
            return tuple(parts), field, owner
    return tuple(parts), None, owner


def _unknown(loc: tuple[str, ...], root: type[BaseModel]) -> ConfigKeyError:
    *where, name = loc
    if not where:
        known = sorted(root.model_fields)
        close = difflib.get_close_matches(name, known, n=1)
        return ConfigKeyError(f"unknown section [{name}]", key=name, parts=loc, suggestion=close[0] if close else None,
                              hint=(f"did you mean [{close[0]}]? " if close else "") + f"known sections: {', '.join(known)}")
    dotted, table = ".".join(loc), ".".join(where)
    parts, field, owner = resolve(tuple(where), root)
    known = list(fields_of(owner) or {}) if field is None and parts == tuple(where) else []
    close = difflib.get_close_matches(name, known, n=1)
    guess = f"{table}.{close[0]}" if close else _elsewhere(name, root)
    hint = (f"did you mean {guess}? " if guess else "") + (
        f"known keys in [{table}]: {', '.join(known)}" if known else f"[{table}] has no sub-tables")
    return ConfigKeyError(f"unknown key {dotted}", key=dotted, parts=loc, suggestion=guess, hint=hint)


def _elsewhere(name: str, root: type[BaseModel]) -> str | None:
    """The same key in another section (``[caps] total_spend_usd`` → ``limits.total_spend_usd``)."""
    for section, field in root.model_fields.items():
        if name in (fields_of(field.annotation) or {}):
            return f"{section}.{name}"
    return None


# ---------------------------------------------------------------------------------- line numbers

_PART = r'(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|\'[^\']*\')'
_DOTTED = rf"{_PART}(?:\s*\.\s*{_PART})*"
_HEADER = re.compile(rf"^\s*(\[\[?)\s*({_DOTTED})\s*\]\]?\s*(?:#.*)?$")
_KEY_LINE = re.compile(rf"^\s*({_DOTTED})\s*=")


def _split(dotted: str) -> tuple[str, ...]:
    return tuple(p[1:-1] if p[:1] in "\"'" else p for p in re.findall(_PART, dotted))


def line_of(text: str, parts: tuple[str, ...]) -> int | None:
    """The line of ``text`` that writes the key ``parts`` (for ``("org", "loop_agents")``:
    ``loop_agents = ...`` under ``[org]``, or ``org.loop_agents = ...``), else the line of the
    nearest table that holds it (a missing price names its ``[prices."m"]``); None if absent.
    The nth ``[[name]]`` is the key ``(name, n)``."""
    table: tuple[str, ...] = ()
    arrays: dict[tuple[str, ...], int] = {}
    best, best_len = None, 0
    for n, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header:
            table = _split(header.group(2))
            paths = [table]
            if header.group(1) == "[[":                 # the array itself, and its nth table
                arrays[table] = arrays.get(table, -1) + 1
                table = (*table, str(arrays[table]))
                paths.append(table)
        else:
            m = _KEY_LINE.match(line)
            if not m:
                continue
            paths = [(*table, *_split(m.group(1)))]
        for path in paths:
            if path == parts[:len(path)] and len(path) > best_len:
                best, best_len = n, len(path)
                if len(path) == len(parts):
                    return n
    return best
