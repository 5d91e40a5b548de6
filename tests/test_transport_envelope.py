"""Envelope encoding, signing and checked decoding (in-process; property tests included)."""
from __future__ import annotations

import json
import os

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transport.envelope import Envelope, Limits, decode, new_id
from transport.errors import REJECTION_CODES, Code, Rejected

NOW = 1_800_000_000.0
KEYS = {name: os.urandom(32) for name in ("coordinator", "loop-agent-1", "loop-agent-2",
                                          "supervisor", "human")}


class DictKeys:
    """A fixed keyring (the KeySource protocol) that counts refreshes."""

    def __init__(self, keys: dict[str, bytes]) -> None:
        self.keys = dict(keys)
        self.refreshes = 0

    def key_for(self, instance: str) -> bytes | None:
        return self.keys.get(instance)

    def refresh(self) -> bool:
        self.refreshes += 1
        return False


RING = DictKeys(KEYS)


def make(kind="dispatch", sender="coordinator", recipient="loop-agent-1", payload=None,
         now=NOW, key=None) -> Envelope:
    return Envelope.create(kind, sender, recipient, payload or {"work": "w1"},
                           key=key or KEYS[sender], now=now)


def rejected_code(data: bytes, **kw) -> str:
    kw.setdefault("keyring", RING)
    kw.setdefault("now", NOW)
    with pytest.raises(Rejected) as info:
        decode(data, **kw)
    return info.value.code


def test_encode_decode_round_trip_keeps_every_field():
    env = make(payload={"work": "w1", "n": 3, "nested": {"a": [1, 2.5, None]}, "é": "ü"})
    back = Envelope.decode(env.encode(), keyring=RING, now=NOW + 1, recipient="loop-agent-1")
    assert back == env


