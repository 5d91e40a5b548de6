"""What the dashboard reads: the CLI's own ``--json`` loaders, plus the series its plots draw.

``org``/``run``/``diff``/``decisions``/``candidates`` call the functions behind ``org status``,
``org show``, ``org diff``, ``org decisions`` and ``org candidates`` so the JSON API and the
CLI's ``--json`` cannot drift apart. ``org_plots``/``run_plots`` are the only queries of their
own: time series and counts no CLI command prints.
"""
from __future__ import annotations

from types import SimpleNamespace

import orjson

from state_db import queries
from state_db.home import OrgHome

MAX_POINTS = 400            # a line plot thins its series to about this many points
RECENT_RUNS = 30


def org(conn) -> dict:
    """What ``org status --json`` prints."""
    from scripts.cli.commands.status import unsent_wakes
    from state_db.views import org_view
    st = org_view(conn)
    st["unsent_wakes"] = unsent_wakes(st["transport"])
    return st


def run(conn, work_id: str) -> dict:
    """What ``org show ID --json`` prints (the run's ``run_view`` under ``run``). Raises NotFound."""
    from scripts.cli.commands.show import load
    return load(conn, work_id)


def diff(home: OrgHome, work_id: str, iteration: int | None) -> bytes:
    """What ``org diff ID [--iteration N]`` prints. Raises NotFound."""
    from scripts.cli.commands.diff import patch_of
    return patch_of(SimpleNamespace(home=str(home.root), id=work_id, iteration=iteration))


def decisions(conn) -> list[dict]:
    """What ``org decisions --json --all`` prints: pending first (oldest first), then recent ones."""
    pending = queries.pending_decisions(conn)
    seen = {d["id"] for d in pending}
    recent = queries.rows(conn, "SELECT * FROM decisions ORDER BY created_at DESC LIMIT 20")
    return pending + [d for d in recent if d["id"] not in seen]


def candidates(conn) -> dict:
    """Open batches and what ``org candidates list --json`` prints (pending and deferred)."""
    from skills import candidates as C
    return {"open_batches": queries.open_batches(conn), "candidates": C.listing(conn, ["pending", "deferred"])}


def _cumulative(calls: list[dict]) -> list[dict]:
    """Model calls in time order → cumulative tokens and cost, thinned to about MAX_POINTS."""
    points, tokens, cost = [], 0, 0.0
    for c in calls:
        tokens += c["input_tokens"] + c["output_tokens"] + c["cache_write_tokens"] + c["cache_read_tokens"]
        cost += c["cost_usd"]
        points.append({"at": c["at"], "tokens": tokens, "cost_usd": round(cost, 6), "iteration": c.get("iteration")})
    step = max(1, len(points) // MAX_POINTS)
    return points[::step] + ([points[-1]] if points and (len(points) - 1) % step else [])


_CALLS = """SELECT at, iteration, input_tokens, output_tokens, cache_write_tokens, cache_read_tokens, cost_usd
              FROM model_calls {where} ORDER BY at"""


def run_plots(conn, work_id: str) -> dict:
    """A run's tokens and cost over time (one point per model call) and per iteration."""
    calls = queries.rows(conn, _CALLS.format(where="WHERE work_id = ?"), (work_id,))
    per_iteration = queries.rows(conn, """SELECT n, input_tokens + output_tokens + cache_write_tokens
                                                  + cache_read_tokens AS tokens, cost_usd, elapsed_s
                                             FROM iterations WHERE work_id = ? ORDER BY n""", (work_id,))
    return {"work_id": work_id, "usage_over_time": _cumulative(calls), "calls": len(calls),
            "per_iteration": per_iteration}


def org_plots(conn, spend_cap_usd: float) -> dict:
    """The org's plots: usage over time, recent runs, verification, the learning pipeline, spend."""
    return {
        "usage_over_time": _cumulative(queries.rows(conn, _CALLS.format(where=""))),
        "runs": _recent_runs(conn),
        "verification": _verification(conn),
        "learning": _learning(conn),
        "spend": {"usd": queries.org_spend(conn), "cap_usd": spend_cap_usd},
    }


def _recent_runs(conn) -> list[dict]:
    """Ended runs, oldest first: iterations used, stop reason, cost."""
    ended = queries.work_items(conn, queries.TERMINAL, limit=RECENT_RUNS)
    return [{"id": w["id"], "iterations": w["iterations"], "stop_reason": w["stop_reason"],
             "cost_usd": w["cost_usd"], "tokens": w["tokens"], "ended_at": w["ended_at"]} for w in reversed(ended)]


def _verification(conn) -> list[dict]:
    """Each verdict with how long its checks ran (the sum of their ``duration_ms``)."""
    out = []
    for v in queries.rows(conn, "SELECT work_id, iteration, outcome, checks, at FROM verdicts ORDER BY at"):
        checks = orjson.loads(v.pop("checks") or "[]")
        v["duration_s"] = round(sum(c.get("duration_ms") or 0 for c in checks) / 1000, 3)
        out.append(v)
    return out[-MAX_POINTS:]


def _learning(conn) -> dict:
    """raw notes → curated notes → skill candidates → skills, and each skill's runs over time."""
    counts = {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
              for t in ("raw_notes", "curated_notes", "skill_candidates", "skills")}
    first_use = queries.rows(conn, """SELECT j.value AS name, i.work_id, MIN(i.committed_at) AS at
                                        FROM iterations i, json_each(i.prompt, '$.skills') j
                                       GROUP BY j.value, i.work_id ORDER BY at""")
    uses: dict[str, list[dict]] = {}
    for u in first_use:
        series = uses.setdefault(u["name"], [])
        series.append({"at": u["at"], "runs": len(series) + 1})
    return {"counts": counts, "skill_uses": uses}
