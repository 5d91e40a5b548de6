"""Hostile and broken input against a real receiver process: rejected with a code, journaled,
counted, and the receiver keeps delivering. Also tcp:// with CURVE."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter

import orjson
import pytest

from state_db.connection import connect
from transport.endpoints import Endpoints, ipc_path
from transport.envelope import Envelope
from transport.errors import Code, CurveRequired, IpcPathTooLong
from transport.keys import Keyring
from transport.ledger import Ledger, read_counters
from transport.outbox import write_message
from tests.support.timing import scaled
from transport.probe import ProbeProcess, prepare_home, wait_until
from transport.receiver import Receiver
from transport.sender import Sender

INSTANCES = ["coordinator", "loop-agent-1", "loop-agent-2", "supervisor", "human"]

# A process that has pyzmq but nothing of loop-org: pushes the frames it reads from stdin.
PLAIN_PUSH = r"""
import sys, zmq, orjson
args = orjson.loads(sys.stdin.buffer.read())
ctx = zmq.Context()
s = ctx.socket(zmq.PUSH)
s.setsockopt(zmq.IMMEDIATE, 1)
if args.get("curve"):
    s.curve_publickey, s.curve_secretkey = zmq.curve_keypair()
    s.curve_serverkey = args["curve"].encode()
s.connect(args["endpoint"])
sent = 0
for hexframe in args["frames"]:
    if not s.poll(args.get("wait_ms", 2000), zmq.POLLOUT):
        break
    s.send(bytes.fromhex(hexframe))
    sent += 1
