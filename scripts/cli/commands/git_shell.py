"""``org git-shell``: sshd's forced command for workers' keys; serves the workspace histories
over ssh:// with the same guards as ``git daemon`` (``roles.workbench.serve.gitshell``).

Not typed by hand: sshd runs it from ``~/.ssh/authorized_keys`` (``org hosts ssh-line KEYFILE``
prints the line) with the client's request in ``SSH_ORIGINAL_COMMAND``. ``scripts.cli.main`` runs
it before building the whole parser (``fast``): it starts once per fetch or push.
"""
from __future__ import annotations

NAME = "git-shell"
HELP = ("sshd's forced command for a worker host's key: serve the workspace histories over ssh "
        "(see 'org hosts ssh-line')")


def add_arguments(p) -> None:
    p.add_argument("--home", dest="shell_home", metavar="HOME",
                   help="the coordinator host's org home whose history/ is served")
    p.add_argument("--host", dest="shell_host", metavar="NAME",
                   help="the joined host this key belongs to: only the histories of the work items it holds or "
                        "held are served, and only the iteration it is about to commit is taken")


def run(args) -> int:
    from roles.workbench.serve.gitshell import serve
    from state_db.kernel.home import resolve_home
    home = resolve_home(getattr(args, "shell_home", None) or getattr(args, "home", None))
    serve(home.root, host=getattr(args, "shell_host", None))       # becomes git; returns only by raising


def fast(argv: list[str]) -> int:
    """``org git-shell [--home HOME]`` with nothing else loaded; expected errors are one line."""
    import sys

    from scripts.cli.main import EXIT_ERROR, EXIT_INTERNAL, EXIT_USAGE, Parser, UsageError
    from state_db.kernel.errors import OrgError
    parser = Parser(prog="org git-shell", description=HELP)
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except UsageError as exc:
        print(exc.line(), file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:          # --help
        return exc.code if isinstance(exc.code, int) else 0
    except OrgError as exc:
        print(exc.line(), file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - a bug: one line to the client all the same
        print(f"error[internal]: {type(exc).__name__}: {exc} — this is a bug in org git-shell",
              file=sys.stderr)
        return EXIT_INTERNAL
