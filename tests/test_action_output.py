"""An approved action's output is kept as it comes, so an action cut by a crash leaves what it
printed for the question asked again; an action that ends leaves nothing behind and returns its
own exit code and output as before. Real processes, the real sandbox for a network action."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roles.loop_agent.process import ActionRunner
from state_db.kernel import config as config_mod
from tests.support.org import wait_for

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kind", ["other", "network"])
def test_an_action_that_ends_returns_its_own_exit_code_and_output_and_keeps_no_file(org_home, tmp_path, kind):
    ws = tmp_path / "ws"
    ws.mkdir()
    runner = ActionRunner(config_mod.load_config(org_home), org_home)
    code, output = runner(r"echo 'it ran'; echo to-stderr >&2; printf 'x\n' > made.txt; exit 7", kind, str(ws))
    assert code == 7 and "it ran" in output and "to-stderr" in output, output
    assert (ws / "made.txt").read_text() == "x\n"
    assert not (runner.log_dir(str(ws)) / "output").exists() and runner.partial_output(str(ws)) is None


def test_an_action_cut_by_a_crash_leaves_what_it_printed_and_nothing_else_runs(org_home, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    script = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
              "from pathlib import Path; from state_db.kernel import config; from state_db.kernel.home import OrgHome\n"
              "from roles.loop_agent.process import ActionRunner\n"
              f"home = OrgHome(Path({str(org_home.root)!r}))\n"
              f"ActionRunner(config.load_config(home), home)('echo pushed half of it; sleep 30; echo the rest > rest.txt', "
              f"'other', {str(ws)!r})\n")
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        runner = ActionRunner(config_mod.load_config(org_home), org_home)
        log = runner.log_dir(str(ws)) / "output"
        wait_for(lambda: proc.poll() is not None or (log.exists() and b"pushed half" in log.read_bytes()), timeout=30,
                 what="the action's first line")
        assert proc.poll() is None, "the process running the action ended early"
        os.kill(proc.pid, signal.SIGKILL)                 # the loop-agent dies while the action runs
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(0.5)
    assert runner.partial_output(str(ws)) == "pushed half of it"
    assert runner.partial_output(str(ws)) is None            # read once: the next question starts clean
    assert not (ws / "rest.txt").exists(), "the action outlived the loop-agent that ran it"
