"""``org schedule``: standing orders on a timer — at each tick the coordinator submits a work item.

    org schedule add NAME --every 30m | --cron "0 9 * * 1-5" -- <org submit arguments>
    org schedule list | show NAME | pause NAME | resume NAME | remove NAME

The submit arguments are parsed by ``org submit``'s own parser and checked as ``org submit``
checks them, when the schedule is made. ``org trigger`` shares the read and change commands.
"""
from __future__ import annotations

import argparse
import time

from scripts.cli.output import add_json, emit_json, home_of, print_unsent, read_conn, table
from state_db.vocab import TIMER_KINDS

NAME = "schedule"
HELP = "standing orders on a timer: submit a work item every N minutes or on a cron expression"
VERBS = ("pause", "resume", "remove")


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p),
                           help="add | list | show | pause | resume | remove")
    add = sub.add_parser("add", help="make a schedule: a rule, then -- and the arguments of 'org submit'",
                         description="make a schedule: a rule, then -- and the arguments of 'org submit'")
    add.add_argument("name", help="a plain name (letters, digits, - _ .)")
    add_rule_options(add)
    add_submit_tail(add)
    add_common(sub, "schedule")


def add_rule_options(p) -> None:
    rule = p.add_mutually_exclusive_group()
    rule.add_argument("--every", metavar="DURATION", help="a period: 30s, 10m, 1h30m, 1d")
    rule.add_argument("--cron", metavar="EXPR", help='a cron expression in local time, e.g. "0 9 * * 1-5"')


def add_submit_tail(p) -> None:
    p.add_argument("--idempotency-key", dest="order_key", help="the same key twice makes one order")
    add_json(p)
    p.add_argument("submit", nargs=argparse.REMAINDER, metavar="-- SUBMIT-ARGS",
                   help="what 'org submit' takes: GOAL --workspace DIR --verify CMD [caps, --backend ...]")


def split_options(args, add_options) -> None:
    """Options written after NAME arrive in ``args.submit`` with the submit arguments (argparse
    hands everything after the first positional to the remainder): parse those before ``--`` with
    the same options, and leave the submit arguments."""
    from scripts.cli.main import Parser
    rest = list(args.submit or [])
    head, tail = (rest[:rest.index("--")], rest[rest.index("--") + 1:]) if "--" in rest else (rest, [])
    parser = Parser(prog=f"org {args.command} add NAME")
    add_options(parser)
    parser.add_argument("--idempotency-key", dest="order_key")
    parser.add_argument("--json", action="store_true")
    late = parser.parse_args(head)
    for key, value in vars(late).items():
        if value not in (None, False):
            setattr(args, key, value)
    args.submit = tail


def add_common(sub, what: str) -> None:
    """list / show / pause / resume / remove, for schedules and triggers alike."""
    ls = sub.add_parser("list", help=f"every {what} with its rule, state and counts",
                        description=f"every {what} with its rule, state and counts")
    ls.add_argument("--all", action="store_true", help="removed ones too")
    add_json(ls)
    show = sub.add_parser("show", help=f"one {what}: its rule, request, counts and the work it started",
                          description=f"one {what}: its rule, request, counts and the work it started")
    show.add_argument("name", help="its name (or id)")
    add_json(show)
    for verb in VERBS:
        v = sub.add_parser(verb, help=f"{verb} a {what}", description=f"{verb} a {what} (a durable write)")
        v.add_argument("name", help="its name (or id)")
        add_json(v)


def submit_request(argv: list[str]):
    """Parse ``argv`` with ``org submit``'s parser into a submit request (UsageError when bad)."""
    from scripts.cli.commands import submit as submit_cmd
    from scripts.cli.main import Parser, UsageError

    if not argv:
        raise UsageError("no submit arguments — add: -- \"GOAL\" --workspace DIR --verify CMD")
    parser = Parser(prog="org submit")
    submit_cmd.add_arguments(parser)
    args = parser.parse_args(argv)
    submit_cmd.check_scripted_backend(args.backend)
    return submit_cmd.request_of(args), argv


def run(args) -> int:
    if args.action == "add":
        from roles.operations.schedules import check_cron, parse_duration
        from scripts.cli.main import UsageError
        split_options(args, add_rule_options)
        if (args.every is None) == (args.cron is None):
            raise UsageError("give one rule: --every DURATION or --cron EXPR — see 'org schedule add --help'")
        if args.every is not None:
            kind, rule = "every", {"every_s": parse_duration(args.every)}
        else:
            kind, rule = "cron", {"cron": check_cron(args.cron)}
        return run_add(args, kind, rule)
    return run_common(args, TIMER_KINDS, "schedule")


