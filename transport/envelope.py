"""The message envelope: a frozen dataclass, its wire encoding and its checked decoding.

Wire format (version 1): one JSON object (orjson) with the fields ``v``, ``id``, ``kind``,
``sender``, ``recipient``, ``created_at``, ``payload`` and ``tag``. The tag is
HMAC-SHA256, keyed with the *sender instance's* key, over :meth:`Envelope.signing_bytes` — the
canonical encoding of every other field — so a message cannot be re-addressed, re-dated or
re-attributed without the sender's key.

:func:`decode` turns untrusted bytes into an Envelope or raises :class:`Rejected` with a code;
it never raises anything else.
"""
from __future__ import annotations

import hmac
import os
import threading
import time
from itertools import count
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from transport.errors import BadInstance, Code, Rejected
from transport.kinds import CAPABILITIES, Kind, role_of

VERSION = 1
_DOMAIN = b"loop-org/envelope/1\n"  # domain separation: this key signs nothing else like this
_FIELDS = frozenset({"v", "id", "kind", "sender", "recipient", "created_at", "payload", "tag"})
_HEX = frozenset("0123456789abcdef")
_ID_LEN = 32
_TAG_LEN = 64
_KINDS = frozenset(k.value for k in Kind)


@dataclass(frozen=True)
class Limits:
    """What a receiver accepts.

    Attributes:
        max_bytes: size cap of an encoded envelope, checked before parsing.
        max_age_s: a message older than this (plus ``skew_s``) is ``expired``.
        skew_s: clock-skew tolerance, both ways.
        max_depth: maximum nesting of lists/dicts in the payload.
    """

    max_bytes: int = 256 * 1024
    max_age_s: float = 600.0
    skew_s: float = 30.0
    max_depth: int = 16

    @classmethod
    def from_config(cls, transport: dict) -> "Limits":
        """Limits from org.toml's ``[transport]`` table (missing keys keep their defaults)."""
        d = cls()
        return cls(
            max_bytes=int(transport.get("max_message_bytes", d.max_bytes)),
            max_age_s=float(transport.get("max_age_s", d.max_age_s)),
            skew_s=float(transport.get("clock_skew_s", d.skew_s)),
        )

    @property
    def ledger_keep_s(self) -> float:
        """How long the delivery ledger must keep an id: any older copy is rejected as expired."""
        return self.max_age_s + 2 * self.skew_s


DEFAULT_LIMITS = Limits()


class KeySource(Protocol):
    """What :func:`decode` needs from a keyring."""

    def key_for(self, instance: str) -> bytes | None: ...

    def refresh(self) -> bool: ...


_id_lock = threading.Lock()
_last_id_ns = 0
_id_tail = count()
_id_process = ""


def _reseed_ids() -> None:
    # A random part per process (re-drawn in a forked child), then a counter: no syscall per id.
    global _id_process, _id_tail
    _id_process, _id_tail = os.urandom(4).hex(), count()


_reseed_ids()
os.register_at_fork(after_in_child=_reseed_ids)


def new_id() -> str:
    """Return a new message id: 32 lowercase hex digits — ns time, process random, counter.

    Ids from one process are strictly increasing; ids from different processes sort by creation
    time to within clock resolution.
    """
    global _last_id_ns
    with _id_lock:
        t = time.time_ns()
        if t <= _last_id_ns:
            t = _last_id_ns + 1
        _last_id_ns = t
    return f"{t:016x}{_id_process}{next(_id_tail) & 0xFFFFFFFF:08x}"


try:  # OpenSSL's HMAC object: copy() reuses the keyed state instead of re-keying per message
    from _hashlib import hmac_new as _hmac_new
except ImportError:  # pragma: no cover - interpreters without OpenSSL's _hashlib
    def _hmac_new(key: bytes, digestmod: str):  # type: ignore[misc]
        return hmac.new(key, digestmod=digestmod)

_keyed: dict[bytes, object] = {}


def _tag(key: bytes, signing_bytes: bytes) -> str:
    base = _keyed.get(key)
    if base is None:
        if len(_keyed) >= 256:  # keys come from the keyring, but stay bounded anyway
            _keyed.clear()
        base = _keyed[key] = _hmac_new(key, digestmod="sha256")
    h = base.copy()
    h.update(signing_bytes)
    return h.hexdigest()


def _signing_bytes(v, msg_id, kind, sender, recipient, created_at, payload) -> bytes:
    return _DOMAIN + orjson.dumps([v, msg_id, kind, sender, recipient, created_at, payload],
                                  option=orjson.OPT_SORT_KEYS)


