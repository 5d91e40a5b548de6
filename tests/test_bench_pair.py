"""bench/pair.py: what it refuses, and what it installs for the earlier tree."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench import pair
from bench.common import BenchError

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


def _tree(tmp_path: Path, bench: str) -> pair.Tree:
    (tmp_path / "bench").mkdir(parents=True)
    (tmp_path / "bench" / "org.py").write_text(bench)
    return pair.Tree(tmp_path, sys.executable, {"PATH": "/usr/bin:/bin"}, timeout_s=2)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bench, code, said", [
    ("import time\ntime.sleep(60)\n", "bench_timeout", "ran longer than 2 s"),
    ("raise RuntimeError('the org would not start')\n", "bench_failed", "the org would not start"),
], ids=["hangs", "crashes"])
def test_a_benchmark_that_hangs_or_crashes_is_one_coded_line_naming_it(tmp_path, bench, code, said):
    with pytest.raises(BenchError) as got:
        _tree(tmp_path, bench).org()
    line = got.value.line()
    assert line.startswith(f"error[{code}]: ") and "org.py" in line and said in line and " — " in line, line
    assert "\n" not in line


@pytest.mark.timeout(60)
def test_main_prints_one_line_when_the_earlier_tree_fails(monkeypatch, capsys):
    def failing(rev, scratch):
        raise BenchError("install_failed", "pip could not install what abc needs (x)", "check the registry")
    monkeypatch.setattr(pair, "earlier_tree", failing)
    assert pair.main(["--against", "HEAD", "--json"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "error[install_failed]: pip could not install what abc needs (x) — check the registry"
