"""Message kinds, instance names and the capability table (which roles may send which kind).

Messages are only wake-ups: every fact that matters is a state.db row first, so payloads are
small JSON dicts of ids and hints. The table is enforced by the receiver (``not_authorized``) and
checked early by the sender.
"""
from __future__ import annotations

import re
from enum import StrEnum
from types import MappingProxyType

from state_db.vocab import Actor

from transport.errors import BadInstance


class Kind(StrEnum):
    PING = "ping"                        # liveness probe; answered by ``pong``
    PONG = "pong"
    STOP = "stop"                        # supervisor → role: stop cleanly
    SUSPEND = "suspend"                  # supervisor → role: reach a safe boundary, then stop
    WAKE = "wake"                        # anyone → a role: "look at state.db"
    DISPATCH = "dispatch"                # coordinator → loop-agent: a work item is yours
    CANCEL = "cancel"                    # cancel a work item
    VERIFY_REQUEST = "verify_request"    # loop-agent → eval-agent: verify checkpoint n
    VERDICT_READY = "verdict_ready"      # eval-agent → loop-agent/coordinator
    RUN_ENDED = "run_ended"              # loop-agent → coordinator/curator
    DECISION_NEEDED = "decision_needed"  # loop-agent → coordinator: a gated action waits
    DECISION_MADE = "decision_made"      # human/coordinator → loop-agent
    ANNOUNCE = "announce"                # coordinator → human-facing channel
    BATCH_OPENED = "batch_opened"        # curator → coordinator: candidate batch to announce
    ROLE_FAILED = "role_failed"          # supervisor → coordinator: a role crashed too often


ANY_SENDER = frozenset(Actor)

#: kind → roles allowed to send it. Recipients are not restricted: any instance may be woken.
CAPABILITIES: MappingProxyType[Kind, frozenset[Actor]] = MappingProxyType(
    {
        Kind.PING: ANY_SENDER,
        Kind.PONG: ANY_SENDER,
        Kind.STOP: frozenset({Actor.SUPERVISOR}),
        Kind.SUSPEND: frozenset({Actor.SUPERVISOR}),
        Kind.WAKE: ANY_SENDER,
        Kind.DISPATCH: frozenset({Actor.COORDINATOR}),
        Kind.CANCEL: frozenset({Actor.COORDINATOR, Actor.HUMAN}),
        Kind.VERIFY_REQUEST: frozenset({Actor.LOOP_AGENT}),
        Kind.VERDICT_READY: frozenset({Actor.EVAL_AGENT}),
        Kind.RUN_ENDED: frozenset({Actor.LOOP_AGENT}),
        Kind.DECISION_NEEDED: frozenset({Actor.LOOP_AGENT}),
        Kind.DECISION_MADE: frozenset({Actor.HUMAN, Actor.COORDINATOR}),
        Kind.ANNOUNCE: frozenset({Actor.COORDINATOR}),
        Kind.BATCH_OPENED: frozenset({Actor.CURATOR}),
        Kind.ROLE_FAILED: frozenset({Actor.SUPERVISOR}),
    }
)
assert set(CAPABILITIES) == set(Kind), "every kind needs a row in the capability table"

# Instance names end up in file names and socket paths, so they are kept to a strict shape.
_INSTANCE_RE = re.compile(r"^(?P<role>[a-z]+(?:-[a-z]+)*?)(?:-(?P<n>[1-9][0-9]{0,3}))?$")
_ROLES = {a.value: a for a in Actor}
_role_cache: dict[str, Actor] = {}


def role_of(instance: str) -> Actor:
    """Return the role of an instance name.

    Args:
        instance: ``<role>`` (e.g. ``coordinator``, ``human``) or ``<role>-<n>`` with n in
            1..9999 (e.g. ``loop-agent-2``).

    Raises:
        BadInstance: the name has another shape or an unknown role.
    """
    role = _role_cache.get(instance) if isinstance(instance, str) else None
    if role is not None:
        return role
    m = _INSTANCE_RE.match(instance) if isinstance(instance, str) else None
    if m is None or m.group("role") not in _ROLES:
        raise BadInstance(instance)
    role = _ROLES[m.group("role")]
    if len(_role_cache) < 4096:  # bounded: names come from the wire
        _role_cache[instance] = role
    return role


def is_instance(instance: object) -> bool:
    """True if ``instance`` is a valid instance name (see :func:`role_of`)."""
    try:
        role_of(instance)  # type: ignore[arg-type]
    except BadInstance:
        return False
    return True


def may_send(instance: str, kind: Kind | str) -> bool:
    """True if the role of ``instance`` may send ``kind``. Unknown kinds and names → False."""
    allowed = CAPABILITIES.get(kind) if isinstance(kind, str) else None  # StrEnum keys: plain str works
    if allowed is None:
        return False
    try:
        return role_of(instance) in allowed
    except BadInstance:
        return False
