"""Nothing that leaves a sandbox is trusted on the host, through the real org and real bubblewrap.

A doer whose code, imported by the tests, turns the runner's report into a link to a host file
holding a forged passing report, and leaves a FIFO, a socket and a sparse tree in the snapshot:
the verification neither follows the link nor blocks, the run never reaches ``goal_met``, and an
honest run submitted to the same org beside it reaches ``goal_met`` meanwhile."""
from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from tests.e2e.hostile_tricks import CALC_BUGGY, CALC_FIXED, TESTS, Trick, prepare, submit, write
from tests.support.org import query, running_org, wait_for

pytestmark = pytest.mark.timeout(420)
PY = str(Path(sys.prefix).resolve() / "bin" / "python")     # the venv at the real path the sandbox shows
CONFIG = """
[org]
loop_agents = 2
[supervisor]
heartbeat_s = 0.2
heartbeat_timeout_s = 10.0
stop_timeout_s = 6.0
[sandbox]
cpu_seconds = 60
"""
FORGED = ('<testsuites><testsuite name="pytest"><testcase classname="test_calc" name="test_mean"/>'
          '<testcase classname="test_calc" name="test_mean_of_zero"/></testsuite></testsuites>')


def _leaving(forged: Path) -> str:
    """calc.py, bug kept, that at interpreter exit (after pytest wrote its report) swaps the
    report for a link to ``forged`` and leaves a FIFO, a socket and sparse files behind."""
    return (CALC_BUGGY + "\n\nimport atexit\nimport os\nimport socket\n\n\ndef _leave():\n"
            "    report = os.environ.get('PYTEST_ADDOPTS', '').partition('--junitxml=')[2]\n"
            "    for step in (lambda: os.unlink(report), lambda: os.symlink(" + repr(str(forged)) + ", report),\n"
            "                 lambda: os.mkfifo('left.fifo'),\n"
            "                 lambda: socket.socket(socket.AF_UNIX).bind('left.sock')):\n"
            "        try:\n            step()\n        except OSError:\n            pass\n"
            "    for i in range(6):\n        with open(f'sparse{i}.bin', 'wb') as f:\n"
            "            f.truncate(100 << 20)\n\n\natexit.register(_leave)\n")


def ended(home, wid: str, timeout: float = 300.0) -> dict:
    return wait_for(lambda: (r := query(home, "SELECT * FROM work_items WHERE id=?", (wid,))[0])["status"] == "ended"
                    and r, timeout=timeout, interval=0.2, what=f"{wid} to end")


def test_a_doer_leaving_links_fifos_and_sparse_files_fools_no_reader_and_blocks_no_other_run(tmp_path):
    forged = tmp_path / "host-only" / "forged.xml"
    forged.parent.mkdir()
    forged.write_text(FORGED)                                   # a host file the sandbox cannot see
    with running_org(CONFIG) as org:
        root = org.root.parent / "runs"
        hostile = Trick("leaves_things", ((write("calc.py", _leaving(forged)),),),
                        files={"calc.py": CALC_BUGGY, "test_calc.py": TESTS}, why="leave links and FIFOs")
        honest = Trick("honest", ((write("calc.py", CALC_FIXED),),),
                       files={"calc.py": CALC_BUGGY, "test_calc.py": TESTS}, why="fix mean")
        bad = submit(org, prepare(root, hostile, PY, max_iterations=2))
        good = submit(org, prepare(root, honest, PY, max_iterations=2))
        good_end = ended(org, good["id"])
        bad_end = ended(org, bad["id"])
        assert good_end["stop_reason"] == "goal_met", good_end
        assert bad_end["stop_reason"] != "goal_met", bad_end
        verdicts = query(org, "SELECT outcome, checks FROM verdicts WHERE work_id=?", (bad["id"],))
        assert verdicts and all(v["outcome"] != "pass" for v in verdicts), verdicts
        assert not any('"junit": {"counts": {"runner": "pytest", "passed": 2' in v["checks"] for v in verdicts)
        left = org.root / "eval" / bad["id"]     # the doer's code ran: what it left is still there
        assert stat.S_ISFIFO((left / "left.fifo").lstat().st_mode), sorted(p.name for p in left.iterdir())
        assert (left / "sparse0.bin").lstat().st_size == 100 << 20
