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


def test_cpu_by_step_counts_only_the_run_and_names_each_pid_by_its_role():
    """``--cpu-steps``: the totals each role wrote before the run are taken off, pids are named
    by the role they are, a pid no role holds is left out, and each figure is per iteration."""
    sys.path.insert(0, str(ROOT))
    from bench.scale import steps_by_role

    before = {11: {"pid": 11, "cpu_s": 1.0, "steps": {"loop: act": [0.5, 10]}},
              12: {"pid": 12, "cpu_s": 2.0, "steps": {}}}
    after = {11: {"pid": 11, "cpu_s": 1.4, "steps": {"loop: act": [0.8, 30]}},
             12: {"pid": 12, "cpu_s": 2.2, "steps": {"loop: act": [0.1, 20]}},
             13: {"pid": 13, "cpu_s": 1.0, "steps": {"loop: act": [0.9, 5]}},     # not a role of the org
             21: {"pid": 21, "cpu_s": 0.5, "steps": {"eval: snapshot": [0.02, 4]}}}
    pids = {"loop-agent-1": 11, "loop-agent-2": 12, "eval-agent": 21}
    got = steps_by_role(before, after, pids, iterations=40)
    assert got["loop-agent"]["process_ms"] == round((0.4 + 0.2) * 1000 / 40, 2)
    assert got["loop-agent"]["steps"]["loop: act"] == {"ms": round((0.3 + 0.1) * 1000 / 40, 2), "calls": 1.0}
    assert got["eval-agent"]["steps"]["eval: snapshot"] == {"ms": 0.5, "calls": 0.1}
    assert set(got) == {"loop-agent", "eval-agent"}


def test_the_step_meter_wraps_the_steps_as_they_are_imported_and_counts_each_forked_process_from_zero(tmp_path):
    """``bench/cpu_steps/sitecustomize.py`` (with ``ORG_CPU_STEPS_DIR`` set) wraps a step's
    function when its module is imported, in the process and in every child forked from it,
    and each child writes its own totals, counted from its fork; without the variable nothing
    is wrapped."""
    out = tmp_path / "steps"
    out.mkdir()
    code = (
        "import os, sys\n"
        "import roles.loop_agent.engine as e\n"
        "print(getattr(e.LoopEngine.derive, '_cpu_step', False))\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    import sitecustomize\n"
        "    sitecustomize._dump()\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print(pid)\n")
    env = {**os.environ, "ORG_CPU_STEPS_DIR": str(out),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "bench" / "cpu_steps"), str(ROOT)])}
    got = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert got.returncode == 0, got.stderr[-2000:]
    wrapped, child = got.stdout.split()
    assert wrapped == "True"
    import json as _json
    assert _json.loads((out / f"{child}.json").read_text()) == {"pid": int(child), "cpu_s": pytest.approx(0, abs=5),
                                                                 "steps": {}, "sql": {}}
    env.pop("ORG_CPU_STEPS_DIR")
    plain = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=60)
    assert plain.returncode == 0 and plain.stdout.split()[0] == "False"
