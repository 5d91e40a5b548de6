"""``org discover``: a read-only scan proposes work; the human accepts, or a standing policy does.

``org discover --workspace DIR [--verify CMD] [--issues FILE] [--limit N]`` scans and records the
candidates (``roles/operations/discover.py``, ``proposals.py``); ``list``, ``show ID``,
``accept ID [--edit ...]`` and ``dismiss ID`` work on what it proposed. Accepting submits a work
item as ``org submit`` does; nothing else starts one, except org.toml's ``discover.auto_start``
within ``limits.daily_spend_usd``.
"""
from __future__ import annotations

import time

from scripts.cli.commands.submit import check_scripted_backend
from scripts.cli.main import UsageError
from scripts.cli.output import add_json, emit_json, home_of, read_conn, table
from state_db.kernel import config as config_mod
from state_db.kernel.errors import NotFound
from state_db.queries import proposals as Q
from state_db.queries.work import Caps

NAME = "discover"
HELP = "scan a workspace for work (failing checks, FIXME/TODO, an issue list) and propose it; accept or dismiss"


def add_arguments(p) -> None:
    p.add_argument("--workspace", help="the directory to scan (read only: the checks run on a snapshot)")
    p.add_argument("--verify", action="append", default=[], metavar="CMD",
                   help="a verify command to run on the current tree (repeatable; default: discover.verify)")
    p.add_argument("--issues", metavar="FILE",
                   help="an issue list: gh issue list --json number,title,body,labels, or JSON lines of "
                        "{title, body, labels}")
    p.add_argument("--limit", type=int, help="how many candidates to propose (default: discover.limit)")
    add_json(p)
    sub = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p),
                           help="list | show | accept | dismiss (default: scan --workspace)")
    ls = sub.add_parser("list", help="open proposals, the recommended first (--all: every one)")
    ls.add_argument("--all", action="store_true", help="accepted, dismissed and expired ones too")
    add_json(ls)
    show = sub.add_parser("show", help="one proposal: its evidence, goal, verify commands and caps")
    show.add_argument("id", help="proposal id")
    add_json(show)
    acc = sub.add_parser("accept", help="submit the proposal as a work item (--edit: change it first)")
    acc.add_argument("id", help="proposal id")
    acc.add_argument("--edit", action="store_true",
                     help="change the goal, verify commands or caps with the flags below")
    acc.add_argument("--goal", help="the goal instead of the proposed one (with --edit)")
    acc.add_argument("--verify", action="append", default=[], metavar="CMD",
                     help="verify commands instead of the proposed ones (repeatable; with --edit)")
    acc.add_argument("--protect", action="append", default=[], metavar="GLOB",
                     help="more files the agent may not change to pass (with --edit)")
    acc.add_argument("--no-default-protect", action="store_true",
                     help="protect only the --protect globs, not the usual test files (with --edit)")
    acc.add_argument("--max-iterations", type=int, help="hard cap on iterations (with --edit)")
    acc.add_argument("--budget-tokens", type=int, help="hard cap on tokens (with --edit)")
    acc.add_argument("--budget-usd", type=float, help="hard cap on cost in USD (with --edit)")
    acc.add_argument("--timeout", type=float, help="hard cap on working time in seconds (with --edit)")
    acc.add_argument("--backend", help="anthropic | command | scripted:FILE (with --edit)")
    acc.add_argument("--worktree", action="store_true",
                     help="work in a new git worktree and branch of the workspace (with --edit)")
    acc.add_argument("--review", metavar="CRITERIA",
                     help="a model reviews passing changes against the goal and these criteria (with --edit)")
    add_json(acc)
    dis = sub.add_parser("dismiss", help="say no: the same evidence is not proposed again")
    dis.add_argument("id", help="proposal id")
    dis.add_argument("--reason", help="why, kept with the proposal")
    add_json(dis)


def run(args) -> int:
    action = args.action or "scan"
    return {"scan": _scan, "list": _list, "show": _show, "accept": _accept, "dismiss": _dismiss}[action](args)


def _scan(args) -> int:
    from roles.operations.discover import scan_all
    from roles.operations.proposals import auto_start, record

    if not args.workspace:
        raise UsageError("give --workspace DIR to scan, or an action: list, show, accept, dismiss — "
                         "see 'org discover --help'")
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be at least 1")
    home = home_of(args).require()
    cfg = config_mod.load_config(home)
    found = scan_all(args.workspace, args.verify, args.issues, cfg=cfg, home=home)
    out = record(home, cfg, args.workspace, found, limit=args.limit)
    out["auto_start"] = auto_start(home, cfg, out["proposals"])
    if args.json:
        emit_json(out)
        return 0
    print(render_scan(out))
    return 0


