"""``python -m roles.supervisor.main --home H``: the supervisor process itself."""
from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    # The role template is this process, forked once it has imported what both need (and built
    # org.toml's validators) and before it reads its arguments or opens anything; then the
    # template imports the rest of the roles' code while this process imports its own few
    # modules and opens the org (two cores: the two overlap). Closed again if org.toml says
    # [supervisor] spawn = "exec", or if this supervisor does not get to run.
    from roles.supervisor.template import COMMON, open_files_limit
    open_files_limit()                  # before the template starts: every role inherits it
    forks = launched = None
    if os.environ.get("ORG_SPAWN", "fork") != "exec":
        import importlib
        for name in COMMON:
            importlib.import_module(name)
        from roles.supervisor.forkserver import build_validators
        from roles.supervisor.template import launch
        build_validators()
        launched = launch(sys.executable, fork=True)
    import argparse
    from pathlib import Path
    parser = argparse.ArgumentParser(prog="python -m roles.supervisor.main")
    parser.add_argument("--home", required=True, help="org home")
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        if launched is not None:        # --help or a bad argument: the template ends here too
            launched[1].close()
            launched[0].kill()
            launched[0].wait()
        raise
    from state_db.kernel.errors import OrgError
    if launched is not None:
        from roles.supervisor.forkserver import ForkServer
        forks = ForkServer(sys.executable)
        forks.adopt(*launched)
    from roles.supervisor.supervisor import Supervisor
    from state_db.bootstrap import init_home
    from state_db.kernel.home import OrgHome
    from state_db.kernel.logsetup import configure

    home = OrgHome(Path(args.home))
    try:
        cfg, _ = init_home(home)
        configure(home.logs_dir, "supervisor", "supervisor", max_bytes=cfg.logs.max_bytes,
                  backups=cfg.logs.backups)
        instances = None
        if cfg.hosts.coordinator:                  # a joined host runs the instances it joined with
            from roles.supervisor import hosts
            instances = hosts.specs(hosts.joined_names(home))
        supervisor, forks = Supervisor(home, cfg, forks=forks, instances=instances), None
        return supervisor.run()
    except OrgError as exc:          # an expected failure: one line
        print(exc.line(), file=sys.stderr)
        return 1
    finally:
        if forks is not None:        # never handed over
            forks.close()


if __name__ == "__main__":
    sys.exit(main())
