"""Caps that cut inside a call: a real org against a hostile Messages API on 127.0.0.1.

Usage: ``bench/caps.py --json [--timeout S] [--budget-tokens N] [--budget-usd D]`` (≈ 15 s).

One org (supervisor, coordinator, loop-agents, eval-agent; the sandbox org.toml asks for, by
default bubblewrap) reaches ``CapsServer`` through the anthropic backend (``model.base_url``) and
runs one work item per case, all at once; the server picks each request's behaviour by the case
named in the goal:

- ``hang``: every model request gets no answer; the item has ``--timeout S``.
- ``runaway``: the model's first tool call is ``run_command sleep 100000``; ``--timeout S``.
- ``hog_tokens`` / ``hog_cost``: every response is a tool call whose usage says ``output_tokens``
  = the request's ``max_tokens`` (the most a real API would bill) plus ``HOG_INPUT`` input
  tokens; the item has a token budget, resp. a cost budget, and nothing else.
- ``wrapup_tokens`` / ``wrapup_cost``: every response bills ``FIXED_USAGE`` (9,000 tokens, most
  of it input, whatever ``max_tokens`` says) and asks for a tool; the wrap-up's requests get a
  hand-off note. The item has a token budget (``WRAPUP_TOKENS``), resp. a cost budget
  (``WRAPUP_USD``), and nothing else: the iterations stop on it and the wrap-up runs, and the
  figures count both.
- ``ladder``: the same 9,000-token calls, but each act is a tool call and a closing answer, so
  iterations commit and fail the same check: ``repeated_failure`` moves the run from ``MODEL`` to
  ``MODEL_STRONG`` (``--ladder``), whose dearer calls then meet the token budget
  (``LADDER_TOKENS``) — the caps hold across rungs, the wrap-up included
  (``budget_overshoot_ratio_tokens_ladder``; ``ladder_climbed``: iterations ran on both models).

Figures: ``budget_overshoot_ratio_tokens`` / ``_cost`` (counted usage in state.db ÷ budget, the
larger of the hog's and the wrap-up case's; each is also given on its own, and
``wrapup_ran_tokens`` / ``_cost`` say whether the wrap-up act wrote the hand-off note);
``timeout_overrun_s`` (the larger, over hang and runaway, of the run's wall time from its first
attempt's start to its end, minus the timeout: it includes the commit and the eval-agent's
verification of the cut iteration); ``max_tokens_over_left`` (requests whose ``max_tokens``
exceeded what the budget had left by the server's own count; must be 0);
``usage_served_minus_counted`` (tokens the server reported but state.db does not hold; 0).
Same-run baselines ``raw_*``: the hog against the backend in-process, once with the run's
``Remaining`` withheld — each request asks for the configured ``max_tokens``, as before caps cut
inside a call — the hang with the configured request timeout (``--raw-request-timeout``), and
the wrap-up cases as the budgets used to hold them: calls until the run has used all but the 5 %
kept for the wrap-up, checked before each call only, then one wrap-up act
(``raw_budget_overshoot_ratio_*_wrapup``).
Targets: both ratios ≤ 1.00, overrun ≤ 5 s, max_tokens_over_left == 0.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from roles.workbench.scripted.server import Exchange, MessagesServer, error_body, message_body  # noqa: E402

MODEL, MODEL_STRONG = "claude-caps", "claude-caps-strong"
PRICE = {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_read": 0.3}
PRICE_STRONG = {"input": 15.0, "output": 75.0, "cache_write": 18.75, "cache_read": 1.5}
MAX_TOKENS = 200_000          # configured per request: one call alone would overshoot the budgets
HOG_INPUT = 2_000
FIXED_USAGE = {"input_tokens": 8_000, "output_tokens": 1_000}     # the 9,000 tokens a call
WRAPUP_TOKENS, WRAPUP_USD = 100_000, 0.5                          # about 11 such calls, about 12 of cost
LADDER_TOKENS = 60_000                      # two weak iterations of two calls, then the strong rung trips it
WRAPUP_NOTE = ("Done: listed the files again.\nRemains: everything; the check still fails.\n"
               "Learned: listing files does not help.")
CASES = ("hang", "runaway", "hog_tokens", "hog_cost", "wrapup_tokens", "wrapup_cost", "ladder")
TARGETS = {"budget_overshoot_ratio_tokens": 1.00, "budget_overshoot_ratio_cost": 1.00, "timeout_overrun_s": 5.0,
           "max_tokens_over_left": 0}
_CASE = re.compile(r"caps-case: (\w+)")


@dataclass
class Served:
    """One request as the server saw it: when, for which case, what it asked and reported."""

    at: float
    case: str
    max_tokens: int
    usage: dict[str, int] = field(default_factory=dict)
    model: str = ""

    @property
    def tokens(self) -> int:
        return sum(self.usage.values())

    def cost(self) -> float:
        price = PRICE_STRONG if self.model == MODEL_STRONG else PRICE
        return (self.usage.get("input_tokens", 0) * price["input"]
                + self.usage.get("output_tokens", 0) * price["output"]) / 1e6


class CapsServer(MessagesServer):
    """A Messages API whose behaviour per request is the case named in the first user message
    (``caps-case: NAME``); records every request as ``Served``."""

    def __init__(self) -> None:
        super().__init__()
        self.served: list[Served] = []
        self._lock = threading.Lock()
        self.stopping = threading.Event()

    def respond(self, ex: Exchange) -> None:
        body = ex.body if isinstance(ex.body, dict) else {}
        messages = body.get("messages") or [{}]
        first = messages[0].get("content")
        found = _CASE.search(first if isinstance(first, str) else json.dumps(first))
        case = found.group(1) if found else "unrouted"
        seen = Served(time.time(), case, int(body.get("max_tokens") or 0))
        with self._lock:
            self.served.append(seen)
        if case == "hang":
            self.stopping.wait(600)      # released by stop(); the client's timeout must cut first
            ex.drop()
        elif case == "runaway" and len(messages) == 1:
            self._reply(ex, seen, _tool("run_command", {"command": "sleep 100000"}), "tool_use")
        elif case.startswith("hog"):
            seen.usage = {"input_tokens": HOG_INPUT, "output_tokens": seen.max_tokens}
            self._reply(ex, seen, _tool("list_files", {"path": "."}), "tool_use")
        elif case.startswith("wrapup") or case == "ladder":   # a real API bills no more output than max_tokens
            seen.usage = {**FIXED_USAGE, "output_tokens": min(FIXED_USAGE["output_tokens"], seen.max_tokens)}
            seen.model = str(body.get("model") or "")
            if case == "ladder" and len(messages) > 1:          # the act's closing answer: the iteration commits
                self._reply(ex, seen, [{"type": "text", "text": "listed them"}], "end_turn")
            elif "Wrap-up:" in (first if isinstance(first, str) else json.dumps(first)):
                self._reply(ex, seen, [{"type": "text", "text": WRAPUP_NOTE}], "end_turn")
            else:
                self._reply(ex, seen, _tool("list_files", {"path": "."}), "tool_use")
        elif case in ("runaway", "warm"):
            self._reply(ex, seen, [{"type": "text", "text": "done"}], "end_turn")
        else:
            ex.json(500, error_body("api_error", f"caps server: no case in the request ({case})"),
                    {"x-should-retry": "false"})

    def _reply(self, ex: Exchange, seen: Served, content: list[dict], stop: str) -> None:
        seen.usage = seen.usage or {"input_tokens": 100, "output_tokens": 10}
        body = message_body(model=MODEL, content=content, stop_reason=stop, usage=seen.usage)
        ex.json(200, body, {"request-id": f"req_caps_{uuid.uuid4().hex[:16]}"})

    def of(self, case: str) -> list[Served]:
        with self._lock:
            return [s for s in self.served if s.case == case]

    def stop(self) -> None:
        self.stopping.set()
        super().stop()


def _tool(name: str, tool_input: dict) -> list[dict]:
    return [{"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:12]}", "name": name, "input": tool_input}]


def org_config(base_url: str, loop_agents: int = len(CASES)) -> str:
    """org.toml for a caps run: the anthropic backend at ``base_url``, priced as ``PRICE``."""
    prices = "".join(f"[prices.\"{m}\"]\n" + "".join(f"{k} = {v}\n" for k, v in p.items())
                     for m, p in ((MODEL, PRICE), (MODEL_STRONG, PRICE_STRONG)))
    return (f"[org]\nloop_agents = {loop_agents}\n[supervisor]\nheartbeat_s = 0.2\n"
            f"[model]\nbackend = \"anthropic\"\nname = \"{MODEL}\"\nbase_url = \"{base_url}\"\n"
            f"max_tokens = {MAX_TOKENS}\nrequest_timeout_s = 120\nmax_retries = 6\n{prices}")


def over_left(served: list[Served], *, budget_tokens: float | None = None, budget_usd: float | None = None) -> int:
    """Requests whose ``max_tokens`` exceeded what the budget had left by the server's count of
    the usage it reported before (tokens; cost at the output price)."""
    used_tokens, used_cost, over = 0, 0.0, 0
    for s in served:
        if budget_tokens is not None and s.max_tokens > budget_tokens - used_tokens:
            over += 1
        if budget_usd is not None and s.max_tokens * PRICE["output"] / 1e6 > budget_usd - used_cost + 1e-12:
            over += 1
        used_tokens += s.tokens
        used_cost += s.cost()
    return over


def _q(home, sql: str, params=()) -> list:
    from state_db.connection import read_rows
    return read_rows(home.db_path, sql, params)


@dataclass
class CaseRun:
    """What one case's work item did: its row, counted usage, and the server's view."""

    case: str
    work_id: str
    stop_reason: str | None
    wall_s: float              # first attempt's start → the item's end
    elapsed_s: float           # the engine's own count (act time)
    counted_tokens: int
    counted_cost: float
    served: list[Served]
    act_status: list[str]
    handoff: str | None = None     # who wrote the hand-off note: "wrapup" (the act), "record", or None

    @property
    def served_tokens(self) -> int:
        return sum(s.tokens for s in self.served)


def run_cases(root: Path, *, timeout_s: float = 3.0, budget_tokens: int = 300_000, budget_usd: float = 5.0,
              cases: tuple[str, ...] = CASES, wait_s: float = 45.0) -> dict[str, CaseRun]:
    """Start a caps server and an org under ``root``, submit one item per case, wait for all to
    end, stop everything. Returns each case's ``CaseRun``. Errors: ``TimeoutError`` naming what
    was seen when an item does not end within ``wait_s``."""
    from roles.operations.submit import SubmitRequest, submit
    from scripts import control
    from state_db.queries.work import Caps
    from state_db.bootstrap import init_home
    from state_db.kernel.home import OrgHome
    from transport.probe import wait_until

    server = CapsServer()
    server.start()
    home = OrgHome(root / "org")
    home.root.mkdir(parents=True)
    home.config_path.write_text(org_config(server.base_url, len(cases)))
    cfg, _ = init_home(home)
    try:
        control.start_background(home, timeout_s=30)
        _warm_up(home, cfg, root, len(cases), wait_s)
        ids = {}
        for case in cases:
            ws = root / case
            ws.mkdir()
            (ws / "notes.txt").write_text("nothing to see\n")
            given = case_caps(case, timeout_s=timeout_s, budget_tokens=budget_tokens, budget_usd=budget_usd)
            ids[case] = submit(home, cfg, SubmitRequest(
                goal=f"caps-case: {case}", workspace=str(ws), verify=["false"], backend="anthropic",
                ladder=(MODEL, MODEL_STRONG) if case == "ladder" else None,
                caps=Caps.given(given, removed=Caps.names())))["id"]

        def statuses() -> dict[str, str]:
            return {case: _q(home, "SELECT status FROM work_items WHERE id=?", (wid,))[0]["status"]
                    for case, wid in ids.items()}
        try:
            wait_until(lambda: set(statuses().values()) == {"ended"}, timeout=wait_s, what="caps items to end",
                       interval=0.05)
        except TimeoutError:
            raise TimeoutError(f"caps items did not all end within {wait_s} s; last seen: {statuses()}") from None
        runs = {case: _case_run(home, case, wid, server.of(case)) for case, wid in ids.items()}
    finally:
        try:
            control.request(home, "stop", force=True, timeout_s=30)
        finally:
            server.stop()
    return runs


def case_caps(case: str, *, timeout_s: float, budget_tokens: int, budget_usd: float) -> dict:
    """The one cap each case's item has (the others are removed: the case is about that one)."""
    return {"hang": {"timeout_s": timeout_s}, "runaway": {"timeout_s": timeout_s},
            "hog_tokens": {"budget_tokens": budget_tokens}, "hog_cost": {"budget_usd": budget_usd},
            "wrapup_tokens": {"budget_tokens": WRAPUP_TOKENS}, "wrapup_cost": {"budget_usd": WRAPUP_USD},
            "ladder": {"budget_tokens": LADDER_TOKENS}}[case]


