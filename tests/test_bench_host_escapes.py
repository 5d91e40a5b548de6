"""bench/host_escapes.py's harness on its quick set: every guarded reader holds, and every
unguarded control is shown to fail on this machine (so the figure can fail)."""
from __future__ import annotations

import pytest

from roles.workbench.sandbox import bubblewrap


@pytest.mark.skipif(bubblewrap() is None, reason="bubblewrap (bwrap) is not installed")
@pytest.mark.timeout(240)
def test_the_quick_set_has_no_escape_and_every_control_escapes():
    from bench.host_escapes import run
    got = run(quick=True)
    assert got["attempts"] == len(got["cases"]) >= 6
    assert got["escapes"] == 0 and got["blocked"] == 0, got["escaped"]
    assert got["raw_unguarded_escapes"] == got["attempts"], [c for c in got["cases"]
                                                       if not (c["control_leaked"] or c["control_blocked"])]
    assert {c["reader"] for c in got["cases"]} == {"report", "output", "checkpoint", "quota", "home"}
