"""The README's learning path, followed literally on a fresh org home: ``scripts/start-org --demo``,
then ``scripts/start-org --demo learning``. The second finds the org running with the default
thresholds, restarts it with the demo's (nothing runs on it), and opens a batch whose candidate
names the runs it was learned from and shows its replay, WITH / WITHOUT / Δ."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.org import query, short_home_dir

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(420)


def _run(env, *argv, timeout=200) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "scripts" / argv[0]), *argv[1:]], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_learning_demo_after_the_first_demo_opens_a_measured_batch_from_its_own_runs():
    root = short_home_dir()
    env = {**os.environ, "ORG_HOME": str(root / "org")}
    for k in ("ORG_RAW_NOTES_TO_CONSOLIDATE", "ORG_NOTES_PER_PATTERN", "ORG_CANDIDATES_PER_BATCH",
              "ORG_LEARNING_REPLAY"):
        env.pop(k, None)
    try:
        first = _run(env, "start-org", "--demo")
        assert first.returncode == 0, first.stdout + first.stderr
        second = _run(env, "start-org", "--demo", "learning")
        said = second.stdout
        assert second.returncode == 0, said + second.stderr
        assert "restarts it with the demo's" in said, said
        ids = re.findall(r"w-\d{4}-[0-9a-f]{6}", said.split("demo: submitted", 1)[1].split("\n", 1)[0])
        assert len(ids) == 3, said
        learned = re.search(r"learned from ([^;\n]+)", said).group(1)
        assert set(re.findall(r"w-\d{4}-[0-9a-f]{6}", learned)) <= set(ids) and learned.count("w-") >= 2, said
        shown = re.search(r"replayed: (.*)", said).group(1)
        assert shown.startswith("with: 2/2 goals, 1 iterations to goal") and "iterations -2" in shown, said
        batch = re.search(r"batch (b-\S+) is open", said).group(1)
        cands = query(type("H", (), {"db_path": root / "org" / "state.db"})(),
                      "SELECT id FROM skill_candidates WHERE batch_id = ?", (batch,))
        assert cands, said
    finally:
        _run(env, "org", "stop", timeout=60)
        shutil.rmtree(root, ignore_errors=True)