def render_scan(out: dict) -> str:
    lines = [f"scanned {out['workspace']} ({', '.join(out['sources']) or 'nothing readable'}): "
             f"{out['found']} candidate(s), {len(out['proposals'])} proposed"
             + (f", {out['held_back']} held back (dismissed, or being worked)" if out["held_back"] else "")
             + (f", {len(out['expired'])} expired" if out["expired"] else "")]
    lines += [f"  note: {n}" for n in out["notes"]]
    if out["proposals"]:
        lines += ["", render_list(out["proposals"])]
        rec = out["proposals"][0]
        lines += ["", f"recommended: {rec['id']} — accept it with 'org discover accept {rec['id']}' "
                      "(or --edit it first), or 'org discover dismiss ID'"]
    else:
        lines.append("nothing to propose")
    started = out.get("auto_start")
    if started:
        how = (f"started as {started['work_id']} ({started['why']})" if started["started"]
               else f"not started: {started['why']}")
        lines.append(f"auto_start: {started['proposal']} {how}")
    return "\n".join(lines)


def render_list(rows: list[dict]) -> str:
    def mark(r: dict) -> str:
        return "* " if r["recommended"] and r["status"] == "proposed" else "  "
    return table([[mark(r) + r["id"], r["kind"], r["status"], r["rank"], r["title"][:70]] for r in rows],
                 ["  PROPOSAL", "KIND", "STATUS", "RANK", "WHAT"])


def _list(args) -> int:
    conn = read_conn(args)
    try:
        rows = [r.as_dict() for r in Q.listing(conn, all_=args.all)]
    finally:
        conn.close()
    if args.json:
        emit_json(rows)
    else:
        print(render_list(rows) if rows else "no open proposals: scan with 'org discover --workspace DIR'")
    return 0


def _show(args) -> int:
    conn = read_conn(args)
    try:
        row = Q.proposal(conn, args.id)
    finally:
        conn.close()
    if row is None:
        raise NotFound(f"no proposal {args.id}", hint="list them with 'org discover list'")
    p = row.as_dict()
    p["open"] = row.is_open(time.time())
    if args.json:
        emit_json(p)
        return 0
    lines = [f"{p['id']}  {p['kind']}  {p['status']}" + ("  (recommended)" if p["recommended"] and p["open"] else "")
             + (f"  work item {p['work_id']}" if p["work_id"] else ""),
             f"workspace: {p['workspace']}", f"found by: {p['source']}  fingerprint {p['fingerprint']}", "",
             f"goal: {p['goal']}", f"verify: {'; '.join(p['verify']) or '(none: accept with --edit --verify CMD)'}",
             "caps: " + ", ".join(f"{k}={v}" for k, v in p["caps"].items()), "", "evidence:"]
    lines += [f"  {k}: {v}" for k, v in p["evidence"].items()]
    if not p["open"]:                    # decided, or lapsed and not yet marked expired
        state = "expired" if p["status"] == "proposed" else p["status"]
        lines += ["", state + (f" by {p['decided_by']}" if p["decided_by"] else "")
                  + (f": {p['detail']}" if p["detail"] else "")]
    print("\n".join(lines))
    return 0


def _accept(args) -> int:
    from roles.operations.proposals import Edits, accept

    flags = {"goal": args.goal, "verify": args.verify or None, "protect": args.protect or None,
             "max_iterations": args.max_iterations, "budget_tokens": args.budget_tokens,
             "budget_usd": args.budget_usd, "timeout_s": args.timeout, "backend": args.backend,
             "review": args.review}
    changed = {k: v for k, v in flags.items() if v is not None}
    if args.no_default_protect:
        changed["default_protect"] = False
    if args.worktree:
        changed["worktree"] = True
    if changed and not args.edit:
        raise UsageError(f"--{next(iter(changed)).replace('_', '-')} changes the proposal: add --edit")
    if args.edit and not changed:
        raise UsageError("--edit needs what to change: --goal, --verify, a cap, --backend, ...")
    check_scripted_backend(args.backend)
    home = home_of(args).require()
    cfg = config_mod.load_config(home)
    caps = Caps.given({k: changed.pop(k) for k in Caps.names() if k in changed})
    out = accept(home, cfg, args.id, Edits(**changed, **({"caps": caps} if caps else {})))
    if args.json:
        emit_json(out)
        return 0
    if out["replayed"] and out["submit"] is None:
        print(f"{out['proposal']} was accepted already: work item {out['work_id']}")
    else:
        print(f"accepted {out['proposal']}: submitted {out['work_id']} ({out['submit']['status']})")
        if out["submit"]["org_status"] != "running":
            print(f"  the org is {out['submit']['org_status']}: nothing runs until it is started")
    print(f"  follow it: org show {out['work_id']}")
    return 0


def _dismiss(args) -> int:
    from roles.operations.proposals import dismiss

    home = home_of(args).require()
    out = dismiss(home, args.id, args.reason)
    if args.json:
        emit_json(out)
    else:
        print(f"dismissed {out['proposal']}" if out["changed"] else f"{out['proposal']} was dismissed already")
    return 0
