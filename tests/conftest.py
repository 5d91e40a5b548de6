"""Shared fixtures: an initialised org home under tmp_path, writers, and hypothesis profiles."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

settings.register_profile("ci", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("dev", max_examples=20, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("thorough", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

_REGISTRY: dict[str, str] = {}


def pytest_configure(config):
    """The org homes the tests create are registered in a registry of the session's own
    (``$XDG_STATE_HOME``, inherited by every org process the tests start), not the user's: pytest
    keeps its last temporary folders, so the user's registry would list every home of them, and
    each sandboxed command hides every registered home."""
    if "XDG_STATE_HOME" not in _REGISTRY:
        _REGISTRY["XDG_STATE_HOME"] = os.environ.get("XDG_STATE_HOME", "")
        os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="org-xdg-")


def pytest_collection_modifyitems(config, items):
    """Each test's pytest-timeout bound (its marker, else the ini's) stretched by the host's load
    as the run starts (tests/support/timing.py), so a busy host slows the suite without failing it."""
    from tests.support.timing import scale

    factor = scale()
    default = getattr(config, "_env_timeout", None)
    if factor <= 1.0:
        return
    for item in items:
        marker = item.get_closest_marker("timeout")
        base = (marker.args[0] if marker is not None and marker.args else
                marker.kwargs.get("timeout") if marker is not None else default)
        if isinstance(base, (int, float)) and base > 0:
            kwargs = {k: v for k, v in (marker.kwargs.items() if marker is not None else ()) if k != "timeout"}
            item.add_marker(pytest.mark.timeout(base * factor, *(marker.args[1:] if marker else ()), **kwargs),
                            append=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that failed because a child process ran out of time says what that process had
    printed by then (``subprocess.TimeoutExpired`` keeps it; pytest shows only the command)."""
    outcome = yield
    import subprocess

    excinfo = call.excinfo
    if excinfo is None or not isinstance(excinfo.value, subprocess.TimeoutExpired):
        return
    report = outcome.get_result()
    exc = excinfo.value
    for name, data in (("stdout", exc.output), ("stderr", exc.stderr)):
        text = data.decode(errors="replace") if isinstance(data, bytes) else (data or "")
        report.sections.append((f"what the timed-out process printed ({name})", text[-4000:] or "(nothing)"))


def pytest_unconfigure(config):
    if "XDG_STATE_HOME" in _REGISTRY:
        shutil.rmtree(os.environ["XDG_STATE_HOME"], ignore_errors=True)
        before = _REGISTRY.pop("XDG_STATE_HOME")
        if before:
            os.environ["XDG_STATE_HOME"] = before
        else:
            os.environ.pop("XDG_STATE_HOME", None)


@pytest.fixture
def org_home(tmp_path, monkeypatch):
    """A fresh, migrated org home; ORG_HOME points at it for code that resolves the home."""
    from state_db.bootstrap import init_home
    from state_db.kernel.home import OrgHome

    home = OrgHome(tmp_path / "org")
    init_home(home)
    monkeypatch.setenv("ORG_HOME", str(home.root))
    return home


@pytest.fixture
def writer_for(org_home):
    """Factory: writer_for(actor, instance=None) -> StateWriter on the fixture's state.db."""
    from state_db.writer import StateWriter

    made = []

    def make(actor, instance=None, **kw):
        w = StateWriter(org_home.db_path, actor, instance, **kw)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()
