"""One error root: every expected error of every package is an ``OrgError`` with a string code,
and the CLI prints it as one line without a traceback."""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

from state_db.kernel.errors import OrgError

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("state_db", "transport", "roles", "knowledge", "skills", "scripts")
# control flow inside one module, never shown to a human (each says why where it is defined)
INTERNAL = {"FastPathUnavailable", "BadResponse", "StreamDeadline", "_Changed"}


def _modules():
    for top in PACKAGES:
        pkg = importlib.import_module(top)
        yield pkg
        for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{top}."):
            if info.name.endswith("__main__") or ".dashboard." in info.name:
                continue
            yield importlib.import_module(info.name)


def test_every_error_class_of_the_org_derives_from_the_one_root():
    strays = []
    for mod in _modules():
        for name, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ != mod.__name__ or not issubclass(cls, Exception) or name in INTERNAL:
                continue
            if not issubclass(cls, OrgError):
                strays.append(f"{mod.__name__}.{name}")
            elif not isinstance(cls.code, str):
                strays.append(f"{mod.__name__}.{name} (code {cls.code!r} is not a string)")
    assert not strays, "errors outside the root: " + ", ".join(sorted(strays))


def test_the_cli_prints_an_expected_error_as_one_line_and_a_bug_as_internal(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "ORG_HOME": str(tmp_path / "none"), "HOME": str(tmp_path)}
    got = subprocess.run([sys.executable, "-m", "scripts.cli.main", "show", "w-x"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    lines = got.stderr.strip().splitlines()
    assert got.returncode != 0 and len(lines) == 1 and lines[0].startswith("error[") and "Traceback" not in got.stderr
