"""``org resume``: start the org again after suspend, stop or a crash of anything."""
from __future__ import annotations

from scripts.cli.output import add_json, emit_json, home_of

NAME = "resume"
HELP = "start the org again (after suspend, stop or a crash); runs continue from their last iteration"


def add_arguments(p) -> None:
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for every role to be ready")
    add_json(p)


def run(args) -> int:
    from roles.supervisor import control
    from state_db.bootstrap import init_home

    home = home_of(args).require()
    init_home(home)
    running = control.supervisor_alive(home)
    result = {"already_running": bool(running)}
    if not running:
        result.update(control.start_background(home, timeout_s=args.timeout))
    if args.json:
        emit_json(result)
    elif running:
        print(f"the org is already running (supervisor pid {running[0]})")
    else:
        print(f"org resumed in {result['ready_ms'] / 1000:.2f}s ({len(result['roles'])} roles ready)")
    return 0
