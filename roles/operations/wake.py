"""The wake after a durable human write: best effort, because state.db already holds the fact."""
from __future__ import annotations

from state_db.config import Config
from state_db.home import OrgHome


class Waker:
    """Opens the connection to the coordinator before the durable write, so the wake after the
    commit leaves at once (a fresh connection takes tens of milliseconds to be usable)."""

    def __init__(self, home: OrgHome, cfg: Config):
        self.home, self.cfg, self.link, self.error = home, cfg, None, None
        try:
            from roles.transport_link import ThreadSender
            self.link = ThreadSender(home, "human", cfg)
            self.link.sender.pusher.prepare("coordinator")
        except Exception as exc:  # noqa: BLE001 - reported by wake()
            self.error = exc

    def wake(self, payload: dict | None = None) -> str:
        """Send the wake; returns "push", "outbox" or "not sent: <why>" (never raises)."""
        if self.link is None:
            return f"not sent: {getattr(self.error, 'code', type(self.error).__name__)}"
        try:
            return self.link.send("coordinator", "wake", payload or {})
        except Exception as exc:  # noqa: BLE001 - a lost wake delays, never loses
            return f"not sent: {getattr(exc, 'code', type(exc).__name__)}"
        finally:
            try:
                self.link.close()
            except Exception:  # noqa: BLE001
                pass


def wake_coordinator(home: OrgHome, cfg: Config, payload: dict | None = None) -> str:
    """Wake the coordinator; returns "push", "outbox" or "not sent: <why>" (never raises)."""
    return Waker(home, cfg).wake(payload)
