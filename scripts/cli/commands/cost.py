"""``org cost``: tokens and dollars per task — by work item, goal family, model or day."""
from __future__ import annotations

import calendar
import re
import time

from scripts.cli.output import add_json, emit_json, read_conn, table
from state_db.queries.cost import BYS, rollup
from state_db.text import one_line

NAME = "cost"
HELP = "tokens (input, output, cache write, cache read) and dollars by work item, goal family, model or day"

_SPAN = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def add_arguments(p) -> None:
    p.add_argument("--by", choices=BYS, default="item",
                   help="group by work item (default), goal family (schedule:NAME, trigger:NAME, discovery, "
                        "goal:TEXT), model, or UTC day")
    p.add_argument("--since", metavar="WHEN",
                   help="only model calls from then on: a span back from now (30m, 12h, 7d, 2w) or a UTC date "
                        "(2026-12-01)")
    p.add_argument("--until", metavar="WHEN", help="only model calls before then (same forms as --since)")
    add_json(p)


def since_of(spec: str | None, now: float | None = None, flag: str = "--since") -> float | None:
    """``--since`` (or ``--until``) as a time: a span back from ``now``, or a UTC date. Raises UsageError."""
    from scripts.cli.main import UsageError
    if spec is None:
        return None
    now = time.time() if now is None else now
    span = _SPAN.match(spec.strip())
    if span:
        return now - float(span.group(1)) * _UNIT_S[span.group(2)]
    try:
        return float(calendar.timegm(time.strptime(spec.strip(), "%Y-%m-%d")))
    except ValueError:
        raise UsageError(f"{flag} {spec!r} is neither a span (30m, 12h, 7d, 2w) nor a date (YYYY-MM-DD)") from None


def run(args) -> int:
    since, until = since_of(args.since), since_of(args.until, flag="--until")
    conn = read_conn(args)
    try:
        out = rollup(conn, args.by, since=since, until=until)
    finally:
        conn.close()
    if args.json:
        emit_json(out)
        return 0
    rows = [[one_line(r["key"])[:60], r["items"], r["endings"], r["calls"], r["input_tokens"], r["output_tokens"],
             r["cache_write_tokens"], r["cache_read_tokens"], f"${r['cost_usd']:.4f}",
             one_line(", ".join(list(r["models"])[:3]))[:40]] for r in out["rows"]]
    t = out["total"]
    rows.append(["total", t["items"], t["endings"], t["calls"], t["input_tokens"], t["output_tokens"],
                 t["cache_write_tokens"], t["cache_read_tokens"], f"${t['cost_usd']:.4f}", ""])
    print(table(rows, [args.by.upper(), "ITEMS", "ENDINGS", "CALLS", "IN", "OUT", "CACHE-W", "CACHE-R", "COST",
                       "MODELS"]))
    if args.since or args.until:
        when = lambda t: time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t))  # noqa: E731
        print("(model calls" + (f" since {when(since)}" if args.since else "")
              + (f" before {when(until)}" if args.until else "") + ")")
    return 0