def _warm_up(home, cfg, root: Path, loop_agents: int, wait_s: float) -> None:
    """Have every loop-agent run one short item first: a loop-agent imports the model SDK after
    it is ready (seconds under load), and a run's clock would otherwise start with that import
    instead of the call the case is about."""
    from roles.operations.submit import SubmitRequest, submit
    from state_db.queries.work import Caps
    from transport.probe import wait_until

    def warmed() -> int:
        return _q(home, "SELECT COUNT(DISTINCT a.instance) AS n FROM attempts a JOIN work_items w ON w.id = a.work_id "
                        "WHERE w.status = 'ended'")[0]["n"]

    for batch in range(4):               # dispatch may hand two items to one agent: try again
        if warmed() >= loop_agents:
            return
        ids = []
        for n in range(loop_agents):
            ws = root / f"warm-{batch}-{n}"
            ws.mkdir()
            ids.append(submit(home, cfg, SubmitRequest(goal="caps-case: warm", workspace=str(ws), verify=["false"],
                                                       caps=Caps(max_iterations=1), backend="anthropic"))["id"])
        marks = ",".join("?" * len(ids))
        wait_until(lambda: _q(home, f"SELECT COUNT(*) AS n FROM work_items WHERE id IN ({marks}) AND status='ended'",
                              ids)[0]["n"] == len(ids), timeout=wait_s, what="the warm-up items to end")


