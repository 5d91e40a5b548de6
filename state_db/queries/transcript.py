"""A run's transcript, act by act: what each attempt was asked, what the model said, each tool
call with its input and result, how the act ended — and beside them, from their own rows, the
usage of each model call, the verdict, the lesson and the decisions of the iteration.

One shape serves ``org show --transcript`` (and its ``--json``), ``org export --transcript``
(one JSON object a line), ``org watch``'s transcript pane, the dashboard's timeline and the MCP
resource ``org://runs/ID/transcript``. An attempt that did not commit (cut by a crash, an
interrupt, a model error, a stop) keeps its entries and is marked ``discarded``.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from state_db.queries.base import loads
from state_db.queries.decisions import of_work as decisions_of
from state_db.queries.verdicts import Verdict

_FAILING_CHARS = 4000     # a failing check's output tail, as the eval-agent kept it
CUT_BYTES = 1 << 62       # what ``used_bytes`` says of a run whose transcript was cut


@dataclass(frozen=True)
class Entry:
    """One transcript row: ``kind`` is a ``vocab.TranscriptKind``; ``data`` its fields."""

    attempt: int
    seq: int
    iteration: int
    kind: str
    at: float
    data: dict = field(default_factory=dict)

    def encode(self) -> dict:
        return {"attempt": self.attempt, "seq": self.seq, "iteration": self.iteration, "kind": self.kind,
                "at": self.at, "data": self.data}


def entries(conn: sqlite3.Connection, work_id: str, *, iteration: int | None = None,
            after: tuple[int, int] = (0, 0)) -> list[Entry]:
    """The transcript rows of ``work_id`` in order (of ``iteration`` when given; after the
    ``(attempt, seq)`` given, for a reader that follows a running act)."""
    sql = "SELECT attempt, seq, iteration, kind, at, data FROM transcript WHERE work_id = ? AND (attempt, seq) > (?, ?)"
    params: list = [work_id, *after]
    if iteration is not None:
        sql += " AND iteration = ?"
        params.append(iteration)
    return [Entry(r[0], r[1], r[2], r[3], r[4], loads(r[5], {})) for r in conn.execute(sql + " ORDER BY attempt, seq",
                                                                                         params)]


def used_bytes(conn: sqlite3.Connection, work_id: str) -> int:
    """What a run's transcript holds already (its bound counts every attempt); once a ``cut``
    entry is written, ``CUT_BYTES`` (nothing more is kept for the run)."""
    row = conn.execute("SELECT COALESCE(SUM(LENGTH(data)) + 64 * COUNT(*), 0), MAX(CASE WHEN kind = 'cut' THEN 1 ELSE 0 END) FROM transcript "
                       "WHERE work_id = ?", (work_id,)).fetchone()
    return CUT_BYTES if row[1] else int(row[0])


def version(conn: sqlite3.Connection, work_id: str) -> tuple:
    """What changes whenever ``of_work`` would answer differently (entries, attempts, verdicts,
    usage, decisions): a reader that polls draws again only when it changed."""
    parts = ["SELECT COUNT(*) FROM transcript WHERE work_id = ?", "SELECT MAX(at) FROM transcript WHERE work_id = ?",
             "SELECT COUNT(*) FROM attempts WHERE work_id = ? AND ended_at IS NOT NULL",
             "SELECT COUNT(*) FROM attempts WHERE work_id = ?", "SELECT COUNT(*) FROM verdicts WHERE work_id = ?",
             "SELECT COUNT(*) FROM model_calls WHERE work_id = ?", "SELECT COUNT(*) FROM decisions WHERE work_id = ?",
             "SELECT COUNT(*) FROM decisions WHERE work_id = ? AND status = 'pending'",
             "SELECT MAX(decided_at) FROM decisions WHERE work_id = ?",
             "SELECT COUNT(*) FROM iterations WHERE work_id = ? AND lesson IS NOT NULL"]
    sql = "SELECT " + ", ".join(f"({p})" for p in parts)
    return tuple(conn.execute(sql, (work_id,) * len(parts)).fetchone())


def failing_output(verdict: Verdict | None) -> list[dict]:
    """The failing checks of a verdict with their output's tail: what the run page shows whole."""
    if verdict is None:
        return []
    return [{"name": c.get("name"), "command": c.get("command"), "exit_code": c.get("exit_code"),
             "code": c.get("code"), "timed_out": bool(c.get("timed_out")),
             "output": str(c.get("output_tail") or "")[-_FAILING_CHARS:]} for c in verdict.failing]


