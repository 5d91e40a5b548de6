"""``org join``: run loop-agents or eval-agents on this machine for an org whose coordinator runs
on another. Joining again with the other role into the same home adds it: the host then runs both
(its supervisor must be stopped first, as it starts the instances it was started with).

This host gets an org home of its own (its own keyring, logs, histories and workspaces), shares
only the PostgreSQL store with the coordinator host, and talks to it over ZeroMQ tcp with CURVE
(roles/supervisor/hosts.py has the design).
"""
from __future__ import annotations

import os

from scripts.cli.main import UsageError
from scripts.cli.output import add_json, emit_json, home_of

NAME = "join"
HELP = ("run role instances on this machine for an org whose coordinator runs on another host "
        "(shared PostgreSQL store; ZeroMQ tcp with CURVE)")


def add_arguments(p) -> None:
    p.add_argument("--coordinator", required=True, metavar="tcp://HOST:PORT",
                   help="the coordinator host's transport base ([transport] endpoint there)")
    p.add_argument("--coordinator-key", required=True, metavar="KEY",
                   help="the coordinator's CURVE public key ('org hosts' on the coordinator host prints it)")
    p.add_argument("--role", required=True, choices=("loop-agent", "eval-agent"),
                   help="what this host runs (join again into the same home with the other role to run both)")
    p.add_argument("--count", type=int, default=1, help="how many instances (default 1)")
    p.add_argument("--listen", required=True, metavar="tcp://HOST:PORT",
                   help="where this host's instances listen (a base: each instance gets a port above it); "
                        "HOST must be an address the other hosts reach")
    p.add_argument("--store", metavar="URL",
                   help="the org's PostgreSQL store, without a password (default: $ORG_STATE_URL)")
    p.add_argument("--store-password-file", metavar="FILE",
                   help="a file whose first line is the store's password ('-': type it at a prompt); "
                        "default: $ORG_STATE_PASSWORD. It is kept in the home's store.pgpass (0600), never in "
                        "org.toml")
    p.add_argument("--name", help="this host's name (default: the machine's hostname)")
    p.add_argument("--foreground", action="store_true", help="run this host's supervisor in this terminal")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the instances to be ready")
    add_json(p)


def _toml(args, store: str, eval_agents: int) -> str:
    lines = ["# a joined host (org join): it runs role instances for the org whose coordinator is below;",
             "# starting, suspending and stopping the org stay the coordinator host's",
             "[state]", f"url = {_q(store)}", "",
             "[transport]", f"endpoint = {_q(args.listen)}", "",
             "[org]", f"eval_agents = {eval_agents}", "",
             "[hosts]", f"coordinator = {_q(args.coordinator)}", f"coordinator_key = {_q(args.coordinator_key)}"]
    if args.name:
        lines.append(f"name = {_q(args.name)}")
    return "\n".join(lines) + "\n"


def _q(text: str) -> str:
    import json
    return json.dumps(text)          # a TOML basic string is a JSON string


def run(args) -> int:
    from roles.operations.hosts import join
    from scripts import control
    from roles.supervisor import hosts
    from state_db.kernel import config as config_mod, credentials
    from state_db import store as store_mod
    from state_db.bootstrap import init_home
    from state_db.kernel.errors import StateError

    if not 1 <= args.count <= 50:
        raise UsageError("--count must be 1..50")
    if args.store:
        credentials.refuse_on_command_line(args.store, "--store")
    store = args.store or os.environ.get("ORG_STATE_URL", "")
    if not store_mod.is_postgres(store):
        raise UsageError("a joined host needs the org's PostgreSQL store: --store postgresql://… (or $ORG_STATE_URL)")
    home = home_of(args)
    password = credentials.password_in(store)
    if password is None:
        password = credentials.password_from(args.store_password_file)
    if home.config_path.exists():
        existing = config_mod.load(home.config_path)
        if not existing.hosts.coordinator:
            raise StateError(f"{home.root} is the home of an org of its own", code="join_refused",
                             hint="join from a home of its own: --home DIR (or $ORG_HOME)")
        if (existing.hosts.coordinator, existing.hosts.coordinator_key) != (args.coordinator, args.coordinator_key):
            raise StateError(f"{home.root} joined the coordinator at {existing.hosts.coordinator} already",
                             code="join_refused", hint="join another org from another home (--home DIR)")
    else:
        if password is not None:        # kept beside org.toml, owner-only; the URL names the file
            home.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            store = credentials.store_password(home.root, store, password)
        probe = config_mod.Config({"state": {"url": store}, "transport": {"endpoint": args.listen},
                                   "hosts": {"coordinator": args.coordinator, "coordinator_key": args.coordinator_key,
                                             "name": args.name or ""}})
        eval_agents = join(store, probe).eval_agents       # read-only: the store's answer, before the home is written
        home.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        credentials.write_private(home.config_path, _toml(args, store, max(1, eval_agents)))
    if home.run_dir.exists() and control.supervisor_alive(home):
        # its supervisor runs the instances it was started with; one of another role is started
        # with the others when it starts again
        raise StateError(f"this host already runs its instances from {home.root}", code="already_running",
                         hint=f"stop them with 'org --home {home.root} stop', then join again: every role this "
                              "home joined with starts")
    cfg, _ = init_home(home)
    mine = hosts.joined_names(home) if hosts.joined_path(home).exists() else []
    names = join(home.db_path, cfg, args.role, args.count, mine).names
    everyone = hosts.write_joined(home, args.role, list(names))
    if args.foreground:
        from roles.supervisor.supervisor import Supervisor
        from state_db.kernel.logsetup import configure
        configure(home.logs_dir, "supervisor", "supervisor", stderr=True)
        return Supervisor(home, cfg, instances=hosts.specs(everyone)).run()
    info = control.start_background(home, timeout_s=args.timeout)
    result = {"home": str(home.root), "host": hosts.host_name(cfg), "instances": everyone, "pid": info["pid"],
              "ready_ms": info["ready_ms"]}
    if args.json:
        emit_json(result)
    else:
        print(f"joined the org at {args.coordinator} as {result['host']}: " + ", ".join(everyone)
              + f" ready in {info['ready_ms'] / 1000:.2f}s")
        print(f"next: 'org --home {home.root} logs -f' to follow them, 'org --home {home.root} stop' to stop them")
    return 0
