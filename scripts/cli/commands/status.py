"""``org status``: the org at a glance, read from state.db (works while the org is down)."""
from __future__ import annotations

import os
import time

from scripts.cli.output import add_json, emit_json, home_of, read_conn, table
from state_db import views

NAME = "status"
HELP = "show the session, roles, work items (with their workspace), schedules and triggers, usage and decisions"


def add_arguments(p) -> None:
    p.add_argument("--orders", action="store_true",
                   help="only the schedules and triggers: rule, state, next due, fired and skipped counts")
    p.add_argument("--transport", action="store_true",
                   help="also the transport counters per instance (delivered, fell back to the outbox, pushed ...)")
    add_json(p)


def run(args) -> int:
    conn = read_conn(args)
    try:
        st = load(conn, run_dir=home_of(args).require().run_dir)
    finally:
        conn.close()
    if getattr(args, "orders", False):
        if args.json:
            emit_json(st["standing_orders"])
        else:
            print(render_orders(st["standing_orders"]) if st["standing_orders"] else
                  "no schedules or triggers — make one with 'org schedule add' or 'org trigger add'")
        return 0
    if args.json:
        emit_json(st)
        return 0
    print(render(st, transport=getattr(args, "transport", False)))
    return 0


def load(conn, run_dir=None) -> dict:
    """What ``org status --json`` prints (and the dashboard's org page reads): ``views.org_view``
    plus ``unsent_wakes`` and ``standing_orders`` (every schedule and trigger: ``schedules.overview``).
    ``run_dir`` (this host's): a role's ``heartbeat_at`` is the later of its row's and its beat
    file's (``roles/base/beat.py``), the time the supervisor judges it by."""
    from roles.operations.schedules import overview
    st = views.org_view(conn)
    if run_dir is not None:
        from roles.base import beat
        for r in st["roles"]:
            r["heartbeat_at"] = beat.latest(r["heartbeat_at"], run_dir, r["instance"])
    st["unsent_wakes"] = unsent_wakes(st["transport"])
    st["standing_orders"] = overview(conn)
    return st


def unsent_wakes(transport: dict) -> dict[str, int]:
    """Wakes each sender could not send (``transport_counters``' ``wake_not_sent``)."""
    from roles.operations.wake import NOT_SENT

    return {inst: c[NOT_SENT] for inst, c in transport.items() if c.get(NOT_SENT)}


def render(st: dict, now: float | None = None, *, transport: bool = False) -> str:
    """The status as text; the transport counters only with ``transport`` (``--transport``)."""
    now = now or time.time()
    out = []
    session = st["session"]
    out.append(f"session: {session.get('line') or session['status'] if session else 'never started'}")
    if st["open_batches"]:
        out.append(f"** {len(st['open_batches'])} skill-candidate batch(es) waiting for review: 'org candidates' **")
    if st["pending_decisions"]:
        out.append(f"** {len(st['pending_decisions'])} decision(s) waiting: 'org decisions' **")
    proposals = st.get("needs_you", {}).get("proposals")
    if proposals:
        out.append(f"** {len(proposals)} work proposal(s) from discovery, recommended {proposals[0]['id']}: "
                   "'org discover list' **")
    failed = [r["instance"] for r in st["roles"] if r["status"] == "failed"]
    if failed:
        out.append(f"** failed role(s), not restarted: {', '.join(failed)} **")
    if st["roles"]:
        rows = [[r["instance"], r.get("activity", r["status"]), r["pid"], r["restarts"],
                 _age(now, r["heartbeat_at"]), r.get("work_id", r["current_work"])] for r in st["roles"]]
        out += ["", table(rows, ["ROLE", "STATUS", "PID", "RESTARTS", "HEARTBEAT", "WORK"])]
    work = st["work"]["active"] + st["work"]["recent_ended"]
    runs = {r["id"]: r for r in st["runs"]["running"] + st["runs"]["recent_ended"]} if "runs" in st else {}
    if work:
        rows = [[w["id"], _phase(w, runs.get(w["id"])), *progress_cells(w, runs.get(w["id"])),
                 w["stop_reason"] or _waiting(w), place(w["workspace"]), w["goal"][:40]] for w in work]
        out += ["", table(rows, ["WORK", "PHASE", "ITER", "TOKENS", "COST", "ELAPSED", "REASON", "WORKSPACE", "GOAL"])]
        out += [line for w in work for line in _now_lines(runs.get(w["id"]))]
    else:
        out += ["", "no work items"]
    orders = st.get("standing_orders")
    if orders:
        out += ["", render_orders(orders, now)]
    u = st["usage"]
    out += ["", f"usage: {u['calls']} model calls, {u['tokens']} tokens, ${u['cost_usd']:.4f}"]
    unsent = st.get("unsent_wakes") or unsent_wakes(st["transport"])
    if unsent:
        out += ["", "wakes not sent (the coordinator picks such writes up at its next reconcile): "
                + ", ".join(f"{inst} {n}" for inst, n in sorted(unsent.items()))]
    if transport and st["transport"]:
        names = sorted({n for c in st["transport"].values() for n in c})
        rows = [[inst] + [c.get(n, 0) for n in names] for inst, c in st["transport"].items()]
        out += ["", table(rows, ["INSTANCE"] + [n.upper() for n in names])]
    return "\n".join(out)


