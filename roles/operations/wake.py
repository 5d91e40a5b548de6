"""The wake after a durable human write: best effort, because state.db already holds the fact."""
from __future__ import annotations

from state_db.config import Config
from state_db.home import OrgHome


def wake_coordinator(home: OrgHome, cfg: Config, payload: dict | None = None) -> str:
    """Wake the coordinator; returns "push", "outbox" or "not sent: <why>" (never raises)."""
    try:
        from roles.transport_link import send_once
        return send_once(home, "human", "coordinator", "wake", payload or {}, cfg)
    except Exception as exc:  # noqa: BLE001 - a lost wake delays, never loses
        return f"not sent: {getattr(exc, 'code', type(exc).__name__)}"
