"""The ``org`` command line: thin commands over the library; expected failures are one line.

Each command lives in ``scripts/cli/commands/<name>.py`` with ``NAME``, ``HELP``,
``add_arguments(parser)`` and ``run(args) -> exit code``. An expected error (an ``OrgError``,
the root every package's errors share) prints ``error[code]: what happened — what to do`` and
exits non-zero, never a traceback; anything else is a bug, logged with its traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import traceback

from state_db.kernel.errors import OrgError

EXIT_OK = 0
EXIT_ERROR = 1         # an expected failure with a code
EXIT_USAGE = 2         # bad command-line arguments
EXIT_INTERNAL = 70     # a bug: the traceback goes to logs/cli.log

# module names under scripts/cli/commands (each module's NAME is the command: continue_run -> continue)
COMMANDS = ["status", "submit", "show", "cancel", "continue_run", "decisions", "decide", "diff", "export", "logs",
            "ping", "chat", "candidates", "skills", "knowledge", "suspend", "resume", "stop", "doctor", "config", "gc",
            "dashboard", "watch", "mcp", "schedule", "trigger", "discover", "migrate_store", "hosts", "join",
            "git_shell", "dismiss", "apply", "cost", "revert"]


class UsageError(OrgError):
    code = "bad_arguments"


class Parser(argparse.ArgumentParser):
    """argparse that reports bad arguments as one coded line instead of usage + exit."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise UsageError(f"{message} — see '{self.prog} --help'")


def build_parser() -> Parser:
    parser = Parser(prog="org", description="Run and inspect a loop-org organisation of agents.")
    parser.add_argument("--home", help="org home (default: $ORG_HOME, else .org/ beside the project)")
    from scripts.cli.version import version
    parser.add_argument("--version", action="version", version=f"loop-org {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMANDS:
        module = importlib.import_module(f"scripts.cli.commands.{name}")
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run, _raw=getattr(module, "raw_output", None))
    return parser


def format_error(exc: OrgError) -> str:
    """The error's one line, its agent-written parts (a path, a question) shown as text."""
    from state_db.text import visible
    return visible(exc.line())


# options whose value is a CURVE key: 40 Z85 characters, which may begin with "-"
KEY_OPTIONS = ("--coordinator-key",)
KEY_LENGTH = 40


def _keys_joined(argv: list[str]) -> list[str]:
    """``--coordinator-key KEY`` as ``--coordinator-key=KEY``: a Z85 key may begin with "-", and
    argparse takes a separate value that begins with "-" for an option of its own."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in KEY_OPTIONS and i + 1 < len(argv) and len(argv[i + 1]) == KEY_LENGTH:
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (``sys.exit`` happens in ``run``)."""
    from state_db.kernel.home import require_linux

    args_given = sys.argv[1:] if argv is None else list(argv)
    if args_given[:1] == ["git-shell"]:      # sshd's forced command: once per fetch or push, so fast
        from scripts.cli.commands.git_shell import fast
        return fast(args_given[1:])

    try:
        require_linux()
        parser = build_parser()
        args = parser.parse_args(_keys_joined(args_given))
        _quiet_logs(getattr(args, "home", None))
        if not getattr(args, "_run", None):
            parser.print_help()
            return EXIT_USAGE
        from scripts.cli.output import RAW_COMMANDS, shown
        raw = args.command in RAW_COMMANDS or bool(args._raw and args._raw(args))
        with shown(raw=raw):
            return int(args._run(args) or 0)
    except UsageError as exc:
        print(format_error(exc), file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:        # argparse's --help (and nothing else) exits from inside parse_args
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except KeyboardInterrupt:
        print("error[interrupted]: stopped by Ctrl-C", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except OrgError as exc:          # every expected error: one line
        print(format_error(exc), file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - anything else is a bug: the one place that says so
        _log_internal(exc)
        from state_db.text import visible
        print(visible(f"error[internal]: {type(exc).__name__}: {exc} — this is a bug; details in logs/cli.log"),
              file=sys.stderr)
        return EXIT_INTERNAL


def _quiet_logs(home_arg) -> None:
    """Library logs of CLI commands go to logs/cli.log (or nowhere), never onto the terminal."""
    import logging

    from state_db.kernel.home import resolve_home
    from state_db.kernel.logsetup import configure
    home = resolve_home(home_arg)
    if home.logs_dir.is_dir():
        configure(home.logs_dir, "human", "cli")
    else:
        configure(None, "human", "cli")
        logging.getLogger().setLevel(logging.CRITICAL)


def _log_internal(exc: BaseException) -> None:
    try:
        from state_db.kernel.home import resolve_home
        home = resolve_home()
        if home.logs_dir.is_dir():
            with open(home.logs_dir / "cli.log", "a") as f:
                f.write("".join(traceback.format_exception(exc)))
    except Exception:
        pass


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
