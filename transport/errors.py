"""The transport's error tree and its closed vocabulary of codes.

Every failure the seam reports is a :class:`TransportError` whose ``code`` is one of
:class:`Code`. Rejections of a received message (:class:`Rejected`) also carry what could be
learnt about it (claimed sender, id) so the receiver can journal them without re-parsing.
"""
from __future__ import annotations

from state_db.kernel.errors import OrgError

from enum import StrEnum


class Code(StrEnum):
    """Machine-readable codes. Rejection codes first, then set-up and configuration codes."""

    # Why a received message was rejected (journaled as ``message_rejected``, counted as
    # ``rejected:<code>``).
    BAD_ENVELOPE = "bad_envelope"
    MESSAGE_TOO_LARGE = "message_too_large"
    EXPIRED = "expired"
    FROM_FUTURE = "from_future"
    NOT_AUTHENTICATED = "not_authenticated"
    NOT_AUTHORIZED = "not_authorized"
    DUPLICATE = "duplicate"
    UNKNOWN_KIND = "unknown_kind"
    UNKNOWN_VERSION = "unknown_version"
    WRONG_RECIPIENT = "wrong_recipient"
    # Set-up and configuration.
    BAD_INSTANCE = "bad_instance"
    IPC_PATH_TOO_LONG = "ipc_path_too_long"
    CURVE_REQUIRED = "curve_required"
    BAD_ENDPOINT = "bad_endpoint"
    UNKNOWN_KEY = "unknown_key"
    KEYRING_UNSAFE = "keyring_unsafe"
    KEYRING_CORRUPT = "keyring_corrupt"
    KEYRING_MISSING = "keyring_missing"
    OUTBOX_FAILED = "outbox_failed"


REJECTION_CODES = frozenset(
    {
        Code.BAD_ENVELOPE,
        Code.MESSAGE_TOO_LARGE,
        Code.EXPIRED,
        Code.FROM_FUTURE,
        Code.NOT_AUTHENTICATED,
        Code.NOT_AUTHORIZED,
        Code.DUPLICATE,
        Code.UNKNOWN_KIND,
        Code.UNKNOWN_VERSION,
        Code.WRONG_RECIPIENT,
    }
)


class TransportError(OrgError):
    """Base of every transport error.

    Attributes:
        code: one of :class:`Code`.
    """

    code: Code = Code.BAD_ENVELOPE

    def __init__(self, message: str, *, code: Code | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = Code(code)

    def line(self) -> str:
        return f"error[{self.code}]: {self.message}"

    def __str__(self) -> str:
        return f"[{self.code}] {super().__str__()}"


class Rejected(TransportError):
    """A received message (bytes on a socket or an outbox file) that must not be handled.

    Attributes:
        code: one of :data:`REJECTION_CODES`.
        sender: the sender it claims, if it could be read (unauthenticated unless code says so).
        msg_id: the id it claims, if it could be read.
        kind: the kind it claims, if it could be read.
    """

    def __init__(
        self,
        code: Code,
        message: str,
        *,
        sender: str | None = None,
        msg_id: str | None = None,
        kind: str | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.sender = sender
        self.msg_id = msg_id
        self.kind = kind


class BadInstance(TransportError):
    """An instance name that is not ``<role>`` or ``<role>-<n>`` with a known role."""

    code = Code.BAD_INSTANCE

    def __init__(self, instance: object) -> None:
        super().__init__(
            f"instance name {instance!r} is not '<role>' or '<role>-<n>' with a role from "
            "state_db.vocab.Actor; use e.g. 'loop-agent-2' or 'coordinator'"
        )
        self.instance = instance


class IpcPathTooLong(TransportError):
    """The ipc:// socket path would exceed the operating system's limit."""

    code = Code.IPC_PATH_TOO_LONG

    def __init__(self, path: str, length: int, limit: int) -> None:
        super().__init__(
            f"ipc socket path {path!r} is {length} bytes, over the {limit}-byte limit; "
            "set a shorter ORG_HOME (e.g. ~/.org) or configure a tcp:// endpoint with CURVE"
        )
        self.path = path
        self.length = length
        self.limit = limit


class CurveRequired(TransportError):
    """A tcp:// endpoint was asked for without CURVE keys to encrypt and authenticate it."""

    code = Code.CURVE_REQUIRED

    def __init__(self, endpoint: str, instance: str) -> None:
        super().__init__(
            f"tcp endpoint {endpoint!r} needs CURVE keys for {instance!r}; issue them with "
            "Keyring.issue_curve(instance) (the supervisor does) or use the default ipc:// endpoint"
        )
        self.endpoint = endpoint
        self.instance = instance


class BadEndpoint(TransportError):
    """An endpoint that is neither ipc:// nor tcp://."""

    code = Code.BAD_ENDPOINT

    def __init__(self, endpoint: str) -> None:
        super().__init__(
            f"endpoint {endpoint!r} is not supported; use ipc://<path> or tcp://<host>:<port>"
        )
        self.endpoint = endpoint


class KeyringError(TransportError):
    """The keyring file is missing, unsafe (readable by others) or corrupt, or lacks a key."""

    def __init__(self, code: Code, message: str, *, path: str | None = None) -> None:
        super().__init__(message, code=code)
        self.path = path
