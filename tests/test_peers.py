"""Instances on other hosts, as the transport sees them (transport/peers.py) and as each host's
supervisor registers them (roles/supervisor/hosts.py): a row in the store never replaces a key
this host issued, the HMAC key is never journaled, a name another host holds is refused, and a
host only joins the coordinator it was told of. Over a real store, keyring and CLI."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import zmq

from roles.operations import hosts as ops_hosts
from roles.supervisor import hosts
from state_db.kernel import config as config_mod
from state_db.kernel.errors import Conflict
from state_db.queries import peers as peer_q
from state_db.vocab import Actor
from state_db.writer import StateWriter
from tests.support.org import query
from tests.support.pg import pg_server, pg_url  # noqa: F401 - fixtures
from transport.endpoints import Endpoints
from transport.keys import Keyring, keyring_path
from transport.peers import StorePeers

pytestmark = pytest.mark.timeout(60)


def _row(tx, instance, host, *, hmac=b"\x01" * 32, public=None, endpoint="tcp://10.0.0.7:7350"):
    public = public or zmq.curve_keypair()[0]
    peer_q.register(tx, instance=instance, host=host, role=hosts._role(instance), endpoint=endpoint,
                    curve_public=public.decode(), hmac_key=hmac.hex())
    return public


def test_a_peer_is_known_by_name_and_key_but_never_over_a_key_this_host_issued(org_home):
    ring = Keyring.create(keyring_path(org_home.run_dir))
    mine = ring.issue("coordinator")
    ring.issue_curve("coordinator")
    sup = StateWriter(org_home.db_path, Actor.SUPERVISOR)
    with sup.transaction() as tx:
        remote = _row(tx, "loop-agent-50", "worker-1", hmac=b"\x02" * 32)
        forged = _row(tx, "coordinator", "worker-1", hmac=b"\x03" * 32, endpoint="tcp://10.0.0.7:7200")
    peers = StorePeers(org_home.db_path)
    ring = Keyring.load(keyring_path(org_home.run_dir)).attach_peers(peers)
    assert ring.key_for("loop-agent-50") == b"\x02" * 32
    assert ring.curve_owner(remote) == "loop-agent-50"
    assert ring.curve_keypair("loop-agent-50") == (remote, b"")         # its public key only
    assert ring.key_for("coordinator") == mine                           # the local file wins
    assert ring.curve_owner(forged) is None                              # a row claiming a local name
    assert ring.curve_owner(zmq.curve_keypair()[0]) is None              # nobody's key
    where = Endpoints(org_home.run_dir, tcp_base="tcp://127.0.0.1:7000", peers=peers)
    assert where("loop-agent-50") == "tcp://10.0.0.7:7350"                # where it registered
    assert where("curator") == "tcp://127.0.0.1:7500"                     # unregistered: the base rule
    # the HMAC keys are in the table for the transport, never in the journal
    events = query(org_home, "SELECT data FROM events WHERE kind='peers.registered'")
    assert len(events) == 2 and not any(("02" * 32) in e["data"] or ("03" * 32) in e["data"] for e in events)


def test_a_name_another_host_registered_is_refused_and_a_new_row_is_seen_after_a_refresh(org_home):
    sup = StateWriter(org_home.db_path, Actor.SUPERVISOR)
    with sup.transaction() as tx:
        _row(tx, "loop-agent-50", "worker-1")
    with pytest.raises(Conflict, match="worker-1"):
        with sup.transaction() as tx:
            _row(tx, "loop-agent-50", "worker-2")
    peers = StorePeers(org_home.db_path, min_interval_s=0.0)
    assert peers.get("loop-agent-51") is None
    with sup.transaction() as tx:
        key = _row(tx, "loop-agent-51", "worker-2")
    assert peers.refresh() and peers.owner(key) == "loop-agent-51"
    with pytest.raises(Exception):                     # only a supervisor registers instances
        with StateWriter(org_home.db_path, Actor.LOOP_AGENT, "loop-agent-1").transaction() as tx:
            _row(tx, "loop-agent-52", "worker-3")
    # a host that left is forgotten: its key is refused once what was read is max_age_s old
    aged = StorePeers(org_home.db_path, min_interval_s=0.0, max_age_s=0.0)
    assert aged.owner(key) == "loop-agent-51"
    assert ops_hosts.forget(org_home, "worker-2").instances == ("loop-agent-51",)
    assert aged.owner(key) is None and aged.get("loop-agent-51") is None
    assert ops_hosts.allocate(sup.conn, "loop-agent", 2, []) == ["loop-agent-51", "loop-agent-52"]
    assert ops_hosts.allocate(sup.conn, "loop-agent", 1, ["loop-agent-50"]) == ["loop-agent-50"]
    # a host that joined with loop-agents joins with an eval-agent too: its own numbering
    assert ops_hosts.allocate(sup.conn, "eval-agent", 1, ["loop-agent-50"]) == ["eval-agent-50"]
    assert ops_hosts.allocate(sup.conn, "eval-agent", 2, ["loop-agent-50", "eval-agent-50"]) == ["eval-agent-50",
                                                                                        "eval-agent-51"]


def test_a_home_joined_with_both_roles_keeps_both(org_home):
    assert hosts.write_joined(org_home, "loop-agent", ["loop-agent-50", "loop-agent-51"]) == ["loop-agent-50",
                                                                                              "loop-agent-51"]
    both = hosts.write_joined(org_home, "eval-agent", ["eval-agent-50"])
    assert both == hosts.joined_names(org_home) == ["loop-agent-50", "loop-agent-51", "eval-agent-50"]
    # joining again with a role replaces that role's instances only
    assert hosts.write_joined(org_home, "loop-agent", ["loop-agent-50"]) == ["eval-agent-50", "loop-agent-50"]
    assert [(s.instance, s.role) for s in hosts.specs(hosts.joined_names(org_home))] == [
        ("eval-agent-50", "eval-agent"), ("loop-agent-50", "loop-agent")]


def test_a_host_joins_only_the_coordinator_it_was_told_of(org_home):
    sup = StateWriter(org_home.db_path, Actor.SUPERVISOR)
    told = zmq.curve_keypair()[0].decode()

    def cfg(key, where="tcp://10.0.0.5:7200"):
        return config_mod.Config({"hosts": {"coordinator": where, "coordinator_key": key}})

    with pytest.raises(hosts.JoinError, match="no coordinator"):
        ops_hosts.check_coordinator(sup.conn, cfg(told))
    with sup.transaction() as tx:
        _row(tx, "coordinator", "coordinator-host", public=told.encode(), endpoint="tcp://10.0.0.5:7200")
    assert ops_hosts.check_coordinator(sup.conn, cfg(told)).host == "coordinator-host"
    with pytest.raises(hosts.JoinError, match="key") as info:
        ops_hosts.check_coordinator(sup.conn, cfg(zmq.curve_keypair()[0].decode()))
    assert info.value.code == "join_refused"
    with pytest.raises(hosts.JoinError, match="listens at"):
        ops_hosts.check_coordinator(sup.conn, cfg(told, "tcp://10.0.0.6:7200"))
    # the join operation asks the store read-only: the names it may take, nothing written
    with sup.transaction() as tx:
        _row(tx, "eval-agent", "coordinator-host")
    before = query(org_home, "SELECT COUNT(*) AS n FROM events")[0]["n"]
    got = ops_hosts.join(org_home.db_path, cfg(told), "loop-agent", 2, ["loop-agent-50"])
    assert got.names == ("loop-agent-50", "loop-agent-51") and got.eval_agents == 1
    assert ops_hosts.join(org_home.db_path, cfg(told)).names == ()
    assert query(org_home, "SELECT COUNT(*) AS n FROM events")[0]["n"] == before
    with pytest.raises(hosts.JoinError, match="key"):
        ops_hosts.join(org_home.db_path, cfg(zmq.curve_keypair()[0].decode()), "loop-agent", 1)


@pytest.mark.parametrize("extra, code", [
    (["--role", "eval-agent"], "bad_arguments"),                                # no PostgreSQL store
    (["--role", "loop-agent"], "bad_arguments"),                                # no PostgreSQL store
    (["--role", "loop-agent", "--store", "postgresql:///x", "--count", "0"], "bad_arguments"),
    (["--role", "cook", "--store", "postgresql:///x"], "bad_arguments"),
])
def test_org_join_with_wrong_arguments_is_one_coded_line(tmp_path, extra, code):
    key = zmq.curve_keypair()[0].decode()
    argv = [sys.executable, "-m", "scripts.cli.main", "join", "--coordinator", "tcp://127.0.0.1:7200",
            "--coordinator-key", key, "--listen", "tcp://127.0.0.1:8000", *extra]
    env = {k: v for k, v in os.environ.items() if k != "ORG_STATE_URL"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          env={**env, "ORG_HOME": str(tmp_path / "joined")})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith(f"error[{code}]"), proc.stderr
    assert not (tmp_path / "joined").exists()


def _key_beginning_with_a_dash() -> str:
    """A real CURVE public key whose Z85 text begins with "-" (about one key in 85 does)."""
    for _ in range(20000):
        key = zmq.curve_keypair()[0].decode()
        if key.startswith("-"):
            return key
    raise AssertionError("no key beginning with '-' in 20,000 tries")


@pytest.mark.parametrize("dash", [False, True], ids=["key", "key_beginning_with_a_dash"])
def test_org_join_refuses_a_home_that_runs_an_org_of_its_own(org_home, dash):
    """Also with a key that begins with "-", given as its own argument, as 'org hosts' prints it."""
    key = _key_beginning_with_a_dash() if dash else zmq.curve_keypair()[0].decode()
    proc = subprocess.run([sys.executable, "-m", "scripts.cli.main", "join", "--coordinator", "tcp://127.0.0.1:7200",
                           "--coordinator-key", key, "--listen", "tcp://127.0.0.1:8000", "--role", "loop-agent",
                           "--store", "postgresql:///x"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "ORG_HOME": str(org_home.root)})
    assert proc.returncode == 1 and proc.stderr.startswith("error[join_refused]"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_org_join_on_a_store_no_coordinator_host_ever_used_is_one_coded_line(tmp_path, pg_url):
    key = zmq.curve_keypair()[0].decode()
    env = {k: v for k, v in os.environ.items() if k != "ORG_STATE_URL"}
    proc = subprocess.run([sys.executable, "-m", "scripts.cli.main", "join", "--coordinator", "tcp://127.0.0.1:7200",
                           "--coordinator-key", key, "--listen", "tcp://127.0.0.1:8000", "--role", "loop-agent",
                           "--store", pg_url], capture_output=True, text=True, timeout=60,
                          env={**env, "ORG_HOME": str(tmp_path / "joined")})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("error[join_refused]"), proc.stderr
    assert not (tmp_path / "joined").exists()


def test_org_hosts_lists_through_the_operation_and_remove_forgets_as_the_human(org_home, capsys):
    """``org hosts`` (list, --json, remove) answers from roles.operations.hosts."""
    import json

    from scripts.cli.main import main
    told = zmq.curve_keypair()[0]
    sup = StateWriter(org_home.db_path, Actor.SUPERVISOR)
    with sup.transaction() as tx:
        _row(tx, "coordinator", "coordinator-host", public=told, endpoint="tcp://10.0.0.5:7200")
        _row(tx, "loop-agent-50", "worker-1")
    sup.close()
    assert main(["--home", str(org_home.root), "hosts", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["coordinator_key"] == told.decode() and shown["coordinator"] == "tcp://10.0.0.5:7200"
    assert [(p["host"], p["instance"], p["status"]) for p in shown["peers"]] == [
        ("coordinator-host", "coordinator", "unknown"), ("worker-1", "loop-agent-50", "unknown")]
    assert shown == ops_hosts.listing(org_home).as_dict() | {"peers": shown["peers"]}
    assert main(["--home", str(org_home.root), "hosts", "remove", "worker-1"]) == 0
    assert "forgot worker-1: loop-agent-50" in capsys.readouterr().out
    assert [p["instance"] for p in ops_hosts.listing(org_home).peers] == ["coordinator"]
