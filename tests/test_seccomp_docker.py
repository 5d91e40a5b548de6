"""The system-call filter against Docker's default profile: io_uring and AF_VSOCK are refused
inside a real sandbox, and every call Docker refuses is refused here or justified."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from roles.workbench.sandbox import BwrapRunner, Limits, bubblewrap
from roles.workbench.sandbox.mode import default_visible
from roles.workbench.sandbox.seccomp import DOCKER_DIFFERENCES, REFUSED

DATA = Path(__file__).parent / "data" / "docker_seccomp_allowed.txt"
UNISTD = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
PY = str(Path(sys.prefix).resolve() / "bin" / "python")
needs_bwrap = pytest.mark.skipif(bubblewrap() is None,
                                 reason="bubblewrap (bwrap) is not installed: apt-get install -y bubblewrap")
# io_uring_setup(8 entries, zeroed params) and socket(AF_VSOCK, SOCK_STREAM): the errno each got, 0 for success
PROBE = r"""
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
fd = libc.syscall(425, 8, params)
print("io_uring", 0 if fd >= 0 else ctypes.get_errno())
try:
    socket.socket(40, socket.SOCK_STREAM).close(); print("vsock", 0)
except OSError as exc:
    print("vsock", exc.errno)
"""


def _docker_allows() -> set[str]:
    return {ln.strip() for ln in DATA.read_text().splitlines() if ln.strip() and not ln.startswith("#")}


@pytest.mark.timeout(30)
@pytest.mark.skipif(not UNISTD.exists() or sys.platform != "linux", reason="x86-64 kernel headers not installed")
def test_every_call_docker_refuses_is_refused_here_or_its_difference_is_justified():
    known = set(re.findall(r"#define __NR_(\w+)", UNISTD.read_text()))
    docker_refuses = known - _docker_allows() - {"clone3"}      # clone3: ENOSYS in both
    assert {"io_uring_setup", "mbind", "unshare"} <= docker_refuses   # the comparison means something
    unexplained = sorted(n for n in docker_refuses if n not in REFUSED and n not in DOCKER_DIFFERENCES)
    assert unexplained == [], f"refuse these in seccomp.py or justify them in DOCKER_DIFFERENCES: {unexplained}"
    assert all(len(why) > 30 for why in DOCKER_DIFFERENCES.values()), "each difference says why"
    assert not set(DOCKER_DIFFERENCES) & set(REFUSED)


@needs_bwrap
@pytest.mark.timeout(60)
def test_io_uring_and_vsock_are_refused_inside_and_io_uring_is_reachable_outside(tmp_path):
    import subprocess
    outside = subprocess.run([PY, "-c", PROBE], capture_output=True, text=True, timeout=30).stdout
    runner = BwrapRunner(tmp_path, readonly_binds=default_visible(), limits=Limits(cpu_s=30))
    inside = runner.run([PY, "-c", PROBE], tmp_path, 30.0, 4000).output
    got = dict(ln.split() for ln in inside.splitlines() if ln.startswith(("io_uring", "vsock")))
    assert got == {"io_uring": "1", "vsock": "97"}, inside          # EPERM, EAFNOSUPPORT
    if "io_uring 0" not in outside:
        pytest.skip(f"io_uring is off on this host, so the control shows nothing: {outside.strip()}")
