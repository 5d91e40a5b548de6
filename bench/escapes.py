"""The sandbox against a hostile doer: every escape attempt of the test suite, tallied.

Usage: ``bench/escapes.py --json`` (≈ 1–3 min).

Runs the escape suites with pytest (real bubblewrap, real git, real processes) and counts each
test case as one escape attempt: a passing case means the attempt was refused or counted, a
failing one is an escape. The suites: ``tests/test_escapes.py`` (file system, network, org
processes, resources), ``tests/test_escapes_git.py`` (hooks, fsmonitor, filters, includes run on
the host), ``tests/test_sandbox_view.py`` (other orgs, other projects, credentials,
``/proc/1/cmdline``, file size, disk quota, seccomp), ``tests/test_relay_metering.py`` (the
model relay's other paths, batches, a killed CLI) and ``tests/test_caps_inside_call.py`` (a hung
model call, a long tool call, a budget hog).

Same-run baseline ``raw_unsandboxed_escapes``: the same probes as ``PROBES`` run once as plain
processes and once in the sandbox — reading another org's ``state.db``, writing outside the
workspace, reading a credentials file in the home, creating a user namespace, writing a file
bigger than the limit, seeing the host's paths in ``/proc/1/cmdline``, talking to a host
process's Unix socket in the workspace — so the figure shows what
the sandbox takes away on this very machine.

The host side (``bench/host_escapes.py``, also alone with ``--host-only``): every kind of file a
sandbox can leave against every host-side reader, and a second org's home in each place a
workspace reaches, each beside its unguarded control (``raw_host_unguarded_escapes``).

Targets: ``escape_attempts`` ≥ 30, ``escapes`` == 0, ``probe_escapes`` == 0, ``host_escapes`` == 0,
``host_blocked`` == 0.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SUITES = ("tests/test_escapes.py", "tests/test_escapes_git.py", "tests/test_sandbox_view.py",
          "tests/test_relay_metering.py", "tests/test_caps_inside_call.py")
TARGETS = {"escape_attempts": ">= 30", "escapes": "== 0", "probe_escapes": "== 0", "host_escapes": "== 0",
           "host_blocked": "== 0"}


def run_suites() -> dict:
    """Run the suites; returns attempts (test cases run), escapes (failed or errored) and names."""
    with tempfile.TemporaryDirectory(prefix="escapes-") as tmp:
        report = Path(tmp) / "junit.xml"
        t0 = time.monotonic()
        got = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                              *[s for s in SUITES if (ROOT / s).exists()]], cwd=ROOT, capture_output=True, text=True,
                             timeout=1200)
        seconds = round(time.monotonic() - t0, 1)
        if not report.exists():
            raise SystemExit(f"error[no_report]: pytest wrote no report (exit {got.returncode}) — "
                             f"{got.stdout[-500:]} {got.stderr[-500:]}")
        cases = ET.parse(report).getroot().iter("testcase")
        attempts, escapes, skipped = 0, [], []
        for case in cases:
            name = f"{case.get('classname')}::{case.get('name')}"
            if case.find("skipped") is not None:
                skipped.append(name)
                continue
            attempts += 1
            if case.find("failure") is not None or case.find("error") is not None:
                escapes.append(name)
    return {"escape_attempts": attempts, "escapes": len(escapes), "escaped": escapes[:20],
            "skipped_attempts": len(skipped), "suite_seconds": seconds}


# Each probe: a shell line that prints ESCAPED when it got through.
PROBES = {
    "read_other_org_state_db": 'cat "$OTHER_ORG/state.db" >/dev/null 2>&1 && echo ESCAPED',
    "write_outside_workspace": 'echo x > "$OUTSIDE/pwned" 2>/dev/null && echo ESCAPED',
    "read_home_credentials": 'cat "$CREDS" >/dev/null 2>&1 && echo ESCAPED',
    "nested_user_namespace": 'unshare -r true >/dev/null 2>&1 && echo ESCAPED',
    "file_over_size_limit": ('head -c 200000000 /dev/zero > big 2>/dev/null; '
                             '[ "$(stat -c %s big 2>/dev/null || echo 0)" -ge 200000000 ] && echo ESCAPED; rm -f big'),
    "host_paths_in_proc_1_cmdline": 'tr "\\0" " " < /proc/1/cmdline | grep -q "$OUR_ORG" && echo ESCAPED',
    # a host process listening on a Unix socket in the workspace (a database, a dev server)
    "connect_host_unix_socket": ('python3 -c "import socket, sys; s = socket.socket(socket.AF_UNIX); '
                                 's.connect(sys.argv[1]); print(s.recv(7).decode())" "$HOST_SOCKET" 2>/dev/null'),
}


def run_probes() -> tuple[dict, dict]:
    """Each probe as a plain process and in the sandbox; returns (unsandboxed, sandboxed) verdicts."""
    from bench.common import unix_listener
    from roles.workbench.sandbox import UnsandboxedRunner, runner_from_config
    from state_db.kernel import config as config_mod
    from state_db.bootstrap import init_home
    from state_db.kernel.home import OrgHome

    root = Path(tempfile.mkdtemp(prefix="esc-", dir="/var/tmp"))
    try:
        ours, other = OrgHome(root / "org"), OrgHome(root / "other-org")
        init_home(ours)
        init_home(other)
        ws = root / "ws"
        ws.mkdir()
        outside = root / "outside"
        outside.mkdir()
        creds = root / "home" / ".aws" / "credentials"
        creds.parent.mkdir(parents=True)
        creds.write_text("[default]\naws_secret_access_key = not-a-real-key\n")
        # passed in the environment, not in the command line: pid 1's command line is the probe's own
        host_socket = ws / "host.sock"
        listener = unix_listener(host_socket, b"ESCAPED")
        env = {"OTHER_ORG": str(other.root), "OUTSIDE": str(outside), "CREDS": str(creds), "OUR_ORG": str(ours.root),
               "HOST_SOCKET": str(host_socket)}
        cfg = config_mod.load(None)
        sandboxed = runner_from_config(cfg, ours, ws)
        plain = UnsandboxedRunner(ws)
        out_plain, out_box = {}, {}
        for name, line in PROBES.items():
            out_plain[name] = "ESCAPED" in plain.execute(line, cwd=ws, timeout_s=60, env=env).output
            out_box[name] = "ESCAPED" in sandboxed.execute(line, cwd=ws, timeout_s=60, env=env).output
            (outside / "pwned").unlink(missing_ok=True)
        listener.close()
        return out_plain, out_box
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--probes-only", action="store_true", help="skip the test suites")
    parser.add_argument("--host-only", action="store_true",
                        help="only the host side: what a sandbox leaves, against every host reader (host_escapes.py)")
    args = parser.parse_args(argv)
    from bench.common import quiet_logs
    quiet_logs()
    passes: dict[str, bool] = {}
    figures: dict = {}
    if not args.host_only:
        figures = {} if args.probes_only else run_suites()
        plain, boxed = run_probes()
        figures.update({"probe_attempts": len(PROBES), "probe_escapes": sum(boxed.values()),
                        "raw_unsandboxed_escapes": sum(plain.values()),
                        "probe_detail": {k: ("escaped" if boxed[k] else "refused") for k in PROBES}})
        passes["probe_escapes"] = figures["probe_escapes"] == 0
    if not args.probes_only:
        from bench.host_escapes import run as host_side
        host = host_side()
        figures.update({"host_attempts": host["attempts"], "host_escapes": host["escapes"],
                        "host_blocked": host["blocked"], "raw_host_unguarded_escapes": host["raw_unguarded_escapes"],
                        "host_escaped": host["escaped"]})
        passes.update({"host_escapes": host["escapes"] == 0, "host_blocked": host["blocked"] == 0})
    if not (args.probes_only or args.host_only):
        passes.update({"escape_attempts": figures["escape_attempts"] >= 30, "escapes": figures["escapes"] == 0})
    figures["targets"] = {k: v for k, v in TARGETS.items() if k in passes}
    figures["pass"] = passes
    if args.json:
        print(json.dumps(figures))
    else:
        for k, v in figures.items():
            print(f"{k}: {v}")
    return 0 if all(passes.values()) else 1


if __name__ == "__main__":
    os.environ.setdefault("HYPOTHESIS_PROFILE", "ci")
    sys.exit(main())
