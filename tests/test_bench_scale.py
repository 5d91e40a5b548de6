"""bench/scale.py on a machine that cannot run the work: one coded line, not figures of nothing."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(120)
def test_a_machine_without_bubblewrap_gets_one_coded_line_naming_the_stop_reason(tmp_path):
    """Every run ends ``verify_unrunnable`` when bubblewrap is missing. The benchmark used to divide
    by the missing iterations and print a traceback."""
    if not shutil.which("bwrap"):
        pytest.skip("bubblewrap is not installed: the machine this test makes is the one it runs on")
    # the machine's own commands, bubblewrap left out
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in ("/usr/local/bin", "/usr/bin"):
        for entry in os.scandir(folder):
            if entry.name != "bwrap" and not (bin_dir / entry.name).exists():
                (bin_dir / entry.name).symlink_to(entry.path)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{bin_dir}:/usr/sbin"}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "scale.py"), "--json", "--ns", "1",
                          "--items-per-agent", "1", "--iterations", "1", "--startups", "1"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error[no_iterations]: at N=1 all 1 items ended without an iteration "
                           "(verify_unrunnable ×1): "), last
    assert "bubblewrap" in last and "org doctor" in last
    assert not out.stdout


def test_no_start_to_take_the_median_of_is_one_coded_line():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "scale.py"), "--json", "--startups", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and not out.stdout
    assert out.stderr.strip() == ("error[bad_argument]: --startups 0: startup_ms is the median of the starts "
                                  "— give --startups 1 or more")
