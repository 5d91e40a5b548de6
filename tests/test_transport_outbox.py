"""The outbox files (atomic write, drain, quarantine, orphans) and an in-process receiver's use of
them: start-up drain, the writer's wake-ups, slow sweep."""
from __future__ import annotations

import os
import time

import pytest

from transport.envelope import Envelope
from transport.keys import Keyring
from transport.ledger import Ledger, read_counters
from transport.outbox import OutboxReader, write_message
from transport.probe import prepare_home
from transport.receiver import Receiver


@pytest.fixture
def home(tmp_path):
    root = tmp_path / "h"
    prepare_home(root, ["coordinator", "loop-agent-1"])
    return root


@pytest.fixture
def keyring(home):
    return Keyring.load(home / "run" / "keys.json")


@pytest.fixture
def make_receiver(home, keyring):
    made = []

    def make(**kw):
        got = kw.pop("got", [])
        r = Receiver("loop-agent-1", run_dir=home / "run", outbox_root=home / "outbox",
                     keyring=keyring, handler=got.append,
                     ledger=Ledger(home / "state.db", "loop-agent-1"), **kw)
        made.append(r)
        return r.start(), got

    yield make
    for r in made:
        r.close()


def envelope(keyring, **payload) -> Envelope:
    return Envelope.create("wake", "coordinator", "loop-agent-1", payload,
                           key=keyring.key_for("coordinator"), now=time.time())


def test_write_is_atomic_and_private_and_leaves_no_temp_file(home, keyring):
    env = envelope(keyring)
    path = write_message(home / "outbox", "loop-agent-1", env.id, env.encode())
    assert path.name == f"{env.id}.msg"
    assert path.read_bytes() == env.encode()
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(path.parent).st_mode & 0o777 == 0o700
    assert list((home / "outbox" / ".tmp" / "loop-agent-1").iterdir()) == []


def test_recipient_names_cannot_escape_the_outbox(home):
    with pytest.raises(Exception) as info:
        write_message(home / "outbox", "../run", "a" * 32, b"{}")
    assert info.value.code == "bad_instance"


def test_reader_lists_oldest_first_and_ignores_dot_files(home, keyring):
    envs = [envelope(keyring, n=i) for i in range(3)]
    for env in reversed(envs):
        write_message(home / "outbox", "loop-agent-1", env.id, env.encode())
    (home / "outbox" / "loop-agent-1" / ".partial").write_bytes(b"x")
    reader = OutboxReader(home / "outbox", "loop-agent-1", max_bytes=1024)
    assert [p.name for p in reader.pending(10)] == [f"{e.id}.msg" for e in envs]
    assert len(reader.pending(2)) == 2


def test_reader_reads_at_most_one_byte_over_the_cap(home):
    reader = OutboxReader(home / "outbox", "loop-agent-1", max_bytes=100)
    big = reader.dir / "big.msg"
    big.write_bytes(b"x" * 10_000)
    assert len(reader.read(big)) == 101


def test_orphaned_temp_files_are_cleaned_after_their_age(home):
    reader = OutboxReader(home / "outbox", "loop-agent-1", max_bytes=1024)
    old, fresh = reader.tmp_dir / "old.123.ab", reader.tmp_dir / "fresh.123.cd"
    old.write_bytes(b"half")
    fresh.write_bytes(b"half")
    os.utime(old, (time.time() - 600, time.time() - 600))
    assert reader.clean_orphans(60) == 1
    assert not old.exists() and fresh.exists()


def test_start_up_drain_handles_files_written_while_down(make_receiver, home, keyring):
    envs = [envelope(keyring, n=i) for i in range(300)]  # more than one batch
    for env in envs:
        write_message(home / "outbox", "loop-agent-1", env.id, env.encode())
    receiver, got = make_receiver(watch=False, sweep_s=3600, batch=128)
    handled = 0
    deadline = time.monotonic() + 10
    while handled < 300 and time.monotonic() < deadline:
        handled += receiver.poll(100)
    assert [e.id for e in got] == [e.id for e in envs]
    assert list(receiver.reader.dir.iterdir()) == []


def test_the_writer_wakes_the_receiver_for_a_new_file_without_waiting_for_the_sweep(
        make_receiver, home, keyring):
    receiver, got = make_receiver(sweep_s=3600)
    receiver.poll(0)  # start-up drain (empty)
    env = envelope(keyring)
    started = time.monotonic()
    write_message(home / "outbox", "loop-agent-1", env.id, env.encode())
    assert receiver.poll(5000) == 1
    assert time.monotonic() - started < 1.0
    assert got == [env]