def place(workspace: str | None) -> str:
    """A workspace as a person tells it apart: under the home folder as ``~/…``."""
    if not workspace:
        return ""
    home = os.path.expanduser("~")
    if home not in ("", "/") and (workspace == home or workspace.startswith(home + "/")):
        return "~" + workspace[len(home):]
    return workspace


def render_orders(orders: list[dict], now: float | None = None) -> str:
    """Schedules and triggers in a table: rule, state, when next, fired and skipped counts."""
    now = now or time.time()
    rows = [[o["name"], o["what"], o["rule"], o["status"], _next(now, o), o["fired"],
             f"{o['skipped_busy']} busy, {o['skipped_spend']} cap" if o["skipped_busy"] or o["skipped_spend"] else 0,
             f"{o['last_work_id']} ({o['last_work_status']})" if o["last_work_id"] else ""] for o in orders]
    return table(rows, ["ORDER", "KIND", "RULE", "STATE", "NEXT", "FIRED", "SKIPPED", "LAST ITEM"])


def _next(now: float, order: dict) -> str:
    if order["next_due"] is None:
        return "on an event" if order["status"] == "active" else ""
    left = order["next_due"] - now
    if left <= 0:
        return "now"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if left >= size:
            return f"in {left / size:.0f}{unit}"
    return f"in {left:.0f}s"


def _phase(w: dict, run: dict | None) -> str:
    return run["phase"] if run else w["status"]


def progress_cells(w: dict, run: dict | None) -> list[str]:
    """ITER, TOKENS, COST and ELAPSED cells: what is used, against its cap where there is one."""
    if run is None:
        return [str(w["iterations"]), str(w["tokens"]), f"${w['cost_usd']:.4f}", f"{w['elapsed_s']:.0f}s"]
    it, tok, cost, el = run["iteration"], run["tokens"], run["cost_usd"], run["elapsed_s"]
    return [of(it["n"], it["max"]), of(tok["used"], tok["cap"]),
            of(f"${cost['used']:.4f}", None if cost["cap"] is None else f"${cost['cap']:g}"),
            of(f"{el['used']:.0f}s", None if el["cap"] is None else f"{el['cap']:g}s")]


def of(used, cap) -> str:
    """``used/cap``, or ``used`` alone when there is no cap."""
    return f"{used}" if cap is None else f"{used}/{cap}"


def _now_lines(run: dict | None) -> list[str]:
    """What a running run is doing and its latest verdict, indented under the table."""
    if run is None or run["phase"] == "ended":
        return []
    lines = []
    if run["current_tool"]:
        lines.append(f"  {run['id']}: running {run['current_tool']['call']} ({run['current_tool']['for_s']:.0f}s)")
    if run["verdict"]:
        lines.append(f"  {run['id']}: iteration {run['verdict']['iteration']}: {run['verdict']['line']}")
    if run["pending_decisions"]:
        lines.append(f"  {run['id']}: waits for decision {', '.join(run['pending_decisions'])}: 'org decisions'")
    return lines


def _age(now: float, at: float | None) -> str:
    return "" if at is None else f"{max(0.0, now - at):.1f}s ago"


def _waiting(w: dict) -> str:
    return f"waiting: {w['stop_detail']}" if w["status"] == "waiting" and w.get("stop_detail") else ""
