"""bench/pair.py: what it refuses, and what it installs for the earlier tree."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench import pair

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(60)
def test_a_revision_that_is_not_a_commit_is_one_coded_line():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "pair.py"), "--json", "--against", "no-such-rev-zz"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.startswith("error[bad_revision]: 'no-such-rev-zz' is not a commit")
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert not out.stdout


@pytest.mark.timeout(30)
def test_only_what_the_earlier_tree_declares_and_this_environment_lacks_is_installed(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\nversion = "0"\n'
        'dependencies = ["pytest>=1", "structlog", "surely-not-installed-zz>=2; python_version >= \'3\'"]\n')
    assert pair._missing(tmp_path) == ["surely-not-installed-zz>=2; python_version >= '3'"]
