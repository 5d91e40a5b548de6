"""``org stop [--force]``: stop every process of the org (graceful, then forced after a timeout).

The human's intent is recorded by the operation (roles/operations/lifecycle.py, called by the
supervisor's control module before it signals); the signal and the wait are the supervisor's
control (operations do not reach into a role: the CLI joins the two)."""
from __future__ import annotations

from roles.operations.lifecycle import OrgStopped
from scripts import control
from scripts.cli.output import add_json, emit_json, home_of
from state_db.kernel.home import OrgHome

NAME = "stop"
HELP = "stop the org: roles finish their step and exit; --force kills them at once"
INTENT = "stop"


def add_arguments(p) -> None:
    p.add_argument("--force", action="store_true", help="kill at once instead of waiting for a safe boundary")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the supervisor to finish")
    add_json(p)


def stop(home: OrgHome, intent: str = INTENT, *, force: bool = False, timeout_s: float = 60.0) -> OrgStopped:
    """Stop (or, with ``intent="suspend"``, suspend) the org: the intent is recorded durably, then
    the supervisor is signalled and waited for. Raises LifecycleError, ControlError."""
    return OrgStopped(**control.request(home.require(), intent, force=force, timeout_s=timeout_s))


def run(args) -> int:
    result = stop(home_of(args), force=args.force, timeout_s=args.timeout)
    if args.json:
        emit_json(result.as_data())
    else:
        print(text(result))
    return 0


def text(result: OrgStopped) -> str:
    return (f"org {result.status} in {result.stopped_ms / 1000:.2f}s"
            + (" (no supervisor was running; leftover roles stopped)" if result.supervisor == "absent" else ""))