def _case_run(home, case: str, work_id: str, served: list[Served]) -> CaseRun:
    item = _q(home, "SELECT * FROM work_items WHERE id=?", (work_id,))[0]
    first = _q(home, "SELECT MIN(started_at) AS t FROM attempts WHERE work_id=?", (work_id,))[0]["t"]
    used = _q(home, "SELECT COALESCE(SUM(input_tokens + output_tokens + cache_write_tokens + cache_read_tokens), 0) AS t, "
                    "COALESCE(SUM(cost_usd), 0) AS c FROM model_calls WHERE work_id=?", (work_id,))[0]
    acts = [r["act_status"] for r in _q(home, "SELECT act_status FROM iterations WHERE work_id=? ORDER BY n", (work_id,))]
    handoff = _q(home, "SELECT source FROM handoffs WHERE work_id=? ORDER BY ending DESC LIMIT 1", (work_id,))
    return CaseRun(case, work_id, item["stop_reason"], round(item["updated_at"] - first, 3), item["elapsed_s"],
                   int(used["t"]), float(used["c"]), served, acts, handoff[0]["source"] if handoff else None)


def raw_baseline(root: Path, *, budget_tokens: int, budget_usd: float, request_timeout_s: float) -> dict:
    """The hog and the hang against the backend in-process with the run's ``Remaining`` withheld
    (every request asks for the configured ``max_tokens`` and waits the configured timeout), the
    budget checked before each call only, as before caps cut inside a call."""
    from roles.loop_agent.backends.anthropic_backend import AnthropicBackend, AnthropicConfig
    from roles.loop_agent.backends.base import ActContext
    from roles.loop_agent.backends.retry import RetryPolicy

    out = {}
    server = CapsServer()
    server.start()
    try:
        for case, cap in (("hog_tokens", budget_tokens), ("hog_cost", budget_usd), ("hang", request_timeout_s)):
            ws = root / f"raw-{case}"
            ws.mkdir(parents=True)
            backend = AnthropicBackend(
                AnthropicConfig(model=MODEL, max_tokens=MAX_TOKENS, base_url=server.base_url, timeout_s=request_timeout_s,
                                retry=RetryPolicy(max_attempts=1)), {MODEL: PRICE}, environ={})
            spent = {"tokens": 0, "cost": 0.0}

            def on_usage(u, spent=spent) -> None:
                spent["tokens"] += u.total_tokens
                spent["cost"] += u.cost_usd

            def budget_left(case=case, cap=cap, spent=spent) -> str | None:
                if case == "hog_tokens" and spent["tokens"] >= cap:
                    return "token_budget"
                if case == "hog_cost" and spent["cost"] >= cap:
                    return "cost_budget"
                return None
            t0 = time.monotonic()
            backend.act(ActContext("raw", 1, 1, ws, "", f"caps-case: {case}"), on_usage=on_usage, budget_left=budget_left)
            if case == "hog_tokens":
                out["raw_budget_overshoot_ratio_tokens"] = round(spent["tokens"] / cap, 4)
            elif case == "hog_cost":
                out["raw_budget_overshoot_ratio_cost"] = round(spent["cost"] / cap, 4)
            else:
                out["raw_hang_call_s"] = round(time.monotonic() - t0, 2)
        out.update(_raw_wrapups(server, root))
    finally:
        server.stop()
    return out


