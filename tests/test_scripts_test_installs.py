"""What ``scripts/test`` installs on the system is said in the README, and can be skipped:
every package ``scripts/_bootstrap.sh`` may install with apt-get is named in the "Two commands"
section, and ``ORG_TEST_NO_SYSTEM_PACKAGES=1`` runs no package manager at all."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOTSTRAP = ROOT / "scripts" / "_bootstrap.sh"

pytestmark = pytest.mark.timeout(60)


def packages() -> list[str]:
    """The Debian packages _bootstrap.sh installs (each ``system_install PACKAGE …`` call)."""
    return re.findall(r"^\s+system_install (\S+) ", BOOTSTRAP.read_text(), re.M)


def two_commands(readme: str) -> str:
    start = readme.index("## Two commands")
    return readme[start:readme.index("\n## ", start + 1)]


def system_install(tmp_path: Path, package: str, **env) -> tuple[subprocess.CompletedProcess, str]:
    """Call system_install with a recording apt-get first on PATH; returns (the run, what apt-get got)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "apt-get.log"
    (bin_dir / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (bin_dir / "apt-get").chmod(0o755)
    run = subprocess.run(["bash", "-c", 'source "$1" && system_install "$2" "the tests that need it"', "_",
                          str(BOOTSTRAP), package], capture_output=True, text=True, timeout=30,
                         env={**{k: v for k, v in os.environ.items() if k != "ORG_TEST_NO_SYSTEM_PACKAGES"},
                              "PATH": f"{bin_dir}:{os.environ['PATH']}", **env})
    return run, log.read_text() if log.exists() else ""


def test_the_readme_names_every_system_package_scripts_test_installs_and_how_to_skip_it():
    assert packages() == ["postgresql", "openssh-server", "gcc", "libc6-dev"]   # the list the README is checked against
    section = two_commands((ROOT / "README.md").read_text())
    for package in packages():
        assert f"apt-get install {package}" in section, package
    assert "ORG_TEST_NO_SYSTEM_PACKAGES=1" in section and "as root" in section


def test_no_system_packages_runs_no_package_manager_and_says_what_is_skipped(tmp_path):
    run, called = system_install(tmp_path, "postgresql", ORG_TEST_NO_SYSTEM_PACKAGES="1")
    assert run.returncode == 0 and called == ""
    assert run.stderr.strip() == ("warning: postgresql is not installed and ORG_TEST_NO_SYSTEM_PACKAGES is set; "
                                  "the tests that need it will be skipped")


@pytest.mark.skipif(os.geteuid() != 0, reason="the install runs apt-get directly only as root")
def test_as_root_without_the_variable_it_runs_apt_get_and_says_how_to_skip_it(tmp_path):
    run, called = system_install(tmp_path, "openssh-server")
    assert run.returncode == 0 and called.split() == ["install", "-y", "-qq", "openssh-server"]
    assert "ORG_TEST_NO_SYSTEM_PACKAGES=1 skips this" in run.stderr
