"""Receiving: one instance's PULL socket and outbox folder, checked, recorded, handled once.

Each round drains what is ready — up to ``batch`` socket frames and outbox files — decodes and
checks every message (size, shape, sender's tag, recipient, capability, age), records the
batch in the delivery ledger in one transaction, deletes processed files (quarantining bad
ones), and then calls the handler for the envelopes seen for the first time. A bad message is
rejected with a code, journaled and counted; the receiver keeps running.

The outbox is drained at start-up (first round), when a writer wakes it (a byte into the
receiver's FIFO, ``transport.outbox.WakeFifo``), and on a slow sweep that also removes orphaned
temp files and prunes the ledger.

A role process drives it from its own loop with :meth:`Receiver.poll`, interleaving its
reconcile tick, or hands it a stop event with :meth:`Receiver.serve`.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable

import structlog
import zmq

from transport.endpoints import ipc_path, scheme_of
from transport.envelope import DEFAULT_LIMITS, Envelope, Limits, decode
from transport.errors import CurveRequired, Rejected
from transport.keys import Keyring
from transport.ledger import HANDLER_ERRORS, Ledger, Rejection
from transport.outbox import OutboxReader, WakeFifo

Handler = Callable[[Envelope], None]
_ZAP_DOMAIN = "loop-org"


class Receiver:
    """The receiving end of one instance.

    Args:
        instance: the receiving instance.
        run_dir: the org home's ``run/`` folder (ipc socket under ``run/s/``).
        outbox_root: the org home's ``outbox/`` folder.
        keyring: loaded keyring (senders' keys; this instance's CURVE keys for tcp).
        handler: called once per new envelope, after it is recorded. Exceptions are logged and
            counted (``handler_errors``), never raised.
        ledger: the delivery ledger of this instance (shares ``counters`` with a Sender).
        endpoint: where to bind; default ``ipc://<run_dir>/s/<instance>``. A tcp endpoint
            (``tcp://127.0.0.1:*`` picks a free port; see :attr:`endpoint`) needs CURVE keys.
        limits: size / age / skew / nesting caps.
        clock: wall clock (message age).
        context: zmq context; default a private one (a tcp receiver runs its own ZAP handler,
            one per context).
        batch: most socket frames (and, separately, files) taken per round.
        sweep_s: the slow outbox sweep's period.
        orphan_age_s: temp files older than this are removed by the sweep.
        prune_every_s: how often the sweep prunes the ledger.
        watch: listen for writers' wakes (off: only start-up drain and sweeps).
        hwm: receive high-water mark.
    """

    def __init__(self, instance: str, *, run_dir: Path | str, outbox_root: Path | str,
                 keyring: Keyring, handler: Handler, ledger: Ledger,
                 endpoint: str | None = None, limits: Limits = DEFAULT_LIMITS,
                 clock: Callable[[], float] = time.time, context: zmq.Context | None = None,
                 batch: int = 256, sweep_s: float = 5.0, orphan_age_s: float = 60.0,
                 prune_every_s: float = 600.0, watch: bool = True, hwm: int = 1000) -> None:
        self.instance = instance
        self.run_dir = Path(run_dir)
        self.keyring = keyring
        self.handler = handler
        self.ledger = ledger
        self.limits = limits
        self.clock = clock
        self.batch = batch
        self.sweep_s = sweep_s
        self.orphan_age_s = orphan_age_s
        self.prune_every_s = prune_every_s
        self.log = structlog.get_logger("transport").bind(instance=instance)
        self._requested_endpoint = endpoint or f"ipc://{ipc_path(self.run_dir, instance)}"
        self._own_context = context is None
        self.context = context or zmq.Context()
        self.reader = OutboxReader(outbox_root, instance, max_bytes=limits.max_bytes)
        self._watch = watch
        self._watcher: WakeFifo | None = None
        self._auth = None
        self._hwm = hwm
        self.socket: zmq.Socket | None = None
        self.endpoint: str | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._interrupt_r = -1
        self._poller = zmq.Poller()
        self._closed = False
        self._outbox_due = True   # drain at start-up
        self._next_sweep = 0.0
        self._next_prune = 0.0

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> Receiver:
        """Bind the socket and watch the outbox. The first :meth:`poll` drains the outbox.

        Raises:
            IpcPathTooLong, BadEndpoint, CurveRequired, zmq.ZMQError (address in use).
        """
        endpoint = self._requested_endpoint
        sock = self.context.socket(zmq.PULL)
        try:
            sock.setsockopt(zmq.RCVHWM, self._hwm)
            sock.setsockopt(zmq.LINGER, 0)
            # Frames a little over the cap still arrive, so they are rejected and journaled;
            # absurd ones are cut by libzmq (the peer is disconnected) to protect memory.
            sock.setsockopt(zmq.MAXMSGSIZE, 4 * self.limits.max_bytes + 65536)
            if scheme_of(endpoint) == "tcp":
                self._curve_server(sock, endpoint)
            else:
                path = Path(endpoint.removeprefix("ipc://"))
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            sock.bind(endpoint)
        except BaseException:
            sock.close(linger=0)
            self._stop_auth()
            raise
        self.socket = sock
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(self._wake_r, zmq.POLLIN)
        if self._watch:
            try:
                self._watcher = WakeFifo(self.reader.dir.parent, self.instance)
                self._poller.register(self._watcher.fd, zmq.POLLIN)
            except OSError as e:            # the sweep still finds every file, only later
                self.log.warning("outbox_wake_unavailable", error=str(e), next=f"sweep every {self.sweep_s}s")
        self.log.info("receiver_started", endpoint=self.endpoint, outbox=str(self.reader.dir))
        return self

    def close(self) -> None:
        """Stop watching, close the socket, flush counters and close the ledger. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._watcher is not None:
            self._poller.unregister(self._watcher.fd)
            self._watcher.close()
            self._watcher = None
        if self.socket is not None:
            self._poller.unregister(self.socket)
            self.socket.close(linger=0)
            self.socket = None
            if self.endpoint and self.endpoint.startswith("ipc://"):
                # libzmq leaves the socket file behind; a stale one only misleads 'org doctor'
                Path(self.endpoint.removeprefix("ipc://")).unlink(missing_ok=True)
        self._stop_auth()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1
        if self._own_context:
            self.context.term()
        try:
            self.ledger.close()
        except Exception as e:  # noqa: BLE001 - closing must not mask the caller's exit
            self.log.warning("ledger_close_failed", error=str(e))

    def __enter__(self) -> Receiver:
        return self.start() if self.socket is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- driving -------------------------------------------------------------------------------

    @property
    def wake_fd(self) -> int:
        """A file descriptor that becomes readable when the outbox has news.

        For a role that runs its own poller: register :attr:`socket` and this fd, and call
        :meth:`process_ready` when either is readable (it drains this fd itself).
        """
        return self._watcher.fd if self._watcher is not None else self._wake_r

    def interrupt_on(self, fd: int) -> None:
        """Make :meth:`poll` return early once ``fd`` (non-blocking: a pipe a signal handler or
        another thread writes to) becomes readable; what is in it is read and discarded."""
        if self._interrupt_r >= 0:
            self._poller.unregister(self._interrupt_r)
        self._interrupt_r = fd
        self._poller.register(fd, zmq.POLLIN)

    def poll(self, timeout_ms: int = 0) -> int:
        """Handle what is ready, waiting up to ``timeout_ms`` for something to arrive.

        Returns as soon as a round handled something (or rejected or dropped everything it
        took), when the interrupt descriptor (``interrupt_on``) is written to, or when the
        timeout ends.

        Returns:
            How many envelopes were handled.
        """
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            took, handled = self.process_ready()
            if took:
                return handled
            left = deadline - time.monotonic()
            if left <= 0:
                return 0
            wait = min(left, max(0.0, self._next_sweep - time.monotonic()))
            interrupted = False
            for sock, _ in self._poller.poll(max(1, int(wait * 1000))):
                if sock == self._wake_r or (self._watcher is not None and sock == self._watcher.fd):
                    self._outbox_due = True
                elif sock == self._interrupt_r:
                    _drain(sock)
                    interrupted = True
            if interrupted:
                took, handled = self.process_ready()
                return handled

    run_once = poll

    def serve(self, stop: threading.Event, *, tick: Callable[[], None] | None = None,
              tick_s: float = 1.0) -> None:
        """Handle messages until ``stop`` is set, calling ``tick()`` every ``tick_s`` seconds."""
        next_tick = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            if tick is not None and now >= next_tick:
                tick()
                next_tick = now + tick_s
            until_tick = (next_tick - now) if tick is not None else 0.1
            self.poll(int(min(0.1, max(0.0, until_tick)) * 1000))

    def process_ready(self) -> tuple[int, int]:
        """One non-blocking round. Returns ``(messages taken, envelopes handled)``."""
        items: list[tuple[bytes, str, Path | None]] = []
        sock = self.socket
        if sock is not None:
            # Asking for EVENTS is cheaper than the zmq.Again exception of an empty recv.
            while len(items) < self.batch and sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                items.append((sock.recv(zmq.NOBLOCK), "socket", None))
        mono = time.monotonic()
        if self._outbox_due or mono >= self._next_sweep:
            items.extend(self._take_files(mono))
        if not items:
            return 0, 0
        return len(items), self._process(items)

    # -- internals -------------------------------------------------------------------------------

    def _take_files(self, mono: float) -> list[tuple[bytes, str, Path | None]]:
        self._drain_wake()  # this scan covers every wake-up so far (also for external pollers)
        if mono >= self._next_sweep:
            self._sweep(mono)
        paths = self.reader.pending(self.batch)
        self._outbox_due = len(paths) == self.batch  # more may wait: take them next round
        out = []
        for path in paths:
            data = self.reader.read(path)
            if data is not None:
                out.append((data, "file", path))
        return out

    def _sweep(self, mono: float) -> None:
        self._next_sweep = mono + self.sweep_s
        try:
            self.reader.clean_orphans(self.orphan_age_s, now=self.clock())
            if mono >= self._next_prune:
                self._next_prune = mono + self.prune_every_s
                self.ledger.prune()
            elif self.ledger.counters.peek():
                self.ledger.flush()  # pushes counted while nothing arrived
        except Exception as e:  # noqa: BLE001 - housekeeping failures must not stop receiving
            self.log.warning("sweep_failed", error=str(e), next="retry at next sweep")

    def _process(self, items: list[tuple[bytes, str, Path | None]]) -> int:
        now = self.clock()
        lim = self.limits
        accepted: list[Envelope] = []
        accepted_files: list[Path] = []
        rejected: list[Rejection] = []
        bad_files: list[tuple[Path, str]] = []
        for data, source, path in items:
            try:
                env = decode(data, keyring=self.keyring, now=now, max_age_s=lim.max_age_s,
                             skew_s=lim.skew_s, max_bytes=lim.max_bytes,
                             max_depth=lim.max_depth, recipient=self.instance)
            except Rejected as e:
                rejected.append(Rejection(str(e.code), source, e.sender, e.msg_id, e.kind,
                                          str(e)))
                if path is not None:
                    bad_files.append((path, str(e.code)))
                continue
            accepted.append(env)
            if path is not None:
                accepted_files.append(path)
        try:
            new = self.ledger.record(accepted, rejected)
        except Exception as e:  # noqa: BLE001 - e.g. database locked for longer than busy_timeout
            # Unrecorded messages must not be handled (at-most-once). Files stay for a retry;
            # socket frames are lost, and the facts they point at are in state.db anyway.
            self.log.error("ledger_record_failed", error=str(e), dropped=len(items),
                           next="files retried at next sweep; roles reconcile from state.db")
            return 0
        for path in accepted_files:
            self.reader.done(path)
        for path, code in bad_files:
            self.reader.quarantine(path, code)
        for r in rejected:
            self.log.warning("message_rejected", code=r.code, source=r.source, sender=r.sender,
                             msg_id=r.msg_id, kind=r.kind, detail=r.detail,
                             next="dropped; receiver continues")
        for env in new:
            try:
                self.handler(env)
            except Exception as e:  # noqa: BLE001 - one bad handler call must not stop the role
                self.ledger.counters.add(HANDLER_ERRORS)
                self.log.exception("handler_failed", msg_id=env.id, kind=env.kind,
                                   sender=env.sender, error=str(e),
                                   next="message dropped (at-most-once); state.db still holds "
                                        "the facts")
        return len(new)

    def _drain_wake(self) -> None:
        _drain(self._wake_r)
        if self._watcher is not None:
            self._watcher.drain()

    def _curve_server(self, sock: zmq.Socket, endpoint: str) -> None:
        pair = self.keyring.curve_keypair(self.instance)
        if pair is None:
            raise CurveRequired(endpoint, self.instance)
        from zmq.auth.thread import ThreadAuthenticator  # only tcp set-ups pay for it

        keyring, counters, log = self.keyring, self.ledger.counters, self.log

        class _KnownClients:
            def callback(self, domain: str, key: bytes) -> bool:
                if keyring.curve_owner(key) is not None:
                    return True
                # a host nobody registered (or a key since replaced): refused before any frame
                counters.add("curve_refused")
                log.warning("curve_key_refused", key=key.decode(errors="replace"),
                            next="register the host with 'org join', or ignore it")
                return False

        self._auth = ThreadAuthenticator(self.context)
        self._auth.start()
        # The provider is looked up by the socket's exact ZAP domain ("*" only matches none).
        self._auth.configure_curve_callback(_ZAP_DOMAIN, credentials_provider=_KnownClients())
        sock.curve_server = True
        sock.curve_publickey, sock.curve_secretkey = pair
        sock.zap_domain = _ZAP_DOMAIN.encode()

    def _stop_auth(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None


def _drain(fd: int) -> None:
    """Read a non-blocking pipe until it is empty."""
    try:
        while os.read(fd, 4096):
            pass
    except OSError:
        pass
