"""A stand-alone receiver that reports what it handles: for diagnosing the seam, tests, benches.

    python -m transport.probe --home ORG_HOME --instance loop-agent-1 [--endpoint tcp://127.0.0.1:*]

It opens the instance's node (:func:`transport.node.open_node`: the real receiver, ledger and
sender) and prints JSON lines on stdout: ``{"event": "ready", "endpoint"}`` once bound; one
``{"event": "handled", "id", "kind", "sender", "payload", "handled_ns"}`` per handled envelope
(``handled_ns`` is ``time.perf_counter_ns()``, i.e. CLOCK_MONOTONIC, comparable across
processes) — at once, or all at stop with ``--record``, or never with ``--quiet``; and
``{"event": "stopped", "handled", "first_ns", "last_ns"}`` at the end. It answers a ``ping``
whose payload names ``reply_to`` with a ``pong``. Stops on SIGTERM/SIGINT (or when stdin
closes, with ``--stdin-stop``). Logs go to stderr.

:class:`ProbeProcess` runs one as a child process and collects its lines; :func:`prepare_home`
makes the smallest org home it needs.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import structlog


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m transport.probe", description=__doc__.split("\n")[0])
    parser.add_argument("--home", required=True, help="org home (state.db, run/, outbox/)")
    parser.add_argument("--instance", required=True, help="instance to receive as")
    parser.add_argument("--endpoint", help="bind here instead of the default ipc path")
    parser.add_argument("--sweep-s", type=float, default=5.0, help="outbox sweep period")
    parser.add_argument("--quiet", action="store_true", help="print only the ready line and a "
                        "final count (benches)")
    parser.add_argument("--record", action="store_true", help="keep handled events in memory "
                        "and print them at stop, so no output competes with a measurement")
    parser.add_argument("--stdin-stop", action="store_true", help="stop when stdin closes")
    args = parser.parse_args(argv)

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    from transport.node import open_node

    out = sys.stdout.buffer
    recorded: list[bytes] = []
    handled = 0
    first_ns = last_ns = None

    def handle(env) -> None:
        nonlocal handled, first_ns, last_ns
        now_ns = last_ns = time.perf_counter_ns()
        if first_ns is None:
            first_ns = now_ns
        handled += 1
        if not args.quiet:
            line = orjson.dumps({"event": "handled", "id": env.id, "kind": env.kind,
                                 "sender": env.sender, "payload": env.payload,
                                 "handled_ns": now_ns}) + b"\n"
            if args.record:
                recorded.append(line)
            else:
                out.write(line)
                out.flush()
        if env.kind == "ping" and env.payload.get("reply_to"):
            node.sender.send(env.payload["reply_to"], "pong", {"ping": env.id})

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if args.stdin_stop:
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    node = open_node(args.home, args.instance, handle, endpoint=args.endpoint,
                     transport={"sweep_s": args.sweep_s})
    receiver = node.receiver
    out.write(orjson.dumps({"event": "ready", "endpoint": receiver.endpoint}) + b"\n")
    out.flush()
    try:
        receiver.serve(stop)
    finally:
        node.close()
        out.write(b"".join(recorded))
        out.write(orjson.dumps({"event": "stopped", "handled": handled, "first_ns": first_ns,
                                "last_ns": last_ns}) + b"\n")
        out.flush()
    return 0


def wait_until(predicate, *, timeout: float, what: str = "condition", interval: float = 0.02):
    """Poll ``predicate()`` until it returns a truthy value; return that value.

    Raises:
        TimeoutError: naming ``what`` and the last value seen.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not reached within {timeout} s; last seen: {value!r}")
        time.sleep(interval)


def prepare_home(root: Path | str, instances: list[str]) -> Path:
    """Make a minimal org home for probes: a migrated state.db and a keyring with a key per
    instance (what the supervisor does at start). Returns the keyring path."""
    from state_db.migrations import migrate
    from transport.keys import Keyring, keyring_path

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    migrate(root / "state.db")
    keyring = Keyring.create(keyring_path(root / "run"))
    for instance in instances:
        keyring.issue(instance)
    return keyring.path


class ProbeProcess:
    """Runs ``python -m transport.probe`` as a child process and collects what it prints.

    Args:
        home: org home prepared with :func:`prepare_home`.
        instance: the instance the probe receives as.
        args: extra command-line arguments (``--endpoint``, ``--sweep-s``, ``--quiet``).
    """

    def __init__(self, home: Path | str, instance: str, *args: str) -> None:
        self.home = Path(home)
        self.instance = instance
        self.args = list(args)
        self.events: list[dict] = []
        self.endpoint: str | None = None
        self.proc: subprocess.Popen | None = None
        self._cond = threading.Condition()

    def start(self, timeout: float = 15.0) -> "ProbeProcess":
        """Spawn and wait for the ready line. Raises TimeoutError with the probe's stderr."""
        root = Path(__file__).resolve().parents[1]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = str(root)
        self.events = []
        self.log_path = self.home / f"probe-{self.instance}.log"
        with open(self.log_path, "ab") as log:  # a file, not a pipe: a full pipe would block it
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "transport.probe", "--home", str(self.home),
                 "--instance", self.instance, *self.args],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=env, cwd=root)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        ready = self.wait_for(lambda e: e["event"] == "ready", timeout=timeout, count=1)
        self.endpoint = ready[0]["endpoint"]
        return self

    def handled(self) -> list[dict]:
        with self._cond:
            return [e for e in self.events if e["event"] == "handled"]

    def wait_for(self, match, *, timeout: float, count: int = 1) -> list[dict]:
        """Wait until ``count`` printed events satisfy ``match``; return them.

        Raises:
            TimeoutError: with the events seen and the probe's state.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [e for e in self.events if match(e)]
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc is not None and self.proc.poll() is not None
                                 and not self._reading):
                    raise TimeoutError(
                        f"probe {self.instance}: wanted {count} matching events, saw "
                        f"{len(found)}; all events: {self.events[-20:]}; exit code "
                        f"{self.proc.poll() if self.proc else None}; stderr: {self._stderr()}")
                self._cond.wait(min(left, 0.1))

    def stop(self, timeout: float = 10.0) -> dict:
        """SIGTERM and wait; returns the final ``stopped`` event. Kills on timeout."""
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        stopped = self.wait_for(lambda e: e["event"] == "stopped", timeout=2.0)
        return stopped[-1]

    def kill(self) -> None:
        """SIGKILL (a crash) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    _reading = True

    def _read(self, proc: subprocess.Popen) -> None:
        self._reading = True
        for line in proc.stdout:
            with self._cond:
                self.events.append(orjson.loads(line))
                self._cond.notify_all()
        with self._cond:
            self._reading = False
            self._cond.notify_all()

    def _stderr(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"


if __name__ == "__main__":
    sys.exit(main())
