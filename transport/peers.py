"""The org's instances on other hosts, as the transport needs them: where each listens, its CURVE
public key (who may connect) and its HMAC key (whose envelopes are genuine).

They come from the store's ``peers`` table (``state_db.queries.peers``), which every host's
supervisor fills with its own instances when the org runs over tcp. :class:`StorePeers` reads it
at most once per ``min_interval_s`` when asked to refresh (a key or a name this process does not
know yet), and again when what it read is ``max_age_s`` old, so a host removed from the store
(``org hosts remove``) is refused within that long and a message from a known peer costs no query. The local keyring file always
wins: a row in the store cannot replace the key of an instance this host issued.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class PeerKeys:
    endpoint: str
    curve_public: bytes
    hmac_key: bytes
    host: str


class StorePeers:
    """The ``peers`` rows of the store at ``store``, cached (thread-safe)."""

    def __init__(self, store: Path | str, *, min_interval_s: float = 1.0, max_age_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.min_interval_s = min_interval_s
        self.max_age_s = max_age_s      # a host removed from the store is refused within this long
        self.clock = clock
        self._lock = threading.Lock()
        self._by_name: dict[str, PeerKeys] = {}
        self._by_key: dict[bytes, str] = {}
        self._loaded_at: float | None = None

    def _load(self) -> bool:
        from state_db.connection import connect
        from state_db.queries.peers import all_peers

        conn = connect(self.store, readonly=True)
        try:
            rows = all_peers(conn)
        finally:
            conn.close()
        by_name = {p.instance: PeerKeys(p.endpoint, p.curve_public.encode(), bytes.fromhex(p.hmac_key), p.host)
                   for p in rows}
        changed = by_name != self._by_name
        self._by_name = by_name
        self._by_key = {k.curve_public: name for name, k in by_name.items()}
        return changed

    def refresh(self, *, force: bool = False) -> bool:
        """Read the table again unless it was read less than ``min_interval_s`` ago; True if
        anything changed. A store that cannot be read keeps what was read before."""
        with self._lock:
            now = self.clock()
            if not force and self._loaded_at is not None and now - self._loaded_at < self.min_interval_s:
                return False
            self._loaded_at = now
            try:
                return self._load()
            except Exception:  # noqa: BLE001 - the store is down: the peers known so far stay
                return False

    def _fresh(self) -> None:
        if self._loaded_at is None or self.clock() - self._loaded_at >= self.max_age_s:
            self.refresh()

    def get(self, instance: str) -> PeerKeys | None:
        self._fresh()
        return self._by_name.get(instance)

    def owner(self, curve_public: bytes) -> str | None:
        self._fresh()
        return self._by_key.get(curve_public)
