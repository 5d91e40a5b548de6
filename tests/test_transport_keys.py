"""Keyring files, instance names, the capability table and endpoint rules."""
from __future__ import annotations

import os

import pytest

from state_db.vocab import Actor
from transport.endpoints import Endpoints, tcp_port_offset
from transport.errors import BadEndpoint, BadInstance, Code, KeyringError
from transport.keys import Keyring
from transport.kinds import CAPABILITIES, Kind, may_send, role_of


@pytest.fixture
def ring_path(tmp_path):
    return tmp_path / "home" / "run" / "keys.json"


def test_keyring_file_and_folder_are_owner_only(ring_path):
    ring = Keyring.create(ring_path)
    ring.issue("loop-agent-1")
    assert os.stat(ring_path).st_mode & 0o777 == 0o600
    assert os.stat(ring_path.parent).st_mode & 0o777 == 0o700


def test_each_instance_gets_its_own_random_key_that_others_load_by_path(ring_path):
    ring = Keyring.create(ring_path)
    a, b = ring.issue("loop-agent-1"), ring.issue("loop-agent-2")
    assert a != b and len(a) == 32
    loaded = Keyring.load(ring_path)
    assert loaded.key_for("loop-agent-1") == a and loaded.key_for("loop-agent-2") == b
    assert loaded.key_for("curator") is None


def test_a_loaded_keyring_sees_keys_issued_later_after_refresh(ring_path):
    supervisor = Keyring.create(ring_path)
    role = Keyring.load(ring_path)
    assert role.refresh() is False  # nothing changed: one stat, no reload
    key = supervisor.issue("eval-agent")
    assert role.refresh() is True and role.key_for("eval-agent") == key


def test_require_key_names_the_fix_when_missing(ring_path):
    with pytest.raises(KeyringError) as info:
        Keyring.create(ring_path).require_key("curator")
    assert info.value.code == Code.UNKNOWN_KEY and "Keyring.issue" in str(info.value)


def test_keyring_readable_by_others_is_refused(ring_path):
    Keyring.create(ring_path).issue("coordinator")
    os.chmod(ring_path, 0o640)
    with pytest.raises(KeyringError) as info:
        Keyring.load(ring_path)
    assert info.value.code == Code.KEYRING_UNSAFE and "chmod 600" in str(info.value)
    os.chmod(ring_path, 0o600)
    os.chmod(ring_path.parent, 0o755)
    with pytest.raises(KeyringError) as info:
        Keyring.load(ring_path)
    assert info.value.code == Code.KEYRING_UNSAFE


def test_missing_and_corrupt_keyrings_have_codes(ring_path):
    with pytest.raises(KeyringError) as info:
        Keyring.load(ring_path)
    assert info.value.code == Code.KEYRING_MISSING
    Keyring.create(ring_path)
    ring_path.write_bytes(b"{not json")
    with pytest.raises(KeyringError) as info:
        Keyring.load(ring_path)
    assert info.value.code == Code.KEYRING_CORRUPT


def test_curve_keypairs_are_stored_and_found_by_public_key(ring_path):
    ring = Keyring.create(ring_path)
    public, secret = ring.issue_curve("coordinator")
    loaded = Keyring.load(ring_path)
    assert loaded.curve_keypair("coordinator") == (public, secret)
    assert loaded.curve_owner(public) == "coordinator"
    assert loaded.curve_owner(b"x" * 40) is None


def test_revoked_instance_has_no_key(ring_path):
    ring = Keyring.create(ring_path)
    ring.issue("curator")
    ring.revoke("curator")
    assert Keyring.load(ring_path).key_for("curator") is None


@pytest.mark.parametrize("name, role", [
    ("coordinator", Actor.COORDINATOR), ("human", Actor.HUMAN), ("supervisor", Actor.SUPERVISOR),
    ("loop-agent", Actor.LOOP_AGENT), ("loop-agent-2", Actor.LOOP_AGENT),
    ("eval-agent-1", Actor.EVAL_AGENT), ("curator-12", Actor.CURATOR),
])
def test_role_of_instance_names(name, role):
    assert role_of(name) is role


@pytest.mark.parametrize("name", ["", "loop", "loop-agent-0", "loop-agent-01", "Loop-agent-1",
                                  "../run", "coordinator-", "loop-agent-1/x", "root", 7])
def test_bad_instance_names_are_refused(name):
    with pytest.raises(BadInstance) as info:
        role_of(name)
    assert info.value.code == Code.BAD_INSTANCE


def test_capability_table_matches_the_roles_duties():
    assert CAPABILITIES[Kind.PING] == CAPABILITIES[Kind.PONG] == CAPABILITIES[Kind.WAKE] \
        == frozenset(Actor)
    only = {Kind.STOP: {Actor.SUPERVISOR}, Kind.SUSPEND: {Actor.SUPERVISOR},
            Kind.ROLE_FAILED: {Actor.SUPERVISOR}, Kind.DISPATCH: {Actor.COORDINATOR},
            Kind.ANNOUNCE: {Actor.COORDINATOR}, Kind.CANCEL: {Actor.COORDINATOR, Actor.HUMAN},
            Kind.VERIFY_REQUEST: {Actor.LOOP_AGENT}, Kind.RUN_ENDED: {Actor.LOOP_AGENT},
            Kind.DECISION_NEEDED: {Actor.LOOP_AGENT}, Kind.VERDICT_READY: {Actor.EVAL_AGENT},
            Kind.DECISION_MADE: {Actor.HUMAN, Actor.COORDINATOR},
            Kind.BATCH_OPENED: {Actor.CURATOR}}
    for kind, roles in only.items():
        assert CAPABILITIES[kind] == roles, kind
    assert may_send("eval-agent", "verdict_ready") and not may_send("loop-agent-1", "verdict_ready")
    assert not may_send("loop-agent-1", "no_such_kind") and not may_send("nobody", "ping")


def test_tcp_base_gives_each_instance_a_fixed_distinct_port(tmp_path):
    ep = Endpoints(tmp_path / "run", tcp_base="tcp://127.0.0.1:6000")
    names = ["coordinator", "loop-agent-1", "loop-agent-2", "eval-agent", "curator", "supervisor"]
    ports = [int(ep(n).rsplit(":", 1)[1]) for n in names]
    assert len(set(ports)) == len(ports) and min(ports) >= 6000
    assert ep("loop-agent-1") == f"tcp://127.0.0.1:{6000 + tcp_port_offset('loop-agent-1')}"
    with pytest.raises(BadEndpoint):
        Endpoints(tmp_path / "run", tcp_base="udp://1.2.3.4:5")


def test_explicit_endpoint_overrides_win(tmp_path):
    ep = Endpoints(tmp_path / "run", overrides={"coordinator": "tcp://127.0.0.1:7001"})
    assert ep("coordinator") == "tcp://127.0.0.1:7001"
    assert ep("curator") == f"ipc://{tmp_path}/run/s/curator"
