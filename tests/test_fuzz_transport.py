"""Hostile input at the transport seam, beyond tests/test_transport_envelope.py: authentic but
oversized or deep payloads, clock skew, unknown kinds, invalid UTF-8, replays, random files in a
recipient's outbox, and outbox files left by another envelope version across an upgrade."""
from __future__ import annotations

import os
import time

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state_db.connection import connect
from transport import envelope as envelope_mod
from transport.envelope import Envelope, Limits, decode
from transport.errors import REJECTION_CODES, Code, Rejected
from transport.keys import Keyring, keyring_path
from transport.kinds import Kind
from transport.ledger import Ledger, read_counters
from transport.outbox import QUARANTINE_DIR, write_message
from transport.probe import prepare_home
from transport.receiver import Receiver

NOW = 1_800_000_000.0
ME = "loop-agent-1"
LIMITS = Limits(max_bytes=4096, max_age_s=60.0, skew_s=5.0, max_depth=8)
# examples that each build an org home and a receiver: at most this many, whatever the profile
HEAVY = settings(max_examples=min(settings.default.max_examples, 25))
KEYS = {n: os.urandom(32) for n in ("coordinator", "loop-agent-1", "loop-agent-2", "eval-agent", "human")}


class Ring:
    def key_for(self, instance):
        return KEYS.get(instance)

    def refresh(self):
        return False


def signed(kind="wake", sender="coordinator", recipient=ME, payload=None, now=NOW, key=None) -> Envelope:
    return Envelope.create(kind, sender, recipient, payload if payload is not None else {"work": "w1"},
                           key=key or KEYS[sender], now=now)


def outcome(data: bytes, now: float = NOW, limits: Limits = LIMITS) -> str | Envelope:
    try:
        return decode(data, keyring=Ring(), now=now, recipient=ME, max_age_s=limits.max_age_s,
                      skew_s=limits.skew_s, max_bytes=limits.max_bytes, max_depth=limits.max_depth)
    except Rejected as exc:
        assert exc.code in REJECTION_CODES
        return str(exc.code)


def depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


leaves = st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False,
                                                                               allow_infinity=False) | st.text(max_size=30)
payloads = st.dictionaries(st.text(max_size=8), st.recursive(
    leaves, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=12),
    max_size=4)


@given(payloads, st.integers(0, 14), st.integers(0, 6000))
def test_authentic_messages_are_accepted_unless_too_large_or_too_deep(payload, nest, pad):
    """A sender with its key can still send nothing the receiver's limits forbid."""
    for _ in range(nest):
        payload = {"n": [payload]}
    payload["pad"] = "x" * pad
    env = signed(payload=payload)
    data = env.encode()
    got = outcome(data)
    if len(data) > LIMITS.max_bytes:
        assert got == Code.MESSAGE_TOO_LARGE
    elif depth(payload) > LIMITS.max_depth:
        assert got == Code.BAD_ENVELOPE
    elif depth(payload) == LIMITS.max_depth:   # at the cap the decoder also counts a scalar leaf as a level
        assert got in (env, Code.BAD_ENVELOPE)
    else:
        assert got == env


@given(st.floats(-5000, 5000), st.floats(1, 1000), st.floats(0, 100))
def test_age_and_clock_skew_decide_expired_or_from_future(offset, max_age, skew):
    """created_at = receiver's now - offset: accepted iff -skew <= age <= max_age + skew."""
    limits = Limits(max_bytes=4096, max_age_s=max_age, skew_s=skew)
    env = signed(now=NOW - offset)
    got = outcome(env.encode(), limits=limits)
    age = NOW - env.created_at
    expected = Code.EXPIRED if age > max_age + skew else Code.FROM_FUTURE if age < -skew else env
    assert got == expected


@given(st.text(min_size=1, max_size=20).filter(lambda k: k not in {x.value for x in Kind}))
def test_unknown_kinds_are_rejected_even_when_signed(kind):
    assert outcome(signed(kind=kind).encode()) == Code.UNKNOWN_KIND


@given(st.data())
def test_invalid_utf8_anywhere_in_a_string_is_a_bad_envelope(data):
    wire = signed(payload={"note": "abcdefgh"}).encode()
    start = wire.index(b"abcdefgh")
    i = data.draw(st.integers(start, start + 7))
    bad = data.draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]))
    assert outcome(wire[:i] + bad + wire[i + 1:]) == Code.BAD_ENVELOPE


@HEAVY
@given(st.lists(st.integers(0, 6), min_size=1, max_size=25))
def test_replayed_ids_are_handled_once_and_counted_as_duplicates(tmp_path_factory, picks):
    home = tmp_path_factory.mktemp("ledger")
    prepare_home(home, [ME])
    ledger = Ledger(home / "state.db", ME, background_checkpoint=False)
    pool = [signed(now=time.time()) for _ in range(7)]
    handled = []
    try:
        for start in range(0, len(picks), 4):                  # batches of up to 4, replays within and across
            handled += ledger.record([pool[p] for p in picks[start:start + 4]])
    finally:
        ledger.close()
    assert [e.id for e in handled] == list(dict.fromkeys(pool[p].id for p in picks))
    counters = read_counters(home / "state.db")[ME]
    assert counters.get("duplicates", 0) == len(picks) - len(handled)
    assert counters["delivered"] == len(handled)