def test_receivers_hold_no_inotify_instance_so_an_org_is_not_bound_by_the_users_limit(home, keyring):
    """fs.inotify.max_user_instances (128) is shared by every process of the user: a receiver
    that held one each kept an org of 128 loop-agents from starting. Many receivers in one
    process hold none, and each is still woken by a writer."""
    import zmq
    names = [f"loop-agent-{i}" for i in range(2, 140)]
    prepare_home(home, names)
    ring = Keyring.load(home / "run" / "keys.json")
    got: list = []
    ctx = zmq.Context()
    made = [Receiver(n, run_dir=home / "run", outbox_root=home / "outbox", keyring=ring, handler=got.append,
                     ledger=Ledger(home / "state.db", n), sweep_s=3600, context=ctx).start() for n in names]
    try:
        links = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                 if os.path.exists(f"/proc/self/fd/{fd}")]
        assert "anon_inode:inotify" not in links
        last = made[-1]
        last.poll(0)
        env = Envelope.create("wake", "coordinator", names[-1], {}, key=ring.key_for("coordinator"), now=time.time())
        write_message(home / "outbox", names[-1], env.id, env.encode())
        assert last.poll(5000) == 1 and got == [env]
    finally:
        for r in made:
            r.close()
        ctx.term()


def test_a_wake_for_a_receiver_that_is_down_neither_blocks_nor_fails(home, keyring, make_receiver):
    receiver, _ = make_receiver(sweep_s=3600)
    receiver.close()                        # its FIFO stays, with no reader
    env = envelope(keyring)
    started = time.monotonic()
    path = write_message(home / "outbox", "loop-agent-1", env.id, env.encode())
    assert path.exists() and time.monotonic() - started < 1.0
    receiver2, got = make_receiver(sweep_s=3600)
    assert receiver2.poll(2000) == 1 and got == [env]          # the start-up drain


def test_sweep_finds_files_when_no_event_arrives(make_receiver, home, keyring):
    receiver, got = make_receiver(watch=False, sweep_s=0.2)
    receiver.poll(0)
    env = envelope(keyring)
    write_message(home / "outbox", "loop-agent-1", env.id, env.encode())
    assert receiver.poll(5000) == 1
    assert got == [env]


def test_bad_file_is_copied_to_quarantine_then_deleted(make_receiver, home, keyring):
    folder = home / "outbox" / "loop-agent-1"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "junk.msg").write_bytes(b"\x00not an envelope")
    good = envelope(keyring)
    write_message(home / "outbox", "loop-agent-1", good.id, good.encode())
    receiver, got = make_receiver(watch=False)
    assert receiver.poll(1000) == 1
    assert got == [good]
    assert not (folder / "junk.msg").exists()
    copy = home / "outbox" / ".quarantine" / "loop-agent-1" / "junk.msg.bad_envelope"
    assert copy.read_bytes() == b"\x00not an envelope"
    receiver.ledger.flush()
    assert read_counters(home / "state.db")["loop-agent-1"] == {
        "delivered": 1, "rejected:bad_envelope": 1}


def test_handler_failure_is_counted_and_the_receiver_goes_on(make_receiver, home, keyring):
    calls = []

    def flaky(env):
        calls.append(env)
        if len(calls) == 1:
            raise RuntimeError("boom")

    receiver, _ = make_receiver(watch=False)
    receiver.handler = flaky
    for i in range(2):
        env = envelope(keyring, n=i)
        write_message(home / "outbox", "loop-agent-1", env.id, env.encode())
    assert receiver.poll(1000) == 2
    assert len(calls) == 2
    receiver.close()
    counters = read_counters(home / "state.db")["loop-agent-1"]
    assert counters["handler_errors"] == 1 and counters["delivered"] == 2


def test_serve_interleaves_a_tick_with_message_handling_until_stopped(make_receiver, home,
                                                                      keyring):
    import threading

    stop = threading.Event()
    ticks: list[float] = []
    receiver, got = make_receiver(sweep_s=3600)

    def tick():
        ticks.append(time.monotonic())
        if len(ticks) == 2:
            env = envelope(keyring, during="tick")
            write_message(home / "outbox", "loop-agent-1", env.id, env.encode())
        if got and len(ticks) >= 4:
            stop.set()

    thread = threading.Thread(target=receiver.serve, args=(stop,),
                              kwargs={"tick": tick, "tick_s": 0.05})
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), f"serve did not stop; ticks={len(ticks)} got={got}"
    assert [e.payload for e in got] == [{"during": "tick"}]
    assert all(b - a >= 0.045 for a, b in zip(ticks, ticks[1:]))
