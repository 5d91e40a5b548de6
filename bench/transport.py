"""Benchmark of the transport seam against plain pyzmq, on ipc:// under a temp folder.

    python bench/transport.py --json

Measures, in one run and between real processes:

- ``raw_zmq_*``: plain pyzmq PUSH → PULL one way (the floor);
- ``push_*``: through the whole seam — envelope, HMAC, push, decode and checks, the ledger
  transaction in state.db, the handler call in a receiver process (``transport.probe``);
- ``fallback_*``: outbox file write (temp, fsync, rename) → the receiver's wake FIFO → handler call;
- ``throughput_msgs_s``: sustained, one receiver, ledger on, batching allowed;
- ``duplicates_handled``: handler calls beyond one per id when every message goes both ways.

Latencies are one-way: the sender stamps ``time.perf_counter_ns()`` (CLOCK_MONOTONIC, shared by
all processes) into the message and the receiver subtracts it on arrival. Messages are paced
so that each latency is a lone message's, not a queue's. Exits 1 if a target fails.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402
import zmq  # noqa: E402

from transport.endpoints import Endpoints  # noqa: E402
from transport.keys import Keyring  # noqa: E402
from transport.probe import ProbeProcess, prepare_home  # noqa: E402
from transport.sender import Sender  # noqa: E402

RAW_CHILD = r"""
import sys, time, zmq, orjson
endpoint, n = sys.argv[1], int(sys.argv[2])
ctx = zmq.Context(); s = ctx.socket(zmq.PULL); s.bind(endpoint)
print("ready", flush=True)
lat = []
for _ in range(n):
    frame = s.recv()
    lat.append(time.perf_counter_ns() - int(frame[:20]))
print(orjson.dumps(lat).decode(), flush=True)
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def pace(gap_s: float) -> None:
    """Pause between paced messages. Sleep, not spin: on a 2-CPU machine a spinning sender
    takes the CPU the receiver needs and inflates every latency, raw and seam alike."""
    time.sleep(gap_s)


class RawPair:
    """Plain pyzmq PUSH (here) → PULL (a child process that records one-way latencies)."""

    def __init__(self, home: Path, total: int) -> None:
        (home / "run" / "s").mkdir(mode=0o700, exist_ok=True)
        endpoint = f"ipc://{home}/run/s/raw"
        self.child = subprocess.Popen([sys.executable, "-c", RAW_CHILD, endpoint, str(total)],
                                      stdout=subprocess.PIPE, text=True)
        assert self.child.stdout.readline().strip() == "ready"
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUSH)
        self.sock.connect(endpoint)
        self.sock.poll(5000, zmq.POLLOUT)

    def send_paced(self, n: int, gap_s: float) -> None:
        for _ in range(n):
            self.sock.send(b"%020d" % time.perf_counter_ns() + b"x" * 200)  # an envelope's size
            pace(gap_s)

    def latencies(self) -> list[float]:
        lat = orjson.loads(self.child.stdout.readline())
        self.sock.close(linger=1000)
        self.ctx.term()
        self.child.wait()
        return [x / 1000 for x in lat]

    def kill(self) -> None:
        if self.child.poll() is None:
            self.child.kill()
            self.child.wait()


def wait_recorded(home: Path, target: int, timeout: float = 60.0) -> None:
    """Wait until the receiver's ledger holds ``target`` ids (polling state.db, so nothing in
    this process competes with the measurement while it runs)."""
    deadline = time.monotonic() + timeout
    while _ledger_count(home) < target:
        if time.monotonic() > deadline:
            raise TimeoutError(f"ledger has {_ledger_count(home)} ids, expected {target}")
        time.sleep(0.02)


def send_paced(sender: Sender, n: int, gap_s: float, via: str) -> tuple[set[str], dict]:
    ids, paths = set(), {}
    for i in range(n):
        t = time.perf_counter_ns()
        env = sender.envelope("loop-agent-1", "wake", {"t": t, "i": i})
        path = sender.send_envelope(env, via=via)
        paths[path] = paths.get(path, 0) + 1
        ids.add(env.id)
        pace(gap_s)
    return ids, paths


def latencies_of(events: list[dict], ids: set[str]) -> list[float]:
    return [(e["handled_ns"] - e["payload"]["t"]) / 1000 for e in events if e["id"] in ids]


def bench_throughput(home: Path, keyring: Keyring, m: int) -> dict:
    target = _ledger_count(home) + m
    probe = ProbeProcess(home, "loop-agent-1", "--quiet").start()
    try:
        with Sender("coordinator", keyring, Endpoints(home / "run"), home / "outbox") as sender:
            paths: dict[str, int] = {}
            started = time.perf_counter()
            for i in range(m):
                path = sender.send("loop-agent-1", "wake", {"i": i})
                paths[path] = paths.get(path, 0) + 1
            send_s = time.perf_counter() - started
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _ledger_count(home) < target:
            time.sleep(0.05)
        stopped = probe.stop()
    finally:
        probe.kill()
    span_s = (stopped["last_ns"] - stopped["first_ns"]) / 1e9
    return {"handled": stopped["handled"], "span_s": span_s, "send_s": send_s, "paths": paths,
            "msgs_s": stopped["handled"] / span_s if span_s > 0 else 0.0}