# -- the outbox reader: random files in a recipient's folder ---------------------------------------

class Outbox:
    """An org home with a real receiver for ME (no watchdog: every poll drains the folder)."""

    def __init__(self, root, *, prepare: bool = True):
        if prepare:
            prepare_home(root, list(KEYS))
        self.root = root
        self.keyring = Keyring.load(keyring_path(root / "run"))
        self.folder = root / "outbox" / ME
        self.got: list[Envelope] = []
        self.receiver = Receiver(ME, run_dir=root / "run", outbox_root=root / "outbox", keyring=self.keyring,
                                 handler=self.got.append, ledger=Ledger(root / "state.db", ME), limits=LIMITS,
                                 watch=False, sweep_s=3600).start()

    def env(self, kind="wake", sender="coordinator", recipient=ME, payload=None, age=0.0, key=None) -> Envelope:
        return Envelope.create(kind, sender, recipient, payload or {"work": "w1"},
                               key=key or self.keyring.key_for(sender), now=time.time() - age)

    def drop(self, name: str, data: bytes) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / name).write_bytes(data)

    def close(self):
        self.receiver.close()


def state_besides_bookkeeping(db) -> dict:
    """Every row of every table but the journal, the ledger and the counters."""
    conn = connect(db, readonly=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
                  if r[0] not in ("events", "delivery_ledger", "transport_counters", "sqlite_sequence")]
        return {t: [tuple(r) for r in conn.execute(f"SELECT * FROM {t} ORDER BY 1")] for t in tables}
    finally:
        conn.close()


def events(db) -> list[tuple[str, dict]]:
    conn = connect(db, readonly=True)
    try:
        return [(k, orjson.loads(d)) for k, d in conn.execute("SELECT kind, data FROM events ORDER BY id")]
    finally:
        conn.close()


def bad_file(box: Outbox, kind: str, data: st.DataObject) -> tuple[bytes, str | None]:
    """Bytes of one bad outbox file and the rejection code it must get (None: any code)."""
    if kind == "random":
        return data.draw(st.binary(max_size=300)), None
    if kind == "oversized":
        return box.env(payload={"blob": "x" * LIMITS.max_bytes}).encode(), Code.MESSAGE_TOO_LARGE
    if kind == "deep":
        deep: object = 1
        for _ in range(LIMITS.max_depth + 2):
            deep = [deep]
        return box.env(payload={"d": deep}).encode(), Code.BAD_ENVELOPE
    if kind == "utf8":
        wire = box.env(payload={"note": "abc"}).encode()
        return wire.replace(b"abc", b"a\xffc"), Code.BAD_ENVELOPE
    if kind == "types":
        wire = orjson.loads(box.env().encode())
        field = data.draw(st.sampled_from(["payload", "created_at", "id", "tag", "sender"]))
        wire[field] = data.draw(st.sampled_from([[1], "now", True, None, 5, {"a": 1}]))
        return orjson.dumps(wire), None
    if kind == "unknown_kind":
        return box.env(kind="format_disk").encode(), Code.UNKNOWN_KIND
    if kind == "expired":
        return box.env(age=LIMITS.max_age_s + LIMITS.skew_s + 30).encode(), Code.EXPIRED
    if kind == "skewed":
        return box.env(age=-(LIMITS.skew_s + 30)).encode(), Code.FROM_FUTURE
    if kind == "forged":
        return box.env(key=os.urandom(32)).encode(), Code.NOT_AUTHENTICATED
    if kind == "unauthorized":
        return box.env(kind="dispatch", sender="loop-agent-2").encode(), Code.NOT_AUTHORIZED
    if kind == "misaddressed":
        return box.env(recipient="loop-agent-2").encode(), Code.WRONG_RECIPIENT
    wire = orjson.loads(box.env().encode())             # "old_version": a v0 file from before an upgrade
    wire["v"] = 0
    return orjson.dumps(wire), Code.UNKNOWN_VERSION


BAD_KINDS = ["random", "oversized", "deep", "utf8", "types", "unknown_kind", "expired", "skewed", "forged",
             "unauthorized", "misaddressed", "old_version"]
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=30).filter(
    lambda n: not n.startswith(".") and n not in (".", ".."))


