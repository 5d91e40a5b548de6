"""The verify seam inside the org: ask the eval-agent, then wait for its verdict in state.db.

The request is only a wake-up: the eval-agent also finds unverified committed iterations on its
own tick, so a lost message delays the verdict, never loses it.
"""
from __future__ import annotations

import threading
import time
from typing import Callable


class VerifyInterrupted(Exception):
    code = "verify_interrupted"


class RemoteVerify:
    """``verify(work_id, n)`` for a loop-agent process.

    Args:
        conn_factory: returns a sqlite3 connection for reads.
        send: ``send(recipient, kind, payload)`` over the transport.
        interrupt: events; any set abandons the wait (suspend, shutdown). The iteration stays
            committed and is verified on resume.
        resend_s: how often the request is repeated while waiting.
    """

    def __init__(self, conn, send: Callable, interrupt: tuple[threading.Event, ...], *, resend_s: float = 15.0):
        self.conn = conn
        self.send = send
        self.interrupt = interrupt
        self.resend_s = resend_s
        self.arrived = threading.Event()

    def _found(self, work_id: str, n: int) -> bool:
        return self.conn.execute("SELECT 1 FROM verdicts WHERE work_id=? AND iteration=? AND written_by LIKE 'eval-agent%'",
                                 (work_id, n)).fetchone() is not None

    def __call__(self, work_id: str, n: int) -> None:
        next_send = 0.0
        while not self._found(work_id, n):
            if any(e.is_set() for e in self.interrupt):
                raise VerifyInterrupted(f"stopped waiting for the verdict of {work_id} #{n}")
            if time.monotonic() >= next_send:
                self.send("eval-agent", "verify_request", {"work_id": work_id, "iteration": n})
                next_send = time.monotonic() + self.resend_s
            self.arrived.wait(0.25)
            self.arrived.clear()
