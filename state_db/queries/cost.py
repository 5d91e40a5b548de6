"""Cost per task: tokens (all four kinds) and dollars rolled up by work item, goal family, model or
day, over any period — for ``org cost``, the dashboard's cost page and MCP's ``org://cost``.

Every model call the org paid for counts, whoever made it (the doer, the eval-agent's reviews,
the coordinator, the curator), and so does what retention folded into ``usage_summaries`` (its
calls have no model or time of their own any more: they count under ``(summarised)`` and the day
their run ended), so the totals equal ``org status``'s spend whatever was pruned.

A *goal family* is what a run was started for, across runs: a schedule (``schedule:NAME``), a
trigger (``trigger:NAME``), a discovery scan (``discovery``), a skill's replays (``replay:SKILL``:
the learning budget's spend), or a human's goal (``goal:`` and its text; the same goal submitted
again is the same family). An ``org continue`` chain is one
work item, so it rolls up with it (``endings`` counts its links); a model ladder's rungs are the
``models`` inside each row.
"""
from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field

BYS = ("item", "goal", "model", "day")
NO_ITEM = "(org: chat, curation)"
SUMMARISED = "(summarised)"
_KINDS = ("input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens")


@dataclass
class Row:
    """One group of the rollup; ``tokens`` is all four kinds, ``budget_tokens`` leaves cache reads out."""

    key: str
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0
    cost_usd: float = 0.0
    items: set = field(default_factory=set)
    models: dict = field(default_factory=dict)
    endings: int = 0

    def add(self, r: dict) -> None:
        self.calls += r["calls"]
        for k in _KINDS:
            setattr(self, k, getattr(self, k) + r[k])
        self.cost_usd += r["cost_usd"]
        if r["work_id"]:
            self.items.add(r["work_id"])
        self.models[r["model"]] = self.models.get(r["model"], 0.0) + r["cost_usd"]

    def encode(self) -> dict:
        return {"key": self.key, "calls": self.calls, **{k: getattr(self, k) for k in _KINDS},
                "tokens": sum(getattr(self, k) for k in _KINDS),
                "budget_tokens": self.input_tokens + self.output_tokens + self.cache_write_tokens,
                "cost_usd": round(self.cost_usd, 6), "items": len(self.items),
                "models": {m: round(c, 6) for m, c in sorted(self.models.items(), key=lambda kv: -kv[1])},
                "endings": self.endings}


def family(origin: str | None, origin_name: str | None, goal: str | None, work_id: str | None) -> str:
    """The goal family of a run (see the module docstring)."""
    if work_id is None or goal is None:
        return NO_ITEM
    if origin in ("schedule", "trigger", "replay"):
        return f"{origin}:{origin_name or '?'}"
    if origin == "discovery":
        return "discovery"
    return "goal:" + " ".join(goal.split())[:100]


def _day(at: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(at))


def _calls(conn: sqlite3.Connection, since: float | None, until: float | None) -> list[dict]:
    where, params = [], []
    if since is not None:
        where.append("mc.at >= ?")
        params.append(since)
    if until is not None:
        where.append("mc.at < ?")
        params.append(until)
    sql = f"""SELECT mc.work_id, mc.model, mc.at, 1 AS calls, {', '.join('mc.' + k for k in _KINDS)}, mc.cost_usd,
                     w.goal, w.origin, COALESCE(s.name, r.skill_name) AS origin_name
                FROM model_calls mc LEFT JOIN work_items w ON w.id = mc.work_id
                LEFT JOIN schedules s ON s.id = w.origin_id LEFT JOIN replays r ON r.work_id = w.id
               {('WHERE ' + ' AND '.join(where)) if where else ''}"""
    return [dict(r) for r in conn.execute(sql, params)]


def _summaries(conn: sqlite3.Connection, since: float | None, until: float | None) -> list[dict]:
    rows = conn.execute(f"""SELECT u.work_id, '{SUMMARISED}' AS model, COALESCE(w.ended_at, u.pruned_at) AS at,
                                   u.calls, {', '.join('u.' + k for k in _KINDS)}, u.cost_usd,
                                   w.goal, w.origin, COALESCE(s.name, r.skill_name) AS origin_name
                              FROM usage_summaries u LEFT JOIN work_items w ON w.id = u.work_id
                              LEFT JOIN schedules s ON s.id = w.origin_id
                              LEFT JOIN replays r ON r.work_id = w.id""")
    return [dict(r) for r in rows if (since is None or r["at"] >= since) and (until is None or r["at"] < until)]


def rollup(conn: sqlite3.Connection, by: str = "item", *, since: float | None = None,
           until: float | None = None) -> dict:
    """Tokens and dollars grouped ``by`` one of ``BYS``, for calls made in ``[since, until)``.

    Returns ``{"by", "since", "until", "rows": [Row.encode()...], "total": Row.encode()}``; rows
    are ordered by cost (most first), days by date. Errors: ``ValueError`` for an unknown ``by``.
    """
    if by not in BYS:
        raise ValueError(f"by must be one of {BYS}")
    groups: dict[str, Row] = {}
    total = Row("total")
    for r in _calls(conn, since, until) + _summaries(conn, since, until):
        if by == "item":
            key = r["work_id"] or NO_ITEM
        elif by == "goal":
            key = family(r["origin"], r["origin_name"], r["goal"], r["work_id"])
        elif by == "model":
            key = r["model"]
        else:
            key = _day(r["at"])
        groups.setdefault(key, Row(key)).add(r)
        total.add(r)
    endings = {w: n + 1 for w, n in conn.execute("SELECT work_id, COUNT(*) FROM stop_history GROUP BY work_id")}
    for row in groups.values():
        row.endings = sum(endings.get(w, 1) for w in row.items)
    total.endings = sum(endings.get(w, 1) for w in total.items)
    ordered = sorted(groups.values(), key=(lambda g: g.key) if by == "day" else (lambda g: (-g.cost_usd, g.key)))
    return {"by": by, "since": since, "until": until, "rows": [g.encode() for g in ordered], "total": total.encode()}