@dataclass(frozen=True)
class Envelope:
    """One message. Build with :meth:`create`; parse with :func:`decode`."""

    v: int
    id: str
    kind: str
    sender: str
    recipient: str
    created_at: float
    payload: dict[str, Any] = field(default_factory=dict)
    tag: str = ""

    @classmethod
    def create(
        cls,
        kind: Kind | str,
        sender: str,
        recipient: str,
        payload: dict[str, Any] | None,
        *,
        key: bytes,
        now: float,
        msg_id: str | None = None,
    ) -> Envelope:
        """Build and sign an envelope.

        Args:
            kind: a :class:`Kind` (not checked against the capability table here).
            sender: the sending instance; ``key`` must be its key.
            recipient: the receiving instance.
            payload: a small JSON-serialisable dict (ids and hints; facts live in state.db).
            key: the sender instance's key.
            now: creation time (epoch seconds).
            msg_id: reuse an id (e.g. to send one message by two paths); default a new one.

        Raises:
            Rejected(bad_envelope): a field has the wrong type or the payload is not JSON.
        """
        msg_id = msg_id or new_id()
        kind, now = str(kind), float(now)
        payload = {} if payload is None else payload
        if not isinstance(payload, dict):
            raise Rejected(Code.BAD_ENVELOPE, "payload must be a dict (ids and hints)")
        try:
            sig = _signing_bytes(VERSION, msg_id, kind, sender, recipient, now, payload)
        except TypeError as e:
            raise Rejected(Code.BAD_ENVELOPE, f"payload is not JSON-serialisable: {e}") from e
        return cls(VERSION, msg_id, kind, sender, recipient, now, payload, _tag(key, sig))

    def signing_bytes(self) -> bytes:
        """Canonical bytes of every field but ``tag`` (payload keys sorted)."""
        return _signing_bytes(self.v, self.id, self.kind, self.sender, self.recipient,
                              self.created_at, self.payload)

    def verify(self, key: bytes) -> bool:
        """True if ``tag`` was made with ``key`` over this envelope's other fields."""
        return hmac.compare_digest(_tag(key, self.signing_bytes()), self.tag)

    @classmethod
    def decode(cls, data: bytes, **checks: Any) -> Envelope:
        """Parse and check untrusted bytes: see the module function :func:`decode`."""
        return decode(data, **checks)

    def encode(self) -> bytes:
        """The wire bytes (one JSON object)."""
        return orjson.dumps(
            {"v": self.v, "id": self.id, "kind": self.kind, "sender": self.sender,
             "recipient": self.recipient, "created_at": self.created_at,
             "payload": self.payload, "tag": self.tag}
        )


def _claimed(obj: dict, name: str) -> str | None:
    value = obj.get(name)
    return value[:64] if isinstance(value, str) else None


def _too_deep(payload: Any, max_depth: int) -> bool:
    """True if lists/dicts nest more than ``max_depth`` levels (scalars are not a level)."""
    stack = [(payload, 1)]
    while stack:
        value, depth = stack.pop()
        if not isinstance(value, (dict, list)):
            continue
        if depth > max_depth:
            return True
        children = value.values() if isinstance(value, dict) else value
        stack.extend((v, depth + 1) for v in children if isinstance(v, (dict, list)))
    return False


def _is_hex(value: object, length: int) -> bool:
    return isinstance(value, str) and len(value) == length and _HEX.issuperset(value)


def decode(
    data: bytes,
    *,
    keyring: KeySource,
    now: float,
    max_age_s: float = DEFAULT_LIMITS.max_age_s,
    skew_s: float = DEFAULT_LIMITS.skew_s,
    max_bytes: int = DEFAULT_LIMITS.max_bytes,
    max_depth: int = DEFAULT_LIMITS.max_depth,
    recipient: str | None = None,
) -> Envelope:
    """Parse and check untrusted bytes.

    Checks, in order: size, JSON, version, shape and types, kind, instance names, the sender's
    tag, recipient (if given), the capability table, age.

    Args:
        data: the bytes received (socket frame or outbox file contents).
        keyring: gives the claimed sender's key; refreshed once if the key is missing or wrong.
        now: the receiver's clock (epoch seconds).
        max_age_s, skew_s: older than ``max_age_s + skew_s`` → expired; newer than
            ``now + skew_s`` → from_future.
        max_bytes: size cap, checked before parsing.
        max_depth: nesting cap of the payload.
        recipient: the receiving instance; another recipient → wrong_recipient.

    Returns:
        The authenticated, authorised envelope.

    Raises:
        Rejected: with a code from :data:`transport.errors.REJECTION_CODES`; nothing else.
    """
    try:
        return _decode(data, keyring, now, max_age_s, skew_s, max_bytes, max_depth, recipient)
    except Rejected:
        raise
    except Exception as e:  # noqa: BLE001 - untrusted input must never escape as another error
        raise Rejected(Code.BAD_ENVELOPE, f"unreadable envelope ({type(e).__name__})") from e


