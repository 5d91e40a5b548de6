"""``org submit``: give the org a goal, a workspace and the commands that verify it."""
from __future__ import annotations

import sys

from roles.operations.caps import NO_FLAGS, given as given_caps, line as caps_line
from roles.operations.submit import SubmitRequest, Submitted, check_script, submit
from state_db.queries.work import Caps
from scripts.cli.output import add_json, emit_json, home_of
from state_db.kernel.config import load_config

NAME = "submit"
HELP = "submit a work item: a goal, a workspace, and verify commands that exit 0 when it is met"


def add_arguments(p) -> None:
    p.add_argument("goal", help="what must be true when the work is done")
    p.add_argument("--workspace", required=True, help="the directory the agent works in")
    p.add_argument("--verify", action="append", default=[], metavar="CMD",
                   help="a command that exits 0 when the goal is met (repeatable); run by the eval-agent")
    p.add_argument("--protect", action="append", default=[], metavar="GLOB",
                   help="more files the agent may not change to pass, added to the usual test files "
                        "(globs; ** spans folders)")
    p.add_argument("--no-default-protect", action="store_true",
                   help="protect only the --protect globs, not the usual test files")
    p.add_argument("--scope", action="append", default=[], metavar="GLOB",
                   help="widen the change scope: changes to matching files reach the checks too (repeatable; by "
                        "default only edits to existing code and new code files in existing packages do)")
    caps = p.add_argument_group("caps", "a flag sets the cap it names; every other cap keeps its default "
                                        "([caps] in org.toml, else the built-in one)")
    caps.add_argument("--max-iterations", type=int, help="hard cap on iterations")
    caps.add_argument("--budget-tokens", type=int, help="hard cap on tokens")
    caps.add_argument("--budget-usd", type=float, help="hard cap on cost in USD")
    caps.add_argument("--timeout", type=float, help="hard cap on working time in seconds")
    for name, flag in NO_FLAGS.items():
        caps.add_argument(flag, dest="no_" + name, action="store_true",
                          help=f"no {name.replace('_', ' ')} cap at all (instead of the default)")
    p.add_argument("--backend", help="anthropic | command | scripted:FILE (default from org.toml)")
    p.add_argument("--ladder", metavar="MODEL[,MODEL...]",
                   help="models, weakest first: when repeated_failure or no_progress would stop the run, it goes on "
                        "with the next one within the same caps (default: [loop] ladder in org.toml)")
    p.add_argument("--worktree", action="store_true", help="work in a new git worktree and branch of the workspace")
    p.add_argument("--review", metavar="CRITERIA",
                   help="after the verify commands pass, a model reviews the change against the goal and these "
                        "criteria and may veto it (default: [review] criteria in org.toml)")
    p.add_argument("--no-review", action="store_true",
                   help="no model review of passing changes (by default one reviews every pass wherever a review "
                        "model can be reached)")
    p.add_argument("--verify-hidden", metavar="DIR",
                   help="held-out checks: a folder outside the workspace whose files (laid out as in the "
                        "workspace) are copied into each verification's snapshot only, never shown to the doer "
                        "(default: [verify] hidden in org.toml)")
    p.add_argument("--no-wait", action="store_true",
                   help="return at once instead of waiting for the verify commands' preflight on the baseline")
    p.add_argument("--wait-timeout", type=float, default=120.0, metavar="S",
                   help="seconds to wait for the preflight (default 120)")
    p.add_argument("--idempotency-key", help="the same key twice submits once (default: a fresh key)")
    add_json(p)


def check_scripted_backend(spec: str | None) -> None:
    """A ``scripted:FILE`` backend's script is checked where the human's input arrives
    (``roles.operations.submit.check_script``)."""
    check_script(spec)


def caps_of(args) -> Caps:
    """The caps the flags give (``--max-iterations`` ... ``--timeout``; ``--no-*`` removes one), as
    the one ``Caps`` every operation takes. Raises CapsError (``bad_caps``)."""
    values = {"max_iterations": args.max_iterations, "budget_tokens": args.budget_tokens,
              "budget_usd": args.budget_usd, "timeout_s": args.timeout}
    return given_caps(values, tuple(k for k in NO_FLAGS if getattr(args, "no_" + k, False)))


def request_of(args) -> SubmitRequest:
    return SubmitRequest(
        goal=args.goal, workspace=args.workspace, verify=args.verify, protect=args.protect,
        default_protect=not args.no_default_protect, scope=args.scope, caps=caps_of(args),
        backend=args.backend, ladder=None if args.ladder is None else tuple(m.strip() for m in args.ladder.split(",")),
        worktree=args.worktree, review=args.review, no_review=args.no_review,
        idempotency_key=args.idempotency_key, verify_hidden=args.verify_hidden)


def run(args) -> int:
    home = home_of(args).require()
    cfg = load_config(home)
    check_scripted_backend(args.backend)
    result = submit(home, cfg, request_of(args), wait_s=0.0 if args.no_wait else max(0.0, args.wait_timeout))
    preflight = result.preflight
    if args.json:
        emit_json(result.as_data())
        return 0 if not preflight or preflight.outcome != "unrunnable" else 3
    print(text(result))
    if preflight is not None and preflight.outcome == "unrunnable":
        print(f"error[verify_unrunnable]: {preflight.detail}", file=sys.stderr)
        print(f"  {result.id} ended before any model call; nothing was spent")
        return 3
    print(f"  follow it: org show {result.id}")
    return 0


def text(result: Submitted) -> str:
    """The lines ``org submit`` prints for ``result`` (the preflight's outcome included)."""
    lines = [f"{'already submitted' if result.replayed else 'submitted'} {result.id} ({result.status})",
             f"  caps: {caps_line(result.caps)}"]
    if result.org_status != "running":
        start = "'org resume'" if result.org_status in ("suspending", "suspended", "stopped") else "'scripts/start-org'"
        lines.append(f"  the org is {result.org_status}: nothing runs until {start}")
    if result.waiting_for:
        lines.append(f"  waiting: the workspace is busy with {result.waiting_for} (use --worktree to work in parallel)")
    if result.wake not in ("push", "outbox"):
        lines.append(f"  the coordinator was not reached ({result.wake}); it picks the item up when the org runs")
    preflight = result.preflight
    if preflight is not None and preflight.outcome != "unrunnable":
        lines.append(f"  preflight: {preflight.detail}")
        if preflight.outcome == "already_passes":
            lines.append("  every check passes already: decide whether to go on with 'org decisions' / 'org decide'")
    return "\n".join(lines)