@HEAVY
@given(st.data())
def test_random_files_in_an_outbox_are_quarantined_with_a_code_and_the_receiver_goes_on(tmp_path_factory, data):
    box = Outbox(tmp_path_factory.mktemp("home"))
    try:
        before = state_besides_bookkeeping(box.root / "state.db")
        files = {}
        for name in data.draw(st.lists(names, min_size=1, max_size=5, unique=True)):
            raw, code = bad_file(box, data.draw(st.sampled_from(BAD_KINDS)), data)
            box.drop(name, raw)
            files[name] = (raw, code)
        good = box.env(payload={"alive": True})
        write_message(box.root / "outbox", ME, good.id, good.encode())
        box.receiver.poll(0)
        assert [e.id for e in box.got] == [good.id]                      # the receiver still delivers
        assert not [p for p in box.folder.iterdir() if not p.name.startswith(".")]
        quarantine = box.root / "outbox" / QUARANTINE_DIR / ME
        for name, (raw, code) in files.items():
            copies = [p for p in quarantine.iterdir() if p.name.rsplit(".", 1)[0] == name]
            assert len(copies) == 1, (name, sorted(p.name for p in quarantine.iterdir()))
            got_code = copies[0].name.rsplit(".", 1)[1]
            assert got_code in REJECTION_CODES and (code is None or got_code == code), (name, got_code, code)
            assert copies[0].read_bytes() == raw
        box.close()
        assert state_besides_bookkeeping(box.root / "state.db") == before
        journal = events(box.root / "state.db")
        assert sorted(k for k, _ in journal) == ["message_rejected"] * len(files)
        counters = read_counters(box.root / "state.db")[ME]
        assert sum(v for k, v in counters.items() if k.startswith("rejected:")) == len(files)
        assert counters["delivered"] == 1
    finally:
        box.close()


def test_dot_files_and_folders_are_left_alone_and_symlinks_removed_unread(tmp_path):
    box = Outbox(tmp_path / "home")
    try:
        secret = tmp_path / "secret.txt"
        secret.write_text("not for the receiver")
        box.drop(".partial", b"half")
        (box.folder / "sub").mkdir()
        (box.folder / "link.msg").symlink_to(secret)
        box.receiver.poll(0)
        assert sorted(p.name for p in box.folder.iterdir()) == [".partial", "sub"]
        assert secret.read_text() == "not for the receiver"
        assert not (box.root / "outbox" / QUARANTINE_DIR / ME).exists()
        assert box.got == []
    finally:
        box.close()


def test_replayed_copies_of_a_delivered_message_are_dropped_and_counted_not_quarantined(tmp_path):
    box = Outbox(tmp_path / "home")
    try:
        env = box.env(payload={"work": "w-replay"})
        write_message(box.root / "outbox", ME, env.id, env.encode())
        box.receiver.poll(0)
        box.close()
        for name in ("copy-1.msg", "copy-2"):                    # replayed while the receiver was down
            box.drop(name, env.encode())
        again = Outbox(box.root, prepare=False)                  # restarted: drains at start-up
        again.receiver.poll(0)
        again.close()
        assert [e.id for e in box.got] == [env.id] and again.got == []
        assert not [p for p in box.folder.iterdir() if not p.name.startswith(".")]
        assert not (box.root / "outbox" / QUARANTINE_DIR / ME).exists()
        assert read_counters(box.root / "state.db")[ME] == {"delivered": 1, "duplicates": 2}
        assert events(box.root / "state.db") == []
    finally:
        box.close()


# -- upgrades: a file written by another envelope version is rejected with a code, never lost ------

def test_an_outbox_file_from_an_older_envelope_version_is_quarantined_and_journaled(tmp_path):
    box = Outbox(tmp_path / "home")
    try:
        wire = orjson.loads(box.env(payload={"work": "w-old"}).encode())
        wire["v"] = 0
        old = orjson.dumps(wire)
        box.drop(f"{wire['id']}.msg", old)
        box.receiver.poll(0)
        copy = box.root / "outbox" / QUARANTINE_DIR / ME / f"{wire['id']}.msg.unknown_version"
        assert copy.read_bytes() == old and box.got == []
        box.close()
        [(kind, data)] = events(box.root / "state.db")
        assert (kind, data["code"], data["kind"], data["sender"]) == (
            "message_rejected", "unknown_version", "wake", "coordinator")
        assert read_counters(box.root / "state.db")[ME] == {"rejected:unknown_version": 1}
    finally:
        box.close()


def test_files_written_before_an_upgrade_are_rejected_with_a_code_after_it(tmp_path, monkeypatch):
    """Messages waiting in an outbox while the org is upgraded to the next envelope version are
    quarantined as unknown_version (with the original bytes), journaled and counted."""
    box = Outbox(tmp_path / "home")
    box.receiver.close()                                   # the org stops for the upgrade
    waiting = [box.env(payload={"n": i}) for i in range(3)]
    for env in waiting:
        write_message(box.root / "outbox", ME, env.id, env.encode())
    monkeypatch.setattr(envelope_mod, "VERSION", envelope_mod.VERSION + 1)
    upgraded = Outbox(box.root, prepare=False)
    try:
        upgraded.receiver.poll(0)
        assert upgraded.got == []
        quarantine = box.root / "outbox" / QUARANTINE_DIR / ME
        assert sorted(p.name for p in quarantine.iterdir()) == sorted(f"{e.id}.msg.unknown_version" for e in waiting)
        upgraded.close()
        journal = events(box.root / "state.db")
        assert [d["code"] for _, d in journal] == ["unknown_version"] * 3
    finally:
        upgraded.close()


@pytest.mark.parametrize("version", [0, 2, -1])
def test_decoder_names_the_version_mismatch(version):
    wire = dict(orjson.loads(signed().encode()), v=version)
    assert outcome(orjson.dumps(wire)) == Code.UNKNOWN_VERSION
