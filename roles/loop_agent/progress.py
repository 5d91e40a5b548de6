"""A run's progress, read from state.db: what the stop conditions and the next gather see.

Everything here is derived from committed rows (iterations, eval-agent verdicts, model calls),
so a resumed run sees exactly what an uninterrupted one would. Rows come from the typed queries
(state_db.queries): verdicts as ``Verdict``; iterations as plain dicts of their decoded columns,
the loop's working rows (a reflection not written yet is merged into them).
"""
from __future__ import annotations

import sqlite3

from roles.loop_agent.context import IterationDigest
from roles.loop_agent.lessons import LessonBook
from roles.loop_agent.stop import RunProgress, VerdictSummary
from state_db.queries.iterations import of_work as iterations_of
from state_db.queries.usage import largest_doer_call, of_doer
from state_db.queries.verdicts import Verdict, latest_eval_verdicts
from state_db.queries.work import WorkItem, continued_after


def summary_of(verdict: Verdict | None) -> VerdictSummary | None:
    if verdict is None:
        return None
    failing = tuple((c["name"], c.get("signature") or "") for c in verdict.failing)
    return VerdictSummary(passed=verdict.passed, by_eval_agent=True, failing=failing)


def outcome_line(verdict: Verdict | None) -> str:
    if verdict is None:
        return "not verified"
    if verdict.passed:
        return "pass"
    return "fail: " + ", ".join(c["name"] for c in verdict.failing[:3])


class Reflected:
    """What ``load`` read of the iterations already reflected (their verdict recorded): those
    rows never change again (only this loop-agent writes them, once), so a long run reads each
    once. Kept by the engine; a new engine (a resumed run) starts empty and reads them all."""

    def __init__(self) -> None:
        self.rows: list[dict] = []              # iterations 1..k, each with its verdict_id set
        self.verdicts: dict[int, Verdict] = {}
        self.summaries: list[VerdictSummary] = []
        self.digests: dict[int, IterationDigest] = {}
        self.book: tuple[int, LessonBook] | None = None   # the lessons of rows[:int]

    def keep(self, its: list[dict], verdicts: dict[int, Verdict]) -> None:
        for r in its[len(self.rows):]:
            verdict = verdicts.get(r["n"])
            if r["n"] != len(self.rows) + 1 or r["verdict_id"] is None or verdict is None:
                return
            self.rows.append(r)
            self.verdicts[r["n"]] = verdict
            self.summaries.append(summary_of(verdict))


def load(conn: sqlite3.Connection, work: WorkItem, *, running_s: float = 0.0,
         org_limit: bool | str = False, model_error: bool | str = False, human_rejected: bool | str = False,
         needs_human: bool | str = False, reflected: Reflected | None = None,
         unwritten: tuple[int, dict] | None = None) -> tuple[RunProgress, list[dict], dict[int, Verdict]]:
    """Return (progress, iteration rows, verdicts by iteration) for ``work``.

    ``running_s`` is time spent in the current, uncommitted attempt (counts toward timeout); the
    flags (``org_limit`` … ``needs_human``) are the stop policy's, True or the sentence that says why;
    ``reflected`` (one per run) spares reading the reflected iterations again; ``unwritten``
    is ``(n, columns)`` of a reflection the engine will write with its next transaction, read
    as if written.
    """
    work_id = work.id
    reflected = reflected if reflected is not None else Reflected()
    k = len(reflected.rows)
    its = reflected.rows + [i.as_row() for i in iterations_of(conn, work_id, after=k, prompts=False)]
    if unwritten is not None:
        for r in its[k:]:
            if r["n"] == unwritten[0] and r["verdict_id"] is None:
                r.update(unwritten[1])
    # the latest eval-agent verdict of each iteration (state_db.queries.verdicts says which counts)
    verdicts = {**reflected.verdicts, **latest_eval_verdicts(conn, work_id, after=k)}
    # the token budget leaves cache reads out (they count in cost): see Usage.budget_tokens; the
    # eval-agent's review calls have a budget of their own (roles/eval_agent/review.py)
    usage = of_doer(conn, work_id)
    largest_input, largest_cost = largest_doer_call(conn, work_id)
    # a continued run ('org continue') is judged for no_progress / repeated_failure on the
    # iterations after its latest continuation only: the ones before already ended it once
    since = max(continued_after(conn, work_id), work.ladder.since)     # a continuation, a ladder's climb
    progress = RunProgress(
        iterations=len(its), tokens=usage.budget_tokens, cost_usd=float(usage.cost_usd),
        elapsed_s=float(work.elapsed_s) + running_s,
        fingerprints=tuple(r["fingerprint"] or "" for r in its[since:]),
        verdicts=(*reflected.summaries, *(summary_of(verdicts.get(r["n"])) for r in its[k:]))[since:],
        cancelled=work.cancel_requested, org_limit=org_limit, model_error=model_error,
        human_rejected=human_rejected, needs_human=needs_human,
        largest_input=largest_input, largest_cost=largest_cost,
    )
    reflected.keep(its, verdicts)
    return progress, its, verdicts


def digests(its: list[dict], verdicts: dict[int, Verdict], reflected: Reflected | None = None) -> list[IterationDigest]:
    out = []
    for r in its:
        known = reflected.digests.get(r["n"]) if reflected is not None else None
        if known is None:
            calls = r["tool_calls"]
            known = IterationDigest(
                iteration=r["n"], summary=r["act_summary"], outcome=outcome_line(verdicts.get(r["n"])),
                tool_calls=tuple(_call_line(c) for c in calls[:8]),
                changed_paths=tuple(r["changed_paths"]))
            if reflected is not None and r["n"] <= len(reflected.rows):
                reflected.digests[r["n"]] = known
        out.append(known)
    return out


def lessons(its: list[dict], max_lessons: int, reflected: Reflected | None = None) -> LessonBook:
    """The current lessons, as if added from the iterations that recorded one (oldest first)."""
    if reflected is None or len(its) != len(reflected.rows):
        return LessonBook.latest([(r["lesson"], r["n"]) for r in its if r["lesson"]], max(1, max_lessons))
    upto, book = reflected.book if reflected.book is not None else (0, None)
    if book is None or book.max_lessons != max(1, max_lessons) or upto > len(its):
        upto, book = len(its), lessons(its, max_lessons)
    for r in its[upto:]:                        # the same book, one add per new iteration
        if r["lesson"]:
            book = book.add(r["lesson"], r["n"])
    reflected.book = (len(its), book)
    return book


def _call_line(call: dict) -> str:
    name = call.get("name", "?")
    arg = call.get("input") or {}
    target = arg.get("path") or arg.get("command") or arg.get("pattern") or "" if isinstance(arg, dict) else ""
    return f"{name} {str(target)[:60]}".strip()
