"""The wake after a durable human write: best effort, because state.db already holds the fact.

A wake that cannot be sent delays the coordinator until its next reconcile (or the org's next
start); it never loses the write. Still, it is never silent: the log says so, and the sender's
``wake_not_sent`` counter (in ``transport_counters``, beside the transport's own counters) is
raised, so ``org status`` shows how often it happened per sender.
"""
from __future__ import annotations

import structlog

from state_db.kernel.config import Config
from state_db.kernel.errors import OrgError
from state_db.kernel.home import OrgHome

SENT = ("push", "outbox")
NOT_SENT = "wake_not_sent"          # transport counter: wakes this sender could not send

log = structlog.get_logger("wake")


class Waker:
    """Opens the connection to the coordinator before the durable write, so the wake after the
    commit leaves at once (a fresh connection takes tens of milliseconds to be usable). It sends
    as ``sender`` through the transport's own one-actor sender (``transport.wake.OneSender``),
    never through a role's link.

    Args:
        home, cfg: the org home and its config.
        sender: the sending instance (``human`` for the CLI).
        keep: keep the connection for the next wake (a process submitting many items: each new
            sender opens its keyring, a socket and a store connection for its counters); the
            caller closes it (``close``), which writes the counters.
    """

    def __init__(self, home: OrgHome, cfg: Config, sender: str = "human", *, keep: bool = False):
        self.home, self.cfg, self.sender, self.link, self.error = home, cfg, sender, None, None
        self.keep = keep
        try:
            from transport.wake import OneSender
            self.link = OneSender(home.root, sender, transport=cfg.transport.model_dump(), store=home.db_path)
            self.link.prepare("coordinator")
        except Exception as exc:  # noqa: BLE001 - reported by wake()
            self.error = exc

    def wake(self, payload: dict | None = None) -> str:
        """Send the wake; returns "push", "outbox" or "not sent: <why>" (never raises). A wake
        not sent is logged and counted."""
        result = self._send(payload or {})
        if result not in SENT:
            record_unsent(self.home, self.sender, result, payload or {})
        return result

    def _send(self, payload: dict) -> str:
        if self.link is None:
            return f"not sent: {_why(self.error)}"
        try:
            return self.link.send("coordinator", "wake", payload)
        except Exception as exc:  # noqa: BLE001 - a lost wake delays, never loses
            return f"not sent: {_why(exc)}"
        finally:
            if not self.keep:
                self.close()

    def close(self) -> None:
        """Close the connection and write its counters (never raises; idempotent)."""
        link, self.link = self.link, None
        if link is not None:
            try:
                link.close()
            except Exception:  # noqa: BLE001
                pass


def _why(exc: BaseException | None) -> str:
    """An error's code (an OrgError), else its type's name."""
    return exc.code if isinstance(exc, OrgError) else type(exc).__name__


def record_unsent(home: OrgHome, sender: str, result: str, payload: dict) -> None:
    """Log a wake that could not be sent and count it durably (never raises)."""
    log.warning("wake_not_sent", sender=sender, why=result, payload=payload,
                next="the coordinator sees the write at its next reconcile, or when the org starts")
    try:
        from transport.ledger import Counters, Ledger
        counters = Counters(sender)
        counters.add(NOT_SENT)
        ledger = Ledger(home.db_path, sender, counters=counters, background_checkpoint=False)
        try:
            ledger.flush()
        finally:
            ledger.close()
    except Exception as exc:  # noqa: BLE001 - the log line above still tells
        log.warning("wake_not_counted", sender=sender, error=str(exc), next="nothing; the log keeps it")


def unsent_note(result: str, then: str) -> str | None:
    """The one line a command prints when its wake was not sent (None when it was)."""
    return None if result in SENT else f"the coordinator was not reached ({result}); {then}"


def wake_coordinator(home: OrgHome, cfg: Config, payload: dict | None = None) -> str:
    """Wake the coordinator; returns "push", "outbox" or "not sent: <why>" (never raises)."""
    return Waker(home, cfg).wake(payload)
