"""The supervisor raises the soft limit of open files to the hard one before it starts the role
template, so every role of a large org inherits it."""
from __future__ import annotations

import resource
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)


def _lowered():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))


def test_the_soft_limit_of_open_files_is_raised_to_the_hard_one_and_inherited_by_children():
    code = ("import resource, subprocess, sys\n"
            "from roles.supervisor.template import open_files_limit\n"
            "before = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
            "now = open_files_limit()\n"
            "child = subprocess.run([sys.executable, '-c', 'import resource; "
            "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])'], capture_output=True, text=True).stdout\n"
            "print(before[0], before[1], now, child.strip())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=_lowered,
                         timeout=30, check=True).stdout.split()
    before_soft, hard, now, child = (int(x) for x in out)
    assert before_soft == 256
    expected = hard if hard != resource.RLIM_INFINITY else int(open("/proc/sys/fs/nr_open").read())
    assert now == expected and child == expected
