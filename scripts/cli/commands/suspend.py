"""``org suspend [--force]``: stop the org and mark it suspended; ``org resume`` continues it."""
from __future__ import annotations

from scripts.cli.commands import stop as _stop

NAME = "suspend"
HELP = "suspend the org (processes stop, state is kept); 'org resume' continues every run"
add_arguments = _stop.add_arguments


def run(args) -> int:
    from roles.supervisor import control
    from scripts.cli.output import emit_json, home_of

    result = control.request(home_of(args).require(), "suspend", force=args.force, timeout_s=args.timeout)
    if args.json:
        emit_json(result)
    else:
        print(f"org {result['status']} in {result['stopped_ms'] / 1000:.2f}s; continue with 'org resume'")
    return 0
