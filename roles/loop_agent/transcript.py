"""An act's transcript as it happens: the prompt, each model turn's words, each tool call with its
input and its result, and how the act ended — kept for ``org show --transcript``, ``org export
--transcript``, ``org watch``, the dashboard and MCP (read by ``state_db/queries/transcript.py``).

Backends call ``ActContext.record(kind, data)`` as the conversation goes (``kind`` from
``vocab.TranscriptKind``); ``Transcript`` keeps the entries in memory and the engine writes them
with the transactions it makes anyway: the usage of each model response, the iteration's commit,
the attempt's close. So recording costs no transaction of its own, and a crash loses at most the
entries since the last model response (the attempt is then discarded, and says so).

Every entry is bounded as it is recorded: strings are cleaned of terminal control sequences
(``state_db.text.clean``) and cut to ``entry_chars`` (head and tail kept: a command's failure is
usually at its end); the writer redacts secrets. A run's transcript is bounded too: once
``run_bytes`` are used, one ``cut`` entry says so and later entries are dropped — the act goes on.
"""
from __future__ import annotations

from typing import Any, Callable

import orjson

from state_db.text import clean
from state_db.vocab import TranscriptKind

ENTRY_CHARS = 8000           # one string of an entry (a tool's output, the model's words)
RUN_BYTES = 4_000_000        # one run's transcript, every attempt together
_NESTED_ITEMS = 50           # items kept of a list or mapping inside an entry (tool input)
_NESTED_DEPTH = 12           # levels kept as data; deeper ones as (bounded) JSON text


def bounded(text: str, cap: int = ENTRY_CHARS) -> str:
    """``text`` cleaned and cut to about ``cap`` characters, its head and tail kept."""
    text = clean(text)
    if len(text) <= cap:
        return text
    head = cap * 2 // 5
    tail = cap - head
    return f"{text[:head]}\n…[{len(text) - cap} characters cut]…\n{text[-tail:]}"


def _bound(value: Any, cap: int, depth: int = 0) -> Any:
    if isinstance(value, str):
        return bounded(value, cap)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if depth >= _NESTED_DEPTH:                 # deeper input (a model's or a CLI's) is kept as text
        try:
            return bounded(orjson.dumps(value, default=str).decode(), cap)
        except (TypeError, ValueError):        # nested past orjson's own limit
            return f"({type(value).__name__} nested deeper than {_NESTED_DEPTH + 255} levels)"
    if isinstance(value, dict):
        return {clean(str(k))[:200]: _bound(v, cap, depth + 1) for k, v in list(value.items())[:_NESTED_ITEMS]}
    if isinstance(value, (list, tuple)):
        return [_bound(v, cap, depth + 1) for v in list(value)[:_NESTED_ITEMS]]
    return bounded(repr(value), cap)


class Transcript:
    """The entries of one attempt not yet written, and the run's bound.

    Params: ``work_id``, ``iteration``, ``attempt`` key the entries; ``used_bytes`` is what the
    run's earlier attempts already hold; ``clock`` stamps each entry.
    """

    def __init__(self, work_id: str, iteration: int, attempt: int, *, used_bytes: int = 0,
                 run_bytes: int = RUN_BYTES, entry_chars: int = ENTRY_CHARS,
                 clock: Callable[[], float]) -> None:
        self.work_id, self.iteration, self.attempt = work_id, iteration, attempt
        self.used = used_bytes
        self.run_bytes, self.entry_chars = run_bytes, entry_chars
        self.clock = clock
        self.seq = 0
        self.cut = used_bytes >= run_bytes
        self._pending: list[dict] = []

    def record(self, kind: str, data: dict | None = None) -> None:
        """Keep one entry (``kind`` a ``TranscriptKind``). Never raises for its content."""
        if self.cut:
            return
        try:
            entry = _bound(data or {}, self.entry_chars)
            size = len(orjson.dumps(entry, default=str)) + 64
        except (TypeError, ValueError, RecursionError) as exc:    # nothing a model or CLI sends stops the act
            entry = {"unrecordable": type(exc).__name__}
            size = 128
        if self.used + size > self.run_bytes:
            self.cut = True
            kind, entry = TranscriptKind.CUT, {"run_bytes": self.run_bytes,
                                               "note": "the run's transcript bound was reached; later entries are not kept"}
        self.used += size
        self.seq += 1
        self._pending.append({"work_id": self.work_id, "attempt": self.attempt, "seq": self.seq,
                              "iteration": self.iteration, "kind": str(TranscriptKind(kind)), "at": self.clock(),
                              "data": entry})

    def flush(self, tx) -> int:
        """Write the pending entries in the open transaction ``tx``; returns how many."""
        rows, self._pending = self._pending, []
        for row in rows:
            tx.insert("transcript", row, journal=False)
        return len(rows)
