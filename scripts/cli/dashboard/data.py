"""What the dashboard reads: the CLI's own ``--json`` loaders, plus the series its plots draw.

``org``/``run``/``diff``/``decisions``/``candidates``/``transcript``/``cost``/``knowledge`` call the
functions behind ``org status``, ``org show``, ``org diff``, ``org decisions``, ``org candidates``,
``org show --transcript``, ``org cost`` and ``org knowledge`` so the JSON API and the CLI's
``--json`` cannot drift apart. ``org_plots``/``run_plots`` draw time series and counts no
CLI command prints, from the typed queries (state_db.queries), turned into plain data here.
"""
from __future__ import annotations

from types import SimpleNamespace

from state_db import queries
from state_db.kernel.home import OrgHome
from state_db.queries import decisions as D, verdicts
from state_db.queries.base import plain
from state_db.queries.iterations import of_work as iterations_of, skill_first_uses
from state_db.queries.usage import ModelCall, calls as model_calls

MAX_POINTS = 400            # a line plot thins its series to about this many points
RECENT_RUNS = 30


def org(conn) -> dict:
    """What ``org status --json`` prints."""
    from scripts.cli.commands.status import load
    return load(conn)


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
    pending = D.pending(conn)
    seen = {d.id for d in pending}
    return plain(pending + [d for d in D.recent(conn, 20) if d.id not in seen])


def candidates(conn) -> dict:
    """Open batches and what ``org candidates list --json`` prints (pending and deferred)."""
    from skills import candidates as C
    return {"open_batches": queries.open_batches(conn), "candidates": C.listing(conn, ["pending", "deferred"])}


def _cumulative(calls: list[ModelCall]) -> list[dict]:
    """Model calls in time order → cumulative tokens and cost, thinned to about MAX_POINTS."""
    points, tokens, cost = [], 0, 0.0
    for c in calls:
        tokens += c.tokens
        cost += c.cost_usd
        points.append({"at": c.at, "tokens": tokens, "cost_usd": round(cost, 6), "iteration": c.iteration})
    step = max(1, len(points) // MAX_POINTS)
    return points[::step] + ([points[-1]] if points and (len(points) - 1) % step else [])


def run_plots(conn, work_id: str) -> dict:
    """A run's tokens and cost over time (one point per model call) and per iteration."""
    calls = model_calls(conn, work_id)
    per_iteration = [{"n": i.n, "tokens": i.tokens, "cost_usd": i.cost_usd, "elapsed_s": i.elapsed_s}
                     for i in iterations_of(conn, work_id, prompts=False)]
    return {"work_id": work_id, "usage_over_time": _cumulative(calls), "calls": len(calls),
            "per_iteration": per_iteration}


def org_plots(conn, spend_cap_usd: float) -> dict:
    """The org's plots: usage over time, recent runs, verification, the learning pipeline, spend."""
    return {
        "usage_over_time": _cumulative(model_calls(conn)),
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
    for v in verdicts.everything(conn):
        out.append({"work_id": v.work_id, "iteration": v.iteration, "outcome": v.outcome, "at": v.at,
                    "duration_s": round(sum(c.get("duration_ms") or 0 for c in v.checks) / 1000, 3)})
    return out[-MAX_POINTS:]


def _learning(conn) -> dict:
    """raw notes → curated notes → skill candidates → skills, and each skill's runs over time."""
    counts = queries.table_counts(conn, ("raw_notes", "curated_notes", "skill_candidates", "skills"))
    uses: dict[str, list[dict]] = {}
    for name, _work_id, at in skill_first_uses(conn):
        series = uses.setdefault(name, [])
        series.append({"at": at, "runs": len(series) + 1})
    return {"counts": counts, "skill_uses": uses}


def transcript(conn, work_id: str) -> dict:
    """What ``org show ID --transcript --json`` prints. Raises NotFound."""
    from state_db.kernel.errors import NotFound
    from state_db.queries.transcript import of_work
    if queries.work_item(conn, work_id) is None:
        raise NotFound(f"no work item {work_id}", hint="list them with 'org status'")
    return {"id": work_id, "iteration": None, "attempts": of_work(conn, work_id)}


def cost(conn, by: str, since: str | None) -> dict:
    """What ``org cost --by BY [--since SINCE] --json`` prints. Raises UsageError (a bad ``since``)."""
    from scripts.cli.commands.cost import since_of
    from scripts.cli.dashboard.errors import BadRequest
    from scripts.cli.main import UsageError
    from state_db.queries.cost import rollup
    try:
        start = since_of(since)
    except UsageError as exc:
        raise BadRequest(str(exc), hint="since: 30m, 12h, 7d, 2w or YYYY-MM-DD") from None
    return rollup(conn, by, since=start)


def knowledge(conn) -> dict:
    """What ``org knowledge --json`` prints, with the open batches and every candidate in full
    (their SKILL.md text, for the approve / reject / edit forms)."""
    from skills import candidates as C
    from skills.overview import overview
    return {**overview(conn), "open_batches": queries.open_batches(conn),
            "candidate_forms": C.listing(conn, ["pending", "deferred", "approved", "rejected"])}
