"""The verify seam inside the org: ask the eval-agent, then wait for its verdict in state.db.

The request is only a wake-up: the eval-agent also finds unverified committed iterations on its
own tick, so a lost message delays the verdict, never loses it.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from state_db.kernel.errors import OrgError
from state_db.queries.verdicts import verified
from state_db.queries.work import item


class VerifyInterrupted(OrgError):
    code = "verify_interrupted"


class VerifyAbandoned(OrgError):
    """The run must end while it waits for a verdict (cancelled, or past its timeout):
    ``reason`` is the stop reason, ``detail`` says why."""

    code = "verify_abandoned"

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def wait_check(conn, work_id: str, waited_s: float) -> tuple[str, str] | None | bool:
    """While a loop-agent waits for a verdict: ``True`` if the run ended meanwhile (the eval-agent
    ended it), ``(reason, detail)`` if it must end now (cancel requested; the act time plus this
    wait passed the run's timeout), else None."""
    work = item(conn, work_id)
    if work is None or work.ended:
        return True
    if work.cancel_requested:
        return ("cancelled", "cancelled while waiting for the eval-agent's verdict")
    timeout = work.caps.timeout_s
    if timeout is not None and work.elapsed_s + waited_s > timeout:
        return ("timeout", f"{work.elapsed_s + waited_s:.1f} s elapsed (acts plus the wait for a verdict), "
                           f"limit {timeout} s")
    return None


class RemoteVerify:
    """``verify(work_id, n)`` for a loop-agent process.

    Args:
        conn_factory: returns a sqlite3 connection for reads.
        send: ``send(recipient, kind, payload)`` over the transport.
        interrupt: events; any set abandons the wait (suspend, shutdown). The iteration stays
            committed and is verified on resume.
        resend_s: how often the request is repeated while waiting.
        recheck_s: how often the store is read again without a wake-up (the eval-agent's
            ``verdict_ready`` sets ``arrived``); bounds how late a cancel or the run's timeout
            is seen while waiting.
        eval_agent: ``eval_agent(work_id, n)``: the eval-agent instance that verifies iteration
            ``n`` of a work item (of several, its owner).
    """

    def __init__(self, conn, send: Callable, interrupt: tuple[threading.Event, ...], *, resend_s: float = 15.0,
                 recheck_s: float = 0.5, eval_agent: Callable[[str, int], str] = lambda work_id, n: "eval-agent"):
        self.conn = conn
        self.eval_agent = eval_agent        # (work id, n) -> the eval-agent that verifies it
        self.send = send
        self.interrupt = interrupt
        self.resend_s = resend_s
        self.recheck_s = recheck_s
        self.arrived = threading.Event()

    def _found(self, work_id: str, n: int) -> bool:
        return verified(self.conn, work_id, n)      # n == 0: the preflight, on the baseline

    def __call__(self, work_id: str, n: int) -> None:
        """Wait for the verdict of iteration ``n`` (0: the preflight). Returns when it is in
        state.db or the run ended; raises VerifyInterrupted (suspend, shutdown) or
        VerifyAbandoned (cancel, timeout)."""
        next_send = 0.0
        t0 = time.monotonic()
        while not self._found(work_id, n):
            if any(e.is_set() for e in self.interrupt):
                raise VerifyInterrupted(f"stopped waiting for the verdict of {work_id} #{n}")
            verdict = wait_check(self.conn, work_id, time.monotonic() - t0)
            if verdict is True:
                return
            if verdict:
                raise VerifyAbandoned(*verdict)
            if time.monotonic() >= next_send:
                self.send(self.eval_agent(work_id, n), "verify_request", {"work_id": work_id, "iteration": n})
                next_send = time.monotonic() + self.resend_s
            self.arrived.wait(self.recheck_s)
            self.arrived.clear()
