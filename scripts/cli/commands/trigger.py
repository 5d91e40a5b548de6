"""``org trigger``: standing orders on an event in a workspace — a new commit on a branch, files
matching a glob changing, the verify commands failing — each starts a work item; or a discovery
scan on a period, whose proposals start only as org.toml's ``discover.auto_start`` allows.

    org trigger add NAME --on git-commit [--branch B] -- <org submit arguments>
    org trigger add NAME --on file-change --glob 'src/**/*.py' [--debounce 2s] -- <org submit arguments>
    org trigger add NAME --on verify-fails [--every 10m] -- <org submit arguments>
    org trigger add NAME --on discover [--every 1h] [--issues FILE] -- <org submit arguments>
    org trigger list | show NAME | pause NAME | resume NAME | remove NAME

The workspace watched is the submit arguments' ``--workspace``; verify-fails runs their
``--verify`` commands.
"""
from __future__ import annotations

from scripts.cli.commands.schedule import (add_common, add_submit_tail, run_add, run_common, split_options,
                                           submit_request)
from state_db.vocab import EVENT_KINDS

NAME = "trigger"
HELP = "standing orders on an event: a new commit, a file change, the verify commands failing, a discovery scan"


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p),
                           help="add | list | show | pause | resume | remove")
    add = sub.add_parser("add", help="make a trigger: an event, then -- and the arguments of 'org submit'",
                         description="make a trigger: an event, then -- and the arguments of 'org submit'")
    add.add_argument("name", help="a plain name (letters, digits, - _ .)")
    add_event_options(add)
    add_submit_tail(add)
    add_common(sub, "trigger")


def add_event_options(p) -> None:
    p.add_argument("--on", metavar="EVENT", help="git-commit | file-change | verify-fails | discover")
    p.add_argument("--branch", help="git-commit: the branch watched (default: the one checked out now)")
    p.add_argument("--glob", help="file-change: the files watched, e.g. 'src/**/*.py' (** spans folders)")
    p.add_argument("--debounce", metavar="DURATION",
                   help="wait until changes have stopped this long, then fire once (default 2s for file-change)")
    p.add_argument("--every", metavar="DURATION",
                   help="verify-fails: how often the checks run (default 10m); discover: how often it scans (default 1h)")
    p.add_argument("--issues", metavar="FILE",
                   help="discover: an issue list to read on each scan (gh issue list --json number,title,body,labels)")


def run(args) -> int:
    if args.action != "add":
        return run_common(args, EVENT_KINDS, "trigger")
    from roles.operations.schedules import ScheduleError, current_branch, parse_duration
    from scripts.cli.main import UsageError
    split_options(args, add_event_options)
    kind = args.on
    if kind is None:
        raise UsageError("say which event: --on git-commit | file-change | verify-fails | discover "
                         "— see 'org trigger add --help'")
    if kind not in EVENT_KINDS:
        raise ScheduleError(f"unknown trigger kind {kind!r}", code="bad_trigger_kind",
                            hint="use --on git-commit, file-change, verify-fails or discover")
    misplaced = {"--branch": args.branch if kind != "git-commit" else None,
                 "--glob": args.glob if kind != "file-change" else None,
                 "--every": args.every if kind not in ("verify-fails", "discover") else None,
                 "--issues": args.issues if kind != "discover" else None,
                 "--debounce": args.debounce if kind == "discover" else None}
    for flag, value in misplaced.items():
        if value is not None:
            raise UsageError(f"{flag} has no meaning with --on {kind} — drop it")
    rule: dict = {}
    if args.debounce is not None:
        rule["debounce_s"] = parse_duration(args.debounce, "--debounce")
    if kind == "git-commit":
        rule["branch"] = args.branch or current_branch(submit_request(args.submit)[0].workspace)
    elif kind == "file-change":
        if not args.glob or not args.glob.strip():
            raise ScheduleError("--on file-change needs --glob", code="bad_trigger",
                                hint="say which files, e.g. --glob 'src/**/*.py'")
        rule["glob"] = args.glob.strip()
        rule.setdefault("debounce_s", 2.0)
    elif kind == "discover":
        rule["every_s"] = parse_duration(args.every or "1h")
        if args.issues is not None:
            rule["issues"] = _issues_file(args.issues)
    else:
        rule["every_s"] = parse_duration(args.every or "10m")
    return run_add(args, kind, rule)


def _issues_file(path: str) -> str:
    """The issue list's absolute path (each scan reads it again), checked to be readable JSON now."""
    from pathlib import Path

    from roles.operations.discover import read_issues
    full = Path(path).expanduser().resolve()
    read_issues(full)                       # DiscoverError: issues_file_missing, bad_issues_file
    return str(full)