def _ledger_count(home: Path) -> int:
    from state_db.connection import connect

    conn = connect(home / "state.db", readonly=True)
    try:
        return conn.execute("SELECT COUNT(*) FROM delivery_ledger").fetchone()[0]
    finally:
        conn.close()


def run(args: argparse.Namespace) -> dict:
    home = Path(tempfile.mkdtemp(prefix="lob-"))
    try:
        prepare_home(home, ["coordinator", "loop-agent-1"])
        keyring = Keyring.load(home / "run" / "keys.json")
        rounds, warm = 10, 50
        per_round = max(1, args.n // rounds)
        raw_pair = RawPair(home, warm + rounds * per_round)
        probe = ProbeProcess(home, "loop-agent-1", "--record").start()
        try:
            with Sender("coordinator", keyring, Endpoints(home / "run"), home / "outbox") as s:
                gap, fgap = args.gap_ms / 1000, args.fallback_gap_ms / 1000
                raw_pair.send_paced(warm, gap)
                send_paced(s, warm, gap, "push")
                wait_recorded(home, warm)
                # Raw and seam alternate in rounds, so both see the same machine conditions.
                push_ids, push_paths = set(), {}
                for r in range(rounds):
                    raw_pair.send_paced(per_round, gap)
                    ids, paths = send_paced(s, per_round, gap, "push")
                    push_ids |= ids
                    for k, v in paths.items():
                        push_paths[k] = push_paths.get(k, 0) + v
                    wait_recorded(home, warm + (r + 1) * per_round)
                raw = raw_pair.latencies()[warm:]
                fallback_ids, _ = send_paced(s, args.n_fallback, fgap, "outbox")
                base = warm + rounds * per_round
                wait_recorded(home, base + args.n_fallback)
                both_ids, _ = send_paced(s, args.n_dup, 0, "both")
                wait_recorded(home, base + args.n_fallback + args.n_dup)
                outbox = home / "outbox" / "loop-agent-1"
                deadline = time.monotonic() + 30
                while any(outbox.iterdir()) and time.monotonic() < deadline:
                    time.sleep(0.05)
            stopped = probe.stop()
        finally:
            probe.kill()
            raw_pair.kill()
        events = probe.handled()
        assert stopped["handled"] == len(events)
        push = latencies_of(events, push_ids)
        fallback = latencies_of(events, fallback_ids)
        both = [e["id"] for e in events if e["id"] in both_ids]
        duplicates_handled = len(both) - len(set(both))
        assert len(set(both)) == len(both_ids), "a message sent both ways was never handled"

        tput = bench_throughput(home, keyring, args.m)
    finally:
        shutil.rmtree(home, ignore_errors=True)

    raw_p50 = statistics.median(raw)
    out = {
        "raw_zmq_p50_us": round(raw_p50, 1),
        "raw_zmq_p99_us": round(pct(raw, 0.99), 1),
        "push_p50_us": round(statistics.median(push), 1),
        "push_p99_us": round(pct(push, 0.99), 1),
        "fallback_p50_us": round(statistics.median(fallback), 1),
        "fallback_p99_us": round(pct(fallback, 0.99), 1),
        "throughput_msgs_s": round(tput["msgs_s"]),
        "duplicates_handled": duplicates_handled,
        "detail": {
            "messages": {"raw": len(raw), "push": len(push), "fallback": len(fallback),
                         "both_ways": args.n_dup, "throughput": tput["handled"]},
            "push_paths": push_paths,
            "throughput_paths": tput["paths"],
            "throughput_sender_msgs_s": round(args.m / tput["send_s"]),
            "gap_ms": args.gap_ms,
            "cpus": os.cpu_count(),
        },
    }
    targets = {
        "push_p50_us": ("<=", round(5 * raw_p50, 1)),
        "push_p99_us": ("<=", 2000),
        "fallback_p50_us": ("<=", 5000),
        "throughput_msgs_s": (">=", 10000),
        "duplicates_handled": ("<=", 0),
    }
    out["targets"] = {k: f"{op} {v}" for k, (op, v) in targets.items()}
    out["pass"] = {k: (out[k] <= v if op == "<=" else out[k] >= v)
                   for k, (op, v) in targets.items()}
    out["ok"] = all(out["pass"].values())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument("-n", type=int, default=2000, help="paced messages for latency")
    parser.add_argument("--gap-ms", type=float, default=0.5, help="pause between paced messages")
    parser.add_argument("--n-fallback", type=int, default=300, help="paced outbox messages")
    parser.add_argument("--fallback-gap-ms", type=float, default=3.0)
    parser.add_argument("--n-dup", type=int, default=1000, help="messages sent both ways")
    parser.add_argument("-m", type=int, default=50000, help="messages for throughput")
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = run(args)
    result["detail"]["run_s"] = round(time.monotonic() - started, 1)
    if args.json:
        print(orjson.dumps(result).decode())
    else:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
