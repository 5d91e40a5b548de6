"""``org hosts``: the machines an org runs on, what each runs, and the key a new host joins with."""
from __future__ import annotations

from scripts.cli.output import add_json, emit_json, home_of, table

NAME = "hosts"
HELP = ("list the hosts of an org over tcp and the coordinator's key to join with; 'remove HOST' forgets one; "
        "'ssh-line KEYFILE' prints the authorized_keys line serving histories to a worker's ssh key")


def add_arguments(p) -> None:
    p.add_argument("action", nargs="?", choices=("list", "remove", "ssh-line"), default="list",
                   help="list (default): the registered instances by host; remove HOST: forget a host that left; "
                        "ssh-line KEYFILE: the ~/.ssh/authorized_keys line that lets a worker host's public key "
                        "fetch and push this home's histories through 'org git-shell', and nothing else")
    p.add_argument("host", nargs="?", help="the host to remove, or the public key file for ssh-line")
    p.add_argument("--host", dest="for_host", metavar="NAME",
                   help="ssh-line: the joined host the key belongs to (its name in 'org hosts'); the key then "
                        "reaches only the histories of the work items that host holds or held")
    p.add_argument("--all-histories", action="store_true",
                   help="ssh-line: a key that reaches every work item's history (an operator's own key, never a "
                        "worker host's)")
    add_json(p)


def run(args) -> int:
    from roles.operations import hosts
    from scripts.cli.main import UsageError

    home = home_of(args).require()
    if args.action == "ssh-line":
        return _ssh_line(home, args.host, args.for_host, args.all_histories)
    if args.action == "remove":
        if not args.host:
            raise UsageError("org hosts remove HOST: which host?")
        gone = hosts.forget(home, args.host)
        print(f"forgot {args.host}: " + ", ".join(gone.instances))
        return 0
    found = hosts.listing(home)
    if args.json:
        emit_json(found.as_dict())
        return 0
    rows = found.peers
    if not rows:
        print("no host is registered: the org runs on one machine over ipc ([transport] endpoint = \"ipc\")")
        return 0
    print(table([[r["host"], r["instance"], r["endpoint"], r["status"],
                  "" if r["heartbeat_s_ago"] is None else f"{r['heartbeat_s_ago']}s"] for r in rows],
                ["HOST", "INSTANCE", "ENDPOINT", "STATUS", "HEARTBEAT"]))
    if found.coordinator_key is not None:
        print(f"\njoin another machine with:\n  org join --coordinator {found.coordinator} "
              f"--coordinator-key '{found.coordinator_key}' --role loop-agent|eval-agent "
              "--listen tcp://THAT_HOST:PORT --store <this org's postgresql:// URL, no password> "
              "--store-password-file FILE")
        if not found.git_url:
            print("  (first set [hosts] git_listen or git_url here: joined loop-agents get their workspaces "
                  "through it, joined eval-agents the checkpoints they verify)")
    return 0


def _ssh_line(home, keyfile: str | None, host: str | None, all_histories: bool) -> int:
    """Print the forced-command line of ``keyfile`` (a worker host's public key), scoped to
    ``host``; a key for every history only when asked for by name."""
    from pathlib import Path

    from roles.workbench.serve.gitshell import authorized_keys_line
    from scripts.cli.main import UsageError
    if not keyfile:
        raise UsageError("org hosts ssh-line KEYFILE: which public key file?")
    if (host is None) == (not all_histories):
        raise UsageError("org hosts ssh-line KEYFILE --host NAME: whose key is it? (or --all-histories for "
                         "an operator's own key, which reaches every work item)")
    try:
        text = Path(keyfile).read_text(errors="replace")
    except OSError as exc:
        raise UsageError(f"cannot read {keyfile}: {exc.strerror}") from None
    org_script = Path(__file__).resolve().parents[2] / "org"
    print(authorized_keys_line([org_script], home.root, text, host))
    return 0
