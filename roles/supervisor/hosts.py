"""An org over several machines: what each host's supervisor registers, and how a host joins.

The coordinator host runs the org as usual with a tcp transport (``[transport] endpoint =
"tcp://HOST:PORT"``) and a PostgreSQL store (``[state] url``); its supervisor registers every
instance it runs in the store's ``peers`` table: where it listens, its CURVE public key and its
HMAC key (``register``). A *joined* host (``org join``) has its own org home, its own keyring and
its own supervisor, which runs only the instances it was given (loop-agents, eval-agents or both),
registers them the same way, and never touches the org session: starting, suspending and
stopping the org stay the coordinator host's.

Every role reaches and authenticates the others through those rows (``transport.peers``): a
connection from a CURVE key nobody registered is refused and counted (``curve_refused``). A
message that cannot be pushed to another host is not written to a file there (the outbox is a
same-host fallback); it is not needed either, because every fact is a row in the shared store and
every role reconciles on its tick.
"""
from __future__ import annotations


from roles.base.instances import InstanceSpec, host_name
from state_db.kernel.config import Config
from state_db.kernel.errors import JoinError
from state_db.kernel.home import OrgHome
from state_db.queries import peers as peer_q
from state_db.queries.peers import instance_role as _role
from state_db.writer import StateWriter


def is_tcp(cfg: Config) -> bool:
    return cfg.transport.endpoint not in ("", "ipc")


def git_url(cfg: Config) -> str:
    """Where joined hosts fetch and push histories: the coordinator host's ``[hosts] git_url``
    (ssh:// through ``org git-shell``, or git://), else ``git://<git_listen>``; empty when it
    serves none. Joined hosts append ``/<work_id>.git``, so a trailing ``/`` is dropped."""
    if cfg.hosts.git_url:
        return cfg.hosts.git_url.rstrip("/")
    return f"git://{cfg.hosts.git_listen}" if cfg.hosts.git_listen else ""


def register(writer: StateWriter, home: OrgHome, cfg: Config, instances: list[str]) -> list[str]:
    """Register ``instances`` (this host's) in the store; returns their names.

    Raises:
        Conflict: a name is registered by another host.
        KeyringError: an instance has no keys (the supervisor issues them at start).
    """
    from roles.base.transport_link import peer_keys
    host, url = host_name(cfg), git_url(cfg)
    rows = peer_keys(home, cfg, instances)
    with writer.transaction() as tx:
        for name, keys in rows.items():
            peer_q.register(tx, instance=name, host=host, role=_role(name), **keys,
                            git_url=url if name == "coordinator" else "")
    return instances


def specs(names: list[str]) -> list[InstanceSpec]:
    return [InstanceSpec(n, _role(n)) for n in names]


# -- a joined host's own record: which instances it runs ----------------------------------------

def joined_path(home: OrgHome):
    return home.root / "joined.json"


def joined_names(home: OrgHome) -> list[str]:
    """The instances this joined host runs (written by ``org join``)."""
    import orjson
    try:
        doc = orjson.loads(joined_path(home).read_bytes())
        return [str(n) for n in doc["instances"]]
    except FileNotFoundError:
        raise JoinError(f"{home.root} has not joined an org", hint="run 'org join' first") from None
    except (ValueError, KeyError, TypeError):
        raise JoinError(f"{joined_path(home)} is not a joined host's record",
                        hint="run 'org join' again") from None


def write_joined(home: OrgHome, role: str, names: list[str]) -> list[str]:
    """Record ``names`` as this host's instances of ``role``, next to those of any other role it
    joined with before (one host may run loop-agents and eval-agents); returns them all."""
    import orjson
    from transport.keys import write_private
    before = joined_names(home) if joined_path(home).exists() else []
    everyone = [n for n in before if _role(n) != role] + list(names)
    roles = sorted({_role(n) for n in everyone})
    write_private(joined_path(home), orjson.dumps({"roles": roles, "instances": everyone}))
    return everyone