def _raw_wrapups(server: CapsServer, root: Path, reserve: float = 0.05) -> dict:
    """The wrap-up cases as the budgets used to hold them: calls until the run has used all but
    ``reserve`` of the budget, checked before each call only, then one wrap-up act."""
    from roles.loop_agent.backends.anthropic_backend import AnthropicBackend, AnthropicConfig
    from roles.loop_agent.backends.base import ActContext
    from roles.loop_agent.backends.retry import RetryPolicy

    out = {}
    for case, field_, cap in (("wrapup_tokens", "tokens", WRAPUP_TOKENS), ("wrapup_cost", "cost", WRAPUP_USD)):
        ws = root / f"raw-{case}"
        ws.mkdir(parents=True)
        backend = AnthropicBackend(AnthropicConfig(model=MODEL, max_tokens=MAX_TOKENS, base_url=server.base_url,
                                                   retry=RetryPolicy(max_attempts=1)), {MODEL: PRICE}, environ={})
        spent = {"tokens": 0, "cost": 0.0}

        def on_usage(u, spent=spent) -> None:
            spent["tokens"] += u.total_tokens
            spent["cost"] += u.cost_usd

        def budget_left(field_=field_, cap=cap, spent=spent) -> str | None:
            return "budget" if spent[field_] >= cap * (1 - reserve) else None
        backend.act(ActContext("raw", 1, 1, ws, "", f"caps-case: {case}", max_turns=1000), on_usage=on_usage,
                    budget_left=budget_left)
        backend.act(ActContext("raw", 2, 2, ws, "", f"Wrap-up: caps-case: {case}"), on_usage=on_usage,
                    budget_left=lambda: None)
        name = "tokens" if field_ == "tokens" else "cost"
        out[f"raw_budget_overshoot_ratio_{name}_wrapup"] = round(spent[field_] / cap, 4)
    return out