print(sent)
s.close(linger=2000)
ctx.term()
"""


def plain_push(endpoint: str, frames: list[bytes], **extra) -> int:
    """Push raw frames from a separate plain-pyzmq process; returns how many it could send."""
    doc = orjson.dumps({"endpoint": endpoint, "frames": [f.hex() for f in frames], **extra})
    done = subprocess.run([sys.executable, "-c", PLAIN_PUSH], input=doc, capture_output=True,
                          timeout=30, check=True)
    return int(done.stdout)


@pytest.fixture
def home(tmp_path):
    root = tmp_path / "h"
    prepare_home(root, INSTANCES)
    return root


@pytest.fixture
def keyring(home):
    return Keyring.load(home / "run" / "keys.json")


@pytest.fixture
def probe(home):
    p = ProbeProcess(home, "loop-agent-1").start()
    yield p
    p.kill()


def rejections(home) -> list[dict]:
    conn = connect(home / "state.db", readonly=True)
    try:
        rows = conn.execute("SELECT subject, data FROM events WHERE kind = 'message_rejected' "
                            "ORDER BY id").fetchall()
    finally:
        conn.close()
    return [dict(orjson.loads(data), msg_id=subject) for subject, data in rows]


def wait_rejections(home, n: int) -> list[dict]:
    return wait_until(lambda: (r := rejections(home)) and len(r) >= n and r, timeout=scaled(10),
                      what=f"{n} journaled rejections")


def still_delivers(probe, sender: Sender) -> None:
    env = sender.envelope("loop-agent-1", "wake", {"check": "alive"})
    sender.send_envelope(env)
    probe.wait_for(lambda e: e.get("id") == env.id, timeout=scaled(10))
    assert probe.proc.poll() is None


def test_forged_messages_from_a_plain_process_are_rejected(home, keyring, probe):
    forged_key = Envelope.create("dispatch", "coordinator", "loop-agent-1", {"work": "evil"},
                                 key=os.urandom(32), now=time.time())
    no_tag = orjson.loads(forged_key.encode()) | {"tag": "0" * 64}
    unknown = Envelope.create("wake", "loop-agent-9", "loop-agent-1", {}, key=os.urandom(32),
                              now=time.time())
    sent = plain_push(probe.endpoint, [forged_key.encode(), orjson.dumps(no_tag),
                                       unknown.encode()])
    assert sent == 3
    found = wait_rejections(home, 3)
    assert [r["code"] for r in found] == [Code.NOT_AUTHENTICATED] * 3
    assert {r["sender"] for r in found} == {"coordinator", "loop-agent-9"}
    assert all(r["source"] == "socket" for r in found)
    with Sender("coordinator", keyring, Endpoints(home / "run"), home / "outbox") as s:
        still_delivers(probe, s)
    assert probe.handled()[-1]["payload"] == {"check": "alive"}
    assert len(probe.handled()) == 1


def test_replayed_messages_readdressed_or_resigned_are_rejected(home, keyring, probe):
    other = ProbeProcess(home, "loop-agent-2").start()
    try:
        with Sender("coordinator", keyring, Endpoints(home / "run"), home / "outbox") as s:
            captured = s.envelope("loop-agent-1", "dispatch", {"work": "w1"})
            s.send_envelope(captured)
            probe.wait_for(lambda e: e.get("id") == captured.id, timeout=scaled(10))
            wire = orjson.loads(captured.encode())
            readdressed = orjson.dumps(wire | {"recipient": "loop-agent-2"})
            # loop-agent-1 holds its own key: it re-signs the dispatch in the coordinator's name.
            resigned = Envelope.create("dispatch", "coordinator", "loop-agent-2", {"work": "w1"},
                                       key=keyring.key_for("loop-agent-1"), now=time.time())
            assert plain_push(other.endpoint, [readdressed, resigned.encode(),
                                               captured.encode()]) == 3
            assert plain_push(probe.endpoint, [captured.encode()]) == 1  # exact replay
            found = wait_rejections(home, 3)
            codes = Counter(r["code"] for r in found if r["recipient"] == "loop-agent-2")
            assert codes == {Code.NOT_AUTHENTICATED: 2, Code.WRONG_RECIPIENT: 1}
            still_delivers(probe, s)
        assert other.stop()["handled"] == 0
        assert probe.stop()["handled"] == 2  # the original and the liveness check, not the replay
        counters = read_counters(home / "state.db")
        assert counters["loop-agent-1"]["duplicates"] == 1
        assert counters["loop-agent-2"] == {"rejected:not_authenticated": 2,
                                            "rejected:wrong_recipient": 1}
    finally:
        other.kill()


def test_kind_sent_by_a_role_without_the_capability_is_not_authorized(home, keyring, probe):
    bogus = Envelope.create("dispatch", "loop-agent-2", "loop-agent-1", {"work": "w9"},
                            key=keyring.key_for("loop-agent-2"), now=time.time())
    also = Envelope.create("stop", "human", "loop-agent-1", {}, key=keyring.key_for("human"),
                           now=time.time())
    assert plain_push(probe.endpoint, [bogus.encode()]) == 1
    write_message(home / "outbox", "loop-agent-1", also.id, also.encode())
    found = wait_rejections(home, 2)
    assert sorted((r["code"], r["sender"], r["source"]) for r in found) == [
        (Code.NOT_AUTHORIZED, "human", "file"), (Code.NOT_AUTHORIZED, "loop-agent-2", "socket")]
    copy = home / "outbox" / ".quarantine" / "loop-agent-1" / f"{also.id}.msg.not_authorized"
    wait_until(copy.exists, timeout=scaled(10), what="quarantined copy")  # copied after the commit
    with pytest.raises(Exception) as info:  # the sender refuses it before anything is sent
        with Sender("loop-agent-2", keyring, Endpoints(home / "run"), home / "outbox") as s:
            s.send("loop-agent-1", "dispatch", {})
    assert info.value.code == Code.NOT_AUTHORIZED


def test_malformed_truncated_oversized_expired_are_rejected_and_receiver_keeps_delivering(
        home, keyring, probe):
    key = keyring.key_for("coordinator")
    now = time.time()
    good = Envelope.create("wake", "coordinator", "loop-agent-1", {"x": 1}, key=key, now=now)
    expired = Envelope.create("wake", "coordinator", "loop-agent-1", {}, key=key, now=now - 3600)
    skewed_ok = Envelope.create("wake", "coordinator", "loop-agent-1", {"skew": "ahead"},
                                key=key, now=now + 20)  # within the 30 s tolerance
    skewed_old_ok = Envelope.create("wake", "coordinator", "loop-agent-1", {"skew": "behind"},
                                    key=key, now=now - 600 - 20)
    oversized = Envelope.create("wake", "coordinator", "loop-agent-1",
                                {"blob": "x" * 300_000}, key=key, now=now)
    bad_frames = [b"\x00garbage", good.encode()[:40], oversized.encode(), expired.encode(),
                  b"\xff\xfe\xfd", b'{"v": 1, "payload": ' + b"[" * 5000 + b"]" * 5000 + b"}"]
    assert plain_push(probe.endpoint, bad_frames + [skewed_ok.encode(),
                                                    skewed_old_ok.encode()]) == 8
    # the same kinds of damage as outbox files
    folder = home / "outbox" / "loop-agent-1"
    for name, data in [("garbage.msg", b"\x00garbage"), ("truncated.msg", good.encode()[:40]),
                       ("big.msg", oversized.encode())]:
        (folder / f".{name}").write_bytes(data)  # whole files appear at once, as writers do
        os.rename(folder / f".{name}", folder / name)
    write_message(home / "outbox", "loop-agent-1", expired.id, expired.encode())
    (folder / ".in-progress").write_bytes(b"dot-files are not messages")

    found = wait_rejections(home, 10)
    by_source = {src: sorted(r["code"] for r in found if r["source"] == src)
                 for src in ("socket", "file")}
    assert by_source == {
        "socket": sorted([Code.BAD_ENVELOPE, Code.BAD_ENVELOPE, Code.MESSAGE_TOO_LARGE,
                          Code.EXPIRED, Code.BAD_ENVELOPE, Code.BAD_ENVELOPE]),
        "file": sorted([Code.BAD_ENVELOPE, Code.BAD_ENVELOPE, Code.MESSAGE_TOO_LARGE,
                        Code.EXPIRED]),
    }
    handled = probe.wait_for(lambda e: e["event"] == "handled", count=2, timeout=scaled(10))
    assert sorted(e["payload"]["skew"] for e in handled) == ["ahead", "behind"]
    wait_until(lambda: sorted(p.name for p in folder.iterdir()) == [".in-progress"],
               timeout=scaled(10), what="bad files removed, dot-file left alone")
    quarantined = sorted(p.name for p in (home / "outbox" / ".quarantine" / "loop-agent-1")
                         .iterdir())
    assert quarantined == sorted(["big.msg.message_too_large", "garbage.msg.bad_envelope",
                                  "truncated.msg.bad_envelope", f"{expired.id}.msg.expired"])
    with Sender("coordinator", keyring, Endpoints(home / "run"), home / "outbox") as s:
        still_delivers(probe, s)
    probe.stop()
    counters = read_counters(home / "state.db")["loop-agent-1"]
    assert counters["rejected:bad_envelope"] == 6
    assert counters["rejected:expired"] == 2
    assert counters["rejected:message_too_large"] == 2
    assert counters["delivered"] == 3


def test_tcp_with_curve_delivers_and_a_client_without_the_key_is_refused(home, keyring):
    keyring.issue_curve("loop-agent-1")
    keyring.issue_curve("coordinator")
    server = ProbeProcess(home, "loop-agent-1", "--endpoint", "tcp://127.0.0.1:*").start()
    try:
        assert server.endpoint.startswith("tcp://127.0.0.1:")
        server_public = keyring.curve_keypair("loop-agent-1")[0].decode()
        env = Envelope.create("wake", "coordinator", "loop-agent-1", {"via": "rogue"},
                              key=keyring.key_for("coordinator"), now=time.time())
        # A client with the server's public key but an unknown keypair, and one without CURVE.
        assert plain_push(server.endpoint, [env.encode()], curve=server_public,
                          wait_ms=800) == 0
        assert plain_push(server.endpoint, [env.encode()], wait_ms=300) == 0

        resolver = Endpoints(home / "run", overrides={"loop-agent-1": server.endpoint})
        with Sender("coordinator", keyring, resolver, home / "outbox") as s:
            assert s.send("loop-agent-1", "wake", {"via": "curve"}) == "push"
        got = server.wait_for(lambda e: e["event"] == "handled", timeout=scaled(10))
        assert got[0]["payload"] == {"via": "curve"}

        with Sender("supervisor", keyring, resolver, home / "outbox") as s:
            with pytest.raises(CurveRequired) as info:  # no keypair issued for it
                s.send("loop-agent-1", "wake", {})
        assert info.value.code == Code.CURVE_REQUIRED
        assert server.stop()["handled"] == 1
    finally:
        server.kill()


def test_tcp_receiver_without_curve_keys_refuses_to_bind(home, keyring):
    receiver = Receiver("loop-agent-2", run_dir=home / "run", outbox_root=home / "outbox",
                        keyring=keyring, handler=lambda env: None,
                        ledger=Ledger(home / "state.db", "loop-agent-2"),
                        endpoint="tcp://127.0.0.1:*", watch=False)
    try:
        with pytest.raises(CurveRequired):
            receiver.start()
    finally:
        receiver.close()


def test_ipc_path_over_the_limit_is_a_coded_error(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 40)
    with pytest.raises(IpcPathTooLong) as info:
        ipc_path(deep / "run", "loop-agent-1")
    assert info.value.code == Code.IPC_PATH_TOO_LONG
    assert "ORG_HOME" in str(info.value) and info.value.length > 100
    with pytest.raises(IpcPathTooLong):
        Endpoints(deep / "run")("coordinator")
    assert len(str(ipc_path(tmp_path / "run", "loop-agent-12"))) <= 100