def _decode(data, keyring, now, max_age_s, skew_s, max_bytes, max_depth, recipient) -> Envelope:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise Rejected(Code.BAD_ENVELOPE, f"expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise Rejected(Code.MESSAGE_TOO_LARGE,
                       f"{len(data)} bytes is over the {max_bytes}-byte cap; send ids, not data")
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise Rejected(Code.BAD_ENVELOPE, f"not JSON/UTF-8: {e}") from None
    if not isinstance(obj, dict):
        raise Rejected(Code.BAD_ENVELOPE, "not a JSON object")

    def reject(code: Code, message: str) -> Rejected:
        return Rejected(code, message, sender=_claimed(obj, "sender"), msg_id=_claimed(obj, "id"),
                        kind=_claimed(obj, "kind"))

    v = obj.get("v")
    if type(v) is not int:
        raise reject(Code.BAD_ENVELOPE, "missing or non-integer version 'v'")
    if v != VERSION:
        raise reject(Code.UNKNOWN_VERSION,
                     f"version {v} is not {VERSION}; sender and receiver run different releases")
    if obj.keys() != _FIELDS:
        raise reject(Code.BAD_ENVELOPE, f"fields must be exactly {sorted(_FIELDS)}")
    created_at, payload = obj["created_at"], obj["payload"]
    if not _is_hex(obj["id"], _ID_LEN):
        raise reject(Code.BAD_ENVELOPE, "id must be 32 lowercase hex digits")
    if not _is_hex(obj["tag"], _TAG_LEN):
        raise reject(Code.BAD_ENVELOPE, "tag must be 64 lowercase hex digits")
    if type(created_at) not in (float, int):
        raise reject(Code.BAD_ENVELOPE, "created_at must be a number")
    if not isinstance(payload, dict):
        raise reject(Code.BAD_ENVELOPE, "payload must be a JSON object")
    # A payload cannot be deeper than its count of brackets: skip the walk for flat ones.
    if data.count(b"{") + data.count(b"[") > max_depth and _too_deep(payload, max_depth):
        raise reject(Code.BAD_ENVELOPE, f"payload nested deeper than {max_depth}")
    if not isinstance(obj["kind"], str) or obj["kind"] not in _KINDS:
        raise reject(Code.UNKNOWN_KIND, f"kind {_claimed(obj, 'kind')!r} is not a known kind")
    try:
        role = role_of(obj["sender"])
        role_of(obj["recipient"])
    except BadInstance:
        raise reject(Code.BAD_ENVELOPE, "sender and recipient must be instance names") from None
    env = Envelope(v, obj["id"], obj["kind"], obj["sender"], obj["recipient"], created_at,
                   payload, obj["tag"])
    key = keyring.key_for(env.sender)
    if key is None or not env.verify(key):
        # The supervisor may have issued or rotated keys since this process loaded them.
        key = keyring.key_for(env.sender) if keyring.refresh() else None
        if key is None or not env.verify(key):
            raise reject(Code.NOT_AUTHENTICATED,
                         "tag does not match the claimed sender's key (forged, altered, or "
                         "signed with another instance's key)")
    if recipient is not None and env.recipient != recipient:
        raise reject(Code.WRONG_RECIPIENT, f"addressed to {env.recipient!r}, not {recipient!r}")
    if role not in CAPABILITIES[env.kind]:  # StrEnum keys match plain str
        raise reject(Code.NOT_AUTHORIZED, f"role {role} may not send {env.kind!r}")
    age = now - created_at
    if age > max_age_s + skew_s:
        raise reject(Code.EXPIRED, f"created {age:.1f} s ago, over the {max_age_s} s maximum age")
    if age < -skew_s:
        raise reject(Code.FROM_FUTURE,
                     f"created {-age:.1f} s in the future, over the {skew_s} s skew tolerance; "
                     "check the clocks")
    return env
