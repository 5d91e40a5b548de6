"""A run's progress, read from state.db: what the stop conditions and the next gather see.

Everything here is derived from committed rows (iterations, eval-agent verdicts, model calls),
so a resumed run sees exactly what an uninterrupted one would.
"""
from __future__ import annotations

import sqlite3

import orjson

from roles.loop_agent.context import IterationDigest
from roles.loop_agent.lessons import LessonBook
from roles.loop_agent.stop import RunProgress, VerdictSummary
from state_db.vocab import Actor, VerdictOutcome

_VERDICTS = f"""SELECT * FROM verdicts WHERE work_id = ? AND written_by LIKE '{Actor.EVAL_AGENT}%'
                ORDER BY iteration, at"""


def verdicts_by_iteration(conn: sqlite3.Connection, work_id: str) -> dict[int, dict]:
    """The latest eval-agent verdict of each iteration (verdicts by anyone else do not count)."""
    out: dict[int, dict] = {}
    for row in conn.execute(_VERDICTS, (work_id,)):
        out[row["iteration"]] = dict(row)
    return out


def summary_of(verdict: dict | None) -> VerdictSummary | None:
    if verdict is None:
        return None
    checks = orjson.loads(verdict["checks"])
    failing = tuple((c["name"], c.get("signature") or "") for c in checks if not c.get("passed"))
    return VerdictSummary(passed=verdict["outcome"] == VerdictOutcome.PASS, by_eval_agent=True, failing=failing)


def outcome_line(verdict: dict | None) -> str:
    if verdict is None:
        return "not verified"
    if verdict["outcome"] == VerdictOutcome.PASS:
        return "pass"
    checks = orjson.loads(verdict["checks"])
    names = [c["name"] for c in checks if not c.get("passed")]
    return "fail: " + ", ".join(names[:3])


def load(conn: sqlite3.Connection, work: sqlite3.Row | dict, *, running_s: float = 0.0,
         org_limit: bool = False, model_error: bool = False, human_rejected: bool = False) -> tuple[RunProgress, list[dict], dict[int, dict]]:
    """Return (progress, iteration rows, verdicts by iteration) for ``work``.

    ``running_s`` is time spent in the current, uncommitted attempt (counts toward timeout).
    """
    work_id = work["id"]
    its = [dict(r) for r in conn.execute("SELECT * FROM iterations WHERE work_id = ? ORDER BY n", (work_id,))]
    verdicts = verdicts_by_iteration(conn, work_id)
    usage = conn.execute("""SELECT COALESCE(SUM(input_tokens + output_tokens + cache_write_tokens + cache_read_tokens), 0),
                                   COALESCE(SUM(cost_usd), 0) FROM model_calls WHERE work_id = ?""", (work_id,)).fetchone()
    progress = RunProgress(
        iterations=len(its), tokens=int(usage[0]), cost_usd=float(usage[1]),
        elapsed_s=float(work["elapsed_s"]) + running_s,
        fingerprints=tuple(r["fingerprint"] or "" for r in its),
        verdicts=tuple(summary_of(verdicts.get(r["n"])) for r in its),
        cancelled=bool(work["cancel_requested"]), org_limit=org_limit, model_error=model_error,
        human_rejected=human_rejected,
    )
    return progress, its, verdicts


def digests(its: list[dict], verdicts: dict[int, dict]) -> list[IterationDigest]:
    out = []
    for r in its:
        calls = orjson.loads(r["tool_calls"])
        out.append(IterationDigest(
            iteration=r["n"], summary=r["act_summary"], outcome=outcome_line(verdicts.get(r["n"])),
            tool_calls=tuple(_call_line(c) for c in calls[:8]),
            changed_paths=tuple(orjson.loads(r["changed_paths"]))))
    return out


def lessons(its: list[dict], max_lessons: int) -> LessonBook:
    """The current lessons, rebuilt from the iterations that recorded one (oldest first)."""
    book = LessonBook(max_lessons=max(1, max_lessons))
    for r in its:
        if r["lesson"]:
            book = book.add(r["lesson"], r["n"])
    return book


def _call_line(call: dict) -> str:
    name = call.get("name", "?")
    arg = call.get("input") or {}
    target = arg.get("path") or arg.get("command") or arg.get("pattern") or "" if isinstance(arg, dict) else ""
    return f"{name} {str(target)[:60]}".strip()