def figures_of(runs: dict[str, CaseRun], *, timeout_s: float, budget_tokens: int, budget_usd: float) -> dict:
    tok, cost, wtok, wcost = runs["hog_tokens"], runs["hog_cost"], runs["wrapup_tokens"], runs["wrapup_cost"]
    ratios = {"ladder": round(runs["ladder"].counted_tokens / LADDER_TOKENS, 4),
              "hog_tokens": round(tok.counted_tokens / budget_tokens, 4),
              "hog_cost": round(cost.counted_cost / budget_usd, 4),
              "wrapup_tokens": round(wtok.counted_tokens / WRAPUP_TOKENS, 4),
              "wrapup_cost": round(wcost.counted_cost / WRAPUP_USD, 4)}
    return {
        "budget_overshoot_ratio_tokens": max(ratios["hog_tokens"], ratios["wrapup_tokens"], ratios["ladder"]),
        "budget_overshoot_ratio_cost": max(ratios["hog_cost"], ratios["wrapup_cost"]),
        "budget_overshoot_ratio_tokens_hog": ratios["hog_tokens"],
        "budget_overshoot_ratio_cost_hog": ratios["hog_cost"],
        "budget_overshoot_ratio_tokens_wrapup": ratios["wrapup_tokens"],
        "budget_overshoot_ratio_cost_wrapup": ratios["wrapup_cost"],
        "budget_overshoot_ratio_tokens_ladder": round(runs["ladder"].counted_tokens / LADDER_TOKENS, 4),
        "ladder_climbed": {s.model for s in runs["ladder"].served} == {MODEL, MODEL_STRONG},
        "wrapup_ran_tokens": wtok.handoff == "wrapup",
        "wrapup_ran_cost": wcost.handoff == "wrapup",
        "timeout_overrun_s": round(max(runs["hang"].wall_s, runs["runaway"].wall_s) - timeout_s, 2),
        "timeout_overrun_s_hang": round(runs["hang"].wall_s - timeout_s, 2),
        "timeout_overrun_s_runaway": round(runs["runaway"].wall_s - timeout_s, 2),
        "max_tokens_over_left": (over_left(tok.served, budget_tokens=budget_tokens)
                                 + over_left(cost.served, budget_usd=budget_usd)),
        "usage_served_minus_counted": sum(r.served_tokens - r.counted_tokens for r in runs.values()),
        "stop_reasons": {c: r.stop_reason for c, r in runs.items()},
        "timeout_s": timeout_s, "budget_tokens": budget_tokens, "budget_usd": budget_usd,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--timeout", type=float, default=3.0, help="the hang and runaway items' timeout, seconds")
    p.add_argument("--budget-tokens", type=int, default=300_000, help="the token hog's budget")
    p.add_argument("--budget-usd", type=float, default=5.0, help="the cost hog's budget")
    p.add_argument("--raw-request-timeout", type=float, default=8.0,
                   help="configured request timeout of the raw hang baseline, seconds")
    p.add_argument("--wait", type=float, default=45.0,
                   help="seconds each stage (warm-up, the cases) may take before the run gives up (a loaded machine "
                        "needs more)")
    args = p.parse_args(argv)
    from bench.common import at_most, finish, quiet_logs
    quiet_logs()
    tmp = Path(tempfile.mkdtemp(prefix="lo-"))
    try:
        runs = run_cases(tmp / "o", timeout_s=args.timeout, budget_tokens=args.budget_tokens, budget_usd=args.budget_usd,
                         wait_s=args.wait)
        figures = figures_of(runs, timeout_s=args.timeout, budget_tokens=args.budget_tokens, budget_usd=args.budget_usd)
        figures.update(raw_baseline(tmp / "raw", budget_tokens=args.budget_tokens, budget_usd=args.budget_usd,
                                    request_timeout_s=args.raw_request_timeout))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    passes = at_most(figures, TARGETS)
    passes["stop_reasons"] = figures["stop_reasons"] == {
        "hang": "timeout", "runaway": "timeout", "hog_tokens": "token_budget", "hog_cost": "cost_budget",
        "wrapup_tokens": "token_budget", "wrapup_cost": "cost_budget", "ladder": "token_budget"}
    passes["ladder_climbed"] = figures["ladder_climbed"]
    passes["wrapup_ran"] = figures["wrapup_ran_tokens"] and figures["wrapup_ran_cost"]
    return finish(figures, TARGETS | {"stop_reasons": "each case's own cap", "wrapup_ran": "the wrap-up act wrote "
                                      "the hand-off note in both wrap-up cases",
                                      "ladder_climbed": "the ladder case ran on both models"}, passes, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
