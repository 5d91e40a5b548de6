"""The hosts of an org over tcp, as the human's commands: ``org hosts`` (list, remove) and the
store's half of ``org join`` (is the coordinator the one this host was told of, which instance
names it gets). Reads are read-only connections; the one write (forgetting a host that left) is
the human's. Starting the joined host's supervisor is the CLI's side, as for ``org resume``.
"""
from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass

from roles.operations import Result, human_writer
from state_db.kernel.config import Config
from state_db.connection import connect
from state_db.kernel.errors import Conflict, JoinError
from state_db.kernel.home import OrgHome
from state_db.queries import peers as peer_q
from state_db.queries.processes import role_instances
from state_db.vocab import Actor

FIRST_JOINED = 50          # a joined host's numbers: the coordinator host's own stay free for it to grow into
LAST_JOINED = 99


@dataclass(frozen=True)
class Hosts(Result):
    """``org hosts``: every registered instance with its host, status and heartbeat age, and
    what a new host joins with (the coordinator's endpoint, CURVE key and git url)."""

    peers: tuple[dict, ...]
    coordinator_key: str | None
    coordinator: str | None
    git_url: str | None


@dataclass(frozen=True)
class Forgotten(Result):
    """``org hosts remove HOST``: the instances of the host that were forgotten."""

    host: str
    instances: tuple[str, ...]


@dataclass(frozen=True)
class Joining(Result):
    """The store's answer to a host joining: the names its instances of ``role`` run as, and
    how many eval-agents the org has registered."""

    role: str
    names: tuple[str, ...]
    eval_agents: int


def listing(home: OrgHome, *, now: float | None = None) -> Hosts:
    """The registered instances of the org at ``home``, by host."""
    conn = connect(home.require().db_path, readonly=True)
    try:
        peers = peer_q.all_peers(conn)
        roles = {r.instance: r for r in role_instances(conn)}
    finally:
        conn.close()
    now = time.time() if now is None else now
    rows = tuple({**p.public(), "status": roles[p.instance].status if p.instance in roles else "unknown",
                  "heartbeat_s_ago": round(now - roles[p.instance].heartbeat_at, 1)
                  if p.instance in roles and roles[p.instance].heartbeat_at else None} for p in peers)
    coordinator = next((p for p in peers if p.instance == "coordinator"), None)
    return Hosts(rows, coordinator.curve_public if coordinator else None,
                 coordinator.endpoint if coordinator else None, coordinator.git_url if coordinator else None)


def forget(home: OrgHome, host: str, *, via: str | None = None) -> Forgotten:
    """Remove a host's rows (a machine that left for good), as the human; its runs were requeued
    already when its heartbeats lapsed.

    Raises:
        Conflict: no such host is registered.
    """
    writer = human_writer(home.require().db_path, via)
    try:
        with writer.transaction() as tx:
            gone = [p.instance for p in peer_q.of_host(tx.conn, host)]
            for name in gone:
                tx.delete("peers", name)
    finally:
        writer.close()
    if not gone:
        raise Conflict(f"no host {host!r} is registered", hint="see 'org hosts'")
    return Forgotten(host, tuple(gone))


def check_coordinator(conn, cfg: Config) -> peer_q.Peer:
    """The coordinator a host joins (``cfg``'s [hosts] coordinator and coordinator_key) is the
    one registered in the store at ``conn``: the same endpoint and key.

    Raises:
        JoinError: no coordinator registered yet, or another one.
    """
    try:
        found = peer_q.peer(conn, "coordinator")
    except sqlite3.Error as exc:        # the store's errors (PostgreSQL's too) come as sqlite3's
        raise JoinError(f"the store holds no org hosts ({str(exc).splitlines()[0]})",
                        hint="start the org on the coordinator host first, on this store, with this "
                             "version of loop-org") from None
    if found is None:
        raise JoinError("no coordinator is registered in the store",
                        hint="start the org on the coordinator host first, with a tcp endpoint "
                             "([transport] endpoint) and this PostgreSQL store")
    if found.curve_public != cfg.hosts.coordinator_key:
        raise JoinError(f"the coordinator registered in the store has key {found.curve_public}, "
                        f"not {cfg.hosts.coordinator_key}",
                        hint="check --coordinator-key against 'org hosts' on the coordinator host")
    if found.endpoint != cfg.hosts.coordinator:
        raise JoinError(f"the coordinator registered in the store listens at {found.endpoint}, "
                        f"not {cfg.hosts.coordinator}", hint="check --coordinator")
    return found


def allocate(conn, role: str, count: int, mine: list[str]) -> list[str]:
    """Names for ``count`` instances of ``role`` on a joining host: the ones of that role it had
    (``mine``, from its own earlier join), then the lowest numbers no host uses (from 50 up).

    Raises:
        JoinError: 50..99 are all taken.
    """
    names = [n for n in mine if peer_q.instance_role(n) == role][:count]
    taken = peer_q.taken_names(conn, role)
    n = FIRST_JOINED
    while len(names) < count:
        name = f"{role}-{n}"
        if name not in taken and name not in names:
            names.append(name)
        n += 1
        if n > LAST_JOINED:
            raise JoinError(f"no free {role} names left (50..99 are taken)",
                            hint="remove hosts that left with 'org hosts remove HOST'")
    return names


def join(store, cfg: Config, role: str = "", count: int = 0, mine: list[str] | None = None) -> Joining:
    """The store's half of ``org join``, read-only: check the coordinator ``cfg`` names against
    the store at ``store`` (a URL or path), then pick ``count`` names for ``role`` (none with
    ``count=0``: a first look, before the home is written).

    Raises:
        JoinError: another coordinator, none yet, or no free names.
    """
    conn = connect(store, readonly=True)
    try:
        check_coordinator(conn, cfg)
        evals = sum(1 for p in peer_q.all_peers(conn) if p.role == Actor.EVAL_AGENT)
        names = allocate(conn, role, count, mine or []) if count else []
    finally:
        conn.close()
    return Joining(role, tuple(names), evals)
