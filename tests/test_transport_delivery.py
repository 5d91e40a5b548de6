"""Delivery between real processes on ipc:// under tmp_path: push, outbox fallback, at-most-once."""
from __future__ import annotations

import os
import time

import pytest

from transport.endpoints import Endpoints
from transport.keys import Keyring
from transport.ledger import read_counters
from tests.support.timing import scaled
from transport.probe import ProbeProcess, prepare_home, wait_until
from transport.sender import Sender

INSTANCES = ["coordinator", "loop-agent-1", "supervisor", "human"]


@pytest.fixture
def home(tmp_path):
    root = tmp_path / "h"
    prepare_home(root, INSTANCES)
    return root


@pytest.fixture
def sender(home):
    s = Sender("coordinator", Keyring.load(home / "run" / "keys.json"), Endpoints(home / "run"),
               home / "outbox")
    yield s
    s.close()


@pytest.fixture
def probes():
    started: list[ProbeProcess] = []

    def start(home, instance, *args):
        p = ProbeProcess(home, instance, *args).start()
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()


def handled_ids(probe):
    return [e["id"] for e in probe.handled()]


def outbox_files(home, instance="loop-agent-1"):
    folder = home / "outbox" / instance
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_same_id_sent_by_push_and_by_file_is_handled_once(home, sender, probes):
    probe = probes(home, "loop-agent-1")
    envs = [sender.envelope("loop-agent-1", "dispatch", {"work": f"w{i}"}) for i in range(20)]
    for env in envs:
        assert sender.send_envelope(env, via="both") == "push+outbox"
    probe.wait_for(lambda e: e["event"] == "handled", count=20, timeout=scaled(10))
    wait_until(lambda: outbox_files(home) == [], timeout=scaled(10), what="outbox drained")
    assert probe.stop()["handled"] == 20
    assert sorted(handled_ids(probe)) == sorted(e.id for e in envs)
    counters = read_counters(home / "state.db")["loop-agent-1"]
    assert counters["delivered"] == 20
    assert counters["duplicates"] == 20


def test_send_to_a_missing_receiver_falls_back_fast_and_is_delivered_once_after_start(
        home, sender, probes):
    started = time.monotonic()
    assert sender.send("loop-agent-1", "wake", {"why": "work queued"}) == "outbox"
    assert time.monotonic() - started < 0.5, "a send to a missing peer must not block"
    assert len(outbox_files(home)) == 1

    probe = probes(home, "loop-agent-1")
    probe.wait_for(lambda e: e["event"] == "handled", timeout=scaled(10))
    wait_until(lambda: outbox_files(home) == [], timeout=scaled(10), what="outbox file deleted")
    assert probe.stop()["handled"] == 1

    again = probes(home, "loop-agent-1")  # a restart must not handle it a second time
    assert again.stop()["handled"] == 0


def test_receiver_killed_then_restarted_gets_fallen_back_messages_exactly_once(
        home, sender, probes):
    probe = probes(home, "loop-agent-1")
    first = sender.envelope("loop-agent-1", "wake", {"n": 0})
    assert sender.send_envelope(first) == "push"
    probe.wait_for(lambda e: e["event"] == "handled", timeout=scaled(10))
    probe.kill()  # kill -9: the socket file stays behind

    # Until the sender notices the dead peer a push may still be queued (and lost: at-most-once).
    paths = []

    def fell_back():
        paths.append(sender.send("loop-agent-1", "wake", {"n": len(paths) + 1}))
        return paths[-1] == "outbox"

    wait_until(fell_back, timeout=scaled(5), what="a send falling back to the outbox")
    filed = len(outbox_files(home))
    assert filed == paths.count("outbox") == 1

    restarted = probes(home, "loop-agent-1")
    restarted.wait_for(lambda e: e["event"] == "handled", timeout=scaled(10))
    after = sender.send("loop-agent-1", "wake", {"n": "after restart"})
    restarted.wait_for(lambda e: e["event"] == "handled", count=2, timeout=scaled(10))
    assert restarted.stop()["handled"] == 2
    payloads = [e["payload"]["n"] for e in restarted.handled()]
    assert payloads == [len(paths), "after restart"]
    assert first.id not in handled_ids(restarted)
    assert after in ("push", "outbox")


def test_ping_is_answered_with_pong_by_the_probe(home, probes):
    """Two receiving processes talk both ways (the reply uses the same seam)."""
    coordinator = probes(home, "coordinator")
    agent = probes(home, "loop-agent-1")
    keyring = Keyring.load(home / "run" / "keys.json")
    with Sender("supervisor", keyring, Endpoints(home / "run"), home / "outbox") as sup:
        assert sup.send("loop-agent-1", "ping", {"reply_to": "coordinator"}) == "push"
    pong = coordinator.wait_for(lambda e: e.get("kind") == "pong", timeout=scaled(10))[0]
    assert pong["sender"] == "loop-agent-1"
    ping_id = agent.wait_for(lambda e: e.get("kind") == "ping", timeout=scaled(1))[0]["id"]
    assert pong["payload"] == {"ping": ping_id}


def test_counters_are_stored_per_instance(home, sender, probes):
    probe = probes(home, "loop-agent-1")
    for i in range(3):
        sender.send("loop-agent-1", "wake", {"i": i})
    probe.wait_for(lambda e: e["event"] == "handled", count=3, timeout=scaled(10))
    probe.stop()
    stored = read_counters(home / "state.db", "loop-agent-1")
    assert stored == {"loop-agent-1": {"delivered": 3}}


def test_keys_are_not_in_the_probe_environment(home, probes):
    probe = probes(home, "loop-agent-1")
    keyring = Keyring.load(home / "run" / "keys.json")
    environ = open(f"/proc/{probe.proc.pid}/environ", "rb").read()
    for instance in INSTANCES:
        assert keyring.key_for(instance).hex().encode() not in environ
    assert os.stat(home / "run" / "keys.json").st_mode & 0o777 == 0o600


def test_cli_sender_as_human_wakes_the_coordinator(home, probes):
    from transport.node import open_sender

    coordinator = probes(home, "coordinator")
    with open_sender(home, "human", transport={"endpoint": "ipc"}) as human:
        assert human.send("coordinator", "wake", {"why": "submitted"}) == "push"
        assert human.send("coordinator", "cancel", {"work": "w1"}) == "push"
    got = coordinator.wait_for(lambda e: e["event"] == "handled", count=2, timeout=scaled(10))
    assert [(e["sender"], e["kind"]) for e in got] == [("human", "wake"), ("human", "cancel")]