def run_add(args, kind: str, rule: dict) -> int:
    from roles.operations.schedules import add
    from state_db.kernel import config as config_mod

    req, argv = submit_request(args.submit)
    home = home_of(args).require()
    cfg = config_mod.load(home.config_path if home.config_path.exists() else None)
    result = add(home, cfg, name=args.name, kind=kind, rule=rule, req=req, argv=argv,
                 idempotency_key=args.order_key)
    if args.json:
        emit_json(result)
        return 0
    what = "schedule" if kind in TIMER_KINDS else "trigger"
    print(f"{'already made' if result['replayed'] else 'made'} {what} {result['name']} ({result['id']})")
    if result["next_due"] is not None:
        print(f"  next tick: {_when(result['next_due'])}")
    print_unsent(result["wake"], "it starts ticking when the org runs")
    return 0


def run_common(args, kinds: tuple[str, ...], what: str) -> int:
    if args.action is None:
        from scripts.cli.main import UsageError
        raise UsageError(f"say what to do — org {what} add | list | show | pause | resume | remove")
    if args.action == "list":
        return _list(args, kinds, what)
    if args.action == "show":
        return _show(args, kinds, what)
    from roles.operations.schedules import change
    from state_db.kernel import config as config_mod
    home = home_of(args).require()
    cfg = config_mod.load(home.config_path if home.config_path.exists() else None)
    result = change(home, cfg, args.name, args.action, kinds=kinds)
    if args.json:
        emit_json(result)
        return 0
    state = "already " + result["status"] if result.get("unchanged") else result["status"]
    print(f"{what} {result['name']}: {state}")
    print_unsent(result["wake"], "the coordinator sees it when the org runs")
    return 0


def _list(args, kinds, what: str) -> int:
    from roles.operations.schedules import describe
    from state_db.queries import schedules as q
    conn = read_conn(args)
    try:
        orders = q.listing(conn, kinds, removed=args.all)
        rows = [_view(o, q.work_status(conn, o.last_work_id)) for o in orders]
    finally:
        conn.close()
    if args.json:
        emit_json(rows)
        return 0
    if not rows:
        print(f"no {what}s — make one with 'org {what} add NAME ...'")
        return 0
    print(table([[r["name"], describe(r["kind"], r["rule"]), r["status"], _when(r["next_due"]) if r["next_due"] else "",
                  r["fired"], r["skipped_busy"] + r["skipped_spend"], _last(r)] for r in rows],
                ["NAME", "RULE", "STATE", "NEXT", "FIRED", "SKIPPED", "LAST ITEM"]))
    return 0


def _show(args, kinds, what: str) -> int:
    from roles.operations.schedules import describe
    from state_db.kernel.errors import NotFound
    from state_db.queries import schedules as q
    conn = read_conn(args)
    try:
        order = q.find(conn, args.name)
        if order is None or order.kind not in kinds:
            raise NotFound(f"no {what} named {args.name!r}", code="no_such_schedule",
                           hint=f"'org {what} list' shows them")
        view = _view(order, q.work_status(conn, order.last_work_id))
        view["started"] = q.started_by(conn, order.id)
    finally:
        conn.close()
    if args.json:
        emit_json(view)
        return 0
    print(f"{what} {view['name']} ({view['id']}): {view['status']}, {describe(view['kind'], view['rule'])}")
    print(f"  submits: org submit {' '.join(_quote(a) for a in view['argv'])}")
    print(f"  workspace: {view['request']['workspace']}")
    print(f"  signed: {view['actor']}; made by {view['created_by']} at {_when(view['created_at'])}")
    if view["next_due"]:
        print(f"  next {'tick' if view['kind'] in TIMER_KINDS else 'check'}: {_when(view['next_due'])}")
    if view["kind"] == "discover":
        scan = view["watch"].get("scan")
        print(f"  scans: {view['watch'].get('scans', 0)}" + (
            f"; the last at {_when(scan['at'])} found {scan['found']}, proposes {', '.join(scan['proposed']) or 'nothing'}"
            " ('org discover list')" if scan else ""))
    elif view["kind"] not in TIMER_KINDS:
        w = view["watch"]
        print(f"  watching: {'last seen ' + str(w['seen'])[-12:] if w.get('seen') else 'the first look is to come'}"
              f"{', a change settling' if w.get('pending') else ''}; the org's own changes passed over: "
              f"{w.get('ignored', 0)}")
    merged = "missed ticks" if view["kind"] in TIMER_KINDS else "changes"
    print(f"  fired {view['fired']}, skipped while busy {view['skipped_busy']}, skipped by the daily cap "
          f"{view['skipped_spend']}, {merged} taken into another {view['coalesced']}")
    if view["last_skip"]:
        print(f"  last skip: {view['last_skip']}")
    for item in view["started"]:
        print(f"  {item['id']}  {item['status']}{' ' + item['stop_reason'] if item['stop_reason'] else ''}"
              f"  {_when(item['created_at'])}")
    return 0


def _view(order, last_status: str | None) -> dict:
    from roles.operations.schedules import due
    view = order.encode()
    view["actor"] = order.actor
    view["last_work_status"] = last_status
    view["next_due"] = due(order)           # a schedule's next tick, a periodic trigger's next check
    return view


def _last(r: dict) -> str:
    return f"{r['last_work_id']} ({r['last_work_status']})" if r["last_work_id"] else ""


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _quote(arg: str) -> str:
    import shlex
    return shlex.quote(arg)

