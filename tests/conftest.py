"""Shared fixtures: an initialised org home under tmp_path, writers, and hypothesis profiles."""
from __future__ import annotations

import os
import sys
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


@pytest.fixture
def org_home(tmp_path, monkeypatch):
    """A fresh, migrated org home; ORG_HOME points at it for code that resolves the home."""
    from state_db.bootstrap import init_home
    from state_db.home import OrgHome

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
