"""``org suspend [--force]``: stop the org and mark it suspended; ``org resume`` continues it."""
from __future__ import annotations

from roles.operations.lifecycle import OrgStopped
from scripts.cli.commands import stop as _stop
from scripts.cli.output import emit_json, home_of
from state_db.kernel.home import OrgHome

NAME = "suspend"
HELP = "suspend the org (processes stop, state is kept); 'org resume' continues every run"
add_arguments = _stop.add_arguments


def suspend(home: OrgHome, *, force: bool = False, timeout_s: float = 60.0) -> OrgStopped:
    """Record the suspend durably, then stop every process. Raises LifecycleError, ControlError."""
    return _stop.stop(home, "suspend", force=force, timeout_s=timeout_s)


def run(args) -> int:
    result = suspend(home_of(args), force=args.force, timeout_s=args.timeout)
    if args.json:
        emit_json(result.as_data())
    else:
        print(text(result))
    return 0


def text(result: OrgStopped) -> str:
    return f"org {result.status} in {result.stopped_ms / 1000:.2f}s; continue with 'org resume'"