def of_work(conn: sqlite3.Connection, work_id: str, *, iteration: int | None = None) -> list[dict]:
    """The run's attempts in order, each a dict: ``iteration``, ``attempt``, ``outcome`` (the
    attempt's), ``discarded``, ``wrapup``, ``started_at``/``ended_at``, ``entries`` (encoded
    ``Entry``), ``usage`` (its model calls: request id, model, the four token counts, cost),
    and for the attempt that committed its iteration: ``verdict`` (outcome, feedback, failing
    checks with output), ``lesson`` and ``decisions``."""
    sql = "SELECT * FROM attempts WHERE work_id = ?"
    params: list = [work_id]
    if iteration is not None:
        sql += " AND iteration = ?"
        params.append(iteration)
    rows = conn.execute(sql + " ORDER BY attempt", params).fetchall()
    by_attempt: dict[int, list[dict]] = {}
    for e in entries(conn, work_id, iteration=iteration):
        by_attempt.setdefault(e.attempt, []).append(e.encode())
    usage: dict[int, list[dict]] = {}
    for r in conn.execute("""SELECT attempt, request_id, model, input_tokens, output_tokens, cache_write_tokens,
                                    cache_read_tokens, cost_usd, at FROM model_calls
                              WHERE work_id = ? AND lower(COALESCE(instance, '')) NOT LIKE 'eval-agent%' ORDER BY at""", (work_id,)):
        usage.setdefault(r[0], []).append({"request_id": r[1], "model": r[2], "input_tokens": r[3],
                                           "output_tokens": r[4], "cache_write_tokens": r[5],
                                           "cache_read_tokens": r[6], "cost_usd": r[7], "at": r[8]})
    committed = {r["n"]: r for r in conn.execute(
        "SELECT n, attempt, lesson, feedback, verdict_id FROM iterations WHERE work_id = ?", (work_id,))}
    verdicts = {v.iteration: v for v in (Verdict.from_row(r) for r in conn.execute(
        "SELECT * FROM verdicts WHERE work_id = ? AND lower(written_by) LIKE 'eval-agent%' ORDER BY at", (work_id,)))}
    out = []
    for a in rows:
        it = committed.get(a["iteration"])
        keeps = it is not None and it["attempt"] == a["attempt"]
        wrapup = bool(a["wrapup"]) if "wrapup" in a.keys() else False
        item = {"iteration": a["iteration"], "attempt": a["attempt"], "outcome": a["outcome"],
                "discarded": a["outcome"] is not None and not keeps and not wrapup, "wrapup": wrapup,
                "started_at": a["started_at"], "ended_at": a["ended_at"],
                "entries": by_attempt.get(a["attempt"], []), "usage": usage.get(a["attempt"], [])}
        if keeps:
            v = verdicts.get(a["iteration"])
            item["verdict"] = None if v is None else {"id": v.id, "outcome": v.outcome, "at": v.at,
                                                      "feedback": v.feedback, "failing": failing_output(v)}
            item["lesson"] = it["lesson"]
            item["decisions"] = [{"id": d.id, "kind": d.kind, "status": d.status, "question": d.question,
                                  "command": d.command, "answer": d.answer}
                                 for d in decisions_of(conn, work_id, iteration=a["iteration"])]
        out.append(item)
    return out