def test_ids_are_unique_and_time_ordered():
    ids = [new_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_tag_covers_every_field():
    env = make()
    wire = orjson.loads(env.encode())
    for field, value in [("id", new_id()), ("kind", "wake"), ("sender", "human"),
                         ("recipient", "loop-agent-2"), ("created_at", NOW + 0.5),
                         ("payload", {"work": "w2"})]:
        forged = dict(wire, **{field: value})
        assert rejected_code(orjson.dumps(forged)) == Code.NOT_AUTHENTICATED, field


def test_message_signed_with_another_instances_key_is_not_authenticated():
    env = make(sender="coordinator", key=KEYS["loop-agent-1"])
    assert rejected_code(env.encode()) == Code.NOT_AUTHENTICATED


def test_unknown_sender_refreshes_the_keyring_once_then_rejects():
    ring = DictKeys({})
    assert rejected_code(make().encode(), keyring=ring) == Code.NOT_AUTHENTICATED
    assert ring.refreshes == 1


def test_wrong_recipient_is_rejected():
    assert rejected_code(make().encode(), recipient="loop-agent-2") == Code.WRONG_RECIPIENT


def test_kind_from_a_role_without_the_capability_is_not_authorized():
    env = make(kind="dispatch", sender="loop-agent-2", recipient="loop-agent-1")
    assert rejected_code(env.encode()) == Code.NOT_AUTHORIZED


def test_unknown_kind_and_unknown_version_get_their_own_codes():
    wire = orjson.loads(make().encode())
    assert rejected_code(orjson.dumps(dict(wire, kind="format_disk"))) == Code.UNKNOWN_KIND
    assert rejected_code(orjson.dumps(dict(wire, v=2))) == Code.UNKNOWN_VERSION
    assert rejected_code(orjson.dumps(dict(wire, v=0))) == Code.UNKNOWN_VERSION


def test_age_limits_with_clock_skew_tolerance():
    lim = Limits(max_age_s=60, skew_s=5)
    kw = dict(max_age_s=lim.max_age_s, skew_s=lim.skew_s)
    old_but_within_skew = make(now=NOW - 64)
    assert decode(old_but_within_skew.encode(), keyring=RING, now=NOW, **kw)
    assert rejected_code(make(now=NOW - 66).encode(), **kw) == Code.EXPIRED
    ahead_within_skew = make(now=NOW + 4)
    assert decode(ahead_within_skew.encode(), keyring=RING, now=NOW, **kw)
    assert rejected_code(make(now=NOW + 6).encode(), **kw) == Code.FROM_FUTURE


def test_size_cap_is_checked_before_parsing():
    big = make(payload={"blob": "x" * 2000}).encode()
    assert rejected_code(big, max_bytes=1000) == Code.MESSAGE_TOO_LARGE
    assert rejected_code(b"{" * 5000, max_bytes=1000) == Code.MESSAGE_TOO_LARGE


@pytest.mark.parametrize("data", [
    b"", b"not json", b"[]", b"null", b"\xff\xfe{}", b'{"v":1}',
    b'{"v":"1","id":"x"}', b'{"v":true}',
])
def test_malformed_bytes_are_bad_envelopes(data):
    assert rejected_code(data) == Code.BAD_ENVELOPE


def test_truncated_envelope_is_bad():
    data = make().encode()
    for cut in (1, len(data) // 2, len(data) - 1):
        assert rejected_code(data[:cut]) == Code.BAD_ENVELOPE


def test_wrong_field_types_and_extra_fields_are_bad():
    wire = orjson.loads(make().encode())
    for field, value in [("payload", [1]), ("created_at", "now"), ("created_at", True),
                         ("id", "ABC"), ("tag", 5), ("sender", "root"),
                         ("recipient", "../etc"), ("extra", 1)]:
        assert rejected_code(orjson.dumps(dict(wire, **{field: value}))) == Code.BAD_ENVELOPE, field


def test_deep_nesting_is_bad_envelope():
    deep: object = 1
    for _ in range(40):
        deep = [deep]
    wire = dict(orjson.loads(make().encode()), payload={"d": deep})
    assert rejected_code(orjson.dumps(wire)) == Code.BAD_ENVELOPE
    very_deep = b'{"v":1,"payload":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert rejected_code(very_deep, max_bytes=1 << 20) == Code.BAD_ENVELOPE


def test_rejection_carries_the_claimed_sender_and_id():
    env = make(sender="coordinator", key=os.urandom(32))
    with pytest.raises(Rejected) as info:
        decode(env.encode(), keyring=RING, now=NOW)
    assert (info.value.sender, info.value.msg_id, info.value.kind) == ("coordinator", env.id,
                                                                     "dispatch")


def test_unserialisable_payload_is_refused_at_creation():
    with pytest.raises(Rejected) as info:
        make(payload={"x": object()})
    assert info.value.code == Code.BAD_ENVELOPE


# -- properties: untrusted bytes never escape as anything but a coded rejection ----------------

VALID = make(payload={"work": "w1", "list": [1, 2, {"a": "b"}]}).encode()
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6),
                                                                      children, max_size=4),
    max_leaves=20,
)


def assert_coded(data: bytes) -> None:
    try:
        decode(data, keyring=RING, now=NOW, recipient="loop-agent-1")
    except Rejected as e:
        assert e.code in REJECTION_CODES
    # accepting is allowed only for authentic bytes; the property is "no other exception"


SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.binary(max_size=600))
def test_random_bytes_only_raise_coded_rejections(data):
    assert_coded(data)


@SETTINGS
@given(st.data())
def test_mutated_valid_envelopes_only_raise_coded_rejections(data):
    buf = bytearray(VALID)
    for _ in range(data.draw(st.integers(1, 6))):
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        i = data.draw(st.integers(0, max(0, len(buf) - 1)))
        if op == "flip" and buf:
            buf[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "insert":
            buf[i:i] = data.draw(st.binary(min_size=1, max_size=4))
        elif op == "delete" and buf:
            del buf[i]
        else:
            del buf[i:]
    mutated = bytes(buf)
    try:
        env = decode(mutated, keyring=RING, now=NOW, recipient="loop-agent-1")
    except Rejected as e:
        assert e.code in REJECTION_CODES
    else:  # a mutation may only survive if it changed nothing the tag covers
        assert env == decode(VALID, keyring=RING, now=NOW)


@settings(SETTINGS, max_examples=150)
@given(st.dictionaries(st.sampled_from(["v", "id", "kind", "sender", "recipient",
                                        "created_at", "payload", "tag", "x"]), json_values))
def test_random_json_objects_only_raise_coded_rejections(obj):
    assert_coded(json.dumps(obj).encode())  # stdlib: may write what orjson refuses to read
