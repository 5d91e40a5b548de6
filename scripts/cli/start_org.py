"""``scripts/start-org``: prepare the org home, start the org in the background, report.

Usage: ``scripts/start-org [--demo] [--foreground] [--home DIR] [--timeout S]``.
"""
from __future__ import annotations

import argparse
import sys

from state_db.kernel.errors import OrgError
from state_db.store import describe


class _Parser(argparse.ArgumentParser):
    """Bad arguments are one coded line, as in the ``org`` CLI, not argparse's usage and exit 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise OrgError(message, code="bad_arguments", hint=f"see '{self.prog} --help'")


def parse(argv):
    p = _Parser(prog="scripts/start-org",
                description="Set up (once) and start the org in the background.")
    p.add_argument("--home", help="org home (default: $ORG_HOME, else .org/ beside the project)")
    p.add_argument("--demo", nargs="?", const="fix", choices=("fix", "learning"),
                   help="run a bundled offline demo end to end: fix (default) a failing test, or learning "
                        "(similar jobs until a skill candidate batch opens)")
    p.add_argument("--foreground", action="store_true", help="run the supervisor in this terminal")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for every role to be ready")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from scripts import control
    from state_db.bootstrap import init_home
    from state_db.kernel.home import resolve_home

    try:
        args = parse(argv)
        home = resolve_home(args.home)
        cfg, migration = init_home(home)
        if not args.foreground:
            from state_db.kernel.logsetup import configure
            configure(home.logs_dir, "human", "cli")
        if migration["applied"]:
            where = describe(home.store_url) if home.store_url else home.db_path
            print(f"state.db ready at {where} (schema {migration['to']}"
                  + (f"; backup {migration['backup']}" if migration["backup"] else "") + ")")
        if args.foreground:
            from roles.supervisor.supervisor import Supervisor
            from state_db.kernel.logsetup import configure
            configure(home.logs_dir, "supervisor", "supervisor", stderr=True)
            return Supervisor(home, cfg).run()
        running = control.supervisor_alive(home)
        if args.demo == "learning" and running:
            from scripts.demo.run import restart_for_learning
            running = restart_for_learning(home, running)
        env = None
        if args.demo and not running:
            from roles.workbench.sandbox import bubblewrap, unsandboxed_allowed
            if bubblewrap() is None and not unsandboxed_allowed(cfg):
                # the offline demo may run its known script unsandboxed, and says so
                env = {"ORG_SANDBOX": "unsandboxed", "ORG_ALLOW_UNSANDBOXED": "true"}
                print("bubblewrap is not installed: this demo org runs agent commands UNSANDBOXED "
                      "(only the bundled demo script); install 'bubblewrap' before real work")
        if args.demo == "learning" and not running:
            from scripts.demo.run import LEARNING_ENV
            env = {**(env or {}), **LEARNING_ENV}
        if running:
            print(f"the org is already running (supervisor pid {running[0]}) in {home.root}")
        else:
            info = control.start_background(home, timeout_s=args.timeout, env=env)
            print(f"org started in {info['ready_ms'] / 1000:.2f}s: " + ", ".join(
                f"{r['instance']} {r['status']}" for r in sorted(info["roles"], key=lambda r: r["instance"])))
        if args.demo:
            from scripts.demo.run import run_demo, run_learning_demo
            return (run_learning_demo if args.demo == "learning" else run_demo)(home, cfg)
        print("next: 'scripts/org status' to look, 'scripts/org logs -f' to follow, 'scripts/org stop' to stop")
        return 0
    except OrgError as exc:          # an expected failure: one line
        print(exc.line(), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
