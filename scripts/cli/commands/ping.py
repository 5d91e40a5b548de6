"""``org ping [INSTANCE...]``: ping role instances through the transport and show round trips."""
from __future__ import annotations

from scripts.cli.output import add_json, emit_json, home_of, table

NAME = "ping"
HELP = "ping role instances over the transport (push, or the outbox) and show their answers"


def add_arguments(p) -> None:
    p.add_argument("instances", nargs="*", help="instances to ping (default: every configured one)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for answers")
    add_json(p)


def run(args) -> int:
    from roles.supervisor.ping import ping_all
    from state_db.kernel import config as config_mod

    home = home_of(args).require()
    cfg = config_mod.load_config(home)
    rows = ping_all(home, cfg, args.instances or None, timeout_s=args.timeout)
    if args.json:
        emit_json(rows)
    else:
        print(table([[r["instance"], r["result"]] for r in rows], ["INSTANCE", "RESULT"]))
    return 0 if all(r["ms"] is not None for r in rows) else 1
