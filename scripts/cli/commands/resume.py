"""``org resume``: start the org again after suspend, stop or a crash of anything."""
from __future__ import annotations

from roles.operations.lifecycle import OrgResumed, prepare_resume
from scripts import control
from scripts.cli.output import add_json, emit_json, home_of
from state_db.kernel.home import OrgHome

NAME = "resume"
HELP = "start the org again (after suspend, stop or a crash); runs continue from their last iteration"


def add_arguments(p) -> None:
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for every role to be ready")
    add_json(p)


def resume(home: OrgHome, *, timeout_s: float = 30.0) -> OrgResumed:
    """The org home is made ready (the operation), then a supervisor starts in the background
    unless one runs. Raises ControlError (it did not become ready in time)."""
    prepare_resume(home)
    running = control.supervisor_alive(home)
    if running:
        return OrgResumed(True, running_pid=running[0])
    started = control.start_background(home, timeout_s=timeout_s)
    return OrgResumed(False, started["pid"], started["ready_ms"], tuple(started["roles"]))


def run(args) -> int:
    result = resume(home_of(args).require(), timeout_s=args.timeout)
    if args.json:
        emit_json(result.as_data())
    else:
        print(text(result))
    return 0


def text(result: OrgResumed) -> str:
    if result.already_running:
        return f"the org is already running (supervisor pid {result.running_pid})"
    return f"org resumed in {result.ready_ms / 1000:.2f}s ({len(result.roles)} roles ready)"
