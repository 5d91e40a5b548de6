#!/usr/bin/env python3
"""The test suite beside CPU-bound processes: the suite must pass on a busy host.

Usage: ``bench/busy_suite.py [--busy 2] [--out FILE] [--quiet-first] [-- PYTEST_ARGS...]``.

Starts ``--busy`` processes that each spin one core at normal priority (a stand-in for other test
runs, other orgs or a build on the same host), runs ``scripts/test`` with the given pytest
arguments beside them (default: the whole suite), then stops them. With ``--quiet-first`` the same
selection runs once before, with nothing beside it: the baseline of the same run. Prints one JSON
object (also written to ``--out``): per run the pytest counts (``passed``, ``failed``,
``errors``, ``skipped``), the failed test ids, the wall time and the host's load average at the
end, and ``ok`` (the busy run passed); pytest's own output goes to stderr as it runs. Exit
status: the busy run's ``scripts/test`` status.

It is a check, not a benchmark figure: bench/report.py does not run it (the whole suite takes
longer than a report's budget). ``.ci/run`` runs it after the suite on the tests that wait on
real processes and terminals, and on the whole suite with ``ORG_CI_BUSY=1``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPIN = "while True:\n    pass\n"
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)")
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


def start_busy(n: int) -> list[subprocess.Popen]:
    """``n`` processes spinning one core each, in their own process group."""
    return [subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True) for _ in range(n)]


def stop_busy(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait(timeout=10)


def summary(output: str) -> dict:
    """The counts of pytest's last summary line and the failed test ids."""
    tail = output.strip().splitlines()[-1] if output.strip() else ""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    for n, what in COUNT.findall(tail):
        key = "errors" if what.startswith("error") else what
        counts[key] = counts.get(key, 0) + int(n)
    return {**counts, "failed_tests": FAILED.findall(output), "last_line": tail}


def run_suite(pytest_args: list[str], busy: int) -> dict:
    """One run of scripts/test beside ``busy`` spinning processes; its output goes on to stderr."""
    procs = start_busy(busy)
    t0 = time.monotonic()
    lines = []
    try:
        proc = subprocess.Popen([str(ROOT / "scripts" / "test"), "-rfE", *pytest_args], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            sys.stderr.write(line)
            lines.append(line)
        proc.wait()
    finally:
        stop_busy(procs)
    out = "".join(lines)
    return {"busy": busy, "exit": proc.returncode, "seconds": round(time.monotonic() - t0, 1),
            "load_1min_at_end": round(os.getloadavg()[0], 2), **summary(out)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/busy_suite.py", description=__doc__.split("\n")[0])
    parser.add_argument("--busy", type=int, default=2, help="CPU-bound processes beside the suite (default 2)")
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    parser.add_argument("--quiet-first", action="store_true", help="run the selection once without them first")
    parser.add_argument("pytest_args", nargs="*", help="after --: what scripts/test passes to pytest")
    args = parser.parse_args(argv)
    runs = []
    if args.quiet_first:
        runs.append(run_suite(args.pytest_args, 0))
    runs.append(run_suite(args.pytest_args, args.busy))
    busy = runs[-1]
    result = {"selection": args.pytest_args or ["(whole suite)"], "runs": runs,
              "ok": busy["exit"] == 0 and busy["failed"] == 0 and busy["errors"] == 0}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return busy["exit"]


if __name__ == "__main__":
    sys.exit(main())
