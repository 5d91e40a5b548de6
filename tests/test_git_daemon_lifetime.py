"""The git daemon the supervisor starts ends with it, however the supervisor ends: a supervisor
killed with -9 used to leave its daemon listening, and the next org given that port could not
start (``git_port_taken``)."""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(60)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.skipif(not shutil.which("git") or not shutil.which("setpriv"), reason="needs git and setpriv")
def test_a_daemon_whose_starter_is_killed_stops_listening(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import sys, time\n"
            "from pathlib import Path\n"
            "from roles.workbench.serve.gitserve import GitServer\n"
            f"g = GitServer(Path({str(tmp_path)!r}) / 'history', '127.0.0.1', {port})\n"
            "g.start(10)\n"
            "print('STARTED', flush=True)\n"
            "time.sleep(60)\n")
    starter = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert any(line.startswith("STARTED") for line in starter.stdout)
        assert _listening(port)
        starter.send_signal(signal.SIGKILL)          # as the supervisor dies under kill -9
        starter.wait(10)
        deadline = time.monotonic() + 10
        while _listening(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _listening(port), "the daemon outlived the process that started it"
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()
        subprocess.run(["pkill", "-f", f"--port={port}"], check=False)
