"""``org stop [--force]``: stop every process of the org (graceful, then forced after a timeout)."""
from __future__ import annotations

from scripts.cli.output import add_json, emit_json, home_of

NAME = "stop"
HELP = "stop the org: roles finish their step and exit; --force kills them at once"
INTENT = "stop"


def add_arguments(p) -> None:
    p.add_argument("--force", action="store_true", help="kill at once instead of waiting for a safe boundary")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the supervisor to finish")
    add_json(p)


def run(args) -> int:
    from roles.supervisor import control

    result = control.request(home_of(args).require(), INTENT, force=args.force, timeout_s=args.timeout)
    if args.json:
        emit_json(result)
    else:
        print(f"org {result['status']} in {result['stopped_ms'] / 1000:.2f}s"
              + (" (no supervisor was running; leftover roles stopped)" if result["supervisor"] == "absent" else ""))
    return 0
